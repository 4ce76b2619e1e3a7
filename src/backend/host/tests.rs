use crate::backend::MemoryKind;
use crate::{
    CudaResource, Device, Error, HostConfig, HostResource, ManagedResource, MemoryResource,
    PinnedHostResource, Stream,
};

#[test]
fn every_leaf_constructor_succeeds_on_the_host_backend() {
    // The host backend emulates every memory kind, so no leaf constructor may refuse it.
    let d = Device::host_with(HostConfig::default());
    let s = Stream::new(&d).unwrap();
    for kind in [
        MemoryKind::Device,
        MemoryKind::Managed,
        MemoryKind::PinnedHost,
    ] {
        assert!(d.raw().check_kind(kind).is_ok(), "{kind:?}");
    }
    let resources: [Box<dyn MemoryResource>; 4] = [
        Box::new(CudaResource::new(&d).unwrap()),
        Box::new(ManagedResource::new(&d).unwrap()),
        Box::new(PinnedHostResource::new(&d).unwrap()),
        Box::new(HostResource::new(&d).unwrap()),
    ];
    for mr in &resources {
        let p = mr.try_allocate(256, &s).unwrap();
        // SAFETY: allocated just above with the same size; no work uses it.
        unsafe { mr.deallocate(p, 256, &s) };
    }
    s.synchronize_blocking().unwrap();
}

#[test]
fn capacity_bounds_allocations_with_figures_in_the_error() {
    let d = Device::host_with(HostConfig::default().capacity(4096));
    let s = Stream::new(&d).unwrap();
    let mr = CudaResource::new(&d).unwrap();
    let p = mr.try_allocate(3000, &s).unwrap();
    match mr.try_allocate(2000, &s) {
        Err(Error::OutOfMemory {
            requested,
            available,
            device,
            ..
        }) => {
            assert_eq!((requested, available, device), (2000, Some(1096), d.id()));
        }
        other => panic!("expected out-of-memory, got {other:?}"),
    }
    // SAFETY: allocated above with the same size; no work uses it.
    unsafe { mr.deallocate(p, 3000, &s) };
    s.synchronize_blocking().unwrap();
    assert_eq!(d.memory_info().unwrap().free, 4096);
}

#[test]
fn injected_failures_fail_exactly_that_many_allocations() {
    let d = Device::host_with(HostConfig::default());
    let s = Stream::new(&d).unwrap();
    let mr = CudaResource::new(&d).unwrap();
    d.host_controls().unwrap().fail_next_allocations(2);
    assert!(mr.try_allocate(256, &s).unwrap_err().is_out_of_memory());
    assert!(mr.try_allocate(256, &s).unwrap_err().is_out_of_memory());
    let p = mr.try_allocate(256, &s).unwrap();
    // SAFETY: allocated above with the same size; no work uses it.
    unsafe { mr.deallocate(p, 256, &s) };
}

#[test]
fn a_bad_free_is_a_deferred_error_not_undefined_behaviour() {
    let d = Device::host_with(HostConfig::default());
    let s = Stream::new(&d).unwrap();
    let mr = CudaResource::new(&d).unwrap();
    let p = mr.try_allocate(1024, &s).unwrap();
    // SAFETY: deliberately wrong size; the host backend checks frees against its live map and
    // refuses this one without touching memory.
    unsafe { mr.deallocate(p, 512, &s) };
    assert!(matches!(
        d.take_deferred_error(),
        Some(Error::InvalidArgument(_))
    ));
    assert_eq!(d.host_controls().unwrap().live_allocations(), 1);
    // SAFETY: the right size this time.
    unsafe { mr.deallocate(p, 1024, &s) };
    s.synchronize_blocking().unwrap();
    assert_eq!(d.host_controls().unwrap().live_allocations(), 0);
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn frees_are_stream_ordered() {
    let d = Device::host_with(HostConfig::default());
    let s = Stream::new(&d).unwrap();
    let mr = CudaResource::new(&d).unwrap();
    let p = mr.try_allocate(1 << 20, &s).unwrap();
    s.enqueue_delay(std::time::Duration::from_millis(50))
        .unwrap();
    // SAFETY: allocated above; the queued work ahead of the free does not touch it.
    unsafe { mr.deallocate(p, 1 << 20, &s) };
    assert_eq!(
        d.host_controls().unwrap().allocated_bytes(),
        1 << 20,
        "freed before the stream"
    );
    s.synchronize_blocking().unwrap();
    assert_eq!(d.host_controls().unwrap().allocated_bytes(), 0);
}

#[test]
fn streams_of_another_device_are_rejected() {
    let (d1, d2) = (
        Device::host_with(HostConfig::default()),
        Device::host_with(HostConfig::default()),
    );
    let s2 = Stream::new(&d2).unwrap();
    match CudaResource::new(&d1).unwrap().try_allocate(256, &s2) {
        Err(Error::DeviceMismatch { expected, actual }) => {
            assert_eq!((expected, actual), (d1.id(), d2.id()))
        }
        other => panic!("expected a device mismatch, got {other:?}"),
    }
}

#[test]
fn default_device_is_host_without_a_gpu() {
    if Device::cuda_device_count() == 0 {
        assert_eq!(Device::default(), Device::host());
        assert!(Device::cuda(0).is_err());
    }
}

#[test]
fn a_panicking_host_function_is_a_deferred_error() {
    let d = Device::host_with(HostConfig::default());
    let s = Stream::new(&d).unwrap();
    s.launch_host_fn(|| panic!("boom in a host function"))
        .unwrap();
    s.synchronize_blocking().unwrap();
    let error = d.take_deferred_error().expect("the panic was not reported");
    assert!(
        error.to_string().contains("boom in a host function"),
        "{error}"
    );
    assert_eq!(d.deferred_error_count(), 1);
    // The stream went on.
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ran.clone();
    s.launch_host_fn(move || flag.store(true, std::sync::atomic::Ordering::Release))
        .unwrap();
    s.synchronize_blocking().unwrap();
    assert!(ran.load(std::sync::atomic::Ordering::Acquire));
}

#[test]
fn errors_met_on_stream_workers_are_all_counted_and_the_oldest_kept() {
    let d = Device::host_with(HostConfig::default());
    let s = Stream::new(&d).unwrap();
    let n = crate::device::DEFERRED_ERRORS_KEPT + 6;
    for i in 0..n {
        s.launch_host_fn(move || panic!("panic {i}")).unwrap();
    }
    s.synchronize_blocking().unwrap();
    assert_eq!(d.deferred_error_count(), n as u64);
    let first = d.take_deferred_error().unwrap();
    assert!(first.to_string().contains(": panic 0;"), "{first}");
    let mut kept = 1;
    while d.take_deferred_error().is_some() {
        kept += 1;
    }
    assert_eq!(kept, crate::device::DEFERRED_ERRORS_KEPT);
}
