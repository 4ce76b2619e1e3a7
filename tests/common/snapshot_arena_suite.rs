//! Snapshots of the arena, fixed-size and binning resources ([`MemoryResource::snapshot`]): the
//! blocks tile their segments without overlap, the live blocks are the allocations, frees on
//! one stream or another read as the states the resources document, and the fragmentation
//! figures say what the resource would actually serve (checked by serving it).
//!
//! `snapshot_arena_suite!` instantiates it for one device expression.

use std::collections::BTreeMap;

use streamalloc::{
    ArenaResource, BinningResource, BlockState, CudaResource, Device, DevicePtr, FixedSizeResource,
    MemoryResource, MemorySnapshot, PoolResource, StatisticsAdaptor, Stream, StreamId,
};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn free(mr: &impl MemoryResource, p: DevicePtr, bytes: usize, s: &Stream) {
    // SAFETY: every caller frees what it allocated from `mr` with the same size, unused.
    unsafe { mr.deallocate(p, bytes, s) }
}

fn arena(device: &Device, size: usize) -> ArenaResource<CudaResource> {
    ArenaResource::new(CudaResource::new(device).unwrap(), Some(size)).unwrap()
}

/// `(address, bytes, state, stream)` of every block, in snapshot order.
type Row = (u64, usize, BlockState, Option<StreamId>);

fn rows(snap: &MemorySnapshot) -> Vec<Row> {
    snap.blocks()
        .map(|(_, b)| (b.address.addr(), b.bytes, b.state, b.stream))
        .collect()
}

/// Segments in address order and apart; blocks in address order, inside their segment, apart;
/// when `tiled`, each segment's blocks cover it exactly.
fn check_layout(snap: &MemorySnapshot, tiled: bool) {
    let mut end = 0u64;
    for s in &snap.segments {
        let start = s.address.addr();
        assert!(start >= end, "segment {start:#x} overlaps the one before");
        let seg_end = start + s.bytes as u64;
        let mut at = start;
        for b in &s.blocks {
            let a = b.address.addr();
            assert!(b.bytes > 0, "an empty block at {a:#x}");
            if tiled {
                assert_eq!(a, at, "gap or overlap at {a:#x} in segment {start:#x}");
            } else {
                assert!(a >= at, "block {a:#x} overlaps the one before");
            }
            at = b.end();
            assert!(at <= seg_end, "block {a:#x} past its segment's end");
        }
        if tiled {
            assert_eq!(at, seg_end, "segment {start:#x} not covered to its end");
        }
        end = seg_end;
    }
}

/// The live blocks: address → (bytes, stream).
fn live(snap: &MemorySnapshot) -> BTreeMap<u64, (usize, Option<StreamId>)> {
    snap.blocks()
        .filter(|(_, b)| b.state == BlockState::Live)
        .map(|(_, b)| (b.address.addr(), (b.bytes, b.stream)))
        .collect()
}

fn state_at(snap: &MemorySnapshot, addr: DevicePtr) -> (BlockState, Option<StreamId>) {
    let (_, b) = snap
        .blocks()
        .find(|(_, b)| b.address.addr() <= addr.addr() && addr.addr() < b.end())
        .unwrap_or_else(|| panic!("no block holds {addr}"));
    (b.state, b.stream)
}

/// The arena's blocks tile its memory, and its live blocks are the allocations, on the stream
/// that made them (large ones in whole pages).
pub fn arena_blocks_tile_and_match_allocations(device: Device) {
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let mr = arena(&device, 8 * MIB);
    let mut made = Vec::new();
    for (i, bytes) in [1000, 256, 4 * KIB, 70 * KIB, 1, 3 * MIB]
        .into_iter()
        .enumerate()
    {
        let s = if i % 2 == 0 { &a } else { &b };
        made.push((mr.try_allocate(bytes, s).unwrap(), bytes, s.clone()));
    }
    let snap = mr.snapshot().expect("an arena answers snapshot");
    assert_eq!(snap.resource, "arena");
    assert_eq!(snap.capacity, Some(8 * MIB));
    assert_eq!(snap.device, device.id());
    assert_eq!(snap.reserved_bytes(), 8 * MIB);
    check_layout(&snap, true);
    let live = live(&snap);
    assert_eq!(live.len(), made.len(), "{live:?}");
    for (p, bytes, s) in &made {
        let (held, stream) = live[&p.addr()];
        assert!(held >= *bytes && held % 256 == 0, "{p}: {held} for {bytes}");
        assert_eq!(stream, Some(s.id()), "{p}");
        if *bytes > MIB {
            assert_eq!(held, 3 * MIB, "a large block is whole pages");
        }
    }
    assert_eq!(snap.live_bytes(), mr.statistics().live_bytes);
    for (p, bytes, s) in made {
        free(&mr, p, bytes, &s);
    }
}

/// A block freed on its arena's stream is free on that stream; one freed on another stream
/// stays in the arena it lies in, free on that arena's stream (which reclaims it after waiting
/// for the freeing stream); a large block goes back to the global arena, free on the stream
/// that freed it until that stream passes an event recorded after the free (the arena records
/// one when another stream takes the memory); after `defragment` everything is free, and for
/// every stream once those events have passed.
pub fn arena_frees_on_own_and_other_streams(device: Device) {
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let c = Stream::new(&device).unwrap();
    let mr = arena(&device, 8 * MIB);
    let p = mr.try_allocate(4 * KIB, &a).unwrap();
    let q = mr.try_allocate(4 * KIB, &a).unwrap();
    let keep = mr.try_allocate(4 * KIB, &a).unwrap();
    let large = mr.try_allocate(2 * MIB, &a).unwrap();
    free(&mr, p, 4 * KIB, &a);
    b.wait(&a.record().unwrap()).unwrap();
    free(&mr, q, 4 * KIB, &b);
    free(&mr, large, 2 * MIB, &b);
    let snap = mr.snapshot().unwrap();
    check_layout(&snap, true);
    assert_eq!(state_at(&snap, p), (BlockState::FreeOnStream, Some(a.id())));
    assert_eq!(state_at(&snap, q), (BlockState::FreeOnStream, Some(a.id())));
    assert_eq!(state_at(&snap, keep), (BlockState::Live, Some(a.id())));
    assert_eq!(
        state_at(&snap, large),
        (BlockState::FreeOnStream, Some(b.id()))
    );
    // Nothing is lost: live, free and free-on-a-stream make up the arena.
    let f = snap.fragmentation();
    assert_eq!(f.live_bytes + f.free_bytes(), 8 * MIB);
    assert_eq!(f.live_bytes, 4 * KIB);

    free(&mr, keep, 4 * KIB, &a);
    assert_eq!(mr.defragment(), MIB);
    let snap = mr.snapshot().unwrap();
    assert!(
        snap.blocks().all(|(_, blk)| blk.state.is_free()),
        "{:?}",
        rows(&snap)
    );
    // `c` takes a superblock: the arena records events on `a` and `b` and makes `c` wait for
    // them; once they have passed, the rest is free for every stream.
    let small = mr.try_allocate(4 * KIB, &c).unwrap();
    a.synchronize_blocking().unwrap();
    b.synchronize_blocking().unwrap();
    let all_free = |snap: &MemorySnapshot| {
        snap.blocks()
            .filter(|(_, blk)| blk.state != BlockState::Live)
            .all(|(seg, blk)| {
                seg.stream == Some(c.id())
                    || (blk.state == BlockState::Free && blk.stream.is_none())
            })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !all_free(&mr.snapshot().unwrap()) {
        let rows = rows(&mr.snapshot().unwrap());
        assert!(std::time::Instant::now() < deadline, "{rows:?}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let f = mr.fragmentation().unwrap();
    assert_eq!(f.largest_free_now, 7 * MIB, "{f}");
    free(&mr, small, 4 * KIB, &c);
}

/// An arena wholly free, its superblocks freed on four streams (some into other streams'
/// arenas), reads as one extent of its whole size, and a request of that size succeeds.
pub fn arena_wholly_free_over_streams_is_one_extent(device: Device) {
    let streams: Vec<Stream> = (0..4).map(|_| Stream::new(&device).unwrap()).collect();
    let mr = arena(&device, 4 * MIB);
    let blocks: Vec<(DevicePtr, usize)> = streams
        .iter()
        .map(|s| (mr.try_allocate(512 * KIB, s).unwrap(), 512 * KIB))
        .collect();
    for (i, &(p, bytes)) in blocks.iter().enumerate() {
        let by = &streams[(i + 1) % 4];
        by.wait(&streams[i].record().unwrap()).unwrap();
        free(&mr, p, bytes, by);
    }
    let f = mr.fragmentation().expect("an arena answers fragmentation");
    assert_eq!(f.largest_free_block, 4 * MIB, "{f}");
    assert_eq!(f.free_bytes(), 4 * MIB);
    assert_eq!(f.fragmentation_ratio(), 0.0);
    let p = mr.try_allocate(4 * MIB, &streams[0]).unwrap();
    free(&mr, p, 4 * MIB, &streams[0]);
}

/// Free memory never reads as joined across the edge of a superblock that holds a live block:
/// the largest free extent is what the arena then serves, and no more.
pub fn arena_largest_free_block_is_what_it_serves(device: Device) {
    let streams: Vec<Stream> = (0..4).map(|_| Stream::new(&device).unwrap()).collect();
    let mr = arena(&device, 4 * MIB);
    // One superblock per stream, in address order; the second keeps a block.
    let blocks: Vec<DevicePtr> = streams
        .iter()
        .map(|s| mr.try_allocate(256, s).unwrap())
        .collect();
    for (i, &p) in blocks.iter().enumerate() {
        if i != 1 {
            free(&mr, p, 256, &streams[i]);
        }
    }
    let f = mr.fragmentation().unwrap();
    // Superblocks 2 and 3 join (on exhaustion they go back to the global arena); superblock
    // 1's free tail stays in its arena, apart from superblock 0.
    assert_eq!(f.largest_free_block, 2 * MIB, "{f}");
    assert_eq!(f.free_bytes(), 4 * MIB - 256);
    assert!(mr
        .try_allocate(2 * MIB + 64 * KIB, &streams[0])
        .unwrap_err()
        .is_out_of_memory());
    let p = mr.try_allocate(2 * MIB, &streams[0]).unwrap();
    free(&mr, p, 2 * MIB, &streams[0]);
    free(&mr, blocks[1], 256, &streams[1]);
}

/// A fixed-size resource: one segment per upstream chunk, blocks that never join, free on the
/// stream whose list holds them.
pub fn fixed_size_blocks_never_merge(device: Device) {
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let mr = FixedSizeResource::new(CudaResource::new(&device).unwrap(), 64 * KIB, 8).unwrap();
    let blocks: Vec<DevicePtr> = (0..4).map(|_| mr.try_allocate(1000, &a).unwrap()).collect();
    free(&mr, blocks[0], 1000, &a);
    free(&mr, blocks[1], 1000, &a);
    free(&mr, blocks[2], 1000, &b);
    let snap = mr
        .snapshot()
        .expect("a fixed-size resource answers snapshot");
    assert_eq!(snap.resource, "fixed-size");
    assert_eq!(snap.segments.len(), 1);
    assert!(!snap.segments[0].coalesces);
    assert_eq!(snap.reserved_bytes(), 8 * 64 * KIB);
    check_layout(&snap, true);
    assert!(snap.blocks().all(|(_, b)| b.bytes == 64 * KIB));
    assert_eq!(
        state_at(&snap, blocks[0]),
        (BlockState::FreeOnStream, Some(a.id()))
    );
    assert_eq!(
        state_at(&snap, blocks[2]),
        (BlockState::FreeOnStream, Some(b.id()))
    );
    assert_eq!(state_at(&snap, blocks[3]).0, BlockState::Live);
    let f = snap.fragmentation();
    assert_eq!(f.largest_free_block, 64 * KIB, "{f}");
    assert_eq!(f.free_bytes(), 7 * 64 * KIB);
    // The fresh chunk's blocks were on the list of the stream it was taken on; `a` took
    // some over and freed two; `b` freed one.
    let on = |s: &Stream| {
        f.free_on_stream
            .iter()
            .find(|(id, _)| *id == s.id())
            .map(|x| x.1)
    };
    assert!(on(&a).unwrap() >= 2 * 64 * KIB, "{f:?}");
    assert_eq!(on(&b), Some(64 * KIB));
    assert_eq!(f.largest_free_for(b.id()), 64 * KIB);
    assert_eq!(mr.fragmentation().unwrap(), f);
    // A second chunk: a second segment.
    let more: Vec<DevicePtr> = (0..8)
        .map(|_| mr.try_allocate(64 * KIB, &a).unwrap())
        .collect();
    let snap = mr.snapshot().unwrap();
    assert_eq!(snap.segments.len(), 2);
    check_layout(&snap, true);
    assert_eq!(snap.live_bytes(), 9 * 64 * KIB);
    for p in more.into_iter().chain([blocks[3]]) {
        free(&mr, p, 64 * KIB, &a);
    }
}

/// Binning over an arena: the bins' chunks are the arena's allocations, shown once, as the
/// bins' segments (blocks that never join) in place of the arena's live blocks; the live
/// blocks are the user's allocations only.
pub fn binning_over_an_arena_counts_bin_chunks_once(device: Device) {
    let s = Stream::new(&device).unwrap();
    let up = arena(&device, 16 * MIB);
    let mr = BinningResource::with_range(up.clone(), 12, 14).unwrap(); // 4, 8, 16 KiB
    let small = mr.try_allocate(3000, &s).unwrap();
    let mid = mr.try_allocate(10 * KIB, &s).unwrap();
    let large = mr.try_allocate(2 * MIB, &s).unwrap();
    let snap = mr.snapshot().expect("binning answers snapshot");
    let under = up.snapshot().unwrap();
    assert_eq!(snap.resource, "binning");
    assert_eq!(snap.reserved_bytes(), under.reserved_bytes());
    assert_eq!(snap.reserved_bytes(), 16 * MIB);
    check_layout(&snap, false);
    let live = live(&snap);
    let addrs: Vec<u64> = live.keys().copied().collect();
    let mut want = vec![small.addr(), mid.addr(), large.addr()];
    want.sort_unstable();
    assert_eq!(addrs, want);
    assert_eq!(live[&small.addr()].0, 4 * KIB);
    assert_eq!(live[&mid.addr()].0, 16 * KIB);
    // Three bins of 128 blocks each: three segments that do not coalesce.
    let bins: Vec<_> = snap.segments.iter().filter(|s| !s.coalesces).collect();
    assert_eq!(bins.len(), 3);
    let chunk_bytes: usize = bins.iter().map(|s| s.bytes).sum();
    assert_eq!(chunk_bytes, 128 * (4 + 8 + 16) * KIB);
    let f = snap.fragmentation();
    assert_eq!(f.live_bytes, 20 * KIB + 2 * MIB);
    for (p, bytes) in [(small, 3000), (mid, 10 * KIB), (large, 2 * MIB)] {
        free(&mr, p, bytes, &s);
    }
}

/// Binning over a pool: bins and large requests share the pool; its snapshot counts each byte
/// once (the pool's own when it answers, the bins' chunks otherwise).
pub fn binning_over_a_pool(device: Device) {
    let s = Stream::new(&device).unwrap();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 32 * MIB, None).unwrap();
    let mr = BinningResource::with_range(pool.clone(), 12, 13).unwrap();
    let small = mr.try_allocate(100, &s).unwrap();
    let large = mr.try_allocate(MIB, &s).unwrap();
    let snap = mr.snapshot().unwrap();
    assert_eq!(snap.resource, "binning");
    check_layout(&snap, false);
    let bins = 128 * (4 + 8) * KIB;
    match pool.snapshot() {
        Some(under) => {
            assert_eq!(snap.reserved_bytes(), under.reserved_bytes());
            assert!(live(&snap).contains_key(&large.addr()));
            // The bins' chunks, nested where the pool has them live.
            let chunks: Vec<_> = snap.segments.iter().filter(|s| !s.coalesces).collect();
            assert_eq!(chunks.iter().map(|s| s.bytes).sum::<usize>(), bins);
            assert_eq!(snap.live_bytes(), 4 * KIB + under_live(&under, large));
        }
        None => assert_eq!(snap.reserved_bytes(), bins),
    }
    assert!(live(&snap).contains_key(&small.addr()));
    free(&mr, small, 100, &s);
    free(&mr, large, MIB, &s);
}

/// The bytes of `under`'s live block at `p`.
fn under_live(under: &MemorySnapshot, p: DevicePtr) -> usize {
    live(under)[&p.addr()].0
}

/// An adaptor passes the resource's snapshot through unchanged.
pub fn snapshot_through_an_adaptor_is_the_resources(device: Device) {
    let s = Stream::new(&device).unwrap();
    let mr = StatisticsAdaptor::new(arena(&device, 4 * MIB));
    let p = mr.try_allocate(5000, &s).unwrap();
    let own = mr.upstream().snapshot().unwrap();
    let through = mr.snapshot().unwrap();
    assert_eq!(rows(&through), rows(&own));
    assert_eq!(
        (through.resource.as_str(), through.capacity),
        ("arena", Some(4 * MIB))
    );
    assert_eq!(mr.fragmentation(), mr.upstream().fragmentation());
    let fixed = StatisticsAdaptor::new(
        FixedSizeResource::new(CudaResource::new(&device).unwrap(), 4 * KIB, 4).unwrap(),
    );
    let q = fixed.try_allocate(1, &s).unwrap();
    assert_eq!(
        rows(&fixed.snapshot().unwrap()),
        rows(&fixed.upstream().snapshot().unwrap())
    );
    free(&fixed, q, 1, &s);
    free(&mr, p, 5000, &s);
}

/// Instantiates the snapshot cases of the arena, fixed-size and binning resources for one
/// device.
#[macro_export]
macro_rules! snapshot_arena_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::snapshot_arena_suite as suite;

            $(#[$attr])* #[test] fn arena_blocks_tile_and_match_allocations() { suite::arena_blocks_tile_and_match_allocations($device) }
            $(#[$attr])* #[test] fn arena_frees_on_own_and_other_streams() { suite::arena_frees_on_own_and_other_streams($device) }
            $(#[$attr])* #[test] fn arena_wholly_free_over_streams_is_one_extent() { suite::arena_wholly_free_over_streams_is_one_extent($device) }
            $(#[$attr])* #[test] fn arena_largest_free_block_is_what_it_serves() { suite::arena_largest_free_block_is_what_it_serves($device) }
            $(#[$attr])* #[test] fn fixed_size_blocks_never_merge() { suite::fixed_size_blocks_never_merge($device) }
            $(#[$attr])* #[test] fn binning_over_an_arena_counts_bin_chunks_once() { suite::binning_over_an_arena_counts_bin_chunks_once($device) }
            $(#[$attr])* #[test] fn binning_over_a_pool() { suite::binning_over_a_pool($device) }
            $(#[$attr])* #[test] fn snapshot_through_an_adaptor_is_the_resources() { suite::snapshot_through_an_adaptor_is_the_resources($device) }
        }
    };
}
