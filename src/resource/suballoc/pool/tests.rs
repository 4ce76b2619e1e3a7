//! The pool wrapper on the host backend: stream ordering when memory crosses streams, and a
//! model-based test of random operations on several streams with trims.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::PoolResource;
use crate::test_support::{busy, device as host, free, reached, when};
use crate::{CudaResource, DevicePtr, MemoryResource, Stream};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// A block freed on S and taken by T: T's later work runs only after S's work before the free.
#[test]
fn memory_taken_from_another_stream_is_ordered_after_its_work() {
    let device = host();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 2 * MIB, Some(2 * MIB)).unwrap();
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let a = pool.try_allocate(2 * MIB, &s).unwrap();
    let s_done = busy(&s, 100);
    free(&pool, a, 2 * MIB, &s);
    let b = pool.try_allocate(2 * MIB, &t).unwrap();
    assert_eq!(b, a, "T is served from S's free, not by growing");
    let t_uses = reached(&t);
    t.synchronize_blocking().unwrap();
    s.synchronize_blocking().unwrap();
    assert!(
        when(&t_uses) >= when(&s_done),
        "T used S's memory before S was done with it"
    );
    free(&pool, b, 2 * MIB, &t);
}

/// T waited for S once; S then frees more after more work: taking that memory waits again,
/// even though no event was needed for S's earlier frees.
#[test]
fn a_new_free_needs_a_new_wait() {
    let device = host();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 2 * MIB, Some(2 * MIB)).unwrap();
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let a = pool.try_allocate(MIB, &s).unwrap();
    let b = pool.try_allocate(MIB, &s).unwrap();
    free(&pool, a, MIB, &s);
    let first = pool.try_allocate(MIB, &t).unwrap();
    assert_eq!(first, a);
    s.synchronize_blocking().unwrap();
    let s_done = busy(&s, 100);
    free(&pool, b, MIB, &s);
    let second = pool.try_allocate(MIB, &t).unwrap();
    assert_eq!(second, b);
    let t_uses = reached(&t);
    t.synchronize_blocking().unwrap();
    s.synchronize_blocking().unwrap();
    assert!(
        when(&t_uses) >= when(&s_done),
        "the second take did not wait for S"
    );
    free(&pool, first, MIB, &t);
    free(&pool, second, MIB, &t);
}

/// Memory merged from V into T (against fragmentation) and then taken by U: U waits for an
/// event of T recorded after T's wait for V, not an older event of T that predates the merge.
#[test]
fn memory_merged_into_a_stream_is_ordered_for_the_next_taker() {
    let device = host();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 2 * MIB, Some(2 * MIB)).unwrap();
    let [t, v, w, u] = std::array::from_fn(|_| Stream::new(&device).unwrap());
    // T and V each take half of the chunk; T frees its half.
    let a = pool.try_allocate(MIB, &t).unwrap();
    let b = pool.try_allocate(MIB, &v).unwrap();
    free(&pool, a, MIB, &t);
    // W takes a quarter of T's half: T gets an event, which W waits on.
    let c = pool.try_allocate(MIB / 2, &w).unwrap();
    t.synchronize_blocking().unwrap();
    // V frees its half after long work on it.
    let v_done = busy(&v, 150);
    free(&pool, b, MIB, &v);
    // T needs more than any one stream's block: V's half merges into T and coalesces.
    let d = pool.try_allocate(MIB + MIB / 4, &t).unwrap();
    let stats = pool.statistics();
    assert_eq!(
        stats.reserved_bytes,
        2 * MIB,
        "served by merging, not by growing"
    );
    assert_eq!(stats.free_bytes, MIB / 4);
    // U takes what is left of it: memory that V's work may still use.
    let e = pool.try_allocate(MIB / 4, &u).unwrap();
    let u_uses = reached(&u);
    for s in [&t, &v, &w, &u] {
        s.synchronize_blocking().unwrap();
    }
    assert!(
        when(&u_uses) >= when(&v_done),
        "U used V's memory before V was done with it"
    );
    free(&pool, c, MIB / 2, &w);
    free(&pool, d, MIB + MIB / 4, &t);
    free(&pool, e, MIB / 4, &u);
    assert_eq!(pool.statistics().free_bytes, 2 * MIB);
}

/// A stream that frees and then goes quiet does not strand its memory.
#[test]
fn memory_freed_on_a_quiet_stream_serves_the_others() {
    let device = host();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 4 * MIB, Some(4 * MIB)).unwrap();
    let quiet = Stream::new(&device).unwrap();
    let blocks: Vec<_> = (0..16)
        .map(|_| pool.try_allocate(256 * KIB, &quiet).unwrap())
        .collect();
    for &p in &blocks {
        free(&pool, p, 256 * KIB, &quiet);
    }
    drop(quiet);
    let others: Vec<Stream> = (0..4).map(|_| Stream::new(&device).unwrap()).collect();
    let taken: Vec<_> = others
        .iter()
        .map(|s| (pool.try_allocate(MIB, s).unwrap(), s))
        .collect();
    assert_eq!(pool.pool_size(), 4 * MIB);
    for (p, s) in taken {
        free(&pool, p, MIB, s);
    }
}

/// A pool that may hold this much has stream shards (see `shard_layout`).
const SHARDED: usize = 256 * MIB;

#[test]
fn large_pools_have_shards_and_small_ones_do_not() {
    let device = host();
    let small =
        PoolResource::new(CudaResource::new(&device).unwrap(), 0, Some(SHARDED - 256)).unwrap();
    let large = PoolResource::new(CudaResource::new(&device).unwrap(), 0, Some(SHARDED)).unwrap();
    assert!(small.inner.shards.is_empty());
    assert!(!large.inner.shards.is_empty());
    assert!(large.inner.shards.len().is_power_of_two());
    assert_eq!(
        (large.inner.shard_chunk, large.inner.shard_limit),
        (4 * MIB, MIB)
    );
}

/// A block from one stream's shard, freed on another stream (after its own work on it), and
/// then taken by the first: found in the right shard, and ordered after the freeing stream.
#[test]
fn a_shard_block_freed_on_another_stream_is_ordered_for_the_next_taker() {
    let device = host();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, Some(SHARDED)).unwrap();
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let a = pool.try_allocate(64 * KIB, &s).unwrap();
    // T uses the block after S, then frees it.
    t.wait(&s.record().unwrap()).unwrap();
    let t_done = busy(&t, 100);
    free(&pool, a, 64 * KIB, &t);
    assert_eq!(pool.statistics().live_allocations, 0);
    // S has free memory of its own in its shard's sub-chunk, but A's block is T's: a request
    // only A's block can serve after it coalesces with S's rest would have to wait for T.
    // Take everything S's shard has, so A's block must be among what S gets.
    let mut taken = Vec::new();
    let mut saw_a = false;
    while !saw_a {
        let p = pool.try_allocate(64 * KIB, &s).unwrap();
        saw_a = p == a;
        taken.push(p);
        assert!(taken.len() < 1000, "S never got T's block");
    }
    let s_uses = reached(&s);
    s.synchronize_blocking().unwrap();
    t.synchronize_blocking().unwrap();
    assert!(
        when(&s_uses) >= when(&t_done),
        "S used T's block before T was done"
    );
    for p in taken {
        free(&pool, p, 64 * KIB, &s);
    }
}

/// Sub-chunks held by shards come back when a request needs them: a pool whose one chunk is
/// its maximum serves a request for all of it after small requests on many streams.
#[test]
fn a_request_under_pressure_takes_back_the_shards_sub_chunks() {
    let device = host();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), SHARDED, Some(SHARDED)).unwrap();
    let streams: Vec<Stream> = (0..8).map(|_| Stream::new(&device).unwrap()).collect();
    for s in &streams {
        let p = pool.try_allocate(4 * KIB, s).unwrap();
        free(&pool, p, 4 * KIB, s);
    }
    let held: usize = pool
        .inner
        .shards
        .iter()
        .map(|s| s.lock().level.chunk_bytes)
        .sum();
    assert!(held > 0, "the shards took sub-chunks");
    let all = pool.try_allocate(SHARDED, &streams[0]).unwrap();
    assert_eq!(pool.pool_size(), SHARDED, "served without growing");
    free(&pool, all, SHARDED, &streams[0]);
    assert_eq!(pool.statistics().free_bytes, SHARDED);
}

/// A request larger than the shard limit that only a shard's free memory can serve, under
/// pressure, is served there, and its free (of a size that normally goes to the global level)
/// finds it.
#[test]
fn a_large_block_served_by_a_shard_under_pressure_is_freed_there() {
    let device = host();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), SHARDED, Some(SHARDED)).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let small = pool.try_allocate(4 * KIB, &a).unwrap();
    let sub_chunk = pool.inner.shard_chunk;
    let rest = pool.try_allocate(SHARDED - sub_chunk, &b).unwrap();
    let large = 2 * MIB;
    assert!(large > pool.inner.shard_limit);
    let p = pool.try_allocate(large, &b).unwrap();
    assert_eq!(pool.pool_size(), SHARDED, "served without growing");
    free(&pool, p, large, &b);
    free(&pool, small, 4 * KIB, &a);
    free(&pool, rest, SHARDED - sub_chunk, &b);
    assert_eq!(pool.statistics().free_bytes, SHARDED);
}

/// A user block at the very start of a shard's sub-chunk has the sub-chunk's address, which the
/// global level knows as a lent block: its free must reach the shard's block, not the global
/// level's sub-chunk.
#[test]
fn a_block_at_a_sub_chunks_base_is_freed_in_its_shard() {
    let device = host();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), SHARDED, Some(SHARDED)).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let sub_chunk = pool.inner.shard_chunk;
    // A's shard takes a sub-chunk; the small block is carved from its end.
    let small = pool.try_allocate(4 * KIB, &a).unwrap();
    let rest = pool.try_allocate(SHARDED - sub_chunk, &b).unwrap();
    // Under pressure B's large requests are served from A's sub-chunk, the second one from its
    // base.
    let first = pool.try_allocate(2 * MIB, &b).unwrap();
    let last = sub_chunk - 4 * KIB - 2 * MIB;
    assert!(last > pool.inner.shard_limit);
    let at_base = pool.try_allocate(last, &b).unwrap();
    assert_eq!(pool.statistics().free_bytes, 0);
    free(&pool, at_base, last, &b);
    let stats = pool.statistics();
    assert_eq!((stats.free_bytes, stats.live_allocations), (last, 3));
    free(&pool, first, 2 * MIB, &b);
    free(&pool, small, 4 * KIB, &a);
    free(&pool, rest, SHARDED - sub_chunk, &b);
    assert_eq!(pool.statistics().free_bytes, SHARDED);
    assert_eq!(pool.trim(), SHARDED);
}

/// Chunks never merge, so a pool whose chunks are all free could not serve a request of its
/// whole maximum: it gives them back and grows by one large enough, awaited or not.
#[test]
fn a_wholly_free_pool_serves_its_maximum() {
    let device = host();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 512 * KIB, Some(MIB)).unwrap();
    let s = Stream::new(&device).unwrap();
    let p = pool.try_allocate(MIB, &s).unwrap();
    assert_eq!(
        (pool.pool_size(), pool.statistics().upstream_chunks),
        (MIB, 1)
    );
    free(&pool, p, MIB, &s);
    // Two chunks again, then the whole maximum awaited (the timeout turns a hang into a
    // failure).
    let halves = [
        pool.try_allocate(MIB / 2, &s).unwrap(),
        pool.try_allocate(MIB / 2, &s).unwrap(),
    ];
    assert!(halves[0] != halves[1]);
    for h in halves {
        free(&pool, h, MIB / 2, &s);
    }
    let q = futures::executor::block_on(pool.allocate(MIB, &s).timeout(Duration::from_secs(5)));
    let q = q.expect("served after giving back the free chunks");
    free(&pool, q, MIB, &s);
}

/// Statistics read while sub-chunks move between a shard and the global level stay
/// consistent: every level is read at once.
#[test]
fn statistics_are_consistent_while_sub_chunks_move() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let device = host();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), SHARDED, Some(SHARDED)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (pool, stop, device) = (pool.clone(), stop.clone(), device.clone());
        std::thread::spawn(move || {
            let s = Stream::new(&device).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let p = pool.try_allocate(4 * KIB, &s).unwrap();
                free(&pool, p, 4 * KIB, &s);
                pool.inner.reclaim();
            }
        })
    };
    for _ in 0..20_000 {
        let stats = pool.statistics();
        assert!(stats.free_bytes <= stats.reserved_bytes, "{stats:?}");
        assert!(stats.live_allocations <= 1, "{stats:?}");
    }
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Allocate { size: usize, stream: usize },
    Free { pick: usize, stream: usize },
    Trim,
}

/// Operations with requests of up to `largest` bytes.
fn any_op(largest: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1..=largest, 0..3usize).prop_map(|(size, stream)| Op::Allocate { size, stream }),
        5 => (any::<usize>(), 0..3usize).prop_map(|(pick, stream)| Op::Free { pick, stream }),
        1 => Just(Op::Trim),
    ]
}

/// Random allocations and frees on three streams, with trims, against a shadow model of the
/// live ranges: no overlap, alignment, exact accounting, and a pool that coalesces back to its
/// chunks and gives them all back once everything is freed.
fn run_ops(ops: Vec<Op>, initial: usize, maximum: usize) {
    let device = host();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), initial, Some(maximum)).unwrap();
    let streams: Vec<Stream> = (0..3).map(|_| Stream::new(&device).unwrap()).collect();
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    let rounded = |n: usize| n.div_ceil(256) * 256;
    for op in ops {
        match op {
            Op::Allocate { size, stream } => {
                let before = pool.statistics();
                match pool.try_allocate(size, &streams[stream]) {
                    Ok(p) => {
                        assert!(p.is_aligned(256), "{p:?}");
                        let (start, end) = (p.addr(), p.addr() + rounded(size) as u64);
                        if let Some((&s, &n)) = live.range(..end).next_back() {
                            let s_end = s + rounded(n) as u64;
                            assert!(s_end <= start, "{p:?}+{size} overlaps {s:#x}+{n}");
                        }
                        live.insert(start, size);
                    }
                    Err(e) => {
                        assert!(e.is_out_of_memory(), "{e}");
                        // Refused only when no free block fits and the pool cannot grow by it.
                        assert!(before.largest_free_block < rounded(size), "{before:?}");
                        assert!(
                            before.reserved_bytes + rounded(size) > maximum,
                            "{before:?}"
                        );
                    }
                }
            }
            Op::Free { pick, stream } => {
                if live.is_empty() {
                    continue;
                }
                let (&p, &n) = live.iter().nth(pick % live.len()).unwrap();
                live.remove(&p);
                free(&pool, DevicePtr::from_raw(p), n, &streams[stream]);
            }
            Op::Trim => {
                let before = pool.pool_size();
                let released = pool.trim();
                assert_eq!(pool.pool_size(), before - released);
            }
        }
        let stats = pool.statistics();
        let used: usize = live.values().map(|&n| rounded(n)).sum();
        assert_eq!(stats.live_allocations, live.len());
        assert_eq!(
            stats.free_bytes + used,
            stats.reserved_bytes,
            "bytes lost or made up"
        );
        assert!(stats.reserved_bytes <= maximum);
    }
    for (&p, &n) in &live {
        free(&pool, DevicePtr::from_raw(p), n, &streams[0]);
    }
    let stats = pool.statistics();
    assert_eq!(stats.free_bytes, stats.reserved_bytes);
    // Fully freed, on whichever streams: trim coalesces every chunk and gives it all back.
    assert_eq!(pool.trim(), stats.reserved_bytes);
    assert_eq!(pool.pool_size(), 0);
    drop(pool);
    // The chunks go back on the streams that owned them (the pool's own among them): wait for
    // those frees to run.
    let controls = device.host_controls().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while controls.allocated_bytes() != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        controls.allocated_bytes(),
        0,
        "chunks not given back upstream"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A small pool: the global level alone.
    #[test]
    fn random_operations_on_several_streams_match_the_model(
        ops in prop::collection::vec(any_op(512 * KIB), 1..120)
    ) {
        run_ops(ops, MIB, 4 * MIB);
    }

    /// The smallest pool with stream shards (sub-chunks of 4 MiB + 64 KiB, requests up to 1 MiB
    /// through the shards), with requests on both sides of that limit and, towards the end of
    /// longer runs, under pressure.
    #[test]
    fn random_operations_on_a_sharded_pool_match_the_model(
        ops in prop::collection::vec(any_op(32 * MIB), 1..160)
    ) {
        run_ops(ops, 0, SHARDED);
    }
}

/// A pool dropped with allocations out (one in the global level of a small pool; one in a
/// shard and one in the global level of a large one) records a typed error with their number
/// and bytes on its device, which the user takes from there.
#[test]
fn drop_with_allocations_out_defers_a_leak_error() {
    let device = host();
    let stream = Stream::new(&device).unwrap();
    let small = PoolResource::new(CudaResource::new(&device).unwrap(), 0, Some(4 * MIB)).unwrap();
    small.try_allocate(1000, &stream).unwrap();
    drop(small);
    assert_eq!(device.deferred_error_count(), 1);
    let err = device.take_deferred_error().expect("the leak is reported");
    assert_eq!(
        err,
        crate::Error::Leaked {
            what: "PoolResource",
            allocations: 1,
            bytes: 1024,
            device: device.id()
        }
    );
    assert!(device.take_deferred_error().is_none());

    let large = PoolResource::new(CudaResource::new(&device).unwrap(), 0, Some(SHARDED)).unwrap();
    assert!(!large.inner.shards.is_empty());
    let p = large.try_allocate(KIB, &stream).unwrap();
    large.try_allocate(64 * MIB, &stream).unwrap();
    let q = large.try_allocate(KIB, &stream).unwrap();
    free(&large, p, KIB, &stream);
    free(&large, q, KIB, &stream);
    let kept = large.try_allocate(100, &stream).unwrap();
    assert!(!kept.is_null());
    drop(large);
    assert_eq!(device.deferred_error_count(), 2);
    assert!(matches!(
        device.take_deferred_error(),
        Some(crate::Error::Leaked { allocations: 2, bytes, .. }) if bytes == 64 * MIB + 256
    ));

    // Dropped with nothing out: no error.
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, Some(SHARDED)).unwrap();
    let p = pool.try_allocate(KIB, &stream).unwrap();
    free(&pool, p, KIB, &stream);
    drop(pool);
    assert_eq!(device.deferred_error_count(), 2);
}

/// Sizes at the top of `usize` are refused with a typed out-of-memory error carrying the
/// request, never a panic (debug) or a wrapped size (release), with and without a maximum,
/// sharded or not; the pool is unchanged and still serves.
#[test]
fn sizes_near_usize_max_can_never_fit() {
    let device = host();
    let stream = Stream::new(&device).unwrap();
    for maximum in [None, Some(4 * MIB), Some(SHARDED)] {
        let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, maximum).unwrap();
        for bytes in [
            usize::MAX,
            usize::MAX - 255,
            usize::MAX / 2 + 1,
            isize::MAX as usize,
        ] {
            let err = pool.try_allocate(bytes, &stream).unwrap_err();
            assert!(
                matches!(err, crate::Error::TooLarge { requested, device: d, .. }
                    if requested == bytes && d == device.id()),
                "{maximum:?} {bytes}: {err}"
            );
            let err = futures::executor::block_on(pool.allocate(bytes, &stream)).unwrap_err();
            assert!(err.never_fits(), "{maximum:?} {bytes}: {err}");
        }
        assert_eq!(pool.statistics().live_allocations, 0);
        let p = pool.try_allocate(MIB, &stream).unwrap();
        free(&pool, p, MIB, &stream);
    }
}

/// A double free, a free with the wrong size and a foreign pointer free nothing and panic not:
/// each is a deferred error naming the pointer, and the pool goes on serving (sharded pools
/// and small ones alike).
#[test]
fn bad_frees_are_deferred_errors_not_panics() {
    for (initial, maximum) in [(MIB, None), (0, Some(256 * MIB))] {
        let device = host();
        let s = Stream::new(&device).unwrap();
        let pool =
            PoolResource::new(CudaResource::new(&device).unwrap(), initial, maximum).unwrap();
        let p = pool.try_allocate(4 * KIB, &s).unwrap();
        let q = pool.try_allocate(4 * KIB, &s).unwrap();
        free(&pool, p, 4 * KIB, &s);
        free(&pool, p, 4 * KIB, &s); // double free
        free(&pool, q, 64 * KIB, &s); // wrong size
        free(&pool, DevicePtr::from_raw(0x10), 256, &s); // foreign
        assert_eq!(device.deferred_error_count(), 3);
        for what in [p, q, DevicePtr::from_raw(0x10)] {
            let e = device
                .take_deferred_error()
                .expect("a deferred error per bad free");
            assert!(e.to_string().contains(&what.to_string()), "{e}");
        }
        free(&pool, q, 4 * KIB, &s); // the right size still frees it
        assert_eq!(pool.statistics().live_allocations, 0);
        let r = pool.try_allocate(4 * KIB, &s).unwrap();
        free(&pool, r, 4 * KIB, &s);
        assert!(device.take_deferred_error().is_none());
    }
}

/// The fast path serves a stream from its own free blocks only: a block S freed in the shard
/// S and T share goes to T only through the full path, after T waits for S's work before the
/// free (the fast path's miss must not hand it over as it is).
#[test]
fn the_fast_path_never_hands_another_streams_free_block_over_without_a_wait() {
    let device = host();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, Some(SHARDED)).unwrap();
    assert!(!pool.inner.shards.is_empty());
    let s = Stream::new(&device).unwrap();
    let t = loop {
        let t = Stream::new(&device).unwrap();
        if pool.inner.shard_index(&t) == pool.inner.shard_index(&s) {
            break t;
        }
    };
    let a = pool.try_allocate(64 * KIB, &s).unwrap();
    let s_done = busy(&s, 100);
    free(&pool, a, 64 * KIB, &s);
    let b = pool.try_allocate(64 * KIB, &t).unwrap();
    assert_eq!(
        b, a,
        "T is carved from the tail of S's free memory, where A was"
    );
    let t_uses = reached(&t);
    t.synchronize_blocking().unwrap();
    s.synchronize_blocking().unwrap();
    assert!(
        when(&t_uses) >= when(&s_done),
        "T used S's freed block before S was done with it"
    );
    free(&pool, b, 64 * KIB, &t);
    assert_eq!(pool.statistics().live_allocations, 0);
}

/// The newest allocation (which the pool keeps apart from its other live blocks, and frees
/// on the fast path) is still checked like the others: freed twice, or with a wrong size, it
/// frees nothing and is a deferred error; freed right, it frees.
#[test]
fn the_newest_allocation_freed_twice_or_with_a_wrong_size_is_caught() {
    for (initial, maximum) in [(MIB, None), (0, Some(SHARDED))] {
        let device = host();
        let s = Stream::new(&device).unwrap();
        let pool =
            PoolResource::new(CudaResource::new(&device).unwrap(), initial, maximum).unwrap();
        let p = pool.try_allocate(4 * KIB, &s).unwrap();
        free(&pool, p, 4 * KIB, &s);
        free(&pool, p, 4 * KIB, &s); // double free of the newest allocation
        assert_eq!(device.deferred_error_count(), 1);
        let e = device.take_deferred_error().unwrap();
        assert!(e.to_string().contains(&p.to_string()), "{e}");
        let q = pool.try_allocate(4 * KIB, &s).unwrap();
        free(&pool, q, 8 * KIB, &s); // wrong size
        assert_eq!(
            device.deferred_error_count(),
            2,
            "errors so far, taken or not"
        );
        let e = device.take_deferred_error().unwrap();
        assert!(e.to_string().contains(&q.to_string()), "{e}");
        assert_eq!(
            pool.statistics().live_allocations,
            1,
            "Q is still allocated"
        );
        free(&pool, q, 4 * KIB, &s);
        assert_eq!(pool.statistics().live_allocations, 0);
        assert!(device.take_deferred_error().is_none());
    }
}

/// Issue 15: a wholly free 64 MiB pool whose blocks were freed on 4 streams read as a largest
/// free block of 8 MiB (the largest block one stream owned), which looks like fragmentation
/// although a 64 MiB request then succeeds. The statistics now say 64 MiB (the per-stream
/// figure, `statistics_with(false)`, is what they said before).
#[test]
fn statistics_of_a_pool_freed_on_several_streams_read_one_block() {
    let device = host();
    let pool = PoolResource::new(
        CudaResource::new(&device).unwrap(),
        64 * MIB,
        Some(64 * MIB),
    )
    .unwrap();
    let streams: Vec<Stream> = (0..4).map(|_| Stream::new(&device).unwrap()).collect();
    let blocks: Vec<(DevicePtr, usize)> = (0..8)
        .map(|i| (pool.try_allocate(8 * MIB, &streams[i % 4]).unwrap(), i % 4))
        .collect();
    for (p, i) in blocks {
        free(&pool, p, 8 * MIB, &streams[i]);
    }
    assert_eq!(
        pool.inner.statistics_with(false).largest_free_block,
        8 * MIB
    );
    let stats = pool.statistics();
    assert_eq!(
        (stats.largest_free_block, stats.free_bytes),
        (64 * MIB, 64 * MIB)
    );
    let t = Stream::new(&device).unwrap();
    let p = pool.try_allocate(64 * MIB, &t).unwrap();
    free(&pool, p, 64 * MIB, &t);
}

/// A snapshot taken while a shard hands wholly free sub-chunks back to the global level shows
/// each sub-chunk as the shard's free blocks or the global level's free block, never as a
/// live block: the reviewer's case (two threads allocating and freeing 256 KiB blocks on a
/// sharded pool) read a whole 4 MiB sub-chunk as `Live` after some 3,000 snapshots, taken
/// between the shard's letting go of it and the global level's taking it back.
#[test]
fn snapshots_never_show_a_sub_chunk_on_its_way_back_as_live() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    const BLOCK: usize = 256 * KIB;
    let device = host();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), SHARDED, Some(SHARDED)).unwrap();
    assert!(!pool.inner.shards.is_empty());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|i| {
            let (pool, stop, device) = (pool.clone(), stop.clone(), device.clone());
            std::thread::spawn(move || {
                let s = Stream::new(&device).unwrap();
                let mut round = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    // More than a shard keeps free (two sub-chunks' worth), so that the
                    // frees hand its wholly free sub-chunks back.
                    let blocks: Vec<_> = (0..48)
                        .map(|_| pool.try_allocate(BLOCK, &s).unwrap())
                        .collect();
                    for p in blocks {
                        free(&pool, p, BLOCK, &s);
                    }
                    round += 1;
                    if (round + i) % 4 == 0 {
                        pool.inner.reclaim();
                    }
                }
            })
        })
        .collect();
    let mut result = Ok(());
    let limit = Instant::now() + Duration::from_secs(60);
    for n in 0..20_000 {
        let snap = pool.snapshot().unwrap();
        if let Some((_, b)) = snap
            .blocks()
            .find(|(_, b)| b.state == crate::BlockState::Live && b.bytes != BLOCK)
        {
            result = Err(format!("snapshot {n}: {b:?}"));
            break;
        }
        if Instant::now() > limit {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    result.unwrap();
}

/// Out-of-memory details: the largest free block joins free blocks of any streams (O(blocks))
/// when the error goes to a caller, but not for a failed try while an allocation waits on the
/// pool and a free may still come: such a try is most likely the waiter's retry at a free,
/// whose error nobody reads, and a walk of every block at every free would cost O(frees ×
/// blocks) under the pool's locks. Those details give the largest block of one stream
/// (O(streams)), as before snapshots; `fragmentation()` gives the joined figure.
#[test]
fn out_of_memory_details_join_streams_unless_a_waiter_retries() {
    use std::future::Future;
    use std::task::{Context, Poll};

    let device = host();
    let pool = PoolResource::new(
        CudaResource::new(&device).unwrap(),
        64 * MIB,
        Some(64 * MIB),
    )
    .unwrap();
    let s: Vec<Stream> = (0..5).map(|_| Stream::new(&device).unwrap()).collect();
    let blocks: Vec<DevicePtr> = (0..8)
        .map(|i| pool.try_allocate(8 * MIB, &s[i % 4]).unwrap())
        .collect();
    for (i, &p) in blocks.iter().enumerate().skip(1) {
        free(&pool, p, 8 * MIB, &s[i % 4]);
    }
    let largest = |e: crate::Error| {
        let d = e.out_of_memory_details().expect("the pool gives details");
        assert_eq!(d.free_bytes, Some(56 * MIB), "{e}");
        d.largest_free_block
            .expect("the pool names its largest free block")
    };
    // No one waits: the error goes to the caller, with the joined figure.
    assert_eq!(
        largest(pool.try_allocate(64 * MIB, &s[4]).unwrap_err()),
        56 * MIB
    );

    // An awaited request waits (queued, at the head); a try now is what its retry at each
    // free does: one stream's largest block.
    let mut waiting = Box::pin(pool.allocate(64 * MIB, &s[4]));
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    assert!(waiting.as_mut().poll(&mut cx).is_pending());
    assert_eq!(
        largest(pool.try_allocate(64 * MIB, &s[4]).unwrap_err()),
        8 * MIB
    );
    // The figures that join the streams' free memory are still there to read.
    assert_eq!(pool.fragmentation().unwrap().largest_free_block, 56 * MIB);
    assert_eq!(pool.statistics().largest_free_block, 56 * MIB);

    // With nothing live, no free can come for the waiter: its retry's error is the one it
    // returns, so it joins the streams again.
    free(&pool, blocks[0], 8 * MIB, &s[0]);
    let e = pool.inner.out_of_memory(64 * MIB, &s[4]);
    let d = e.out_of_memory_details().unwrap();
    assert_eq!(d.largest_free_block, Some(64 * MIB), "{e}");

    // The waiter is served once polled.
    let p = match waiting.as_mut().poll(&mut cx) {
        Poll::Ready(p) => p.unwrap(),
        Poll::Pending => panic!("the wholly free pool serves the waiter"),
    };
    drop(waiting);
    free(&pool, p, 64 * MIB, &s[4]);
}
