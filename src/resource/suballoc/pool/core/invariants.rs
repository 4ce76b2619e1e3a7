//! The core's invariants, checked exhaustively, and views of its state for tests.

use super::classes::{class_index, class_of, FL_COUNT, SL_COUNT};
use super::slab::NIL;
use super::state::PoolCore;
use super::types::{ChunkId, StreamKey, ALIGN_LOG2};
use crate::resource::contract::size::ALIGN;

impl PoolCore {
    /// The free blocks as `(start, size, owner)`, in address order.
    pub(super) fn free_blocks(&self) -> Vec<(u64, u64, StreamKey)> {
        let mut out: Vec<_> = self
            .blocks
            .iter()
            .filter(|b| b.is_free())
            .map(|b| (b.start, b.size, self.stream(b.stream).key))
            .collect();
        out.sort_unstable();
        out
    }

    /// The chunks as `(base, size, id)`, in address order.
    pub(super) fn chunks(&self) -> Vec<(u64, u64, ChunkId)> {
        self.chunks
            .iter()
            .map(|(&base, c)| (base, c.size, c.id))
            .collect()
    }

    /// Checks every invariant exhaustively; panics with a description of the first broken one.
    pub(super) fn check_invariants(&self) {
        // Streams: map and slots agree; the cache is not stale.
        assert_eq!(
            self.stream_slots.len() + self.vacant_streams.len(),
            self.streams.len()
        );
        for (&key, &slot) in &self.stream_slots {
            assert_eq!(self.stream(slot).key, StreamKey(key));
        }
        for &slot in &self.vacant_streams {
            assert!(self.streams[slot as usize].is_none());
        }
        if self.last_stream.1 != NIL {
            assert_eq!(
                self.stream_slots.get(&self.last_stream.0 .0),
                Some(&self.last_stream.1),
                "stale stream cache"
            );
        }

        // Chunks: aligned, disjoint, counted, tiled exactly by their physical lists.
        let mut chunk_bytes = 0;
        let mut prev_end = 0;
        let (mut reached, mut free_reached, mut used_reached) = (0, 0, 0);
        for (&base, chunk) in &self.chunks {
            assert!(base % ALIGN as u64 == 0 && chunk.size % ALIGN as u64 == 0 && chunk.size > 0);
            assert!(prev_end <= base, "chunks overlap at {base:#x}");
            prev_end = base + chunk.size;
            chunk_bytes += chunk.size;
            let mut at = base;
            let mut prev = NIL;
            let mut idx = chunk.first;
            while idx != NIL {
                let b = self.blocks[idx as usize];
                assert_ne!(b.stream, NIL, "vacant slot {idx} in chunk {base:#x}");
                assert_eq!(b.start, at, "{b:?}: gap or overlap in chunk {base:#x}");
                assert!(b.size % ALIGN as u64 == 0 && b.size > 0, "{b:?} size");
                assert_eq!(b.prev_phys, prev, "{b:?} physical back link");
                if b.is_free() {
                    assert!(self.streams[b.stream as usize].is_some(), "{b:?} owner");
                    let owner = self.stream(b.stream);
                    assert!(
                        self.is_coalesced(idx) || owner.lazy && owner.uncoalesced,
                        "{b:?} not coalesced"
                    );
                    let seq = self.stream(b.stream).seq;
                    let behind = (seq as u32).wrapping_sub(b.freed);
                    assert!(
                        seq > 0 && u64::from(behind) < seq,
                        "{b:?} stamped {} with its stream at change {seq}",
                        b.freed
                    );
                    free_reached += 1;
                } else {
                    assert_eq!(self.live.get(b.start), Some(idx), "{b:?} not in live");
                    used_reached += 1;
                }
                reached += 1;
                at = b.end();
                prev = idx;
                idx = b.next_phys;
            }
            assert_eq!(
                at,
                base + chunk.size,
                "chunk {base:#x} not tiled to its end"
            );
        }
        assert_eq!(chunk_bytes, self.chunk_bytes, "chunk_bytes");
        assert_eq!(
            used_reached,
            self.live.len(),
            "live has blocks outside the chunks"
        );
        assert_eq!(free_reached, self.free_count, "free_count");

        // Slab: every slot is in a chunk or on the vacant list.
        let mut vacant = 0;
        let mut v = self.vacant;
        while v != NIL {
            assert_eq!(
                self.blocks[v as usize].stream, NIL,
                "block on the vacant list"
            );
            vacant += 1;
            v = self.blocks[v as usize].next;
        }
        assert_eq!(reached + vacant, self.blocks.len(), "slab slots lost");

        // Each stream's index: bitmaps iff lists, lists well linked, classes right, counts.
        let (mut total, mut on_lists) = (0, 0);
        for (slot, s) in self.streams.iter().enumerate() {
            let Some(s) = s else { continue };
            let (mut bytes, mut blocks) = (0, 0);
            for fl in 0..FL_COUNT {
                assert_eq!(
                    s.fl_bitmap & (1 << fl) != 0,
                    s.sl_bitmaps[fl] != 0,
                    "first-level bit {fl}"
                );
                for sl in 0..SL_COUNT {
                    let head = s.heads[class_index(fl, sl)];
                    assert_eq!(
                        s.sl_bitmaps[fl] & (1 << sl) != 0,
                        head != NIL,
                        "bit of class ({fl}, {sl})"
                    );
                    let mut prev = NIL;
                    let mut idx = head;
                    while idx != NIL {
                        let b = self.blocks[idx as usize];
                        assert_eq!(b.stream, slot as u32, "{b:?} on another stream's list");
                        assert_eq!(class_of(b.size >> ALIGN_LOG2), (fl, sl), "{b:?} class");
                        assert_eq!(b.prev, prev, "{b:?} back link");
                        bytes += b.size;
                        blocks += 1;
                        prev = idx;
                        idx = b.next;
                    }
                }
            }
            assert_eq!(bytes, s.free_bytes, "free bytes of {:?}", s.key);
            assert_eq!(blocks, s.blocks, "block count of {:?}", s.key);
            total += bytes;
            on_lists += blocks;
        }
        assert_eq!(
            on_lists, self.free_count,
            "free blocks missing from the class lists"
        );
        assert_eq!(total, self.free_bytes, "free_bytes");
        let live_bytes: u64 = self
            .live
            .values()
            .map(|&i| self.blocks[i as usize].size)
            .sum();
        assert_eq!(self.free_bytes + live_bytes, self.chunk_bytes, "bytes lost");
    }
}
