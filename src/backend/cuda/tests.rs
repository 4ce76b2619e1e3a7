//! Tests of the CUDA backend at the trait level. All but the first need a GPU: they are built
//! with feature `gpu-tests` (implied by `cuda`) and ignored elsewhere; `.gpu/run.sh` and
//! `cargo test --features cuda -- --include-ignored` run them.
//!
//! No test asks for more managed or pinned host memory than a machine has: oversubscribing
//! managed memory can hang a GPU, and pinning can wake the OOM killer where the kernel
//! overcommits. Out-of-memory is checked on device memory and pools only.

// The helpers below serve the GPU tests only.
#![cfg_attr(not(feature = "gpu-tests"), allow(dead_code, unused_imports))]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::context::MAX_IDLE_EVENTS;
use super::*;
use crate::backend::seam::{BackendEvent, BackendMemPool, BackendStream, Completion};
use crate::backend::{AnyEvent, AnyMemPool, AnyStream};

/// One backend for the whole test process, so tests never release the primary context under
/// each other.
fn backend() -> &'static CudaBackend {
    static BACKEND: OnceLock<CudaBackend> = OnceLock::new();
    BACKEND.get_or_init(|| CudaBackend::new(0).expect("CUDA device 0"))
}

fn stream() -> Arc<CudaStream> {
    backend().create_stream().expect("cuStreamCreate")
}

/// Copies `bytes` at `src` (any memory kind) into a new host vector, through `stream`.
fn read_back(stream: &CudaStream, src: u64, bytes: usize) -> Vec<u8> {
    let mut host = vec![0u8; bytes];
    // SAFETY: `host` is valid for `bytes` and outlives the copy (synchronized below); `src` is
    // a live allocation of at least `bytes` (caller).
    unsafe { stream.copy(host.as_mut_ptr() as u64, src, bytes) }.expect("cuMemcpyAsync");
    stream.synchronize_blocking().expect("cuStreamSynchronize");
    host
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        thread::sleep(Duration::from_micros(100));
    }
}

#[test]
fn device_count_never_panics() {
    // SAFETY: only opens and closes the library.
    let present = unsafe { sys::is_culib_present() };
    match device_count() {
        Ok(_) => assert!(present),
        Err(Error::DriverUnavailable(_)) => {}
        Err(e) => panic!("unexpected error: {e}"),
    }
    if !present {
        assert!(matches!(
            CudaBackend::new(0),
            Err(Error::DriverUnavailable(_))
        ));
    }
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn driver_loads_and_describes_the_device() {
    assert!(device_count().expect("driver") >= 1);
    let b = backend();
    assert_eq!(b.id().backend, BackendKind::Cuda);
    assert_eq!(b.id().ordinal, 0);
    assert!(!b.name().is_empty());
    let info = b.memory_info().expect("cuMemGetInfo");
    assert!(info.total > 0 && info.free <= info.total, "{info:?}");
    let past = device_count().unwrap();
    assert!(matches!(
        CudaBackend::new(past),
        Err(Error::NoSuchDevice { .. })
    ));
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn check_kind_refuses_exactly_what_the_device_attributes_deny() {
    // What `ManagedResource::new` and `PinnedHostResource::new` ask before they succeed.
    let b = backend();
    b.ctx.bind().expect("bind");
    assert!(b.check_kind(MemoryKind::Device).is_ok());
    for (kind, attribute) in [
        (
            MemoryKind::Managed,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY,
        ),
        (
            MemoryKind::PinnedHost,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
        ),
    ] {
        let supported = b.ctx.attribute(attribute).expect("cuDeviceGetAttribute") != 0;
        match b.check_kind(kind) {
            Ok(()) => assert!(supported, "{kind:?} accepted though the device lacks it"),
            Err(Error::Unsupported { device, .. }) => {
                assert!(!supported, "{kind:?} refused though the device has it");
                assert_eq!(device, b.id());
            }
            Err(e) => panic!("unexpected error for {kind:?}: {e}"),
        }
    }
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn every_memory_kind_holds_data() {
    let s = stream();
    let n = 1 << 20;
    for kind in [
        MemoryKind::Device,
        MemoryKind::Managed,
        MemoryKind::PinnedHost,
    ] {
        let p = backend().allocate(kind, n).expect("allocate");
        assert_eq!(p % 256, 0, "{kind:?} is not 256-byte aligned");
        // SAFETY: `p` is a live allocation of `n` bytes until freed below, after a sync.
        unsafe { s.memset(p, 0x5a, n) }.expect("cuMemsetD8Async");
        assert!(read_back(&s, p, n).iter().all(|&b| b == 0x5a), "{kind:?}");

        let pattern: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        // SAFETY: `pattern` outlives the copy (synchronized in `read_back`); `p` is live.
        unsafe { s.copy(p, pattern.as_ptr() as u64, n) }.expect("cuMemcpyAsync");
        assert_eq!(read_back(&s, p, n), pattern, "{kind:?}");

        // SAFETY: allocated above with the same kind and size; all work on it is synchronized.
        unsafe { backend().free(kind, p, n, &*s) }.expect("free");
    }
}

/// Where `ptr..ptr + bytes` was last prefetched to: a device ordinal, `CU_DEVICE_CPU` (-1) or
/// `CU_DEVICE_INVALID` (-2) when it never was (`CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION`,
/// which RMM's prefetch tests read through the runtime API).
fn last_prefetch_location(ptr: u64, bytes: usize) -> c_int {
    backend().ctx.bind().expect("bind");
    let mut location: c_int = 0;
    let attribute = sys::CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION;
    // SAFETY: the context is current; `location` is a valid out-pointer of the 4 bytes this
    // attribute writes; the range is a live managed allocation (caller).
    let r = unsafe {
        sys::cuMemRangeGetAttribute(
            (&mut location as *mut c_int).cast(),
            std::mem::size_of::<c_int>(),
            attribute,
            ptr,
            bytes,
        )
    };
    r.result().expect("cuMemRangeGetAttribute");
    location
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn prefetch_moves_managed_memory_to_the_device_and_skips_other_memory() {
    let b = backend();
    let s = stream();
    let n = 1 << 20;
    let managed = b
        .allocate(MemoryKind::Managed, n)
        .expect("cuMemAllocManaged");
    // RMM's `NotPrefetchedWithoutAdaptor`: a fresh range was never prefetched.
    assert_eq!(last_prefetch_location(managed, n), -2, "CU_DEVICE_INVALID");
    let enqueued = b.prefetch(managed, n, &*s).expect("cuMemPrefetchAsync");
    b.ctx.bind().unwrap();
    let supported = b.can_prefetch().unwrap();
    assert_eq!(
        enqueued, supported,
        "prefetch enqueued iff the device supports it"
    );
    s.synchronize_blocking().unwrap();
    if supported {
        // RMM's `PointerAndSize`: the range was last prefetched to this device.
        assert_eq!(last_prefetch_location(managed, n), b.ctx.device);
        // A piece of the range, as a sub-allocator hands out, prefetches too.
        assert!(b.prefetch(managed + 4096, 4096, &*s).unwrap());
    } else {
        println!("no concurrent managed access or no cuMemPrefetchAsync_v2: prefetch skipped");
    }
    // The data survives the migration.
    // SAFETY: `managed` is live for `n` bytes until freed below, after a sync.
    unsafe { s.memset(managed, 0x3c, n) }.unwrap();
    assert!(read_back(&s, managed, n).iter().all(|&x| x == 0x3c));
    // 0 bytes is nothing to do.
    assert!(!b.prefetch(managed, 0, &*s).unwrap());

    // Device memory is not managed: the driver's CUDA_ERROR_INVALID_VALUE is a no-op, not an
    // error (RMM swallows it too).
    let device = b.allocate(MemoryKind::Device, n).unwrap();
    let r = b.prefetch(device, n, &*s);
    assert!(r.is_ok(), "prefetch of device memory must not fail: {r:?}");
    s.synchronize_blocking().unwrap();
    // SAFETY: both allocated above with these kinds and sizes; all work on them is synchronized.
    unsafe {
        b.free(MemoryKind::Managed, managed, n, &*s).unwrap();
        b.free(MemoryKind::Device, device, n, &*s).unwrap();
    }
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn too_large_device_requests_are_out_of_memory() {
    let s = stream();
    let huge = 1usize << 50; // 1 PiB
    let e = backend().allocate(MemoryKind::Device, huge).unwrap_err();
    assert!(
        matches!(e, Error::OutOfMemory { requested, .. } if requested == huge),
        "{e}"
    );
    let pool = backend().create_mempool(&MemPoolConfig::default()).unwrap();
    let e = pool.allocate_async(huge, &*s).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let e = backend()
        .default_mempool()
        .unwrap()
        .allocate_async(huge, &*s)
        .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    // The device is still usable after the failures.
    let p = backend().allocate(MemoryKind::Device, 4096).unwrap();
    // SAFETY: just allocated, unused.
    unsafe { backend().free(MemoryKind::Device, p, 4096, &*s) }.unwrap();
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn delay_occupies_the_stream() {
    let s = stream();
    let start = Instant::now();
    s.delay(Duration::from_millis(50)).expect("delay kernel");
    let e = s.record().unwrap();
    assert!(!e.query().unwrap(), "the event completed before the delay");
    e.synchronize_blocking().unwrap();
    assert!(e.query().unwrap());
    assert!(start.elapsed() >= Duration::from_millis(50));
    // A zero delay is a no-op kernel.
    s.delay(Duration::ZERO).unwrap();
    s.synchronize_blocking().unwrap();
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn wait_event_orders_work_across_streams() {
    let (a, b) = (stream(), stream());
    let n = 4096;
    let p = backend().allocate(MemoryKind::Device, n).unwrap();
    // SAFETY: `p` is live until the free below.
    unsafe { a.memset(p, 0, n) }.unwrap();
    a.synchronize_blocking().unwrap();

    let start = Instant::now();
    a.delay(Duration::from_millis(100)).unwrap();
    // SAFETY: as above.
    unsafe { a.memset(p, 7, n) }.unwrap();
    let written = a.record().unwrap();
    b.wait_event(&*written).unwrap();
    let after = b.record().unwrap();
    assert!(!after.query().unwrap(), "b did not wait for a");
    // Read on `b`: must see `a`'s memset, ordered by the wait alone.
    assert!(read_back(&b, p, n).iter().all(|&x| x == 7));
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert!(after.query().unwrap());
    // SAFETY: all work on `p` is done (synchronized through `b`, which waited for `a`).
    unsafe { backend().free(MemoryKind::Device, p, n, &*a) }.unwrap();
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn foreign_streams_and_events_are_rejected() {
    // Inside the backend the types rule it out; the erased layer refuses it at run time.
    let s = AnyStream::Cuda(stream());
    let host = crate::Device::host_with(crate::HostConfig::default());
    let host_stream: AnyStream = host.raw().create_stream().unwrap();
    let host_event: AnyEvent = host_stream.record().unwrap();
    assert!(matches!(
        s.wait_event(&host_event),
        Err(Error::InvalidArgument(_))
    ));
    let pool = AnyMemPool::Cuda(backend().default_mempool().unwrap());
    assert!(matches!(
        pool.allocate_async(256, &host_stream),
        Err(Error::InvalidArgument(_))
    ));
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn notify_completes_after_preceding_work_and_leaks_nothing() {
    let s = stream();
    let start = Instant::now();
    s.delay(Duration::from_millis(30)).unwrap();
    let completion = Arc::new(Completion::default());
    s.notify(completion.clone()).unwrap();
    assert!(!completion.is_done());
    wait_until("the completion", Duration::from_secs(5), || {
        completion.is_done()
    });
    assert!(start.elapsed() >= Duration::from_millis(30));
    // The trampoline drops its reference right after completing.
    wait_until(
        "the host function's reference",
        Duration::from_secs(5),
        || Arc::strong_count(&completion) == 1,
    );
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn host_functions_run_in_order_and_survive_a_panic() {
    let s = stream();
    let order = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicBool::new(false));
    s.delay(Duration::from_millis(10)).unwrap();
    let first = order.clone();
    s.host_fn(Box::new(move || {
        first.store(1, Ordering::SeqCst);
        panic!("deliberate panic in a host function");
    }))
    .unwrap();
    let (second, flag) = (order.clone(), seen.clone());
    s.host_fn(Box::new(move || {
        flag.store(second.load(Ordering::SeqCst) == 1, Ordering::SeqCst);
    }))
    .unwrap();
    s.synchronize_blocking().unwrap();
    assert!(seen.load(Ordering::SeqCst));
    // The panic reaches the device's deferred errors through the backend's sink.
    let errors: Vec<_> = std::iter::from_fn(|| backend().errors().pop()).collect();
    assert!(
        errors.iter().any(|e| e
            .to_string()
            .contains("deliberate panic in a host function")),
        "{errors:?}"
    );
    // The stream still works.
    s.delay(Duration::from_millis(1)).unwrap();
    s.synchronize_blocking().unwrap();
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn pools_allocate_free_and_trim() {
    let s = stream();
    let pool = backend()
        .create_mempool(&MemPoolConfig {
            release_threshold: u64::MAX,
            export_handle_types: 0,
        })
        .unwrap();
    assert_ne!(pool.handle(), 0);
    let n = 64 << 20;
    let p = pool.allocate_async(n, &*s).unwrap();
    assert_eq!(p % 256, 0);
    // SAFETY: `p` is valid on `s` in stream order until the free below.
    unsafe { s.memset(p, 3, n) }.unwrap();
    assert!(read_back(&s, p, n).iter().all(|&x| x == 3));
    // SAFETY: from this pool, not freed, all use ordered before on `s`.
    unsafe { pool.free_async(p, n, &*s) }.unwrap();
    s.synchronize_blocking().unwrap();
    assert!(
        pool.reserved().unwrap() >= n,
        "the threshold should keep it"
    );
    pool.trim_to(0).unwrap();
    assert_eq!(pool.reserved().unwrap(), 0);
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn pools_export_handles_or_say_unsupported() {
    let config = MemPoolConfig {
        release_threshold: 0,
        export_handle_types: 1, // POSIX file descriptor
    };
    match backend().create_mempool(&config) {
        Ok(pool) => {
            let s = stream();
            let p = pool.allocate_async(1 << 20, &*s).unwrap();
            // SAFETY: unused, from this pool.
            unsafe { pool.free_async(p, 1 << 20, &*s) }.unwrap();
            s.synchronize_blocking().unwrap();
        }
        Err(Error::Unsupported { .. }) => {}
        Err(e) => panic!("unexpected error: {e}"),
    }
    let bogus = MemPoolConfig {
        release_threshold: 0,
        export_handle_types: 1 << 30,
    };
    assert!(matches!(
        backend().create_mempool(&bogus),
        Err(Error::Unsupported { .. })
    ));
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn the_default_pool_is_shared_and_never_destroyed() {
    let s = stream();
    let a = backend().default_mempool().unwrap();
    let b = backend().default_mempool().unwrap();
    assert_eq!(a.handle(), b.handle());
    let p = a.allocate_async(1 << 20, &*s).unwrap();
    // SAFETY: from the default pool, unused.
    unsafe { b.free_async(p, 1 << 20, &*s) }.unwrap();
    s.synchronize_blocking().unwrap();
    drop((a, b));
    let c = backend().default_mempool().unwrap();
    let p = c.allocate_async(1 << 20, &*s).unwrap();
    // SAFETY: as above.
    unsafe { c.free_async(p, 1 << 20, &*s) }.unwrap();
    s.synchronize_blocking().unwrap();
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn events_are_recycled() {
    let s = stream();
    for _ in 0..3 * MAX_IDLE_EVENTS {
        let e = s.record().unwrap();
        let _ = e.query().unwrap();
    }
    let events: Vec<Arc<CudaEvent>> = (0..2 * MAX_IDLE_EVENTS)
        .map(|_| s.record().unwrap())
        .collect();
    s.synchronize_blocking().unwrap();
    assert!(events.iter().all(|e| e.query().unwrap()));
    drop(events);
    let idle = backend().ctx.idle_events.lock().len();
    assert!(idle > 0 && idle <= MAX_IDLE_EVENTS, "{idle}");
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn threads_bind_the_context_themselves() {
    let handles: Vec<_> = (0..8u8)
        .map(|i| {
            thread::spawn(move || {
                let s = backend().create_stream().unwrap();
                let n = 1 << 16;
                let p = backend().allocate(MemoryKind::Device, n).unwrap();
                // SAFETY: `p` is live until the free below.
                unsafe { s.memset(p, i, n) }.unwrap();
                assert!(read_back(&s, p, n).iter().all(|&x| x == i));
                // SAFETY: all work on `p` is synchronized.
                unsafe { backend().free(MemoryKind::Device, p, n, &*s) }.unwrap();
                // Dropping the stream on this thread binds here too.
                drop(s);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn a_context_changed_by_other_code_is_bound_again() {
    // Failed before binds asked the driver: a per-thread cache still said "bound", so the second
    // allocation ran with no current context (CUDA_ERROR_INVALID_CONTEXT).
    thread::spawn(|| {
        let b = backend();
        let first = b.allocate(MemoryKind::Device, 256).unwrap(); // binds the primary context
                                                                  // Other code on the thread (cudarc, cuBLAS, the runtime API) changes the current
                                                                  // context behind the crate's back; here it unbinds every context.
                                                                  // SAFETY: a null context is allowed: it leaves none current on this thread.
        unsafe { sys::cuCtxSetCurrent(ptr::null_mut()) }
            .result()
            .unwrap();
        let second = b
            .allocate(MemoryKind::Device, 256)
            .expect("the crate binds its context again");
        let s = stream();
        for p in [first, second] {
            // SAFETY: allocated above, freed once; no work uses them.
            unsafe { b.free(MemoryKind::Device, p, 256, &s) }.unwrap();
        }
    })
    .join()
    .unwrap();
}

#[cfg(feature = "gpu-tests")]
#[test]
#[ignore = "needs a CUDA device"]
fn crate_calls_inside_a_host_function_never_reach_the_driver() {
    // Before the check, the record below was a cuEventRecord inside a host function, which
    // CUDA forbids (it may fail, deadlock or not): it was whatever the driver did.
    let (s, other) = (stream(), stream());
    let seen = Arc::new(parking_lot::Mutex::new(None));
    let slot = seen.clone();
    let other2 = other.clone();
    s.host_fn(Box::new(move || {
        *slot.lock() = Some(other2.record().map(drop));
    }))
    .unwrap();
    s.synchronize_blocking().unwrap();
    let seen = seen.lock().take().expect("the host function ran");
    assert!(
        matches!(&seen, Err(Error::Unsupported { what, .. }) if what.contains("host function")),
        "{seen:?}"
    );
    // Outside host functions the same call works.
    other.record().unwrap();
}
