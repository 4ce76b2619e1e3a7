//! The large level of a granular pool over plain device memory: large blocks in the pool's
//! own address space (a [`MappedPoolResource`]), whose mapped pages serve large blocks of any
//! size again, instead of a `cuMemAlloc` and a `cuMemFree` of their own for most of them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::inner::Inner;
use crate::error::Result;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::device_ptr::DevicePtr;
use crate::resource::suballoc::mapped_pool::MappedPoolResource;
use crate::stream::Stream;

impl<R: MemoryResource> Inner<R> {
    /// The mapped level, made at the first large request of a pool that uses one (`vmm`);
    /// `None` for other pools, and where the device has no virtual memory management (large
    /// blocks then get chunks of their own from the upstream, in the `large` level).
    pub(super) fn mapped_level(&self) -> Option<&MappedPoolResource> {
        if !self.vmm {
            return None;
        }
        self.mapped
            .get_or_init(|| {
                let availability = Arc::clone(&self.availability);
                let held = Arc::clone(&self.held);
                match MappedPoolResource::for_pool(&self.device, availability, held) {
                    Ok(level) => Some(level),
                    Err(error) => {
                        tracing::debug!(%error, "no mapped level: large blocks get chunks of their own");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// The mapped level if it has been made (never makes it).
    pub(super) fn mapped_made(&self) -> Option<&MappedPoolResource> {
        self.mapped.get().and_then(Option::as_ref)
    }

    /// Bytes of device memory the mapped level holds (its mapped pages).
    pub(super) fn mapped_bytes(&self) -> usize {
        self.mapped_made()
            .map_or(0, MappedPoolResource::mapped_bytes)
    }

    /// Serves a large request of `size` bytes (aligned) for `stream` from the mapped level, or
    /// from the `large` level where there is none; `None` when the device has no memory for it.
    pub(super) fn large_or_mapped_allocate(
        &self,
        size: usize,
        stream: &Stream,
    ) -> Result<Option<u64>> {
        let Some(level) = self.mapped_level() else {
            return self.large_allocate(size, stream);
        };
        match level.try_allocate(size, stream) {
            Ok(p) => {
                self.mapped_served.fetch_add(1, Ordering::Relaxed);
                let held = self.held.load(Ordering::Relaxed) + level.mapped_bytes();
                self.peak_reserved.fetch_max(held, Ordering::Relaxed);
                Ok(Some(p.addr()))
            }
            Err(e) if e.is_out_of_memory() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Frees `ptr` (allocated with `bytes`) on `stream` into the mapped level: `None` when it
    /// lies outside the level's range, else whether it was a block of the level.
    ///
    /// # Safety
    /// As [`MemoryResource::deallocate`].
    pub(super) unsafe fn mapped_free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Option<bool> {
        let level = self.mapped_made()?;
        // SAFETY: the caller's contract.
        level
            .contains(ptr.addr())
            .then(|| unsafe { level.try_free(ptr, bytes, stream) })
    }
}
