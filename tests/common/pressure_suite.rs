//! Waiting for memory, on every resource that can make a request wait: a free wakes the
//! waiter wherever the memory goes back (a bin, a shard, an upstream, a budget); a request is
//! checked before it waits; a request nothing can satisfy fails at once.
//!
//! `pressure_suite!` instantiates it for one constructor of a *bounded* resource (a maximum, a
//! limit or an arena size of a few MiB), so that it fills up quickly on any device.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use streamalloc::{Device, DevicePtr, Error, HostConfig, MemoryResource, SharedResource, Stream};

pub type Make = fn(&Device) -> SharedResource;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Long enough that a waiter that should be woken surely is; a hang becomes a failure.
const PATIENCE: Duration = Duration::from_secs(20);

fn free(mr: &SharedResource, p: DevicePtr, bytes: usize, stream: &Stream) {
    // SAFETY: every caller passes a pointer it allocated from `mr` with `bytes`, used by nothing.
    unsafe { mr.deallocate(p, bytes, stream) }
}

/// Allocates `bytes` until the resource refuses; the resource must be bounded.
fn fill(mr: &SharedResource, bytes: usize, stream: &Stream) -> Vec<DevicePtr> {
    let mut held = Vec::new();
    loop {
        match mr.try_allocate(bytes, stream) {
            Ok(p) => held.push(p),
            Err(e) => {
                assert!(e.is_out_of_memory(), "filling with {bytes}: {e}");
                return held;
            }
        }
        assert!(held.len() < 1 << 16, "the resource never fills up");
    }
}

/// Starts an awaited allocation on another thread; its outcome comes through the receiver.
fn spawn_waiter(
    mr: &SharedResource,
    bytes: usize,
    stream: &Stream,
) -> mpsc::Receiver<streamalloc::Result<DevicePtr>> {
    let (tx, rx) = mpsc::channel();
    let (mr, stream) = (mr.clone(), stream.clone());
    thread::spawn(move || {
        let r = futures::executor::block_on(mr.allocate(bytes, &stream).timeout(PATIENCE));
        let _ = tx.send(r);
    });
    rx
}

/// Waits until the resource's queue holds a waiter, so that what follows happens while it
/// waits.
fn until_queued(mr: &SharedResource, rx: &mpsc::Receiver<streamalloc::Result<DevicePtr>>) {
    let availability = mr.availability().expect("the resource makes requests wait");
    for _ in 0..2000 {
        if availability.has_waiters() {
            return;
        }
        if let Ok(r) = rx.try_recv() {
            panic!("the request did not wait: {r:?}");
        }
        thread::sleep(Duration::from_millis(1));
    }
    panic!("the request never queued");
}

/// A full resource, a waiter, one free: the waiter gets memory.
pub fn a_free_wakes_the_waiter(device: Device, make: Make, bytes: usize) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    let mut held = fill(&mr, bytes, &s);
    assert!(!held.is_empty(), "nothing of {bytes} bytes fits at all");
    let rx = spawn_waiter(&mr, bytes, &s);
    until_queued(&mr, &rx);
    free(&mr, held.pop().unwrap(), bytes, &s);
    let p = rx
        .recv_timeout(PATIENCE + Duration::from_secs(5))
        .expect("the waiter never finished")
        .unwrap_or_else(|e| panic!("the free of {bytes} bytes did not wake the waiter: {e}"));
    held.push(p);
    for p in held {
        free(&mr, p, bytes, &s);
    }
    s.synchronize_blocking().unwrap();
}

pub fn a_small_free_wakes_the_waiter(device: Device, make: Make) {
    a_free_wakes_the_waiter(device, make, 4 * KIB)
}

pub fn a_large_free_wakes_the_waiter(device: Device, make: Make) {
    a_free_wakes_the_waiter(device, make, 2 * MIB)
}

/// Full of large blocks and then of small ones: a small request waits, and a large free (to
/// an upstream, another bin or shard) brings it memory.
pub fn a_free_elsewhere_wakes_the_waiter(device: Device, make: Make) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    let mut large = fill(&mr, 2 * MIB, &s);
    assert!(!large.is_empty(), "nothing of 2 MiB fits at all");
    let small = fill(&mr, 4 * KIB, &s);
    let rx = spawn_waiter(&mr, 4 * KIB, &s);
    until_queued(&mr, &rx);
    free(&mr, large.pop().unwrap(), 2 * MIB, &s);
    let p = rx
        .recv_timeout(PATIENCE + Duration::from_secs(5))
        .expect("the waiter never finished")
        .unwrap_or_else(|e| panic!("a large free did not wake a small waiter: {e}"));
    free(&mr, p, 4 * KIB, &s);
    for p in small {
        free(&mr, p, 4 * KIB, &s);
    }
    for p in large {
        free(&mr, p, 2 * MIB, &s);
    }
    s.synchronize_blocking().unwrap();
}

/// While a request waits, one of another device's stream fails at once, and a 0-byte request
/// is served at once: the queue is no reason to skip the checks.
pub fn a_wrong_request_fails_before_waiting(device: Device, make: Make) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    let held = fill(&mr, 4 * KIB, &s);
    let rx = spawn_waiter(&mr, 4 * KIB, &s);
    until_queued(&mr, &rx);

    let other = Device::host_with(HostConfig::default());
    let foreign = Stream::new(&other).unwrap();
    let r = futures::executor::block_on(mr.allocate(256, &foreign).timeout(PATIENCE));
    assert!(
        matches!(r, Err(Error::DeviceMismatch { .. })),
        "a stream of another device while others wait: {r:?}"
    );
    let r = futures::executor::block_on(mr.allocate(0, &s).timeout(PATIENCE));
    assert_eq!(r, Ok(DevicePtr::NULL), "0 bytes while others wait");

    for p in held {
        free(&mr, p, 4 * KIB, &s);
    }
    let p = rx.recv_timeout(PATIENCE).unwrap().unwrap();
    free(&mr, p, 4 * KIB, &s);
    s.synchronize_blocking().unwrap();
}

/// A request larger than the capacity fails at once; so does one that the resource refuses
/// while nothing of it is out (nothing could come back for it).
pub fn a_hopeless_request_fails_at_once(device: Device, make: Make) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    let cap = mr
        .capacity_limit()
        .expect("a bounded resource has a capacity");
    let r = futures::executor::block_on(mr.allocate(cap + 256, &s).timeout(PATIENCE));
    assert!(
        matches!(r, Err(Error::TooLarge { maximum, .. }) if maximum == cap),
        "beyond the capacity ({cap}): {r:?}"
    );
    // Fill, then give everything back but keep asking for more than what is left.
    let held = fill(&mr, 2 * MIB, &s);
    for p in held {
        free(&mr, p, 2 * MIB, &s);
    }
    s.synchronize_blocking().unwrap();
    let p = futures::executor::block_on(mr.allocate(2 * MIB, &s).timeout(PATIENCE))
        .expect("everything was given back");
    free(&mr, p, 2 * MIB, &s);
    s.synchronize_blocking().unwrap();
}

/// Instantiates the pressure suite for one constructor of a bounded, awaitable resource.
#[macro_export]
macro_rules! pressure_suite {
    ($name:ident, $device:expr, |$d:ident| $make:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::pressure_suite as suite;

            fn make($d: &::streamalloc::Device) -> ::streamalloc::SharedResource {
                $make
            }

            fn device() -> ::streamalloc::Device {
                $device
            }

            $(#[$attr])* #[test] fn a_small_free_wakes_the_waiter() { suite::a_small_free_wakes_the_waiter(device(), make) }
            $(#[$attr])* #[test] fn a_large_free_wakes_the_waiter() { suite::a_large_free_wakes_the_waiter(device(), make) }
            $(#[$attr])* #[test] fn a_free_elsewhere_wakes_the_waiter() { suite::a_free_elsewhere_wakes_the_waiter(device(), make) }
            $(#[$attr])* #[test] fn a_wrong_request_fails_before_waiting() { suite::a_wrong_request_fails_before_waiting(device(), make) }
            $(#[$attr])* #[test] fn a_hopeless_request_fails_at_once() { suite::a_hopeless_request_fails_at_once(device(), make) }
        }
    };
}

/// The pressure suite for every awaitable resource and adaptor, each bounded at 64 MiB, on
/// one device kind: `pressure_suites!(device_expr, #[attrs]...)`.
#[macro_export]
macro_rules! pressure_suites {
    ($device:expr $(, #[$attr:meta])*) => {
        mod pressure {
            use super::*;

            const BOUND: usize = 64 << 20;

            fn pool(d: &Device) -> PoolResource<CudaResource> {
                PoolResource::new(CudaResource::new(d).unwrap(), 0, Some(BOUND)).unwrap()
            }

            fn limited(d: &Device) -> LimitingAdaptor<CudaResource> {
                LimitingAdaptor::new(CudaResource::new(d).unwrap(), BOUND)
            }

            pressure_suite!(bounded_pool, $device, |d| Arc::new(pool(d)) $(, #[$attr])*);
            pressure_suite!(preallocated_pool, $device, |d| {
                Arc::new(PoolResource::new(CudaResource::new(d).unwrap(), BOUND, Some(BOUND)).unwrap())
            } $(, #[$attr])*);
            pressure_suite!(pool_over_limiting, $device, |d| {
                Arc::new(PoolResource::new(limited(d), 0, None).unwrap())
            } $(, #[$attr])*);
            pressure_suite!(limiting, $device, |d| Arc::new(limited(d)) $(, #[$attr])*);
            pressure_suite!(limiting_over_pool, $device, |d| {
                Arc::new(LimitingAdaptor::new(pool(d), BOUND / 2))
            } $(, #[$attr])*);
            pressure_suite!(binning_over_pool, $device, |d| {
                Arc::new(BinningResource::with_range(pool(d), 12, 16).unwrap())
            } $(, #[$attr])*);
            pressure_suite!(binning_over_limiting, $device, |d| {
                Arc::new(BinningResource::with_range(limited(d), 12, 16).unwrap())
            } $(, #[$attr])*);
            pressure_suite!(fixed_size_over_limiting, $device, |d| {
                Arc::new(FixedSizeResource::new(limited(d), 2 << 20, 4).unwrap())
            } $(, #[$attr])*);
            pressure_suite!(fixed_size_over_pool, $device, |d| {
                Arc::new(FixedSizeResource::new(pool(d), 2 << 20, 4).unwrap())
            } $(, #[$attr])*);
            pressure_suite!(arena, $device, |d| {
                Arc::new(ArenaResource::new(CudaResource::new(d).unwrap(), Some(BOUND)).unwrap())
            } $(, #[$attr])*);
            pressure_suite!(statistics_over_pool, $device, |d| {
                Arc::new(StatisticsAdaptor::new(pool(d)))
            } $(, #[$attr])*);
            pressure_suite!(tracking_over_binning, $device, |d| {
                Arc::new(TrackingAdaptor::new(BinningResource::with_range(pool(d), 12, 16).unwrap()))
            } $(, #[$attr])*);
            pressure_suite!(logging_over_fixed_size, $device, |d| {
                let fixed = FixedSizeResource::new(limited(d), 2 << 20, 4).unwrap();
                Arc::new(LoggingAdaptor::to_writer(fixed, std::io::sink()).unwrap())
            } $(, #[$attr])*);
            pressure_suite!(aligned_over_arena, $device, |d| {
                let arena = ArenaResource::new(CudaResource::new(d).unwrap(), Some(BOUND)).unwrap();
                Arc::new(AlignedAdaptor::new(arena, 4096, 64 << 10).unwrap())
            } $(, #[$attr])*);
            pressure_suite!(failure_callback_over_pool, $device, |d| {
                Arc::new(FailureCallbackAdaptor::new(pool(d), |f| f.attempt < 2))
            } $(, #[$attr])*);
            pressure_suite!(tracing_over_limiting, $device, |d| {
                Arc::new(TracingAdaptor::new(limited(d)))
            } $(, #[$attr])*);
            pressure_suite!(prefetch_over_pool_of_managed, $device, |d| {
                let pool = PoolResource::new(ManagedResource::new(d).unwrap(), 0, Some(BOUND)).unwrap();
                Arc::new(PrefetchAdaptor::new(pool))
            } $(, #[$attr])*);
        }
    };
}
