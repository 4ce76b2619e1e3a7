use std::fmt;
use std::sync::Arc;

use crate::error::Result;
use crate::resource::contract::forward::{memory_resource, Forward};
use crate::resource::{DevicePtr, MemoryResource, SharedResource};
use crate::stream::Stream;

/// Prefetches managed memory to the device after each allocation (RMM's
/// `prefetch_resource_adaptor`), so the first kernels that touch it find its pages on the GPU
/// instead of faulting them over one by one.
///
/// After a successful allocation of more than 0 bytes, the adaptor enqueues a prefetch of the
/// whole allocation to the stream's device (`cuMemPrefetchAsync`) on the allocation's stream.
/// Memory that is not managed (plain device memory, pinned host memory) and devices without
/// concurrent managed access make the prefetch a no-op, as in RMM; so the adaptor can sit on
/// any upstream, and over a pool of managed memory it prefetches each piece handed out. Frees
/// go straight to the upstream. On the host backend nothing moves, but each prefetch of
/// managed memory is counted ([`HostControls::prefetches`](crate::HostControls::prefetches)).
///
/// The adaptor forwards the upstream's [`availability`](MemoryResource::availability) and
/// [`capacity_limit`](MemoryResource::capacity_limit), so awaited allocations wait through it
/// as on the upstream; the prefetch follows the allocation that the wait ends with.
///
/// # Stream ordering
/// The prefetch is ordered on the allocation's stream like any other work on it: work enqueued
/// there afterwards finds the pages on the device. Another stream that uses the memory waits
/// for an event of that stream first, as it must anyway.
///
/// # Errors
/// The upstream's errors. A prefetch is a hint, so its failure does not fail the allocation:
/// the memory is returned, and the driver's error is recorded on the device
/// ([`Device::take_deferred_error`](crate::Device::take_deferred_error)) and logged, as for a
/// failed stream-ordered free.
///
/// # Examples
///
/// ```
/// use streamalloc::{Device, HostConfig, ManagedResource, MemoryResource, PrefetchAdaptor, Stream};
///
/// let device = Device::host_with(HostConfig::default());
/// let stream = Stream::new(&device)?;
/// let mr = PrefetchAdaptor::new(ManagedResource::new(&device)?);
/// let p = mr.try_allocate(1 << 20, &stream)?;          // allocated, then prefetched on `stream`
/// assert_eq!(device.host_controls().unwrap().prefetches(), 1);
/// unsafe { mr.deallocate(p, 1 << 20, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub struct PrefetchAdaptor<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R> {
    upstream: R,
}

impl<R: MemoryResource> PrefetchAdaptor<R> {
    /// Wraps `upstream`, prefetching what it allocates.
    pub fn new(upstream: R) -> Self {
        PrefetchAdaptor {
            inner: Arc::new(Inner { upstream }),
        }
    }
}

memory_resource!(shared [R: MemoryResource] PrefetchAdaptor<R>);

// SAFETY: every pointer it hands out is one the upstream returned for the same request (a
// prefetch moves pages, it does not change what the range is), and its properties are the
// upstream's.
unsafe impl<R: MemoryResource> Forward for Inner<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let ptr = self.upstream.try_allocate(bytes, stream)?;
        if bytes > 0 && !ptr.is_null() {
            let device = stream.device();
            if let Err(e) = device.raw().prefetch(ptr.addr(), bytes, stream.raw()) {
                device.defer_error(e);
            }
        }
        Ok(ptr)
    }
}

impl<R: MemoryResource> fmt::Debug for PrefetchAdaptor<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefetchAdaptor")
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

#[cfg(test)]
mod tests;
