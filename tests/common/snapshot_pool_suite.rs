//! Snapshots of the pools ([`MemoryResource::snapshot`], [`MemoryResource::fragmentation`]):
//! segments are the pool's chunks (the mapped pool's mapped ranges), their blocks tile them
//! in address order, live blocks are what is allocated (address, size, stream), free blocks
//! say whether any stream may use them now or only the stream that freed them, and an
//! adaptor over a pool shows the pool's own snapshot.
//!
//! `snapshot_pool_suite!` instantiates it for one device expression.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use streamalloc::{
    BlockState, CudaResource, Device, DevicePtr, LimitingAdaptor, MappedPoolConfig,
    MappedPoolResource, MemoryResource, MemorySnapshot, PoolResource, StatisticsAdaptor, Stream,
    StreamId,
};

use super::SplitMix64;

const MIB: usize = 1 << 20;

fn streams(device: &Device, n: usize) -> Vec<Stream> {
    (0..n).map(|_| Stream::new(device).unwrap()).collect()
}

fn rounded(bytes: usize) -> usize {
    bytes.div_ceil(256) * 256
}

/// What a snapshot says, as comparable tuples: segments `(address, bytes)` with blocks
/// `(address, bytes, state, stream)`.
type Picture = Vec<(
    (u64, usize),
    Vec<(u64, usize, BlockState, Option<StreamId>)>,
)>;

fn picture(s: &MemorySnapshot) -> Picture {
    s.segments
        .iter()
        .map(|seg| {
            let blocks = seg
                .blocks
                .iter()
                .map(|b| (b.address.addr(), b.bytes, b.state, b.stream))
                .collect();
            ((seg.address.addr(), seg.bytes), blocks)
        })
        .collect()
}

/// Segments in address order, not overlapping; in each, blocks in address order that tile it
/// from its start with no gap or overlap (the pool knows every byte of its chunks), up to
/// its end rounded down to 256 bytes.
fn assert_tiled(s: &MemorySnapshot) {
    let mut end = 0u64;
    for seg in &s.segments {
        assert!(seg.address.addr() >= end, "segments overlap: {s:#?}");
        let mut at = seg.address.addr();
        for b in &seg.blocks {
            assert_eq!(
                b.address.addr(),
                at,
                "a gap or overlap at {at:#x}: {seg:#?}"
            );
            assert!(b.bytes > 0 && b.bytes % 256 == 0, "{b:?}");
            at += b.bytes as u64;
        }
        let seg_end = seg.address.addr() + seg.bytes as u64;
        assert_eq!(
            at,
            seg_end / 256 * 256,
            "blocks do not cover the segment: {seg:#?}"
        );
        let covered: usize = seg.blocks.iter().map(|b| b.bytes).sum();
        assert_eq!(covered, seg.bytes / 256 * 256);
        end = seg_end;
    }
}

/// Live blocks: exactly `live` (address → (rounded bytes, stream)).
fn assert_live(s: &MemorySnapshot, live: &BTreeMap<u64, (usize, StreamId)>) {
    let seen: BTreeMap<u64, (usize, StreamId)> = s
        .blocks()
        .filter(|(_, b)| b.state == BlockState::Live)
        .map(|(_, b)| {
            (
                b.address.addr(),
                (b.bytes, b.stream.expect("a live block's stream")),
            )
        })
        .collect();
    assert_eq!(&seen, live);
}

/// Waits (bounded) until `f` holds of the pool's snapshot: an event the pool recorded may
/// complete a moment after the stream it is on has nothing left to run.
fn eventually(mr: &impl MemoryResource, what: &str, f: impl Fn(&MemorySnapshot) -> bool) {
    let limit = Instant::now() + Duration::from_secs(10);
    loop {
        let s = mr.snapshot().expect("the pool takes snapshots");
        if f(&s) {
            return;
        }
        assert!(Instant::now() < limit, "{what}: {s:#?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The case: a wholly free 64 MiB pool whose blocks were freed on 4 streams is one
/// free extent of 64 MiB (usable after the frees' events), not fragmentation; the figures
/// tell memory usable now by any stream from memory free on one stream; and a 64 MiB
/// request then succeeds.
pub fn wholly_free_pool_over_streams_is_one_extent(device: Device) {
    let pool = PoolResource::new(
        CudaResource::new(&device).unwrap(),
        64 * MIB,
        Some(64 * MIB),
    )
    .unwrap();
    let s = streams(&device, 5);
    let blocks: Vec<(DevicePtr, usize)> = (0..8)
        .map(|i| (pool.try_allocate(8 * MIB, &s[i % 4]).unwrap(), i % 4))
        .collect();
    let full = pool
        .fragmentation()
        .expect("a pool has fragmentation figures");
    assert_eq!(
        (full.live_bytes, full.largest_free_block),
        (64 * MIB, 0),
        "{full}"
    );
    for &(p, i) in &blocks {
        unsafe { pool.deallocate(p, 8 * MIB, &s[i]) };
    }

    let f = pool.fragmentation().unwrap();
    assert_eq!(f.reserved_bytes, 64 * MIB, "{f}");
    assert_eq!(f.live_bytes, 0, "{f}");
    assert_eq!(f.largest_free_block, 64 * MIB, "{f}");
    assert_eq!(f.fragmentation_ratio(), 0.0, "{f}");
    assert_eq!(f.free_bytes(), 64 * MIB, "{f}");
    // Freed on their streams, with no event recorded after the frees (the pool records one
    // only when another stream takes the memory): each stream may use its own 16 MiB now,
    // no stream all of it.
    assert_eq!(f.free_now_bytes, 0, "{f}");
    assert_eq!(f.largest_free_now, 0, "{f}");
    let on: Vec<(StreamId, usize)> = (0..4).map(|i| (s[i].id(), 16 * MIB)).collect();
    assert_eq!(f.free_on_stream, on, "{f}");
    for stream in &s[..4] {
        let own = f.largest_free_for(stream.id());
        assert!((8 * MIB..=16 * MIB).contains(&own), "{own}: {f}");
    }
    // The pool's statistics and the snapshot say the same: one block is the most a request
    // can get, after the pool gathers the streams' free memory.
    let stats = pool.statistics();
    assert_eq!(stats.largest_free_block, 64 * MIB, "{stats:?}");
    assert_eq!(stats.free_bytes, 64 * MIB, "{stats:?}");

    // The pool's definition of a passed free is an event recorded after it that has
    // completed: synchronizing the streams records none, so the memory stays theirs.
    for stream in &s[..4] {
        stream.synchronize_blocking().unwrap();
    }
    let after_sync = pool.fragmentation().unwrap();
    assert_eq!(after_sync, f, "{after_sync}");

    // A 64 MiB request on a fifth stream gathers it all.
    let p = pool.try_allocate(64 * MIB, &s[4]).unwrap();
    let snap = pool.snapshot().unwrap();
    assert_tiled(&snap);
    let live = BTreeMap::from([(p.addr(), (64 * MIB, s[4].id()))]);
    assert_live(&snap, &live);
    unsafe { pool.deallocate(p, 64 * MIB, &s[4]) };

    // With one 8 MiB block live at the top, a 64 MiB request fails; its details name the
    // free memory below as one 56 MiB block, as the snapshot does, not one stream's 8 MiB.
    let top: Vec<DevicePtr> = (0..8)
        .map(|i| pool.try_allocate(8 * MIB, &s[i % 4]).unwrap())
        .collect();
    for (i, &q) in top.iter().enumerate().skip(1) {
        unsafe { pool.deallocate(q, 8 * MIB, &s[i % 4]) };
    }
    let e = pool.try_allocate(64 * MIB, &s[4]).unwrap_err();
    let d = e.out_of_memory_details().expect("the pool gives details");
    assert_eq!(d.free_bytes, Some(56 * MIB), "{e}");
    assert_eq!(d.largest_free_block, Some(56 * MIB), "{e}");
    assert_eq!(pool.fragmentation().unwrap().largest_free_block, 56 * MIB);
    assert_eq!(pool.statistics().largest_free_block, 56 * MIB);
    unsafe { pool.deallocate(top[0], 8 * MIB, &s[0]) };
    let p = pool.try_allocate(64 * MIB, &s[4]).unwrap();
    let snap = pool.snapshot().unwrap();
    assert_tiled(&snap);
    let live = BTreeMap::from([(p.addr(), (64 * MIB, s[4].id()))]);
    assert_live(&snap, &live);
    unsafe { pool.deallocate(p, 64 * MIB, &s[4]) };
}

/// A fresh pool's initial chunk is one segment, one block free for every stream (it is
/// ordered on a stream of the pool's own that runs nothing else), with the pool's maximum as
/// the snapshot's capacity.
pub fn a_fresh_pool_is_free_for_every_stream(device: Device) {
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 4 * MIB, Some(16 * MIB)).unwrap();
    eventually(&pool, "the initial chunk is free for every stream", |s| {
        let f = s.fragmentation();
        f.largest_free_now == 4 * MIB && f.free_on_stream.is_empty()
    });
    let snap = pool.snapshot().unwrap();
    assert_eq!(
        (snap.resource.as_str(), snap.capacity),
        ("pool", Some(16 * MIB))
    );
    assert_eq!(
        picture(&snap)[0].1,
        [(
            snap.segments[0].address.addr(),
            4 * MIB,
            BlockState::Free,
            None
        )]
    );
    let unbounded = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
    let snap = unbounded.snapshot().unwrap();
    assert!(
        snap.segments.is_empty() && snap.capacity.is_none(),
        "{snap:#?}"
    );
}

/// Free blocks change state with frees on one stream and another: free on the stream that
/// freed them until another stream takes that stream's memory (the pool then records an
/// event), free for every stream once such an event has completed.
pub fn free_states_follow_the_streams(device: Device) {
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 4 * MIB, Some(4 * MIB)).unwrap();
    let [a, b, c]: [Stream; 3] = streams(&device, 3).try_into().unwrap();
    let blocks: Vec<DevicePtr> = (0..4)
        .map(|_| pool.try_allocate(MIB, &a).unwrap())
        .collect();
    let snap = pool.snapshot().unwrap();
    assert_eq!(
        (snap.resource.as_str(), snap.capacity),
        ("pool", Some(4 * MIB))
    );
    assert_tiled(&snap);
    let mut live: BTreeMap<u64, (usize, StreamId)> =
        blocks.iter().map(|p| (p.addr(), (MIB, a.id()))).collect();
    assert_live(&snap, &live);

    // One block freed on `a`, one on `b`: each free on its own stream.
    let (x, y) = (blocks[1], blocks[2]);
    unsafe { pool.deallocate(x, MIB, &a) };
    unsafe { pool.deallocate(y, MIB, &b) };
    live.remove(&x.addr());
    live.remove(&y.addr());
    let snap = pool.snapshot().unwrap();
    assert_tiled(&snap);
    assert_live(&snap, &live);
    let state = |s: &MemorySnapshot, p: DevicePtr| {
        let (_, block) = s
            .blocks()
            .find(|(_, b)| b.address == p)
            .expect("a block at p");
        (block.state, block.stream)
    };
    assert_eq!(state(&snap, x), (BlockState::FreeOnStream, Some(a.id())));
    assert_eq!(state(&snap, y), (BlockState::FreeOnStream, Some(b.id())));
    let f = snap.fragmentation();
    assert_eq!(
        f.largest_free_block,
        2 * MIB,
        "adjacent, on two streams: {f}"
    );
    assert_eq!(f.largest_free_now, 0, "{f}");
    assert_eq!(f.largest_free_for(a.id()), MIB, "{f}");

    // `c` takes `a`'s block (the pool records an event on `a` and makes `c` wait for it): it
    // is live on `c` now, and `a`'s frees from then on record their events at once.
    let z = pool.try_allocate(MIB, &c).unwrap();
    assert_eq!(z, x, "the take carves `a`'s block");
    live.insert(z.addr(), (MIB, c.id()));
    unsafe { pool.deallocate(blocks[0], MIB, &a) };
    live.remove(&blocks[0].addr());
    a.synchronize_blocking().unwrap();
    b.synchronize_blocking().unwrap();
    let snap = pool.snapshot().unwrap();
    assert_live(&snap, &live);
    // `a` passed its event: its block is free for every stream. `b` never had one recorded.
    eventually(&pool, "a's free passed", |s| {
        state(s, blocks[0]) == (BlockState::Free, None)
    });
    let snap = pool.snapshot().unwrap();
    assert_eq!(state(&snap, y), (BlockState::FreeOnStream, Some(b.id())));
    let f = snap.fragmentation();
    assert_eq!((f.free_now_bytes, f.largest_free_now), (MIB, MIB), "{f}");
    assert_eq!(f.free_on_stream, [(b.id(), MIB)], "{f}");

    for p in [z, blocks[3]] {
        let s = if p == z { &c } else { &a };
        unsafe { pool.deallocate(p, MIB, s) };
    }
    assert_eq!(pool.snapshot().unwrap().live_bytes(), 0);
}

/// Random allocations and frees on several streams, in a bounded pool and in an unbounded one
/// (which grows by chunks, with shards and a level of large blocks on a device of 256 MiB or
/// more): the blocks tile the chunks, live blocks are exactly what is allocated (address,
/// rounded size, stream), reserved and free bytes agree with the pool's statistics.
pub fn blocks_tile_chunks_and_match_allocations(device: Device) {
    let upstream = || CudaResource::new(&device).unwrap();
    let pools = [
        PoolResource::new(upstream(), 0, Some(256 * MIB)).unwrap(),
        PoolResource::new(upstream(), 0, None).unwrap(),
        PoolResource::new(upstream(), 2 * MIB, None).unwrap(),
    ];
    let s = streams(&device, 4);
    let mut rng = SplitMix64(15);
    for pool in &pools {
        let mut live: BTreeMap<u64, (usize, StreamId, usize)> = BTreeMap::new();
        for step in 0..400 {
            if live.len() < 40 && rng.next() % 3 != 0 {
                let size = match rng.next() % 8 {
                    0 => 1 + rng.next() as usize % (8 * MIB),
                    _ => 1 + rng.next() as usize % (64 << 10),
                };
                let i = rng.next() as usize % s.len();
                let p = pool.try_allocate(size, &s[i]).unwrap();
                live.insert(p.addr(), (size, s[i].id(), i));
            } else if let Some((&addr, _)) =
                live.iter().nth(rng.next() as usize % live.len().max(1))
            {
                let (size, _, i) = live.remove(&addr).unwrap();
                // Sometimes freed on another stream than the one it was allocated on.
                let i = if rng.next() % 4 == 0 {
                    (i + 1) % s.len()
                } else {
                    i
                };
                unsafe { pool.deallocate(DevicePtr::from_raw(addr), size, &s[i]) };
            }
            if step % 50 == 49 {
                let snap = pool.snapshot().unwrap();
                assert_tiled(&snap);
                let expected = live
                    .iter()
                    .map(|(&a, &(n, id, _))| (a, (rounded(n), id)))
                    .collect();
                assert_live(&snap, &expected);
                let stats = pool.statistics();
                assert_eq!(snap.reserved_bytes(), pool.pool_size());
                let f = snap.fragmentation();
                assert_eq!(f.free_bytes(), stats.free_bytes, "{f}");
                assert_eq!(f.live_bytes, stats.reserved_bytes - stats.free_bytes, "{f}");
                assert!(
                    stats.largest_free_block <= f.largest_free_block,
                    "{stats:?} {f}"
                );
            }
        }
        for (addr, (size, _, i)) in std::mem::take(&mut live) {
            unsafe { pool.deallocate(DevicePtr::from_raw(addr), size, &s[i]) };
        }
        assert_eq!(pool.snapshot().unwrap().live_bytes(), 0);
    }
}

/// An adaptor over a pool shows the pool's own snapshot.
pub fn adaptors_show_the_pools_snapshot(device: Device) {
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 8 * MIB, None).unwrap();
    let counted = StatisticsAdaptor::new(pool.clone());
    let limited = LimitingAdaptor::new(counted.clone(), 64 * MIB);
    let s = streams(&device, 2);
    let p = limited.try_allocate(3 * MIB, &s[0]).unwrap();
    let q = counted.try_allocate(1000, &s[1]).unwrap();
    unsafe { limited.deallocate(p, 3 * MIB, &s[0]) };
    let own = picture(&pool.snapshot().unwrap());
    assert!(!own.is_empty());
    assert_eq!(picture(&counted.snapshot().unwrap()), own);
    assert_eq!(picture(&limited.snapshot().unwrap()), own);
    assert_eq!(limited.fragmentation(), pool.fragmentation());
    unsafe { counted.deallocate(q, 1000, &s[1]) };
}

/// A mapped pool's segments are its mapped page runs (reserved address space that is not
/// mapped is no segment); live blocks carry their stream; a free block is free on the stream
/// that freed it; pages given back leave the picture.
pub fn mapped_pool_segments_are_mapped_ranges(device: Device) {
    let config = MappedPoolConfig::default().release_threshold(usize::MAX);
    let pool = MappedPoolResource::with_config(&device, config).unwrap();
    let g = pool.statistics().granularity;
    let s = streams(&device, 2);
    let snap = pool.snapshot().expect("a mapped pool takes snapshots");
    assert_eq!(snap.resource, "mapped-pool");
    assert!(snap.segments.is_empty(), "nothing mapped: {snap:#?}");

    // Both above 1 MiB: placed from the bottom of the range, `q` right above `p`.
    let p = pool.try_allocate(g + g / 4, &s[0]).unwrap();
    let q = pool.try_allocate(g / 2 + 256, &s[1]).unwrap();
    let snap = pool.snapshot().unwrap();
    assert_eq!(snap.capacity, pool.capacity_limit());
    assert_eq!(snap.reserved_bytes(), pool.statistics().reserved_bytes);
    assert_eq!(snap.segments.len(), 1, "{snap:#?}");
    assert_eq!(snap.segments[0].address, p);
    assert_eq!(snap.segments[0].bytes, 2 * g);
    assert_tiled(&snap);
    let live = BTreeMap::from([
        (p.addr(), (g + g / 4, s[0].id())),
        (q.addr(), (g / 2 + 256, s[1].id())),
    ]);
    assert_live(&snap, &live);

    unsafe { pool.deallocate(p, g + g / 4, &s[0]) };
    let snap = pool.snapshot().unwrap();
    assert_tiled(&snap);
    let (_, freed) = snap.blocks().find(|(_, b)| b.address == p).unwrap();
    assert_eq!(
        (freed.state, freed.stream),
        (BlockState::FreeOnStream, Some(s[0].id()))
    );
    let f = snap.fragmentation();
    assert_eq!(f.free_on_stream, [(s[0].id(), g + g / 4)], "{f}");
    assert_eq!(f.largest_free_block, g + g / 4, "{f}");

    unsafe { pool.deallocate(q, g / 2 + 256, &s[1]) };
    pool.trim_blocking().unwrap();
    assert!(pool.snapshot().unwrap().segments.is_empty());
    assert_eq!(pool.fragmentation().unwrap().reserved_bytes, 0);
}

/// Instantiates the snapshot cases of the pools for one device.
#[macro_export]
macro_rules! snapshot_pool_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::snapshot_pool_suite as suite;

            $(#[$attr])* #[test] fn wholly_free_pool_over_streams_is_one_extent() { suite::wholly_free_pool_over_streams_is_one_extent($device) }
            $(#[$attr])* #[test] fn a_fresh_pool_is_free_for_every_stream() { suite::a_fresh_pool_is_free_for_every_stream($device) }
            $(#[$attr])* #[test] fn free_states_follow_the_streams() { suite::free_states_follow_the_streams($device) }
            $(#[$attr])* #[test] fn blocks_tile_chunks_and_match_allocations() { suite::blocks_tile_chunks_and_match_allocations($device) }
            $(#[$attr])* #[test] fn adaptors_show_the_pools_snapshot() { suite::adaptors_show_the_pools_snapshot($device) }
            $(#[$attr])* #[test] fn mapped_pool_segments_are_mapped_ranges() { suite::mapped_pool_segments_are_mapped_ranges($device) }
        }
    };
}
