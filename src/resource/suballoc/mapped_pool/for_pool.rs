//! What a [`PoolResource`](crate::PoolResource) uses of a mapped pool that serves as its level
//! of large blocks: blocks in the pool's own address space, whose mapped pages serve large
//! blocks of any size again, instead of a `cuMemAlloc` of its own for each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{Inner, MappedPoolConfig, MappedPoolResource};
use crate::device::Device;
use crate::error::Result;
use crate::resource::contract::availability::Availability;
use crate::resource::device_ptr::DevicePtr;
use crate::stream::Stream;

impl MappedPoolResource {
    /// A mapped pool with the default settings for a pool's large blocks: its pages' releases
    /// wake `availability` (the pool's wait queue), its release policy counts the bytes
    /// `held` says the pool holds elsewhere as live, and it records no [`Error::Leaked`] of
    /// its own when dropped with allocations out (the pool counts them in its own).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    ///
    /// [`Error::Leaked`]: crate::Error::Leaked
    pub(crate) fn for_pool(
        device: &Device,
        availability: Arc<Availability>,
        held: Arc<AtomicUsize>,
    ) -> Result<Self> {
        let config = MappedPoolConfig::default();
        Self::build(device, &config, availability, false, Some(held))
    }

    /// Whether `addr` lies in the pool's reserved range.
    pub(crate) fn contains(&self, addr: u64) -> bool {
        addr.wrapping_sub(self.inner.base) < self.inner.reserved as u64
    }

    /// Frees `ptr` (allocated with `bytes`) on `stream`; false, freeing nothing and recording
    /// no error, when it is no such allocation of this pool.
    ///
    /// # Safety
    /// As [`MemoryResource::deallocate`](crate::MemoryResource::deallocate).
    pub(crate) unsafe fn try_free(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) -> bool {
        !ptr.is_null() && self.inner.free(ptr, bytes, stream).is_ok()
    }

    /// The bytes of the pages mapped now (read without the pool's lock).
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.inner.mapped_bytes.load(Ordering::Relaxed)
    }

    /// Applies the default release policy now (as a free would): after the memory held
    /// outside the pool grew, free pages over what it keeps go. Returns the bytes released.
    pub(crate) fn release_over_keep(&self) -> usize {
        let released = {
            let mut state = self.inner.state.lock();
            let (high, low) = self.inner.keep_pages(&state);
            self.inner.collect(&mut state, high, low)
        };
        if released > 0 {
            self.inner.availability.notify();
        }
        released
    }

    /// Releases wholly free pages, whose streams have passed their frees, while more than
    /// `keep` bytes of them are mapped (fencing those kept with no event yet first); returns
    /// the bytes released. Pages whose frees are still queued go at a later free or release.
    pub(crate) fn release_free_above(&self, keep: usize) -> usize {
        let pages = keep / self.inner.granularity;
        let released = {
            let mut state = self.inner.state.lock();
            Inner::collect(&self.inner, &mut state, pages, pages)
        };
        if released > 0 {
            self.inner.availability.notify();
        }
        released
    }
}
