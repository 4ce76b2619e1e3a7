//! The blocks that tile each chunk: a slab of them, linked in address order per chunk, and
//! the coalescing of a freed block with its physical neighbours of the same stream (see
//! "Blocks" in the [core's documentation](super)).

use super::classes::same_class;
use super::slab::{Block, NIL, USED};
use super::state::PoolCore;
use super::types::StreamKey;

impl PoolCore {
    /// Links the free, unlinked block `idx` into its stream's index, merged with its physical
    /// neighbours of the same stream ([`merge_and_link`](Self::merge_and_link)), unless the
    /// stream coalesces lazily ([`set_lazy_coalescing`](Self::set_lazy_coalescing)): then it
    /// is linked alone, keeping the stamp of its own free. The byte counters are the caller's.
    #[inline]
    pub(super) fn coalesce_and_link(&mut self, idx: u32) {
        let slot = self.blocks[idx as usize].stream;
        let s = self.stream_mut(slot);
        if s.lazy {
            s.uncoalesced = true;
            self.link(idx);
        } else {
            self.merge_and_link(idx);
        }
    }

    /// Merges the free, unlinked block `idx` with its physical neighbours of the same stream
    /// (the left one survives, with the newer stamp) and links the result. The byte counters
    /// are the caller's.
    #[inline]
    pub(super) fn merge_and_link(&mut self, idx: u32) {
        let Block {
            stream,
            prev_phys: left,
            next_phys: right,
            ..
        } = self.blocks[idx as usize];
        debug_assert!(stream < USED);
        let seq = self.stream(stream).seq as u32;
        // The merged block is as recent as its newest part: a taker waits for that free.
        let newer = |a: u32, b: u32| {
            if seq.wrapping_sub(a) <= seq.wrapping_sub(b) {
                a
            } else {
                b
            }
        };
        if right != NIL && self.blocks[right as usize].stream == stream {
            self.unlink(right);
            let r = self.blocks[right as usize];
            let b = &mut self.blocks[idx as usize];
            b.size += r.size;
            b.freed = newer(b.freed, r.freed);
            self.unlink_phys(right);
        }
        let survivor = if left != NIL && self.blocks[left as usize].stream == stream {
            let size = self.blocks[left as usize].size + self.blocks[idx as usize].size;
            let freed = newer(
                self.blocks[left as usize].freed,
                self.blocks[idx as usize].freed,
            );
            self.blocks[left as usize].freed = freed;
            self.unlink_phys(idx);
            self.resize(left, size);
            left
        } else {
            self.link(idx);
            idx
        };
        // (A lazy stream's other blocks may still wait for their own merge.)
        debug_assert!(self.stream(stream).lazy || self.is_coalesced(survivor));
    }

    /// Takes block `idx`, already merged into its left neighbour's size (or the other way
    /// round) and off any class list, out of its chunk's physical list and frees its slot.
    pub(super) fn unlink_phys(&mut self, idx: u32) {
        let Block {
            prev_phys,
            next_phys,
            ..
        } = self.blocks[idx as usize];
        debug_assert!(
            prev_phys != NIL,
            "a chunk's first block is never merged away"
        );
        self.blocks[prev_phys as usize].next_phys = next_phys;
        if next_phys != NIL {
            self.blocks[next_phys as usize].prev_phys = prev_phys;
        }
        self.drop_block(idx);
    }

    /// Makes `stream`'s frees coalesce lazily from now on (nothing when it has no slot): a freed
    /// block is linked alone, with the stamp of its own free, instead of merged with its
    /// neighbours, whose frees may be older. Another stream that takes it then waits for its
    /// free only, not for the newest free of a merged block (which, freed just now, the device
    /// has not reached: a pipeline's upload would wait for the download just queued). Blocks
    /// are merged when a request finds none big enough
    /// ([`coalesce_stream`](Self::coalesce_stream)), and before chunks are released.
    pub(crate) fn set_lazy_coalescing(&mut self, stream: StreamKey) {
        if let Some(&slot) = self.stream_slots.get(&stream.0) {
            self.stream_mut(slot).lazy = true;
        }
    }

    /// Merges the lazily coalesced stream's adjacent free blocks (see
    /// [`set_lazy_coalescing`](Self::set_lazy_coalescing)); returns whether it had any to
    /// merge. O(free blocks of the stream).
    pub(crate) fn coalesce_stream(&mut self, stream: StreamKey) -> bool {
        let Some(&slot) = self.stream_slots.get(&stream.0) else {
            return false;
        };
        self.coalesce_slot(slot)
    }

    /// [`coalesce_stream`](Self::coalesce_stream) by slot.
    pub(super) fn coalesce_slot(&mut self, slot: u32) -> bool {
        if !std::mem::take(&mut self.stream_mut(slot).uncoalesced) {
            return false;
        }
        let s = self.stream(slot);
        let mut free = Vec::with_capacity(s.blocks);
        for &head in s.heads.iter() {
            let mut idx = head;
            while idx != NIL {
                free.push(idx);
                idx = self.blocks[idx as usize].next;
            }
        }
        for idx in free {
            // Merged into a neighbour already (its slot vacant or reused), or not this
            // stream's: skip.
            let b = &self.blocks[idx as usize];
            if b.stream != slot || self.is_coalesced(idx) {
                continue;
            }
            self.unlink(idx);
            self.merge_and_link(idx);
        }
        true
    }

    /// Merges every lazily coalesced stream's free blocks (before chunks are released: a
    /// wholly free chunk must be one block).
    pub(crate) fn coalesce_lazy_streams(&mut self) {
        for slot in 0..self.streams.len() as u32 {
            if self.streams[slot as usize].is_some() {
                self.coalesce_slot(slot);
            }
        }
    }

    /// Whether the free block `idx` has no physical neighbour of the same stream.
    pub(super) fn is_coalesced(&self, idx: u32) -> bool {
        let b = &self.blocks[idx as usize];
        let same = |n: u32| n != NIL && self.blocks[n as usize].stream == b.stream;
        b.is_free() && !same(b.prev_phys) && !same(b.next_phys)
    }

    /// Sets the size of the free, linked block `idx`, moving it to its new class list if the
    /// class changes.
    #[inline]
    pub(super) fn resize(&mut self, idx: u32, size: u64) {
        let old = self.blocks[idx as usize].size;
        if same_class(old, size) {
            self.blocks[idx as usize].size = size;
        } else {
            self.unlink(idx);
            self.blocks[idx as usize].size = size;
            self.link(idx);
        }
    }

    /// A new block, on no class list and in no map, in a slab slot.
    pub(super) fn new_block(
        &mut self,
        start: u64,
        size: u64,
        stream: u32,
        prev_phys: u32,
        next_phys: u32,
    ) -> u32 {
        let block = Block {
            start,
            size,
            stream,
            prev: NIL,
            next: NIL,
            prev_phys,
            next_phys,
            freed: 0,
        };
        if self.vacant != NIL {
            let idx = self.vacant;
            self.vacant = self.blocks[idx as usize].next;
            self.blocks[idx as usize] = block;
            idx
        } else {
            let idx = u32::try_from(self.blocks.len())
                .ok()
                .filter(|&i| i != NIL)
                .expect("too many blocks");
            self.blocks.push(block);
            idx
        }
    }

    /// Returns a slot, on no list and in no map, to the vacant list.
    pub(super) fn drop_block(&mut self, idx: u32) {
        let block = &mut self.blocks[idx as usize];
        block.stream = NIL;
        block.prev = NIL;
        block.prev_phys = NIL;
        block.next_phys = NIL;
        block.next = self.vacant;
        self.vacant = idx;
    }
}
