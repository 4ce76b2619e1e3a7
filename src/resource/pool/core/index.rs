//! The per-stream size-class index (TLSF, as in `rlsf`): the class math, each stream's class
//! lists and bitmaps, and putting free blocks on and off them (see "Per-stream TLSF index" in
//! the [core's documentation](super)).

use super::blocks::{Block, NIL};
use super::{PoolCore, StreamKey, ALIGN_LOG2};

/// log2 of the number of second-level classes per power of two.
pub(super) const SL_LOG2: u32 = 5;
/// The number of second-level classes per power of two.
pub(super) const SL_COUNT: usize = 1 << SL_LOG2;
/// The number of first levels: enough for any size below 2^64 bytes (units below 2^56).
pub(super) const FL_COUNT: usize = (u64::BITS - ALIGN_LOG2 - SL_LOG2 + 1) as usize;
/// The number of size classes of one stream's index.
pub(super) const CLASS_COUNT: usize = FL_COUNT * SL_COUNT;
/// How many blocks of the request's own class an allocation tries when no class whose every
/// block fits has a block.
pub(super) const OWN_CLASS_PROBES: usize = 8;

/// The size class `(first level, second level)` of a block of `units` 256-byte units
/// (`units >= 1`). Classes are ordered: a larger size never maps to a smaller class.
pub(super) fn class_of(units: u64) -> (usize, usize) {
    debug_assert!(units > 0);
    if units < SL_COUNT as u64 {
        (0, units as usize)
    } else {
        let msb = u64::BITS - 1 - units.leading_zeros();
        let shift = msb - SL_LOG2;
        ((shift + 1) as usize, (units >> shift) as usize - SL_COUNT)
    }
}

/// The smallest size, in units, of class `(fl, sl)`.
pub(super) fn class_min(fl: usize, sl: usize) -> u64 {
    if fl == 0 {
        sl as u64
    } else {
        ((SL_COUNT + sl) as u64) << (fl - 1)
    }
}

/// The smallest class whose *every* block holds `units`: the class of `units` rounded up to
/// the next class boundary. `None` when that is past the largest class.
pub(super) fn search_class(units: u64) -> Option<(usize, usize)> {
    debug_assert!(units > 0);
    if units < SL_COUNT as u64 {
        return Some((0, units as usize));
    }
    let msb = u64::BITS - 1 - units.leading_zeros();
    let rounded = units.checked_add((1 << (msb - SL_LOG2)) - 1)?;
    let (fl, sl) = class_of(rounded);
    (fl < FL_COUNT).then_some((fl, sl))
}

/// The flat index of class `(fl, sl)` in [`StreamFree::heads`].
pub(super) fn class_index(fl: usize, sl: usize) -> usize {
    fl * SL_COUNT + sl
}

/// The flat class index of a block of `size` bytes.
pub(super) fn class_index_of_size(size: u64) -> usize {
    let (fl, sl) = class_of(size >> ALIGN_LOG2);
    class_index(fl, sl)
}

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
