use std::alloc::{self, Layout};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::backend::{MemoryInfo, MemoryKind};
use crate::device::DeviceId;
use crate::error::{Error, Result};

/// The alignment of every allocation, as CUDA guarantees for `cuMemAlloc`.
pub(crate) const ALIGNMENT: usize = 256;

/// Emulated device memory: zeroed, 256-byte-aligned host allocations counted against a capacity.
pub(crate) struct HostMemory {
    device: DeviceId,
    capacity: usize,
    /// Live allocations: address → (bytes, kind). Frees are checked against it, so a bad free is
    /// an error instead of undefined behaviour.
    live: Mutex<Live>,
    /// Allocations still to fail on purpose.
    fail_next: AtomicUsize,
}

#[derive(Default)]
struct Live {
    blocks: HashMap<u64, (usize, MemoryKind)>,
    bytes: usize,
}

impl HostMemory {
    pub(crate) fn new(device: DeviceId, capacity: usize) -> Self {
        HostMemory {
            device,
            capacity,
            live: Mutex::default(),
            fail_next: AtomicUsize::new(0),
        }
    }

    pub(crate) fn info(&self) -> MemoryInfo {
        let used = self.live.lock().bytes;
        MemoryInfo {
            free: self.capacity.saturating_sub(used),
            total: self.capacity,
        }
    }

    fn out_of_memory(&self, requested: usize, available: usize) -> Error {
        Error::OutOfMemory {
            requested,
            available: Some(available),
            device: self.device,
        }
    }

    pub(crate) fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<u64> {
        let bytes = bytes.max(1);
        let injected = self
            .fail_next
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        let mut live = self.live.lock();
        let available = self.capacity.saturating_sub(live.bytes);
        if injected || bytes > available {
            return Err(self.out_of_memory(bytes, available));
        }
        let layout = Layout::from_size_align(bytes, ALIGNMENT)
            .map_err(|_| self.out_of_memory(bytes, available))?;
        // SAFETY: `layout` has a non-zero size (bytes >= 1).
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(self.out_of_memory(bytes, available));
        }
        let addr = ptr as u64;
        live.blocks.insert(addr, (bytes, kind));
        live.bytes += bytes;
        Ok(addr)
    }

    /// Checks that `ptr` is a live block of `bytes` bytes of `kind`.
    pub(crate) fn check_live(&self, kind: MemoryKind, ptr: u64, bytes: usize) -> Result<()> {
        Self::check(&self.live.lock(), kind, ptr, bytes.max(1))
    }

    fn check(live: &Live, kind: MemoryKind, ptr: u64, bytes: usize) -> Result<()> {
        match live.blocks.get(&ptr) {
            Some(&(b, k)) if b == bytes && k == kind => Ok(()),
            Some(&(b, k)) => Err(Error::invalid(format!(
                "free of {ptr:#x} as {bytes} bytes of {kind:?}; it was allocated as {b} bytes of \
                 {k:?}"
            ))),
            None => Err(Error::invalid(format!("free of unknown pointer {ptr:#x}"))),
        }
    }

    /// Frees a block from [`HostMemory::allocate`].
    ///
    /// # Safety
    /// No code reads or writes the block after this call.
    pub(crate) unsafe fn free(&self, kind: MemoryKind, ptr: u64, bytes: usize) -> Result<()> {
        let bytes = bytes.max(1);
        let mut live = self.live.lock();
        Self::check(&live, kind, ptr, bytes)?;
        live.blocks.remove(&ptr);
        live.bytes -= bytes;
        drop(live);
        let layout = Layout::from_size_align(bytes, ALIGNMENT).expect("checked at allocation");
        // SAFETY: `ptr` was returned by `alloc_zeroed` with this layout (checked against the live
        // map above) and the caller guarantees nothing uses it any more.
        unsafe { alloc::dealloc(ptr as *mut u8, layout) };
        Ok(())
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        let live = std::mem::take(&mut self.live.get_mut().blocks);
        for (ptr, (bytes, _)) in live {
            let layout = Layout::from_size_align(bytes, ALIGNMENT).expect("checked at allocation");
            // SAFETY: the device is gone, so no stream or resource can use its memory any more;
            // each block came from `alloc_zeroed` with this layout.
            unsafe { alloc::dealloc(ptr as *mut u8, layout) };
        }
    }
}

/// Fault injection and accounting of a host-backend device
/// ([`Device::host_controls`](crate::Device::host_controls)).
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, HostConfig, MemoryResource, Stream};
///
/// let device = Device::host_with(HostConfig::default());
/// let controls = device.host_controls().unwrap();
/// let stream = Stream::new(&device)?;
/// let mr = CudaResource::new(&device);
///
/// controls.fail_next_allocations(1);
/// assert!(mr.try_allocate(1024, &stream).unwrap_err().is_out_of_memory());
/// let p = mr.try_allocate(1024, &stream)?;
/// assert_eq!(controls.allocated_bytes(), 1024);
/// unsafe { mr.deallocate(p, 1024, &stream) };
/// stream.synchronize_blocking()?; // the free is stream-ordered
/// assert_eq!(controls.live_allocations(), 0);
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Clone)]
pub struct HostControls {
    memory: Arc<HostMemory>,
}

impl HostControls {
    pub(crate) fn new(memory: Arc<HostMemory>) -> Self {
        HostControls { memory }
    }

    pub(crate) fn memory(&self) -> &Arc<HostMemory> {
        &self.memory
    }

    /// Makes the next `n` raw allocations of this device fail with out-of-memory.
    pub fn fail_next_allocations(&self, n: usize) {
        self.memory.fail_next.store(n, Ordering::Release);
    }

    /// Bytes of emulated device memory now allocated.
    pub fn allocated_bytes(&self) -> usize {
        self.memory.live.lock().bytes
    }

    /// Number of raw allocations now live.
    pub fn live_allocations(&self) -> usize {
        self.memory.live.lock().blocks.len()
    }
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemory")
            .field("device", &self.device)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for HostControls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostControls")
            .field("allocated_bytes", &self.allocated_bytes())
            .field("live_allocations", &self.live_allocations())
            .finish()
    }
}

/// Allocates `bytes` (> 0) of zeroed pageable system memory, 256-byte aligned; `None` when the
/// system allocator refuses. Zeroed, so that copying a fresh block to the host never reads
/// uninitialised bytes (large blocks come zeroed from the OS anyway).
pub(crate) fn system_allocate(bytes: usize) -> Option<u64> {
    let layout = Layout::from_size_align(bytes.max(1), ALIGNMENT).ok()?;
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe { alloc::alloc_zeroed(layout) };
    (!ptr.is_null()).then_some(ptr as u64)
}

/// Frees what [`system_allocate`] returned.
///
/// # Safety
/// 1. `ptr` came from `system_allocate(bytes)` and is not freed yet.
/// 2. Nothing reads or writes it any more.
pub(crate) unsafe fn system_free(ptr: u64, bytes: usize) {
    let layout = Layout::from_size_align(bytes.max(1), ALIGNMENT).expect("checked at allocation");
    // SAFETY: by the caller's contract, `ptr` came from `alloc` with this layout.
    unsafe { alloc::dealloc(ptr as *mut u8, layout) }
}
