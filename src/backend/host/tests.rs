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
        Err(Error::DeviceMismatch {
            expected,
            actual,
            call,
        }) => {
            assert_eq!((expected, actual), (d1.id(), d2.id()));
            assert_eq!(call, "CudaResource::try_allocate(stream)");
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

/// Every fault point fails exactly the armed number of its calls with the error its driver
/// call would return, is counted, and leaves the next call working.
#[test]
fn every_fault_point_fails_its_call_once_with_a_typed_error() {
    use crate::{CudaAsyncResource, DeviceBuffer, FaultPoint};

    let d = Device::host_with(HostConfig::default());
    let c = d.host_controls().unwrap();
    let s = Stream::new(&d).unwrap();
    let mr = CudaResource::new(&d).unwrap();
    let driver_error = |r: crate::Result<()>, point: FaultPoint| match r {
        Err(Error::Driver { call, device, .. }) => {
            assert_eq!((call, device), (point.driver_call(), d.id()), "{point:?}")
        }
        other => panic!("{point:?}: expected an injected driver error, got {other:?}"),
    };
    for point in FaultPoint::ALL {
        let fresh = Stream::new(&d).unwrap();
        c.fail_next(point, 1);
        match point {
            FaultPoint::Allocation => {
                assert!(mr.try_allocate(256, &s).unwrap_err().is_out_of_memory())
            }
            FaultPoint::Free => {
                let p = mr.try_allocate(256, &s).unwrap();
                // SAFETY: allocated above with this size; no work uses it.
                unsafe { mr.deallocate(p, 256, &s) };
                // The failed free is reported where drops report, and the block stays
                // allocated, as when the driver refuses a free.
                driver_error(d.take_deferred_error().map_or(Ok(()), Err), point);
                assert_eq!(c.live_allocations(), 1);
                // SAFETY: as above; the first free did not happen.
                unsafe { mr.deallocate(p, 256, &s) };
                s.synchronize_blocking().unwrap();
                assert_eq!(c.live_allocations(), 0);
            }
            FaultPoint::Copy | FaultPoint::Memset => {
                let mut buf =
                    futures::executor::block_on(DeviceBuffer::new(8, &fresh, mr.clone())).unwrap();
                if point == FaultPoint::Copy {
                    let copy = buf.copy_from_host(vec![1u8; 8]);
                    driver_error(futures::executor::block_on(copy).map(drop), point);
                } else {
                    // Enqueued fine: the stream fails when it reaches the memset.
                    buf.fill(7).unwrap();
                    driver_error(fresh.synchronize_blocking(), point);
                }
                // The buffer's free is stream-ordered: let it land before later cases count
                // live allocations (the stream's own error was taken above).
                drop(buf);
                let _ = fresh.synchronize_blocking();
            }
            FaultPoint::EventRecord => driver_error(fresh.record().map(drop), point),
            FaultPoint::StreamWait => {
                let e = s.record().unwrap();
                driver_error(fresh.wait(&e), point);
            }
            FaultPoint::HostFunction => driver_error(fresh.launch_host_fn(|| ()), point),
            FaultPoint::StreamCreate => driver_error(Stream::new(&d).map(drop), point),
            FaultPoint::PoolCreate => driver_error(CudaAsyncResource::new(&d).map(drop), point),
            FaultPoint::PoolTrim => {
                let pool = CudaAsyncResource::new(&d).unwrap();
                driver_error(pool.trim_to(0), point);
                pool.trim_to(0).unwrap();
            }
            FaultPoint::Prefetch => {
                let managed = ManagedResource::new(&d).unwrap();
                let p = managed.try_allocate(4096, &s).unwrap();
                let r = d
                    .raw()
                    .prefetch_to(p.addr(), 4096, crate::PrefetchTarget::Device, s.raw());
                driver_error(r.map(drop), point);
                // SAFETY: allocated above with this size; no work uses it.
                unsafe { managed.deallocate(p, 4096, &s) };
            }
            FaultPoint::VmmReserve
            | FaultPoint::VmmFreeReservation
            | FaultPoint::VmmCreate
            | FaultPoint::VmmRelease
            | FaultPoint::VmmMap
            | FaultPoint::VmmUnmap => vmm_fault(&d, point, driver_error),
        }
        assert_eq!(c.faults_injected(point), 1, "{point:?} did not fire");
        // Disarmed after one: the same call works again.
        assert!(Stream::new(&d).unwrap().record().is_ok());
    }
    s.synchronize_blocking().unwrap();
    assert!(d.take_deferred_error().is_none());
    assert_eq!(c.live_allocations(), 0);
}

/// One VMM call of the host backend failing on purpose: reserve, create, map, unmap, release
/// and free the reservation in order, with `point`'s call failing once and then retried.
fn vmm_fault(
    d: &Device,
    point: crate::FaultPoint,
    check: impl Fn(crate::Result<()>, crate::FaultPoint),
) {
    use crate::FaultPoint as P;
    // Earlier cases' stream-ordered frees (the prefetch case's, on a live stream) land first:
    // this case counts live allocations.
    let _ = d.synchronize_blocking();
    let raw = d.raw();
    let g = raw.vmm_granularity().unwrap();
    let c = d.host_controls().unwrap();
    // Arms `point` on a second try of the step it names: the first try fails, the retry works.
    let step = |p: P, f: &dyn Fn() -> crate::Result<()>| {
        if p == point {
            check(f(), p);
        }
        f().unwrap();
    };
    let va = std::cell::Cell::new(0);
    let handle = std::cell::Cell::new(0);
    step(P::VmmReserve, &|| raw.vmm_reserve(2 * g).map(|v| va.set(v)));
    step(P::VmmCreate, &|| raw.vmm_create(g).map(|h| handle.set(h)));
    // SAFETY: `va` is a reservation of 2 g bytes and `handle` g bytes of physical memory, both
    // made above; nothing else maps or uses them.
    step(P::VmmMap, &|| unsafe {
        raw.vmm_map(va.get(), g, &[handle.get()])
    });
    // SAFETY: mapped just above; no work uses it.
    step(P::VmmUnmap, &|| unsafe { raw.vmm_unmap(va.get(), g) });
    // SAFETY: unmapped just above, released once.
    step(P::VmmRelease, &|| unsafe {
        raw.vmm_release(handle.get(), g)
    });
    // SAFETY: nothing is mapped in the range any more; freed once.
    step(P::VmmFreeReservation, &|| unsafe {
        raw.vmm_free_reservation(va.get(), 2 * g)
    });
    assert_eq!(c.live_allocations(), 0);
}

/// Whether the page holding `addr` is mapped in this process (reserved or accessible).
#[cfg(unix)]
fn page_is_mapped(addr: u64) -> bool {
    let page = addr & !4095;
    let mut residency = [0u8; 1];
    // SAFETY: `mincore` only reports on the range; it fails with ENOMEM where nothing is mapped.
    unsafe { libc::mincore(page as *mut libc::c_void, 4096, residency.as_mut_ptr()) == 0 }
}

/// A mapped-pool buffer leaked after a failed stream wait, then the pool and the device
/// dropped, while the stream's worker still has a fill of it queued: the reservation must stay
/// mapped until no worker can write it, and go back once they are done. Failed before the
/// emulated VMM moved into the memory the workers hold: the device's drop unmapped the range
/// under the queued fill ("unmapped under a queued fill").
#[cfg(unix)]
#[test]
fn a_reservation_outlives_the_device_while_a_worker_may_write_it() {
    use crate::{DeviceBuffer, FaultPoint, MappedPoolResource};

    let device = Device::host_with(HostConfig::default());
    let (s, reader) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let pool = MappedPoolResource::new(&device).unwrap();
    let mut buf = DeviceBuffer::try_new(4096, &s, pool.clone()).unwrap();
    let addr = buf.ptr().addr();
    // The worker is held here until the device is gone (for ever should the test fail, so
    // that the fill never runs into an unmapped range).
    let (open, gate) = std::sync::mpsc::channel::<()>();
    s.launch_host_fn(move || {
        if gate.recv().is_err() {
            loop {
                std::thread::park();
            }
        }
    })
    .unwrap();
    buf.fill(7).unwrap();
    buf.record_read(&reader).unwrap();
    device
        .host_controls()
        .unwrap()
        .fail_next(FaultPoint::StreamWait, 1);
    drop(buf); // its owner cannot wait for the reader: leaked, not freed
    assert!(matches!(
        device.take_deferred_error(),
        Some(Error::Driver { .. })
    ));
    drop(pool); // an allocation is out: the pool leaks its range
    assert!(matches!(
        device.take_deferred_error(),
        Some(Error::Leaked { .. })
    ));
    drop((s, reader, device));
    assert!(page_is_mapped(addr), "unmapped under a queued fill");
    open.send(()).unwrap();
    let start = std::time::Instant::now();
    while page_is_mapped(addr) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "the range never went back once the workers were done"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
