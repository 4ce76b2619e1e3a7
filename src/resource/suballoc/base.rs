//! The base of the sub-allocators: what a resource that carves an upstream's memory into
//! blocks and reuses them in stream order has of its own (RMM's
//! `detail::stream_ordered_memory_resource`), and what it takes from the upstream.

use crate::error::Result;
use crate::resource::contract::availability::Availability;
use crate::resource::contract::forward::{Forward, Wraps};
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::stats::MemoryStats;
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::{Fragmentation, MemorySnapshot};
use crate::stream::Stream;

/// The shared state of a sub-allocator: its own allocation, wait queue, figures and picture;
/// fragmentation derived from the picture; limits, properties and peaks the upstream's unless
/// it says otherwise. [`Forward`] (an adaptor's base, where everything goes upstream by
/// default) is implemented from it, so `memory_resource!(shared ..)` writes the handle's
/// [`MemoryResource`] impl.
///
/// # Safety
/// As [`Forward`]: [`try_allocate`](SubAllocator::try_allocate) keeps [`MemoryResource`]'s
/// promise (see its `# Safety`) for the blocks it carves, and the properties are the
/// upstream's (a sub-allocator hands out the upstream's memory).
pub(crate) unsafe trait SubAllocator: Wraps {
    /// As [`MemoryResource::try_allocate`].
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr>;

    /// As [`MemoryResource::deallocate`].
    ///
    /// # Safety
    /// As [`MemoryResource::deallocate`].
    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream);

    /// The queue that requests waiting for this resource's memory join: its own, since its
    /// frees are what wakes them.
    fn wait_queue(&self) -> &Availability;

    /// As [`MemoryResource::may_regain_memory`]: what the sub-allocator holds decides.
    fn may_regain_memory(&self, bytes: usize) -> bool;

    /// As [`MemoryResource::capacity_limit`]; the upstream's unless the sub-allocator has a
    /// limit of its own.
    fn capacity_limit(&self) -> Option<usize> {
        self.upstream().capacity_limit()
    }

    /// Its figures: reserved is what it holds from the upstream, allocated what it hands out.
    fn memory_stats(&self) -> MemoryStats;

    /// Resets the upstream's peaks; a sub-allocator that keeps peaks resets them too.
    fn reset_peak(&self) {
        self.upstream().reset_peak()
    }

    /// Its segments (what it holds from the upstream) and blocks; `None` only for one that
    /// routes requests to resources with no picture (a binning resource over the driver).
    fn snapshot(&self) -> Option<MemorySnapshot>;

    /// Read from [`snapshot`](SubAllocator::snapshot); a sub-allocator that can count the
    /// figures without a picture says so.
    fn fragmentation(&self) -> Option<Fragmentation> {
        self.snapshot().map(|s| s.fragmentation())
    }
}

// SAFETY: allocation and its promise are the sub-allocator's (an unsafe trait with the same
// contract); the properties are the upstream's, which keeps the promise itself.
unsafe impl<S: SubAllocator> Forward for S {
    #[inline]
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        SubAllocator::try_allocate(self, bytes, stream)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { SubAllocator::deallocate(self, ptr, bytes, stream) }
    }

    fn availability(&self) -> Option<&Availability> {
        Some(self.wait_queue())
    }

    fn capacity_limit(&self) -> Option<usize> {
        SubAllocator::capacity_limit(self)
    }

    fn may_regain_memory(&self, bytes: usize) -> bool {
        SubAllocator::may_regain_memory(self, bytes)
    }

    fn memory_stats(&self) -> MemoryStats {
        SubAllocator::memory_stats(self)
    }

    fn reset_peak(&self) {
        SubAllocator::reset_peak(self)
    }

    fn snapshot(&self) -> Option<MemorySnapshot> {
        SubAllocator::snapshot(self)
    }

    fn fragmentation(&self) -> Option<Fragmentation> {
        SubAllocator::fragmentation(self)
    }
}
