//! `PoolResource` on a real backend: RMM's pool test cases, stream-ordered reuse, and the
//! stress of many tasks awaiting a bounded pool with random cancellation.

use std::time::Duration;

use streamalloc::{
    percent_of_free_device_memory, CudaResource, Device, DevicePtr, Error, LimitingAdaptor,
    MemoryResource, PoolResource, Stream,
};

use super::stress;

fn free(mr: &impl MemoryResource, p: DevicePtr, bytes: usize, s: &Stream) {
    // SAFETY: every caller frees what it allocated from `mr` with the same size, unused.
    unsafe { mr.deallocate(p, bytes, s) }
}

pub fn maximum_below_initial_is_rejected(device: Device) {
    let up = CudaResource::new(&device);
    let r = PoolResource::new(up.clone(), 1 << 20, Some(1 << 19));
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    let r = PoolResource::new(up, 1000, None);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
}

/// RMM `PoolTest.ReferenceValidity`-style: initial = maximum = 1000192 serves 1000 B.
pub fn initial_equals_maximum(device: Device) {
    let pool = PoolResource::new(CudaResource::new(&device), 1_000_192, Some(1_000_192)).unwrap();
    let s = Stream::new(&device).unwrap();
    let p = pool.try_allocate(1000, &s).unwrap();
    assert_eq!(pool.pool_size(), 1_000_192);
    free(&pool, p, 1000, &s);
}

/// RMM `PoolTest.ForceGrowth`, with its exact growth and failure points, over a 6000-byte
/// limited upstream.
pub fn force_growth(device: Device) {
    let s = Stream::new(&device).unwrap();
    {
        let up = LimitingAdaptor::new(CudaResource::new(&device), 6000);
        let pool = PoolResource::new(up.clone(), 0, None).unwrap();
        let a = pool.try_allocate(1000, &s).unwrap();
        assert_eq!(pool.pool_size(), 1024);
        let b = pool.try_allocate(4000, &s).unwrap();
        assert_eq!(pool.pool_size(), 1024 + 4096);
        // Grows by 5120, 2560, 1280 (refused by the limit) and then 640.
        let c = pool.try_allocate(500, &s).unwrap();
        assert_eq!(pool.pool_size(), 1024 + 4096 + 640);
        assert_eq!(pool.statistics().upstream_chunks, 3);
        let err = pool.try_allocate(2000, &s).unwrap_err();
        assert!(
            matches!(
                err,
                Error::OutOfMemory {
                    requested: 2000,
                    ..
                }
            ),
            "{err}"
        );
        for (p, n) in [(a, 1000), (b, 4000), (c, 500)] {
            free(&pool, p, n, &s);
        }
        assert_eq!(pool.trim(), 5760);
        s.synchronize_blocking().unwrap();
        assert_eq!(up.allocated_bytes(), 0);
    }
    {
        let up = LimitingAdaptor::new(CudaResource::new(&device), 6000);
        let pool = PoolResource::new(up, 0, Some(8192)).unwrap();
        let a = pool.try_allocate(1000, &s).unwrap();
        assert_eq!(pool.pool_size(), 4096, "max(1024, 8192 / 2)");
        assert!(pool.try_allocate(4000, &s).unwrap_err().is_out_of_memory());
        let b = pool.try_allocate(500, &s).unwrap();
        let c = pool.try_allocate(2000, &s).unwrap();
        assert_eq!(pool.pool_size(), 4096);
        for (p, n) in [(a, 1000), (b, 500), (c, 2000)] {
            free(&pool, p, n, &s);
        }
    }
}

/// RMM `PoolTest.InitialAndMaxPoolSizeEqual`'s sibling: a pool of 90 % of free memory.
pub fn ninety_percent_pool(device: Device) {
    let size = percent_of_free_device_memory(&device, 90).unwrap();
    let pool = PoolResource::new(CudaResource::new(&device), size, None).unwrap();
    let s = Stream::new(&device).unwrap();
    let p = pool.try_allocate(size / 2, &s).unwrap();
    assert_eq!(pool.pool_size(), size);
    free(&pool, p, size / 2, &s);
}

/// RMM `PoolTest.TwoLargeBuffers`: a pool of half the free memory serves two buffers of a
/// quarter of it each.
pub fn two_large_buffers(device: Device) {
    let free_now = device.memory_info().unwrap().free;
    let initial = percent_of_free_device_memory(&device, 50).unwrap();
    let pool = PoolResource::new(CudaResource::new(&device), initial, None).unwrap();
    let s = Stream::new(&device).unwrap();
    let quarter = free_now / 4 / 256 * 256;
    let a = pool.try_allocate(quarter, &s).unwrap();
    let b = pool.try_allocate(quarter, &s).unwrap();
    free(&pool, a, quarter, &s);
    free(&pool, b, quarter, &s);
}

/// A stream used and dropped: its freed memory is still there for other streams.
pub fn stream_destroyed_after_use(device: Device) {
    let pool = PoolResource::new(CudaResource::new(&device), 1 << 20, Some(1 << 20)).unwrap();
    {
        let s = Stream::new(&device).unwrap();
        let p = pool.try_allocate(1 << 20, &s).unwrap();
        free(&pool, p, 1 << 20, &s);
    }
    let t = Stream::new(&device).unwrap();
    let p = pool.try_allocate(1 << 20, &t).unwrap();
    free(&pool, p, 1 << 20, &t);
}

/// Memory freed on one stream serves another after an event wait, without growth; a stream
/// reuses its own frees at once.
pub fn cross_stream_reuse_without_growth(device: Device) {
    let pool = PoolResource::new(CudaResource::new(&device), 4 << 20, Some(4 << 20)).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let p = pool.try_allocate(4 << 20, &a).unwrap();
    free(&pool, p, 4 << 20, &a);
    let q = pool.try_allocate(4 << 20, &a).unwrap();
    assert_eq!(q, p, "a stream reuses its own free at once");
    free(&pool, q, 4 << 20, &a);
    // Small frees on A coalesce; B takes the whole block after waiting for A.
    let parts: Vec<_> = (0..4)
        .map(|_| pool.try_allocate(1 << 20, &a).unwrap())
        .collect();
    for &x in &parts {
        free(&pool, x, 1 << 20, &a);
    }
    let r = pool.try_allocate(4 << 20, &b).unwrap();
    assert_eq!(
        pool.pool_size(),
        4 << 20,
        "served from A's frees, not by growing"
    );
    free(&pool, r, 4 << 20, &b);
    let stats = pool.statistics();
    assert_eq!(
        (stats.free_bytes, stats.free_blocks, stats.live_allocations),
        (4 << 20, 1, 0)
    );
}

/// 200 tokio tasks draw random sizes from a bounded pool with total demand 3× its capacity;
/// 20 % of the futures are dropped at random points and some carry deadlines. Every task is
/// served or times out or is cancelled, nothing is left outstanding, and it ends in bounded
/// time.
pub fn stress_awaiting_tasks(device: Device) {
    const CAPACITY: usize = 64 << 20;
    const TASKS: usize = 200;
    let pool = PoolResource::new(CudaResource::new(&device), 0, Some(CAPACITY)).unwrap();
    let outcome = stress::awaiting_tasks(&device, pool.clone(), CAPACITY, TASKS, 0x5eed, false);
    assert!(
        outcome.served >= TASKS / 2,
        "only {} of {TASKS} served",
        outcome.served
    );
    let stats = pool.statistics();
    assert_eq!(stats.live_allocations, 0, "allocations left outstanding");
    assert_eq!(stats.free_bytes, stats.pool_size, "bytes left outstanding");
    assert!(stats.pool_size <= CAPACITY);
    assert!(outcome.elapsed < Duration::from_secs(60));
    println!(
        "stress: {} served, {} timed out, {} cancelled in {:?}",
        outcome.served, outcome.timed_out, outcome.cancelled, outcome.elapsed
    );
}

/// Instantiates the pool cases for one device.
#[macro_export]
macro_rules! pool_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::pool_suite as suite;

            $(#[$attr])* #[test] fn maximum_below_initial_is_rejected() { suite::maximum_below_initial_is_rejected($device) }
            $(#[$attr])* #[test] fn initial_equals_maximum() { suite::initial_equals_maximum($device) }
            $(#[$attr])* #[test] fn force_growth() { suite::force_growth($device) }
            $(#[$attr])* #[test] fn ninety_percent_pool() { suite::ninety_percent_pool($device) }
            $(#[$attr])* #[test] fn two_large_buffers() { suite::two_large_buffers($device) }
            $(#[$attr])* #[test] fn stream_destroyed_after_use() { suite::stream_destroyed_after_use($device) }
            $(#[$attr])* #[test] fn cross_stream_reuse_without_growth() { suite::cross_stream_reuse_without_growth($device) }
            $(#[$attr])* #[test] fn stress_awaiting_tasks() { suite::stress_awaiting_tasks($device) }
        }
    };
}
