//! `PoolResource` on a real backend: RMM's pool test cases, stream-ordered reuse, and the
//! stress of many tasks awaiting a bounded pool with random cancellation.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use streamalloc::{
    percent_of_free_device_memory, CudaResource, Device, DevicePtr, Error, LimitingAdaptor,
    MemoryResource, PoolResource, Stream,
};

use super::SplitMix64;

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
    let mut rng = SplitMix64(0x5eed);
    // Sizes averaging 3 × CAPACITY / TASKS, none above a quarter of the pool.
    let mean = 3 * CAPACITY / TASKS;
    let plans: Vec<(usize, u64, bool, Option<u64>)> = (0..TASKS)
        .map(|_| {
            let size = 256 + (rng.next() as usize % (2 * mean)).min(CAPACITY / 4);
            let hold_us = 1000 + rng.next() % 20_000;
            let cancel = rng.next() % 100 < 20;
            let deadline_ms = (rng.next() % 100 < 30).then(|| 5 + rng.next() % 50);
            (size, hold_us, cancel, deadline_ms)
        })
        .collect();
    let served = Arc::new(AtomicUsize::new(0));
    let timed_out = Arc::new(AtomicUsize::new(0));
    let cancelled = Arc::new(AtomicUsize::new(0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let start = Instant::now();
    rt.block_on(async {
        let streams: Vec<Stream> = (0..4).map(|_| Stream::new(&device).unwrap()).collect();
        let tasks: Vec<_> = plans
            .into_iter()
            .enumerate()
            .map(|(i, (size, hold_us, cancel, deadline_ms))| {
                let (pool, s) = (pool.clone(), streams[i % 4].clone());
                let (served, timed_out, cancelled) =
                    (served.clone(), timed_out.clone(), cancelled.clone());
                tokio::spawn(async move {
                    let mut request = pool.allocate(size, &s);
                    if let Some(ms) = deadline_ms {
                        request = request.timeout(Duration::from_millis(ms));
                    }
                    let outcome = if cancel {
                        // Dropped at a random point: at once, or after some waiting.
                        tokio::time::timeout(Duration::from_micros(hold_us), request).await
                    } else {
                        Ok(request.await)
                    };
                    match outcome {
                        Err(_elapsed) => {
                            cancelled.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Ok(p)) => {
                            tokio::time::sleep(Duration::from_micros(hold_us)).await;
                            free(&pool, p, size, &s);
                            served.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Err(Error::Timeout { .. })) => {
                            timed_out.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Err(e)) => panic!("task {i}: unexpected error {e}"),
                    }
                })
            })
            .collect();
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("a task hung: deadlock or lost wake-up")
                .unwrap();
        }
        for s in &streams {
            s.synchronize().await.unwrap();
        }
    });
    let (served, timed_out, cancelled) = (
        served.load(Ordering::SeqCst),
        timed_out.load(Ordering::SeqCst),
        cancelled.load(Ordering::SeqCst),
    );
    assert_eq!(served + timed_out + cancelled, TASKS);
    assert!(served >= TASKS / 2, "only {served} of {TASKS} served");
    let stats = pool.statistics();
    assert_eq!(stats.live_allocations, 0, "allocations left outstanding");
    assert_eq!(stats.free_bytes, stats.pool_size, "bytes left outstanding");
    assert!(
        !pool.availability().unwrap().has_waiters(),
        "waiters left in the queue"
    );
    assert!(stats.pool_size <= CAPACITY);
    assert!(start.elapsed() < Duration::from_secs(60));
    println!(
        "stress: {served} served, {timed_out} timed out, {cancelled} cancelled in {:?}",
        start.elapsed()
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
