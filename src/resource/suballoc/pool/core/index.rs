//! The per-stream size-class index (TLSF, as in `rlsf`): the class math, each stream's class
//! lists and bitmaps, and putting free blocks on and off them (see "Per-stream TLSF index" in
//! the [core's documentation](super)).

use super::blocks::{Block, NIL};
use super::classes::{class_index, class_min, class_of, search_class, CLASS_COUNT, FL_COUNT};
use super::{PoolCore, StreamKey, ALIGN_LOG2};

/// How many blocks of the request's own class an allocation tries when no class whose every
/// block fits has a block.
pub(super) const OWN_CLASS_PROBES: usize = 8;

/// One stream's free blocks: a TLSF index of class lists.
pub(super) struct StreamFree {
    /// The stream.
    pub(super) key: StreamKey,
    /// Bit `fl` is set iff `sl_bitmaps[fl] != 0`.
    pub(super) fl_bitmap: u64,
    /// Bit `sl` of `sl_bitmaps[fl]` is set iff `heads[class_index(fl, sl)] != NIL`.
    pub(super) sl_bitmaps: [u32; FL_COUNT],
    /// The head of each class's list of blocks (linked through [`Block::prev`]/`next`);
    /// every block on list `c` is owned by this stream and has a size of class `c`.
    pub(super) heads: Box<[u32]>,
    /// The total size of the blocks on the lists.
    pub(super) free_bytes: u64,
    /// The number of blocks on the lists.
    pub(super) blocks: usize,
    /// The number of the stream's latest change to its free memory (a free, a chunk, memory
    /// merged in), counted from 1: each free block carries the low bits of the one it took
    /// part in ([`Block::freed`](super::blocks::Block::freed)).
    pub(super) seq: u64,
    /// The stream's frees are linked alone, not merged with their neighbours
    /// ([`PoolCore::set_lazy_coalescing`](super::PoolCore::set_lazy_coalescing)).
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

impl PoolCore {
    /// A block of `slot`'s that holds `size` bytes: the head of the first non-empty class
    /// whose every block fits, else one of the first [`OWN_CLASS_PROBES`] blocks of the
    /// request's own class that fits.
    #[inline(always)]
    pub(super) fn find_block(&self, slot: u32, size: u64) -> Option<u32> {
        let s = self.stream(slot);
        let units = size >> ALIGN_LOG2;
        if let Some((fl, sl)) = search_class(units) {
            if let Some((fl, sl)) = s.first_nonempty_from(fl, sl) {
                return Some(s.heads[class_index(fl, sl)]);
            }
        }
        let (fl, sl) = class_of(units);
        if class_min(fl, sl) == units {
            // The own class is the search class, already found empty.
            return None;
        }
        let mut idx = s.heads[class_index(fl, sl)];
        for _ in 0..OWN_CLASS_PROBES {
            if idx == NIL {
                break;
            }
            let block = &self.blocks[idx as usize];
            if block.size >= size {
                return Some(idx);
            }
            idx = block.next;
        }
        None
    }

    /// The size of the largest block of `slot`'s: the largest on its largest class's list.
    pub(super) fn largest_of_slot(&self, slot: u32) -> u64 {
        let s = self.stream(slot);
        let Some((fl, sl)) = s.last_nonempty() else {
            return 0;
        };
        let mut largest = 0;
        let mut idx = s.heads[class_index(fl, sl)];
        while idx != NIL {
            let block = &self.blocks[idx as usize];
            largest = largest.max(block.size);
            idx = block.next;
        }
        largest
    }

    /// Puts the free block `idx` at the head of its class list in its stream's index.
    pub(super) fn link(&mut self, idx: u32) {
        let Block { size, stream, .. } = self.blocks[idx as usize];
        let (fl, sl) = class_of(size >> ALIGN_LOG2);
        let c = class_index(fl, sl);
        let s = self.streams[stream as usize]
            .as_mut()
            .expect("stream slot is vacant");
        let head = s.heads[c];
        s.heads[c] = idx;
        s.sl_bitmaps[fl] |= 1 << sl;
        s.fl_bitmap |= 1 << fl;
        s.blocks += 1;
        self.free_count += 1;
        let block = &mut self.blocks[idx as usize];
        block.prev = NIL;
        block.next = head;
        if head != NIL {
            self.blocks[head as usize].prev = idx;
        }
    }

    /// Takes the free block `idx` off its class list in its stream's index.
    pub(super) fn unlink(&mut self, idx: u32) {
        let Block {
            size,
            stream,
            prev,
            next,
            ..
        } = self.blocks[idx as usize];
        let (fl, sl) = class_of(size >> ALIGN_LOG2);
        if next != NIL {
            self.blocks[next as usize].prev = prev;
        }
        if prev != NIL {
            self.blocks[prev as usize].next = next;
        }
        let s = self.streams[stream as usize]
            .as_mut()
            .expect("stream slot is vacant");
        s.blocks -= 1;
        self.free_count -= 1;
        if prev == NIL {
            let c = class_index(fl, sl);
            debug_assert_eq!(s.heads[c], idx, "unlinked block is not on its class list");
            s.heads[c] = next;
            if next == NIL {
                s.sl_bitmaps[fl] &= !(1 << sl);
                if s.sl_bitmaps[fl] == 0 {
                    s.fl_bitmap &= !(1 << fl);
                }
            }
        }
        debug_assert_eq!(
            s.heads[class_index(fl, sl)] != NIL,
            s.sl_bitmaps[fl] & (1 << sl) != 0
        );
    }
}
