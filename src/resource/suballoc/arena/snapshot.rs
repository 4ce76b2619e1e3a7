//! The arena's [`MemorySnapshot`]: its extents, cut at the edges of every superblock that holds
//! a live block, with the global arena's and the stream arenas' blocks in them.
//!
//! Why cut there: a stream arena's free blocks never join across a superblock's edge, and a
//! superblock with a live block stays in its stream's arena; a wholly free superblock goes back
//! to the global arena on exhaustion, where it joins its free neighbours. With those
//! superblocks as segments of their own, the free extents that
//! [`Fragmentation`](crate::Fragmentation) reads (runs of adjacent free blocks in one segment)
//! are exactly what the arena can serve.

use super::core::consts::PAGE_SIZE;
use super::core::Piece;
use super::levels::Inner;
use crate::ids::StreamId;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::{Block, BlockState, MemorySnapshot, Segment};
use crate::resource::suballoc::stream_order::Fence;

impl<R: MemoryResource> Inner<R> {
    /// Takes the registry's read lock, every stream arena's lock and the global arena's lock
    /// at once (in the arena's lock order), so that no superblock moves while it reads; copies,
    /// then builds the snapshot after letting them go.
    pub(super) fn take_snapshot(&self) -> MemorySnapshot {
        // (address, bytes, state, stream) of every block.
        let mut blocks: Vec<(u64, u64, BlockState, Option<StreamId>)> = Vec::new();
        // (base, bytes, stream) of every superblock that holds a live block.
        let mut busy: Vec<(u64, u64, StreamId)> = Vec::new();
        let (ranges, large, extents) = {
            let registry = self.registry.read();
            let guards: Vec<_> = (0..registry.used)
                .map(|i| self.slots.get(i).state.lock())
                .collect();
            for state in &guards {
                let Some(key) = state.key else { continue };
                let home = key.stream;
                for (base, size, holds_live) in state.core.superblock_uses() {
                    if holds_live {
                        busy.push((base, size, home));
                    }
                }
                for (start, size, piece) in state.core.pieces() {
                    let (what, stream) = match piece {
                        // A pending block (freed on another stream) is the arena stream's too:
                        // it reclaims it when it needs it, its stream waiting (on the device)
                        // for the freeing stream's event; no other stream gets it before.
                        Piece::Free | Piece::Pending(_) => (BlockState::FreeOnStream, home),
                        Piece::Live(None) => (BlockState::Live, home),
                        Piece::Live(Some(Fence(by))) => (BlockState::Live, by.stream_id()),
                    };
                    blocks.push((start, size, what, Some(stream)));
                }
            }
            let global = self.global.lock();
            let ranges: Vec<(u64, u64, Vec<Fence>)> = global
                .free_ranges()
                .iter()
                .map(|&(start, pages, fences)| (start, pages, fences.to_vec()))
                .collect();
            (ranges, global.large_blocks(), self.extents.list())
        };
        // Global pages to addresses, through the extent that holds them.
        let page = PAGE_SIZE as u64;
        let addr_of = |p: u64| {
            extents
                .iter()
                .find(|&&(_, _, first, pages)| p >= first && p < first + pages)
                .map(|&(base, _, first, _)| base + (p - first) * page)
        };
        // A global range is free for every stream once each stream that freed into it has
        // passed its frees; until then another stream's request waits for the free's event
        // (`wait_fences`), so the range is free on the first stream that has not.
        let global_free = |fences: &[Fence]| match fences.iter().find(|f| !f.0.passed()) {
            Some(Fence(by)) => (BlockState::FreeOnStream, Some(by.stream_id())),
            None => (BlockState::Free, None),
        };
        for (start, pages, state, stream) in ranges
            .iter()
            .map(|(s, n, fences)| {
                let (state, stream) = global_free(fences);
                (*s, *n, state, stream)
            })
            .chain(
                large
                    .iter()
                    .map(|&(s, n, by)| (s, n, BlockState::Live, Some(StreamId(by)))),
            )
        {
            if let Some(at) = addr_of(start) {
                blocks.push((at, pages * page, state, stream));
            }
        }
        blocks.sort_unstable_by_key(|b| b.0);
        busy.sort_unstable();

        let mut snap = MemorySnapshot::new(self.device.id(), "arena");
        snap.capacity = Some(match self.growth {
            Some(g) => g.maximum,
            None => self.extents.held(),
        });
        let mut extents: Vec<(u64, usize)> = extents.iter().map(|&(b, n, _, _)| (b, n)).collect();
        extents.sort_unstable();
        for (base, bytes) in extents {
            let end = base + bytes as u64;
            let mut at = base;
            let first = busy.partition_point(|&(b, _, _)| b < base);
            for &(sb, size, stream) in busy[first..].iter().take_while(|&&(b, _, _)| b < end) {
                if sb > at {
                    snap.segments
                        .push(Segment::new(DevicePtr::from_raw(at), (sb - at) as usize));
                }
                let mut s = Segment::new(DevicePtr::from_raw(sb), size as usize);
                s.stream = Some(stream);
                snap.segments.push(s);
                at = sb + size;
            }
            if at < end {
                snap.segments
                    .push(Segment::new(DevicePtr::from_raw(at), (end - at) as usize));
            }
        }
        // Blocks into their segments (both in address order).
        let mut next = 0;
        for segment in &mut snap.segments {
            let end = segment.address.addr() + segment.bytes as u64;
            while next < blocks.len() && blocks[next].0 < end {
                let (at, size, state, stream) = blocks[next];
                debug_assert!(at >= segment.address.addr(), "a block outside the extents");
                let mut b = Block::new(DevicePtr::from_raw(at), size as usize, state);
                b.stream = stream;
                segment.blocks.push(b);
                next += 1;
            }
        }
        snap
    }
}
