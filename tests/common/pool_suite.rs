//! `PoolResource` on a real backend: RMM's pool test cases, stream-ordered reuse, and the
//! stress of many tasks awaiting a bounded pool with random cancellation.

use std::sync::Barrier;
use std::time::Duration;

use streamalloc::{
    percent_of_free_device_memory, CudaResource, Device, DevicePtr, Error, LimitingAdaptor,
    MemoryResource, PoolResource, Stream,
};

use super::hold::hold;
use super::stress;

const MIB: usize = 1 << 20;
/// How long S's stage holds S at most in the cross-stream take cases: opened once T is known
/// not to wait for it, it lasts only that long in a passing run.
const STAGE: Duration = Duration::from_secs(10);
/// The maximum of the fill-to-maximum cases: large enough that the pool has stream shards.
const FILL_MAX: usize = 256 * MIB;

/// A mix of sizes that round (to 256 bytes) to powers of two, ascending: RMM's pool holds
/// it up to its maximum whether it starts empty or not.
const POW2_MIX: [usize; 5] = [1000, 512 * 1024 - 3, MIB, 2 * MIB - 100, 4 * MIB - 255];
/// A mix of odd sizes. With all of the maximum allocated at once RMM's pool holds it; grown
/// from empty, RMM's own growth strands memory at the ends of its chunks (its pool refuses
/// request 260 of 264 at a maximum of 256 MiB), so only the first case applies.
const ODD_MIX: [usize; 5] = [3 * MIB + 1, 1000, 768 * 1024 - 5, MIB, 100_000];

/// The fill cases: (initial size, request sizes pattern). With `mixed`, the mixes too.
///
/// Not covered (known limits): [`POW2_MIX`] grown from empty (the shards grow the pool by
/// sub-chunks, not by requests as RMM does, and the last sub-chunks of a grown pool may leave
/// pieces the largest requests cannot use), and mixes from several shards at once (a piece
/// left in one shard's sub-chunk between two of another's cannot join the free memory).
fn fill_cases(mixed: bool) -> Vec<(usize, &'static [usize])> {
    let mut cases = Vec::new();
    for initial in [0, FILL_MAX] {
        cases.extend([(initial, &[MIB][..]), (initial, &[4 * MIB][..])]);
    }
    if mixed {
        cases.extend([(FILL_MAX, &POW2_MIX[..]), (FILL_MAX, &ODD_MIX[..])]);
    }
    cases
}

/// Request sizes whose sizes rounded up to 256 bytes add up to exactly `total` (a multiple of
/// 256): `pattern` repeated while it fits, then one request of whatever is left.
fn fill_sizes(total: usize, pattern: &[usize]) -> Vec<usize> {
    let round = |n: usize| n.div_ceil(256) * 256;
    let mut sizes = Vec::new();
    let mut left = total;
    for &n in pattern.iter().cycle() {
        if round(n) > left {
            break;
        }
        sizes.push(n);
        left -= round(n);
    }
    if left > 0 {
        sizes.push(left);
    }
    assert_eq!(sizes.iter().map(|&n| round(n)).sum::<usize>(), total);
    sizes
}

/// Allocates every size of `sizes` on `s` with `try_allocate`; panics naming the first refusal.
fn fill(pool: &PoolResource<CudaResource>, sizes: &[usize], s: &Stream) -> Vec<(DevicePtr, usize)> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| match pool.try_allocate(n, s) {
            Ok(p) => (p, n),
            Err(e) => panic!(
                "request {i} of {} ({n} bytes; sizes {:?}..) refused: {e}; {:?}",
                sizes.len(),
                &sizes[..sizes.len().min(5)],
                pool.statistics()
            ),
        })
        .collect()
}

/// The pool is full: one more 256-byte request fails with out-of-memory, and an awaited one
/// waits until `to_free` is freed (on another thread), then gets through.
fn full_then_waiter_gets_through(
    pool: &PoolResource<CudaResource>,
    to_free: (DevicePtr, usize),
    s: &Stream,
) {
    let err = pool.try_allocate(256, s).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { requested: 256, .. }),
        "{err}"
    );
    assert_eq!(pool.pool_size(), FILL_MAX);
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            futures::executor::block_on(pool.allocate(256, s).timeout(Duration::from_secs(30)))
        });
        // Let the waiter register first (not needed for correctness: either order must work).
        std::thread::sleep(Duration::from_millis(50));
        free(pool, to_free.0, to_free.1, s);
        let p = waiter
            .join()
            .unwrap()
            .expect("a free lets the waiter through");
        free(pool, p, 256, s);
    });
}

fn free(mr: &impl MemoryResource, p: DevicePtr, bytes: usize, s: &Stream) {
    // SAFETY: every caller frees what it allocated from `mr` with the same size, unused.
    unsafe { mr.deallocate(p, bytes, s) }
}

pub fn maximum_below_initial_is_rejected(device: Device) {
    let up = CudaResource::new(&device).unwrap();
    let r = PoolResource::new(up.clone(), 1 << 20, Some(1 << 19));
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    let r = PoolResource::new(up, 1000, None);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
}

/// RMM `PoolTest.ReferenceValidity`-style: initial = maximum = 1000192 serves 1000 B.
pub fn initial_equals_maximum(device: Device) {
    let pool = PoolResource::new(
        CudaResource::new(&device).unwrap(),
        1_000_192,
        Some(1_000_192),
    )
    .unwrap();
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
        let up = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 6000);
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
        let up = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 6000);
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
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), size, None).unwrap();
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
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), initial, None).unwrap();
    let s = Stream::new(&device).unwrap();
    let quarter = free_now / 4 / 256 * 256;
    let a = pool.try_allocate(quarter, &s).unwrap();
    let b = pool.try_allocate(quarter, &s).unwrap();
    free(&pool, a, quarter, &s);
    free(&pool, b, quarter, &s);
}

/// A stream used and dropped: its freed memory is still there for other streams.
pub fn stream_destroyed_after_use(device: Device) {
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 1 << 20, Some(1 << 20)).unwrap();
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
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 4 << 20, Some(4 << 20)).unwrap();
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

/// RMM issue #2039's pattern: memory freed on stream S serves stream T within T's first
/// miss, with no synchronize, instead of the pool growing while S's memory sits idle; small
/// blocks (each stream in its own shard) and large ones, unbounded pools and bounded ones.
pub fn freed_on_one_stream_serves_another_within_one_miss(device: Device) {
    for maximum in [None, Some(FILL_MAX)] {
        for (size, count) in [(MIB, 32), (8 * MIB, 4)] {
            let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, maximum).unwrap();
            let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
            let on_s: Vec<_> = (0..count)
                .map(|_| pool.try_allocate(size, &s).unwrap())
                .collect();
            for p in on_s {
                free(&pool, p, size, &s);
            }
            let held = pool.pool_size();
            let on_t: Vec<_> = (0..count)
                .map(|_| pool.try_allocate(size, &t).unwrap())
                .collect();
            assert!(
                pool.pool_size() <= held,
                "{maximum:?} {count} x {size}: T grew the pool from {held} to {} bytes \
                 while S's frees sat idle",
                pool.pool_size()
            );
            for p in on_t {
                free(&pool, p, size, &t);
            }
        }
    }
}

/// T taking a block S freed waits for S's work up to the free, not for the work S queued
/// after it: a long stage S runs after the free (held until T is known not to wait) does not
/// hold T up.
pub fn a_taker_waits_only_for_work_before_the_free(device: Device) {
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, Some(2 * MIB)).unwrap();
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    // A first crossing: T takes a block S freed (and keeps it).
    let a = pool.try_allocate(MIB, &s).unwrap();
    free(&pool, a, MIB, &s);
    let kept = pool.try_allocate(MIB, &t).unwrap();
    assert_eq!(kept, a, "T takes S's free");
    // S frees again, then queues a long delay; T takes that block.
    let b = pool.try_allocate(MIB, &s).unwrap();
    free(&pool, b, MIB, &s);
    let stage = hold(&s, STAGE);
    let s_done = s.record().unwrap();
    let taken = pool.try_allocate(MIB, &t).unwrap();
    assert_eq!(taken, b, "T takes S's second free");
    t.synchronize_blocking().unwrap();
    assert!(
        !s_done.is_complete().unwrap(),
        "T waited for S's delay, queued after the free"
    );
    drop(stage);
    s.synchronize_blocking().unwrap();
    free(&pool, kept, MIB, &t);
    free(&pool, taken, MIB, &t);
}

/// T taking one of the blocks S freed waits for S's work up to that block's free, not up to
/// S's latest free: S freed block `b`, then queued a long stage and freed `c`; T takes `b`
/// (the only block that fits) without waiting for the stage. (The pipeline's upload stage takes
/// blocks its download stage freed long before, while the download stream runs far ahead.)
pub fn a_taker_waits_only_for_its_blocks_free(device: Device) {
    let max = 14 * MIB;
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), max, Some(max)).unwrap();
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let a = pool.try_allocate(4 * MIB, &s).unwrap();
    let b = pool.try_allocate(4 * MIB, &s).unwrap();
    let spacer = pool.try_allocate(4 * MIB, &s).unwrap(); // keeps `b` and `c` apart
    let c = pool.try_allocate(2 * MIB, &s).unwrap();
    // A first crossing: T takes `a` (and keeps it), so S's frees record their events.
    free(&pool, a, 4 * MIB, &s);
    let kept = pool.try_allocate(4 * MIB, &t).unwrap();
    assert_eq!(kept, a, "T takes S's free");
    free(&pool, b, 4 * MIB, &s);
    let stage = hold(&s, STAGE);
    free(&pool, c, 2 * MIB, &s);
    let s_done = s.record().unwrap();
    let taken = pool.try_allocate(4 * MIB, &t).unwrap();
    assert_eq!(taken, b, "T takes the block S freed before its stage");
    t.synchronize_blocking().unwrap();
    assert!(
        !s_done.is_complete().unwrap(),
        "T waited for S's stage, queued after the free of its block (for the later free of c)"
    );
    drop(stage);
    s.synchronize_blocking().unwrap();
    free(&pool, kept, 4 * MIB, &t);
    free(&pool, taken, 4 * MIB, &t);
    free(&pool, spacer, 4 * MIB, &s);
}

/// T taking memory S freed takes the block S freed first, not the one it freed last: S freed
/// `b1`, queued a long stage and freed `b2` (the same size); T's take needs no wait for the stage.
/// (The pipeline's upload stage reuses the batch whose download ended first, as a ring of
/// buffers in hand-written CUDA does; a last-in-first-out take made it wait for the download
/// just queued.)
pub fn a_taker_takes_the_oldest_free_block(device: Device) {
    let max = 16 * MIB;
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), max, Some(max)).unwrap();
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let a = pool.try_allocate(4 * MIB, &s).unwrap();
    let b1 = pool.try_allocate(4 * MIB, &s).unwrap();
    let spacer = pool.try_allocate(4 * MIB, &s).unwrap(); // keeps `b1` and `b2` apart
    let b2 = pool.try_allocate(4 * MIB, &s).unwrap();
    free(&pool, a, 4 * MIB, &s);
    let kept = pool.try_allocate(4 * MIB, &t).unwrap(); // the first crossing
    assert_eq!(kept, a);
    free(&pool, b1, 4 * MIB, &s);
    let stage = hold(&s, STAGE);
    free(&pool, b2, 4 * MIB, &s);
    let s_done = s.record().unwrap();
    let taken = pool.try_allocate(4 * MIB, &t).unwrap();
    assert_eq!(taken, b1, "T takes the block S freed first");
    t.synchronize_blocking().unwrap();
    assert!(
        !s_done.is_complete().unwrap(),
        "T waited for S's stage, queued after the free of the block it took"
    );
    drop(stage);
    s.synchronize_blocking().unwrap();
    for p in [kept, taken] {
        free(&pool, p, 4 * MIB, &t);
    }
    free(&pool, spacer, 4 * MIB, &s);
}

/// Blocks freed next to each other on a stream whose memory crossed streams stay apart until
/// needed: T takes the one S freed before its long stage, though S freed its neighbour after
/// the stage (merged, the block would carry the later free); and once the device is past both,
/// S's request for the two together is served from them, in a pool at its maximum.
pub fn adjacent_frees_stay_apart_until_needed(device: Device) {
    let max = 12 * MIB;
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), max, Some(max)).unwrap();
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let a = pool.try_allocate(4 * MIB, &s).unwrap();
    let b1 = pool.try_allocate(4 * MIB, &s).unwrap();
    let b2 = pool.try_allocate(4 * MIB, &s).unwrap();
    assert_eq!(b2.offset(4 * MIB), b1, "b1 and b2 are neighbours");
    free(&pool, a, 4 * MIB, &s);
    let kept = pool.try_allocate(4 * MIB, &t).unwrap(); // the first crossing
    free(&pool, b1, 4 * MIB, &s);
    let stage = hold(&s, STAGE);
    free(&pool, b2, 4 * MIB, &s);
    let s_done = s.record().unwrap();
    let taken = pool.try_allocate(4 * MIB, &t).unwrap();
    assert_eq!(taken, b1, "T takes the block S freed before its stage");
    t.synchronize_blocking().unwrap();
    assert!(
        !s_done.is_complete().unwrap(),
        "T waited for the free of the neighbour S freed after its stage"
    );
    drop(stage);
    s.synchronize_blocking().unwrap();
    free(&pool, taken, 4 * MIB, &t);
    // S frees two neighbours again; its request for both is served without growing.
    let c1 = pool.try_allocate(4 * MIB, &s).unwrap();
    let c2 = pool.try_allocate(4 * MIB, &s).unwrap();
    free(&pool, c1, 4 * MIB, &s);
    free(&pool, c2, 4 * MIB, &s);
    let both = pool
        .try_allocate(8 * MIB, &s)
        .expect("the two neighbours, merged");
    assert_eq!(pool.pool_size(), max);
    free(&pool, both, 8 * MIB, &s);
    free(&pool, kept, 4 * MIB, &t);
    s.synchronize_blocking().unwrap();
}

/// 200 tokio tasks draw random sizes from a bounded pool with total demand 3× its capacity;
/// 20 % of the futures are dropped at random points and some carry deadlines. Every task is
/// served or times out or is cancelled, nothing is left outstanding, and it ends in bounded
/// time.
pub fn stress_awaiting_tasks(device: Device) {
    const CAPACITY: usize = 64 << 20;
    const TASKS: usize = 200;
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, Some(CAPACITY)).unwrap();
    let outcome = stress::awaiting_tasks(&device, pool.clone(), CAPACITY, TASKS, 0x5eed, false);
    assert!(
        outcome.served >= TASKS / 2,
        "only {} of {TASKS} served",
        outcome.served
    );
    let stats = pool.statistics();
    assert_eq!(stats.live_allocations, 0, "allocations left outstanding");
    assert_eq!(
        stats.free_bytes, stats.reserved_bytes,
        "bytes left outstanding"
    );
    assert!(stats.reserved_bytes <= CAPACITY);
    assert!(outcome.elapsed < Duration::from_secs(60));
    println!(
        "stress: {} served, {} timed out, {} cancelled in {:?}",
        outcome.served, outcome.timed_out, outcome.cancelled, outcome.elapsed
    );
}

/// A pool of 256 MiB holds any set of requests whose rounded sizes add up to its maximum, as
/// RMM's does, from one stream (and so one shard): 1 MiB and 4 MiB with initial size 0 and
/// with all of it allocated at once, and two mixes with all of it allocated at once (see
/// [`fill_cases`]). Full, it refuses one byte more, and a free lets a
/// waiter through.
pub fn fill_to_maximum(device: Device) {
    let s = Stream::new(&device).unwrap();
    for (initial, pattern) in fill_cases(true) {
        {
            let pool =
                PoolResource::new(CudaResource::new(&device).unwrap(), initial, Some(FILL_MAX))
                    .unwrap();
            let mut live = fill(&pool, &fill_sizes(FILL_MAX, pattern), &s);
            let last = live.pop().unwrap();
            full_then_waiter_gets_through(&pool, last, &s);
            for (p, n) in live {
                free(&pool, p, n, &s);
            }
            let stats = pool.statistics();
            assert_eq!(
                (stats.live_allocations, stats.free_bytes),
                (0, stats.reserved_bytes)
            );
        }
    }
}

/// [`fill_to_maximum`] from 4 threads at once, each on its own stream (so several shards)
/// taking a quarter of the maximum, in requests of 1 MiB or 4 MiB.
pub fn fill_to_maximum_from_threads(device: Device) {
    const THREADS: usize = 4;
    let streams: Vec<Stream> = (0..THREADS)
        .map(|_| Stream::new(&device).unwrap())
        .collect();
    for (initial, pattern) in fill_cases(false) {
        {
            let pool =
                PoolResource::new(CudaResource::new(&device).unwrap(), initial, Some(FILL_MAX))
                    .unwrap();
            let sizes = fill_sizes(FILL_MAX / THREADS, pattern);
            let start = Barrier::new(THREADS);
            let mut live: Vec<Vec<(DevicePtr, usize)>> = std::thread::scope(|scope| {
                let handles: Vec<_> = streams
                    .iter()
                    .map(|s| {
                        let (pool, sizes, start) = (&pool, &sizes, &start);
                        scope.spawn(move || {
                            start.wait();
                            fill(pool, sizes, s)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let last = live[0].pop().unwrap();
            full_then_waiter_gets_through(&pool, last, &streams[0]);
            for (allocations, s) in live.into_iter().zip(&streams) {
                for (p, n) in allocations {
                    free(&pool, p, n, s);
                }
            }
            let stats = pool.statistics();
            assert_eq!(
                (stats.live_allocations, stats.free_bytes),
                (0, stats.reserved_bytes)
            );
        }
    }
}

/// A pool filled on one stream (one thread, one shard), emptied, then filled to its maximum
/// on another stream from another thread, and back again: memory freed into one shard is
/// reachable from the others when the pool is at its maximum.
pub fn refill_from_another_shard(device: Device) {
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    for (initial, pattern) in fill_cases(false) {
        {
            let pool =
                PoolResource::new(CudaResource::new(&device).unwrap(), initial, Some(FILL_MAX))
                    .unwrap();
            let sizes = fill_sizes(FILL_MAX, pattern);
            for s in [&a, &b, &a] {
                std::thread::scope(|scope| {
                    scope
                        .spawn(|| {
                            for (p, n) in fill(&pool, &sizes, s) {
                                free(&pool, p, n, s);
                            }
                        })
                        .join()
                        .unwrap()
                });
            }
            assert_eq!(pool.pool_size(), FILL_MAX);
        }
    }
}

/// A pool bounded at 64 MiB (the getting-started figures) holds 64 MiB of 4 MiB requests, and
/// of 1 MiB ones, from any initial size that is a whole number of requests: its growth leaves
/// no sliver under the maximum too small for one more.
pub fn bounded_pool_fills_from_any_initial_size(device: Device) {
    const MAX: usize = 64 * MIB;
    let s = Stream::new(&device).unwrap();
    for request in [4 * MIB, MIB] {
        for initial in [0, 4 * MIB, 16 * MIB, 20 * MIB, 32 * MIB, 60 * MIB, MAX] {
            let pool =
                PoolResource::new(CudaResource::new(&device).unwrap(), initial, Some(MAX)).unwrap();
            let held = fill(&pool, &vec![request; MAX / request], &s);
            assert_eq!(
                pool.pool_size(),
                MAX,
                "initial {initial}, requests of {request}"
            );
            let err = pool.try_allocate(256, &s).unwrap_err();
            assert!(err.is_out_of_memory(), "{err}");
            for (p, n) in held {
                free(&pool, p, n, &s);
            }
        }
    }
}

/// A pool made `with_peak_allocated` reports PyTorch's `memory_allocated` and
/// `max_memory_allocated`: exact over its shards (blocks of two streams, one freed on the
/// other stream), its large blocks, and a pool that held blocks before it started counting.
pub fn peak_allocated_counts_every_level_and_stream(device: Device) {
    let (s1, s2) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    for (initial, maximum) in [(0, None), (16 * MIB, Some(64 * MIB))] {
        let plain =
            PoolResource::new(CudaResource::new(&device).unwrap(), initial, maximum).unwrap();
        let before = plain.try_allocate(1000, &s1).unwrap();
        assert_eq!(
            plain.memory_stats().peak_allocated_bytes,
            None,
            "not counted by default"
        );
        let pool = plain.with_peak_allocated();
        let stats = |pool: &PoolResource<CudaResource>| {
            let m = pool.memory_stats();
            (m.allocated_bytes.unwrap(), m.peak_allocated_bytes.unwrap())
        };
        assert_eq!(stats(&pool), (1024, 1024), "initial {initial}");
        let a = pool.try_allocate(3000, &s1).unwrap();
        let b = pool.try_allocate(5000, &s2).unwrap();
        let large = pool.try_allocate(3 * MIB + 1, &s2).unwrap();
        let live = 1024 + 3072 + 5120 + 3 * MIB + 256;
        assert_eq!(stats(&pool), (live, live), "initial {initial}");
        free(&pool, a, 3000, &s2);
        free(&pool, large, 3 * MIB + 1, &s1);
        assert_eq!(stats(&pool), (1024 + 5120, live), "initial {initial}");
        pool.reset_peak();
        assert_eq!(
            stats(&pool),
            (1024 + 5120, 1024 + 5120),
            "initial {initial}"
        );
        free(&pool, b, 5000, &s2);
        free(&pool, before, 1000, &s1);
        // A double free changes nothing.
        free(&pool, before, 1000, &s1);
        assert_eq!(stats(&pool), (0, 1024 + 5120), "initial {initial}");
        assert!(
            device.take_deferred_error().is_some(),
            "the double free is reported"
        );
    }
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
            $(#[$attr])* #[test] fn fill_to_maximum() { suite::fill_to_maximum($device) }
            $(#[$attr])* #[test] fn bounded_pool_fills_from_any_initial_size() { suite::bounded_pool_fills_from_any_initial_size($device) }
            $(#[$attr])* #[test] fn peak_allocated_counts_every_level_and_stream() { suite::peak_allocated_counts_every_level_and_stream($device) }
            $(#[$attr])* #[test] fn fill_to_maximum_from_threads() { suite::fill_to_maximum_from_threads($device) }
            $(#[$attr])* #[test] fn refill_from_another_shard() { suite::refill_from_another_shard($device) }
            $(#[$attr])* #[test] fn stress_awaiting_tasks() { suite::stress_awaiting_tasks($device) }
            $(#[$attr])* #[test] fn freed_on_one_stream_serves_another_within_one_miss() { suite::freed_on_one_stream_serves_another_within_one_miss($device) }
            $(#[$attr])* #[test] fn a_taker_waits_only_for_work_before_the_free() { suite::a_taker_waits_only_for_work_before_the_free($device) }
            $(#[$attr])* #[test] fn a_taker_waits_only_for_its_blocks_free() { suite::a_taker_waits_only_for_its_blocks_free($device) }
            $(#[$attr])* #[test] fn a_taker_takes_the_oldest_free_block() { suite::a_taker_takes_the_oldest_free_block($device) }
            $(#[$attr])* #[test] fn adjacent_frees_stay_apart_until_needed() { suite::adjacent_frees_stay_apart_until_needed($device) }
        }
    };
}
