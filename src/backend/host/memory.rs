use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::backend::pageable::{allocate_zeroed_aligned, free_raw, RawBlock};
use crate::backend::seam::{ErrorSink, MemoryInfo, MemoryKind};
use crate::error::{Error, Result};
use crate::ids::DeviceId;

use super::fault::{FaultPoint, Faults};
use super::vmm::HostVmm;

/// Emulated device memory: zeroed, 256-byte-aligned host allocations counted against a capacity.
pub(crate) struct HostMemory {
    device: DeviceId,
    /// Set when the device (its backend) is dropped; driver calls made after it are counted
    /// in `calls_after_teardown`, so teardown tests can prove there are none.
    torn_down: AtomicBool,
    calls_after_teardown: AtomicUsize,
    capacity: usize,
    /// Live allocations. Frees are checked against it when they are enqueued, so a bad free
    /// (a double free included) is an error returned at once instead of undefined behaviour.
    live: Mutex<Live>,
    /// Errors met on stream workers, for the device to take.
    errors: ErrorSink,
    /// Driver calls still to fail on purpose, per kind.
    faults: Faults,
    /// Prefetches of managed memory requested so far.
    prefetches: AtomicUsize,
    /// The emulation of virtual memory management. Here, not in the backend, because every
    /// stream's queue holds this memory: its ranges outlive every worker that may write them.
    vmm: HostVmm,
}

#[derive(Default)]
struct Live {
    blocks: HashMap<u64, Block>,
    /// The sum of `blocks`' sizes, those with a free pending included, and of the physical
    /// memory of virtual memory management (`vmm.rs`).
    bytes: usize,
    /// Physical allocations of virtual memory management now live (`vmm.rs`).
    physical: usize,
}

/// A live allocation.
struct Block {
    bytes: usize,
    kind: MemoryKind,
    /// The allocation it was carved from.
    raw: RawBlock,
    /// A stream-ordered free of it is enqueued and the stream has not reached it yet: a second
    /// free is a double free, even though the memory is still allocated.
    free_pending: bool,
}

impl HostMemory {
    pub(crate) fn new(device: DeviceId, capacity: usize) -> Self {
        HostMemory {
            device,
            torn_down: AtomicBool::new(false),
            calls_after_teardown: AtomicUsize::new(0),
            capacity,
            live: Mutex::default(),
            errors: ErrorSink::default(),
            faults: Faults::default(),
            prefetches: AtomicUsize::new(0),
            vmm: HostVmm::default(),
        }
    }

    /// The emulation of virtual memory management (`vmm.rs`).
    pub(crate) fn vmm(&self) -> &HostVmm {
        &self.vmm
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
            details: None,
            requested,
            available: Some(available),
            device: self.device,
        }
    }

    pub(crate) fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<u64> {
        self.note_call();
        let bytes = bytes.max(1);
        let injected = self.faults.fires(FaultPoint::Allocation);
        let mut live = self.live.lock();
        let available = self.capacity.saturating_sub(live.bytes);
        if injected || bytes > available {
            return Err(self.out_of_memory(bytes, available));
        }
        let (addr, raw) =
            allocate_zeroed_aligned(bytes).ok_or_else(|| self.out_of_memory(bytes, available))?;
        live.blocks.insert(
            addr,
            Block {
                bytes,
                kind,
                raw,
                free_pending: false,
            },
        );
        live.bytes += bytes;
        Ok(addr)
    }

    /// Counts `bytes` of physical memory for virtual memory management (`cuMemCreate`)
    /// against the capacity, as an allocation: injected allocation failures apply.
    pub(crate) fn charge_physical(&self, bytes: usize) -> Result<()> {
        let injected = self.faults.fires(FaultPoint::Allocation);
        let mut live = self.live.lock();
        let available = self.capacity.saturating_sub(live.bytes);
        if injected || bytes > available {
            return Err(self.out_of_memory(bytes, available));
        }
        live.bytes += bytes;
        live.physical += 1;
        Ok(())
    }

    /// Undoes [`charge_physical`](Self::charge_physical) (`cuMemRelease`).
    pub(crate) fn refund_physical(&self, bytes: usize) {
        let mut live = self.live.lock();
        live.bytes -= bytes;
        live.physical -= 1;
    }

    pub(crate) fn device(&self) -> DeviceId {
        self.device
    }

    /// Marks the device gone: its backend has been dropped.
    pub(crate) fn tear_down(&self) {
        self.torn_down.store(true, Ordering::Release);
    }

    /// Counts a driver call (made by the host side, not a stream's worker) if the device is
    /// gone already.
    pub(crate) fn note_call(&self) {
        if self.torn_down.load(Ordering::Acquire) {
            self.calls_after_teardown.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Where errors met on this device's stream workers go.
    pub(crate) fn errors(&self) -> &ErrorSink {
        &self.errors
    }

    /// Starts a stream-ordered free: checks that `ptr` is a live block of `bytes` bytes of
    /// `kind` with no free enqueued yet, and marks it so, so that a second free fails here, at
    /// once, even while the stream has not reached the first.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the pointer for a double free, a pointer this device
    /// did not allocate, or a free of the wrong size or kind.
    pub(crate) fn begin_free(&self, kind: MemoryKind, ptr: u64, bytes: usize) -> Result<()> {
        self.fail_if(FaultPoint::Free)?;
        let mut live = self.live.lock();
        self.note_call();
        let block = self.check(&mut live, kind, ptr, bytes.max(1))?;
        if block.free_pending {
            return Err(Error::invalid(format!(
                "double free of {ptr:#x} ({bytes} bytes of {kind:?}) on {}: a stream-ordered \
                 free of it is already enqueued",
                self.device
            )));
        }
        block.free_pending = true;
        Ok(())
    }

    /// Undoes [`begin_free`](Self::begin_free) when the free could not be enqueued.
    pub(crate) fn cancel_free(&self, ptr: u64) {
        if let Some(block) = self.live.lock().blocks.get_mut(&ptr) {
            block.free_pending = false;
        }
    }

    fn check<'a>(
        &self,
        live: &'a mut Live,
        kind: MemoryKind,
        ptr: u64,
        bytes: usize,
    ) -> Result<&'a mut Block> {
        match live.blocks.get_mut(&ptr) {
            Some(block) if block.bytes == bytes && block.kind == kind => Ok(block),
            Some(block) => Err(Error::invalid(format!(
                "free of {ptr:#x} as {bytes} bytes of {kind:?}; it was allocated as {} bytes of \
                 {:?}",
                block.bytes, block.kind
            ))),
            None => Err(Error::invalid(format!(
                "free of unknown pointer {ptr:#x} on {} (never allocated there, or freed \
                 already)",
                self.device
            ))),
        }
    }

    /// The injected error of this call of `point`, if one is armed (the call then does
    /// nothing, or, for work enqueued on a stream, fails when the stream reaches it).
    pub(crate) fn injected(&self, point: FaultPoint) -> Option<Error> {
        self.faults.check(point, self.device)
    }

    /// Fails this call of `point` when a failure is armed for it.
    pub(crate) fn fail_if(&self, point: FaultPoint) -> Result<()> {
        self.injected(point).map_or(Ok(()), Err)
    }

    /// A prefetch of `ptr..ptr + bytes`: counted, and `true`, when the range lies inside one
    /// live block of managed memory; `false` (a no-op, as CUDA's prefetch of other memory is)
    /// otherwise; an error when one was injected.
    pub(crate) fn prefetch(&self, ptr: u64, bytes: usize) -> Result<bool> {
        self.fail_if(FaultPoint::Prefetch)?;
        if bytes == 0 {
            return Ok(false);
        }
        let Some(end) = ptr.checked_add(bytes as u64) else {
            return Ok(false);
        };
        let live = self.live.lock();
        let inside = |(&start, block): (&u64, &Block)| {
            block.kind == MemoryKind::Managed && start <= ptr && end <= start + block.bytes as u64
        };
        // Most prefetches cover a whole block; sub-allocators' pieces need the scan.
        let managed = match live.blocks.get_key_value(&ptr) {
            Some(block) => inside(block),
            None => live.blocks.iter().any(inside),
        };
        drop(live);
        if managed {
            self.prefetches.fetch_add(1, Ordering::AcqRel);
        }
        Ok(managed)
    }

    /// Ends a stream-ordered free that [`begin_free`](Self::begin_free) started: frees the
    /// block.
    ///
    /// # Safety
    /// No code reads or writes the block after this call.
    pub(crate) unsafe fn finish_free(
        &self,
        kind: MemoryKind,
        ptr: u64,
        bytes: usize,
    ) -> Result<()> {
        let bytes = bytes.max(1);
        let mut live = self.live.lock();
        if !self.check(&mut live, kind, ptr, bytes)?.free_pending {
            return Err(Error::invalid(format!(
                "stream-ordered free of {ptr:#x} on {} was never started",
                self.device
            )));
        }
        let Block { raw, .. } = live.blocks.remove(&ptr).expect("checked above");
        live.bytes -= bytes;
        drop(live);
        // SAFETY: `raw` is the allocation behind `ptr` (from the live map) and the caller
        // guarantees nothing uses it any more.
        unsafe { free_raw(raw) };
        Ok(())
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        let live = std::mem::take(&mut self.live.get_mut().blocks);
        for (_, block) in live {
            // SAFETY: this was the last handle of the device's memory: every stream worker (each
            // holds one through its queue) has exited and every resource and buffer of the
            // device is gone, so nothing can use its memory any more.
            unsafe { free_raw(block.raw) };
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
/// let mr = CudaResource::new(&device)?;
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

    /// Makes the next `n` raw allocations of this device fail with out-of-memory.
    pub fn fail_next_allocations(&self, n: usize) {
        self.fail_next(FaultPoint::Allocation, n);
    }

    /// Makes the next `n` calls of the kind `point` on this device fail as the driver call
    /// would (see [`FaultPoint`] for which fail at once and which when the stream reaches
    /// them). Replaces what was armed for `point` before; 0 disarms it.
    ///
    /// ```
    /// use streamalloc::{Device, Error, FaultPoint, HostConfig, Stream};
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// let stream = Stream::new(&device)?;
    /// let controls = device.host_controls().unwrap();
    /// controls.fail_next(FaultPoint::EventRecord, 1);
    /// assert!(matches!(stream.record(), Err(Error::Driver { call: "cuEventRecord", .. })));
    /// assert!(stream.record().is_ok());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn fail_next(&self, point: FaultPoint, n: usize) {
        self.memory.faults.arm(point, n);
    }

    /// How many calls of the kind `point` failed on purpose on this device so far (so that a
    /// test can tell that the failure it armed was met).
    ///
    /// ```
    /// use streamalloc::{Device, FaultPoint, HostConfig};
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// assert_eq!(device.host_controls().unwrap().faults_injected(FaultPoint::Copy), 0);
    /// ```
    pub fn faults_injected(&self, point: FaultPoint) -> usize {
        self.memory.faults.injected(point)
    }

    /// How many calls of the kind `point` this device has had so far, those that failed on
    /// purpose included: a test's way to check that a hot path makes no driver call (a
    /// [`MappedPoolResource`](crate::MappedPoolResource) that maps no page).
    /// [`Allocation`](FaultPoint::Allocation) also counts the physical memory of
    /// [`VmmCreate`](FaultPoint::VmmCreate).
    ///
    /// ```
    /// use streamalloc::{Device, FaultPoint, HostConfig, Stream};
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// let stream = Stream::new(&device)?;
    /// let controls = device.host_controls().unwrap();
    /// let before = controls.calls(FaultPoint::EventRecord);
    /// stream.record()?;
    /// assert_eq!(controls.calls(FaultPoint::EventRecord), before + 1);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn calls(&self, point: FaultPoint) -> usize {
        self.memory.faults.calls(point)
    }

    /// Makes the next `n` copies enqueued on this device's streams fail when the stream
    /// reaches them, as an asynchronous driver error does on a GPU: the copy moves nothing, and
    /// the stream reports the error ([`Error::Driver`], `cuMemcpyAsync`) at every event
    /// recorded after it (awaiting, querying or synchronizing), and passes it on to
    /// streams that wait on such an event. Enqueuing itself succeeds.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, HostConfig, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host_with(HostConfig::default());
    /// let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(4, &stream, CudaResource::new(&device)?).await?;
    /// device.host_controls().unwrap().fail_next_copies(1);
    /// let copy = buf.copy_from_host(vec![1u8; 4]);
    /// assert!(matches!(copy.await, Err(streamalloc::Error::Driver { .. })));
    /// assert!(stream.synchronize_blocking().is_err()); // the stream stays failed
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// [`Error::Driver`]: crate::Error::Driver
    pub fn fail_next_copies(&self, n: usize) {
        self.fail_next(FaultPoint::Copy, n);
    }

    /// Bytes of emulated device memory now allocated (physical memory mapped through virtual
    /// memory management included).
    pub fn allocated_bytes(&self) -> usize {
        self.memory.live.lock().bytes
    }

    /// Number of raw allocations now live (physical allocations of virtual memory management
    /// included).
    pub fn live_allocations(&self) -> usize {
        let live = self.memory.live.lock();
        live.blocks.len() + live.physical
    }

    /// Number of prefetches of managed memory requested on this device so far (each a no-op
    /// here; see [`PrefetchAdaptor`](crate::PrefetchAdaptor)). Prefetches of other memory,
    /// which CUDA ignores too, are not counted.
    ///
    /// ```
    /// use streamalloc::{Device, HostConfig, ManagedResource, MemoryResource, PrefetchAdaptor, Stream};
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// let stream = Stream::new(&device)?;
    /// let mr = PrefetchAdaptor::new(ManagedResource::new(&device)?);
    /// let p = mr.try_allocate(4096, &stream)?;
    /// assert_eq!(device.host_controls().unwrap().prefetches(), 1);
    /// unsafe { mr.deallocate(p, 4096, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn prefetches(&self) -> usize {
        self.memory.prefetches.load(Ordering::Acquire)
    }

    /// Makes the next `n` prefetches of this device fail with a driver error.
    pub fn fail_next_prefetches(&self, n: usize) {
        self.fail_next(FaultPoint::Prefetch, n);
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
            .field("prefetches", &self.prefetches())
            .finish()
    }
}

/// Teardown: whether the device is gone, and whether anything called it afterwards.
impl HostControls {
    /// Whether the device is gone: its last handle (those held by its streams, events,
    /// resources and buffers included) has been dropped. The controls outlive it.
    pub fn is_torn_down(&self) -> bool {
        self.memory.torn_down.load(Ordering::Acquire)
    }

    /// Driver calls (allocations, frees, stream creation, enqueues, event records, queries
    /// and synchronizes) made on this device after it was
    /// [torn down](HostControls::is_torn_down): 0 unless something that should not outlives
    /// the device. Work its streams had queued still runs; that is the device executing, not
    /// a call.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, HostConfig, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host_with(HostConfig::default());
    /// let controls = device.host_controls().unwrap().clone();
    /// let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::new(64, &stream, CudaResource::new(&device)?).await?;
    /// drop((device, stream, buf));
    /// assert!(controls.is_torn_down());
    /// assert_eq!(controls.calls_after_teardown(), 0);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn calls_after_teardown(&self) -> usize {
        self.memory.calls_after_teardown.load(Ordering::Acquire)
    }
}
