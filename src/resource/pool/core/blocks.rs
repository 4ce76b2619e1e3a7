//! The blocks that tile each chunk: a slab of them, linked in address order per chunk, and
//! the coalescing of a freed block with its physical neighbours of the same stream (see
//! "Blocks" in the [core's documentation](super)).

use super::classes::same_class;
use super::{PoolCore, StreamKey};

/// The null slab index (also [`Block::stream`] of a vacant slot).
pub(super) const NIL: u32 = u32::MAX;
/// [`Block::stream`] of an allocated block.
pub(super) const USED: u32 = u32::MAX - 1;

/// A block of a chunk, free or allocated, or a vacant slab slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    /// The first address; a multiple of [`ALIGN`](super::ALIGN).
    pub(super) start: u64,
    /// The size in bytes; a non-zero multiple of [`ALIGN`](super::ALIGN).
    pub(super) size: u64,
    /// For a free block, the slot in [`PoolCore::streams`] of the owning stream (always below
    /// [`USED`]); [`USED`] for an allocated block; [`NIL`] for a vacant slab slot.
    pub(super) stream: u32,
    /// Free blocks: the previous block of the same class list ([`NIL`] at the head).
    /// Allocated blocks: the low half of the key of the stream they were allocated for.
    pub(super) prev: u32,
    /// Free blocks: the next block of the same class list ([`NIL`] at the tail). Vacant
    /// slots: the next vacant slot. Allocated blocks: the high half of that key.
    pub(super) next: u32,
    /// The block just below in the same chunk ([`NIL`] for the chunk's first block):
    /// `blocks[prev_phys].start + blocks[prev_phys].size == start`.
    pub(super) prev_phys: u32,
    /// The block just above in the same chunk ([`NIL`] for the chunk's last block).
    pub(super) next_phys: u32,
    /// Free blocks: the low 32 bits of the number of the owning stream's latest free (or other
    /// change, [`StreamFree::seq`](super::index::StreamFree::seq)) that this block's memory
    /// took part in: what another stream that takes it must wait for. (It fits the padding.)
    pub(super) freed: u32,
}

impl Block {
    #[cfg(test)]
    pub(super) fn end(&self) -> u64 {
        self.start + self.size
    }

    pub(super) fn end_addr(&self) -> u64 {
        self.start + self.size
    }

    pub(super) fn is_free(&self) -> bool {
        self.stream < USED
    }

    /// Allocated blocks: notes the stream the block was allocated for, in its class-list
    /// links (unused while it is allocated; [`link`](PoolCore::link) sets them when it is
    /// freed).
    #[inline]
    pub(super) fn set_allocated_for(&mut self, stream: StreamKey) {
        debug_assert_eq!(self.stream, USED);
        self.prev = stream.0 as u32;
        self.next = (stream.0 >> 32) as u32;
    }

    /// Allocated blocks: the stream they were allocated for.
    pub(super) fn allocated_for(&self) -> StreamKey {
        debug_assert_eq!(self.stream, USED);
        StreamKey(u64::from(self.prev) | u64::from(self.next) << 32)
    }
}

impl PoolCore {
    /// Merges the free, unlinked block `idx` with its physical neighbours of the same stream
    /// (the left one survives) and links the result. The byte counters are the caller's.
    #[inline]
    pub(super) fn coalesce_and_link(&mut self, idx: u32) {
        let Block {
            stream,
            prev_phys: left,
            next_phys: right,
            ..
        } = self.blocks[idx as usize];
        debug_assert!(stream < USED);
        if right != NIL && self.blocks[right as usize].stream == stream {
            self.unlink(right);
            let r = self.blocks[right as usize];
            self.blocks[idx as usize].size += r.size;
            self.unlink_phys(right);
        }
        let survivor = if left != NIL && self.blocks[left as usize].stream == stream {
            let size = self.blocks[left as usize].size + self.blocks[idx as usize].size;
            // `idx` holds the stream's newest change: the merged block is as recent.
            self.blocks[left as usize].freed = self.blocks[idx as usize].freed;
            self.unlink_phys(idx);
            self.resize(left, size);
            left
        } else {
            self.link(idx);
            idx
        };
        debug_assert!(self.is_coalesced(survivor));
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
