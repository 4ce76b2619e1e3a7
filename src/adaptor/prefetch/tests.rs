use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::*;
use crate::test_support::{self, free, host, recording, Call, KIB, MIB};
use crate::{
    CudaResource, Error, LimitingAdaptor, ManagedResource, PinnedHostResource, PoolResource,
};

/// RMM's `PointerAndSize` on the host backend: each allocation of managed memory is
/// prefetched once, whole, on its stream's device; nothing else is.
#[test]
fn managed_allocations_are_prefetched() {
    let (device, s) = host();
    let controls = device.host_controls().unwrap();
    let mr = PrefetchAdaptor::new(ManagedResource::new(&device).unwrap());
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
    let plain = ManagedResource::new(&device).unwrap();
    let p = plain.try_allocate(MIB, &s).unwrap();
    free(&plain, p, MIB, &s);
    let upstreams: [SharedResource; 2] = [
        Arc::new(CudaResource::new(&device).unwrap()),
        Arc::new(PinnedHostResource::new(&device).unwrap()),
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
    let pool = PoolResource::new(ManagedResource::new(&device).unwrap(), MIB, None).unwrap();
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
    let mr = PrefetchAdaptor::new(ManagedResource::new(&device).unwrap());
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
    // SAFETY: it hands out no pointer: every answer is an error.
    let (upstream, calls) =
        unsafe { recording(&device, |_| Err(Error::InvalidArgument("no".into()))) };
    let mr = PrefetchAdaptor::new(upstream);
    assert_eq!(
        mr.try_allocate(KIB, &s).unwrap_err(),
        Error::InvalidArgument("no".into())
    );
    assert_eq!(*calls.lock(), [Call::Allocate(KIB, s.id())]);
    let too_much = ManagedResource::new(&device).unwrap();
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
    let mr = PrefetchAdaptor::new(LimitingAdaptor::new(
        ManagedResource::new(&device).unwrap(),
        4 * KIB,
    ));
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
