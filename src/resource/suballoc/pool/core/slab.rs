//! The entries of the core's slab of blocks: [`Block`], the blocks that tile each chunk (see
//! "Blocks" in the [core's documentation](super)), and the marks [`NIL`] and [`USED`].

use super::types::StreamKey;

/// The null slab index (also [`Block::stream`] of a vacant slot).
pub(super) const NIL: u32 = u32::MAX;
/// [`Block::stream`] of an allocated block.
pub(super) const USED: u32 = u32::MAX - 1;

/// A block of a chunk, free or allocated, or a vacant slab slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    /// The first address; a multiple of [`ALIGN`](crate::resource::contract::size::ALIGN).
    pub(super) start: u64,
    /// The size in bytes; a non-zero multiple of [`ALIGN`](crate::resource::contract::size::ALIGN).
    pub(super) size: u64,
    /// For a free block, the slot in [`PoolCore::streams`](super::state::PoolCore::streams) of
    /// the owning stream (always below [`USED`]); [`USED`] for an allocated block; [`NIL`] for a
    /// vacant slab slot.
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
    /// change, [`StreamFree::seq`](super::stream_free::StreamFree::seq)) that this block's memory
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
    /// links (unused while it is allocated; [`link`](super::state::PoolCore::link) sets them
    /// when it is freed).
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
