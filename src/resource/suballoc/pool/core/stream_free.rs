//! One stream's free blocks as the core indexes them: [`StreamFree`], the stream's class lists
//! and their bitmaps (see "Per-stream TLSF index" in the [core's documentation](super)).

use super::classes::{CLASS_COUNT, FL_COUNT};
use super::slab::NIL;
use super::types::StreamKey;

/// One stream's free blocks: a TLSF index of class lists.
pub(super) struct StreamFree {
    /// The stream.
    pub(super) key: StreamKey,
    /// Bit `fl` is set iff `sl_bitmaps[fl] != 0`.
    pub(super) fl_bitmap: u64,
    /// Bit `sl` of `sl_bitmaps[fl]` is set iff `heads[class_index(fl, sl)] != NIL`.
    pub(super) sl_bitmaps: [u32; FL_COUNT],
    /// The head of each class's list of blocks (linked through
    /// [`Block::prev`](super::slab::Block::prev)/`next`); every block on list `c` is owned by
    /// this stream and has a size of class `c`.
    pub(super) heads: Box<[u32]>,
    /// The total size of the blocks on the lists.
    pub(super) free_bytes: u64,
    /// The number of blocks on the lists.
    pub(super) blocks: usize,
    /// The number of the stream's latest change to its free memory (a free, a chunk, memory
    /// merged in), counted from 1: each free block carries the low bits of the one it took
    /// part in ([`Block::freed`](super::slab::Block::freed)).
    pub(super) seq: u64,
    /// The stream's frees are linked alone, not merged with their neighbours
    /// ([`PoolCore::set_lazy_coalescing`](super::state::PoolCore::set_lazy_coalescing)).
    pub(super) lazy: bool,
    /// Lazy streams: some free blocks may have free neighbours of this stream.
    pub(super) uncoalesced: bool,
}

impl StreamFree {
    pub(super) fn new(key: StreamKey) -> Self {
        StreamFree {
            key,
            fl_bitmap: 0,
            sl_bitmaps: [0; FL_COUNT],
            heads: vec![NIL; CLASS_COUNT].into_boxed_slice(),
            free_bytes: 0,
            blocks: 0,
            seq: 0,
            lazy: false,
            uncoalesced: false,
        }
    }

    /// The first non-empty class at or above `(fl, sl)`.
    pub(super) fn first_nonempty_from(&self, fl: usize, sl: usize) -> Option<(usize, usize)> {
        let sl_map = self.sl_bitmaps[fl] & (u32::MAX << sl);
        if sl_map != 0 {
            return Some((fl, sl_map.trailing_zeros() as usize));
        }
        // fl + 1 <= FL_COUNT < 64, so the shift never overflows.
        let fl_map = self.fl_bitmap & (u64::MAX << (fl + 1));
        if fl_map == 0 {
            return None;
        }
        let fl = fl_map.trailing_zeros() as usize;
        Some((fl, self.sl_bitmaps[fl].trailing_zeros() as usize))
    }

    /// The largest non-empty class.
    pub(super) fn last_nonempty(&self) -> Option<(usize, usize)> {
        if self.fl_bitmap == 0 {
            return None;
        }
        let fl = (u64::BITS - 1 - self.fl_bitmap.leading_zeros()) as usize;
        let sl = (u32::BITS - 1 - self.sl_bitmaps[fl].leading_zeros()) as usize;
        Some((fl, sl))
    }
}
