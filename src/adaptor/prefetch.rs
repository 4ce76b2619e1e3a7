use std::fmt;
use std::sync::Arc;

use crate::error::Result;
use crate::resource::ResourceIdentity;
use crate::resource::{Availability, DevicePtr, MemoryResource, Properties, SharedResource};
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
/// let mr = PrefetchAdaptor::new(ManagedResource::new(&device));
/// let p = mr.try_allocate(1 << 20, &stream)?;          // allocated, then prefetched on `stream`
/// assert_eq!(device.host_controls().unwrap().prefetches(), 1);
/// unsafe { mr.deallocate(p, 1 << 20, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub struct PrefetchAdaptor<R: MemoryResource = SharedResource> {
    inner: Arc<R>,
}

impl<R: MemoryResource> PrefetchAdaptor<R> {
    /// Wraps `upstream`, prefetching what it allocates.
    pub fn new(upstream: R) -> Self {
        PrefetchAdaptor {
            inner: Arc::new(upstream),
        }
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &R {
        &self.inner
    }
}

impl<R: MemoryResource> MemoryResource for PrefetchAdaptor<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let ptr = self.inner.try_allocate(bytes, stream)?;
        if bytes > 0 && !ptr.is_null() {
            let device = stream.device();
            if let Err(e) = device.raw().prefetch(ptr.addr(), bytes, stream.raw()) {
                device.defer_error(e);
            }
        }
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract; the pointer is the upstream's own.
        unsafe { self.inner.deallocate(ptr, bytes, stream) }
    }

    fn availability(&self) -> Option<&Availability> {
        self.inner.availability()
    }

    fn may_regain_memory(&self, bytes: usize) -> bool {
        self.inner.may_regain_memory(bytes)
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::of_shared(&self.inner)
    }

    fn capacity_limit(&self) -> Option<usize> {
        self.inner.capacity_limit()
    }

    fn properties(&self) -> Properties {
        self.inner.properties()
    }
}

impl<R: MemoryResource> Clone for PrefetchAdaptor<R> {
    fn clone(&self) -> Self {
        PrefetchAdaptor {
            inner: self.inner.clone(),
        }
    }
}

impl<R: MemoryResource> fmt::Debug for PrefetchAdaptor<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefetchAdaptor")
            .field("upstream", &self.inner)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use super::*;
    use crate::adaptor::test_support::{self, free, host, recording, Call, KIB, MIB};
    use crate::{
        CudaResource, Error, LimitingAdaptor, ManagedResource, PinnedHostResource, PoolResource,
    };

    /// RMM's `PointerAndSize` on the host backend: each allocation of managed memory is
    /// prefetched once, whole, on its stream's device; nothing else is.
    #[test]
    fn managed_allocations_are_prefetched() {
        let (device, s) = host();
        let controls = device.host_controls().unwrap();
        let mr = PrefetchAdaptor::new(ManagedResource::new(&device));
        let a = mr.try_allocate(KIB, &s).unwrap();
        let b = mr.try_allocate(MIB, &s).unwrap();
        assert_eq!(controls.prefetches(), 2);
        // 0 bytes has nothing to prefetch.
        let z = mr.try_allocate(0, &s).unwrap();
        assert_eq!(controls.prefetches(), 2);
        free(&mr, a, KIB, &s);
        free(&mr, b, MIB, &s);
        free(&mr, z, 0, &s);
        // Frees prefetch nothing.
        assert_eq!(controls.prefetches(), 2);
        assert!(device.take_deferred_error().is_none());
    }

    /// RMM's `NotPrefetchedWithoutAdaptor`, and its typed test over `cuda_memory_resource`:
    /// without the adaptor nothing is prefetched, and device or pinned memory under it is a
    /// silent no-op.
    #[test]
    fn other_memory_and_no_adaptor_prefetch_nothing() {
        let (device, s) = host();
        let controls = device.host_controls().unwrap();
        let plain = ManagedResource::new(&device);
        let p = plain.try_allocate(MIB, &s).unwrap();
        free(&plain, p, MIB, &s);
        let upstreams: [SharedResource; 2] = [
            Arc::new(CudaResource::new(&device)),
            Arc::new(PinnedHostResource::new(&device)),
        ];
        for upstream in upstreams {
            let mr = PrefetchAdaptor::new(upstream);
            let p = mr.try_allocate(MIB, &s).unwrap();
            free(&mr, p, MIB, &s);
        }
        assert_eq!(controls.prefetches(), 0);
        assert!(device.take_deferred_error().is_none());
    }

    /// Over a pool of managed memory each piece handed out is prefetched, not the pool's chunk.
    #[test]
    fn pieces_of_a_managed_pool_are_prefetched() {
        let (device, s) = host();
        let controls = device.host_controls().unwrap();
        let pool = PoolResource::new(ManagedResource::new(&device), MIB, None).unwrap();
        let mr = PrefetchAdaptor::new(pool);
        let pieces: Vec<_> = (0..4)
            .map(|_| mr.try_allocate(4 * KIB, &s).unwrap())
            .collect();
        assert_eq!(controls.live_allocations(), 1, "one chunk");
        assert_eq!(controls.prefetches(), 4);
        for p in pieces {
            free(&mr, p, 4 * KIB, &s);
        }
    }

    /// A failed prefetch does not fail the allocation; the error is deferred to the device.
    #[test]
    fn a_failed_prefetch_is_deferred_and_the_memory_returned() {
        let (device, s) = host();
        let controls = device.host_controls().unwrap();
        let mr = PrefetchAdaptor::new(ManagedResource::new(&device));
        controls.fail_next_prefetches(1);
        let p = mr.try_allocate(MIB, &s).unwrap();
        assert!(!p.is_null());
        match device.take_deferred_error() {
            Some(Error::Driver { call, .. }) => assert_eq!(call, "cuMemPrefetchAsync"),
            other => panic!("expected the prefetch's error, got {other:?}"),
        }
        assert_eq!(controls.prefetches(), 0);
        free(&mr, p, MIB, &s);
        let q = mr.try_allocate(MIB, &s).unwrap();
        assert_eq!(controls.prefetches(), 1);
        assert!(device.take_deferred_error().is_none());
        free(&mr, q, MIB, &s);
    }

    /// Errors of the upstream come back, and nothing is prefetched for them.
    #[test]
    fn upstream_errors_pass_through() {
        let (device, s) = host();
        let (upstream, calls) = recording(&device, |_| Err(Error::InvalidArgument("no".into())));
        let mr = PrefetchAdaptor::new(upstream);
        assert_eq!(
            mr.try_allocate(KIB, &s).unwrap_err(),
            Error::InvalidArgument("no".into())
        );
        assert_eq!(*calls.lock(), [Call::Allocate(KIB, s.id())]);
        let too_much = ManagedResource::new(&device);
        let mr = PrefetchAdaptor::new(too_much.clone());
        assert!(mr.try_allocate(1 << 50, &s).unwrap_err().is_out_of_memory());
        assert_eq!(mr.capacity_limit(), too_much.capacity_limit());
        assert_eq!(mr.properties(), too_much.properties());
        assert!(format!("{:?}", mr.clone()).contains("PrefetchAdaptor"));
        let _ = mr.upstream();
    }

    /// Awaiting through the adaptor.
    #[test]
    fn a_waiting_allocation_resumes_after_a_free() {
        test_support::a_waiting_allocation_resumes_after_a_free(4 * KIB, 4 * KIB, KIB, |l| {
            PrefetchAdaptor::new(l)
        });
    }

    /// Over a bounded stack of managed memory, the allocation that ends a wait is prefetched
    /// when it is made, not before.
    #[test]
    fn the_allocation_that_ends_a_wait_is_prefetched() {
        let (device, s) = host();
        let controls = device.host_controls().unwrap();
        let mr = PrefetchAdaptor::new(LimitingAdaptor::new(ManagedResource::new(&device), 4 * KIB));
        let held = mr.try_allocate(4 * KIB, &s).unwrap();
        let mut waiting = Box::pin(mr.allocate(KIB, &s));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        assert_eq!(controls.prefetches(), 1, "only the held allocation so far");
        free(&mr, held, 4 * KIB, &s);
        let Poll::Ready(p) = waiting.as_mut().poll(&mut cx) else {
            panic!("the free did not let the waiting request through");
        };
        let p = p.unwrap();
        assert_eq!(controls.prefetches(), 2);
        free(&mr, p, KIB, &s);
    }
}
