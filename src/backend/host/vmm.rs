//! The host emulation of CUDA's virtual memory management (`cuMemAddressReserve`,
//! `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`).
//!
//! A reservation is an inaccessible anonymous mapping (`mmap(PROT_NONE, MAP_NORESERVE)`), so
//! the address range is the process's and nothing else lands in it. A physical allocation is
//! only a byte count charged against the device's capacity (so
//! [`HostControls::allocated_bytes`](super::HostControls::allocated_bytes) and the device's
//! free memory show the mapped footprint, and a full device refuses it); mapping it replaces
//! the range with fresh, zeroed, readable and writable pages (`mmap(MAP_FIXED)`), unmapping
//! makes the range inaccessible again and drops its pages. Unlike CUDA's, a physical
//! allocation's contents do not survive an unmap and a map elsewhere: the mapped pool never
//! unmaps memory it still holds data in. An access to an unmapped page faults (`SIGSEGV`), as
//! a kernel's does on the GPU, which is what a test wants from a pool that unmaps too much.
//!
//! Every call is checked against the bookkeeping here first, so misuse (a range outside a
//! reservation, a double map, an unknown handle) is an [`Error::InvalidArgument`], never a
//! mapping over memory that is not the emulation's own.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::{Error, Result};

/// The emulated granularity: an H100's (2 MiB), so the host runs the pool's page logic as the
/// GPU does.
pub(crate) const GRANULARITY: usize = 2 << 20;

/// Reservations, physical handles and mappings of one host device.
///
/// It lives in the device's [`HostMemory`](super::memory::HostMemory), which every stream's
/// queue holds: the reservations are given back only when the last of them is gone, so never
/// while a worker may still run queued work in them (a leaked buffer's copies, say), whoever
/// dropped the device first.
#[derive(Debug, Default)]
pub(crate) struct HostVmm {
    state: Mutex<VmmState>,
}

#[derive(Debug, Default)]
struct VmmState {
    /// Reservations: start to length.
    reservations: BTreeMap<u64, usize>,
    /// Physical allocations: handle to length, and whether it is mapped.
    handles: HashMap<u64, (usize, bool)>,
    /// Mappings: start to (length, handle).
    mappings: BTreeMap<u64, (usize, u64)>,
}

fn invalid(what: String) -> Error {
    Error::invalid(what)
}

impl VmmState {
    /// Whether `va..va + bytes` lies inside one reservation.
    fn reserved(&self, va: u64, bytes: usize) -> bool {
        match self.reservations.range(..=va).next_back() {
            Some((&start, &len)) => {
                va.checked_add(bytes as u64)
                    .is_some_and(|end| end <= start + len as u64)
                    && bytes > 0
            }
            None => false,
        }
    }

    /// Whether anything is mapped in `va..va + bytes`.
    fn overlaps_mapping(&self, va: u64, bytes: usize) -> bool {
        let end = va + bytes as u64;
        if let Some((&start, &(len, _))) = self.mappings.range(..end).next_back() {
            return start + len as u64 > va;
        }
        false
    }
}

impl HostVmm {
    pub(crate) fn reserve(&self, bytes: usize) -> Result<u64> {
        if bytes == 0 || bytes % GRANULARITY != 0 {
            return Err(invalid(format!(
                "a reservation of {bytes} bytes is not a positive multiple of the granularity \
                 ({GRANULARITY})"
            )));
        }
        let va = sys::reserve(bytes, GRANULARITY)?;
        self.state.lock().reservations.insert(va, bytes);
        Ok(va)
    }

    /// # Safety
    /// As [`Backend::vmm_free_reservation`](crate::backend::Backend::vmm_free_reservation).
    pub(crate) unsafe fn free_reservation(&self, va: u64, bytes: usize) -> Result<()> {
        let mut state = self.state.lock();
        if state.reservations.get(&va) != Some(&bytes) {
            return Err(invalid(format!(
                "{va:#x} ({bytes} bytes) is not a reservation of this device"
            )));
        }
        if state.overlaps_mapping(va, bytes) {
            return Err(invalid(format!(
                "the reservation at {va:#x} still has mappings"
            )));
        }
        state.reservations.remove(&va);
        // SAFETY: the range is one whole reservation made by `sys::reserve` (checked above)
        // and, with nothing mapped in it, holds no memory anyone uses.
        unsafe { sys::release(va, bytes) };
        Ok(())
    }

    /// A physical allocation of `bytes`; `charge` counts it against the device's memory first
    /// (and may refuse it).
    pub(crate) fn create(&self, bytes: usize, charge: impl FnOnce() -> Result<()>) -> Result<u64> {
        if bytes == 0 || bytes % GRANULARITY != 0 {
            return Err(invalid(format!(
                "a physical allocation of {bytes} bytes is not a positive multiple of the \
                 granularity ({GRANULARITY})"
            )));
        }
        charge()?;
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let handle = NEXT.fetch_add(1, Ordering::Relaxed);
        self.state.lock().handles.insert(handle, (bytes, false));
        Ok(handle)
    }

    /// Releases a physical allocation; `refund` gives its bytes back to the device's memory.
    pub(crate) fn release(&self, handle: u64, bytes: usize, refund: impl FnOnce()) -> Result<()> {
        let mut state = self.state.lock();
        match state.handles.get(&handle) {
            Some(&(len, false)) if len == bytes => {}
            Some(&(_, true)) => {
                return Err(invalid(format!(
                    "release of physical handle {handle} while it is mapped"
                )))
            }
            _ => {
                return Err(invalid(format!(
                    "release of unknown physical handle {handle} ({bytes} bytes)"
                )))
            }
        }
        state.handles.remove(&handle);
        drop(state);
        refund();
        Ok(())
    }

    /// Maps a run of handles, one page each, as CUDA's `cuMemMap` per handle: each counts (and
    /// may fail) as one call of `map_call` (the device's [`FaultPoint::VmmMap`](crate::FaultPoint::VmmMap)
    /// injection); on a failure the pages mapped before it are unmapped again.
    ///
    /// # Safety
    /// As [`Backend::vmm_map`](crate::backend::Backend::vmm_map).
    pub(crate) unsafe fn map_run(
        &self,
        va: u64,
        page: usize,
        handles: &[u64],
        map_call: impl Fn() -> Result<()>,
    ) -> Result<()> {
        for (i, &handle) in handles.iter().enumerate() {
            let at = va + (i * page) as u64;
            let mut mapped = map_call();
            if mapped.is_ok() {
                // SAFETY: page `i` of the caller's run: aligned, inside a reservation,
                // unmapped, and a live handle of `page` bytes.
                mapped = unsafe { self.map(at, page, handle) };
            }
            if let Err(e) = mapped {
                for j in 0..i {
                    // SAFETY: page `j` was mapped just above by this call; nothing uses it yet.
                    let _ = unsafe { self.unmap(va + (j * page) as u64, page) };
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// # Safety
    /// One page of [`map_run`](Self::map_run)'s contract.
    unsafe fn map(&self, va: u64, bytes: usize, handle: u64) -> Result<()> {
        let mut state = self.state.lock();
        if va % GRANULARITY as u64 != 0 || !state.reserved(va, bytes) {
            return Err(invalid(format!(
                "map of {va:#x} ({bytes} bytes): not an aligned range inside a reservation"
            )));
        }
        if state.overlaps_mapping(va, bytes) {
            return Err(invalid(format!(
                "map of {va:#x} ({bytes} bytes) over an existing mapping"
            )));
        }
        match state.handles.get_mut(&handle) {
            Some((len, mapped)) if *len == bytes && !*mapped => *mapped = true,
            _ => {
                return Err(invalid(format!(
                    "map of physical handle {handle} ({bytes} bytes): unknown, of another \
                     size, or mapped already"
                )))
            }
        }
        // SAFETY: the range lies inside one of this device's reservations with nothing mapped
        // in it (checked above), so no memory anyone uses is replaced.
        if let Err(e) = unsafe { sys::protect(va, bytes, true) } {
            state.handles.get_mut(&handle).expect("checked above").1 = false;
            return Err(e);
        }
        state.mappings.insert(va, (bytes, handle));
        Ok(())
    }

    /// # Safety
    /// As [`Backend::vmm_unmap`](crate::backend::Backend::vmm_unmap).
    pub(crate) unsafe fn unmap(&self, va: u64, bytes: usize) -> Result<()> {
        let mut state = self.state.lock();
        let Some(&(len, handle)) = state.mappings.get(&va) else {
            return Err(invalid(format!(
                "unmap of {va:#x}: nothing is mapped there"
            )));
        };
        if len != bytes {
            return Err(invalid(format!(
                "unmap of {va:#x} as {bytes} bytes; it was mapped as {len}"
            )));
        }
        // SAFETY: the range is one mapping inside a reservation (from the map above); the
        // caller guarantees nothing uses it any more.
        unsafe { sys::protect(va, bytes, false)? };
        state.mappings.remove(&va);
        if let Some((_, mapped)) = state.handles.get_mut(&handle) {
            *mapped = false;
        }
        Ok(())
    }
}

impl Drop for HostVmm {
    fn drop(&mut self) {
        // The device's memory, which holds this, is dropped with its last handle: every stream
        // worker (each holds one through its queue) has exited, and every resource and buffer
        // of the device is gone, so nothing can use these address ranges any more.
        for (&va, &len) in &self.state.get_mut().reservations {
            // SAFETY: a whole reservation made by `sys::reserve`, used by no one now (above).
            unsafe { sys::release(va, len) };
        }
    }
}

#[cfg(unix)]
mod sys {
    //! The `mmap` calls behind the emulation.

    use std::ptr;

    use crate::error::{Error, Result};

    fn os_error(call: &'static str) -> Error {
        Error::invalid(format!(
            "{call} failed in the host emulation of virtual memory management: {}",
            std::io::Error::last_os_error()
        ))
    }

    /// Reserves `bytes` of inaccessible address space aligned to `align` (a power of two).
    pub(super) fn reserve(bytes: usize, align: usize) -> Result<u64> {
        let Some(len) = bytes.checked_add(align) else {
            return Err(Error::invalid(format!(
                "a reservation of {bytes} bytes is too large"
            )));
        };
        // SAFETY: an anonymous mapping at an address of the kernel's choosing touches no
        // existing memory.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(os_error("mmap (reserve)"));
        }
        let base = base as usize;
        let start = (base + align - 1) & !(align - 1);
        let head = start - base;
        let tail = len - head - bytes;
        // SAFETY: the head and the tail are parts of the mapping just made, used by no one.
        unsafe {
            if head > 0 {
                libc::munmap(base as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((start + bytes) as *mut libc::c_void, tail);
            }
        }
        Ok(start as u64)
    }

    /// Gives a reservation back.
    ///
    /// # Safety
    /// `va..va + bytes` is a whole reservation from [`reserve`] that no one uses.
    pub(super) unsafe fn release(va: u64, bytes: usize) {
        // SAFETY: the caller's contract.
        unsafe { libc::munmap(va as *mut libc::c_void, bytes) };
    }

    /// Replaces `va..va + bytes` with fresh pages: zeroed and accessible when `accessible`,
    /// else inaccessible (which drops the old pages).
    ///
    /// # Safety
    /// The range lies inside a reservation from [`reserve`], and no one uses its memory.
    pub(super) unsafe fn protect(va: u64, bytes: usize, accessible: bool) -> Result<()> {
        let prot = if accessible {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_NONE
        };
        // SAFETY: the caller's contract: the fixed range is the emulation's own reservation.
        let r = unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                bytes,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(os_error("mmap (map or unmap)"));
        }
        Ok(())
    }
}

#[cfg(not(unix))]
mod sys {
    //! No emulation off Unix: reserving fails, so nothing else is ever called.

    use crate::error::{Error, Result};

    fn unsupported() -> Error {
        Error::invalid("the host emulation of virtual memory management needs a Unix mmap")
    }

    pub(super) fn reserve(_bytes: usize, _align: usize) -> Result<u64> {
        Err(unsupported())
    }

    pub(super) unsafe fn release(_va: u64, _bytes: usize) {}

    pub(super) unsafe fn protect(_va: u64, _bytes: usize, _accessible: bool) -> Result<()> {
        Err(unsupported())
    }
}
