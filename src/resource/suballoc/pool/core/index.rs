//! The per-stream size-class index (TLSF, as in `rlsf`): finding a block on a stream's class
//! lists ([`StreamFree`](super::stream_free::StreamFree)), and putting free blocks on and off
//! them (see "Per-stream TLSF index" in
//! the [core's documentation](super)).

use super::classes::{class_index, class_min, class_of, search_class};
use super::slab::{Block, NIL};
use super::state::PoolCore;
use super::types::ALIGN_LOG2;

/// How many blocks of the request's own class an allocation tries when no class whose every
/// block fits has a block.
pub(super) const OWN_CLASS_PROBES: usize = 8;

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
