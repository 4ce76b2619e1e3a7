//! Per-stream bookkeeping of the core: the slots of the streams that own free memory, their
//! free bytes, and memory crossing streams (which streams can serve a request, merging one
//! stream's free blocks into another's; see "Stream ownership, taking and merging" in the
//! [core's documentation](super)).

use super::classes::class_index;
use super::slab::{NIL, USED};
use super::state::PoolCore;
use super::stream_free::StreamFree;
use super::types::StreamKey;
use crate::resource::contract::size::align_up;

impl PoolCore {
    /// Another stream than `exclude` whose own free blocks can serve `size` bytes, as
    /// [`allocate`](Self::allocate) would find them; among several, the one with the most free
    /// bytes (then the smallest key), so that one [`merge_stream`](Self::merge_stream)
    /// reclaims the most.
    ///
    /// # Panics
    /// When `size` is 0.
    #[cfg(test)]
    pub(crate) fn stream_with_block(&self, size: usize, exclude: StreamKey) -> Option<StreamKey> {
        self.streams_with_block(size, exclude)
            .max_by_key(|&(key, _, bytes)| (bytes, std::cmp::Reverse(key)))
            .map(|(key, _, _)| key)
    }

    /// Every stream other than `exclude` whose own free blocks can serve `size` bytes, as
    /// [`allocate`](Self::allocate) would find them, with its slot and its free bytes.
    ///
    /// # Panics
    /// When `size` is 0.
    pub(crate) fn streams_with_block(
        &self,
        size: usize,
        exclude: StreamKey,
    ) -> impl Iterator<Item = (StreamKey, u32, usize)> + '_ {
        assert!(size != 0, "the pool core does not serve 0-byte requests");
        let size = align_up(size).map(|s| s as u64);
        (0..self.streams.len() as u32).filter_map(move |slot| {
            let s = self.streams[slot as usize].as_ref()?;
            (s.key != exclude && self.find_block(slot, size?).is_some()).then_some((
                s.key,
                slot,
                s.free_bytes as usize,
            ))
        })
    }

    /// Gives every free block of `from` to `into`, coalescing each with `into`'s neighbours,
    /// and forgets `from` (which then owns nothing). The caller must first have made `into`
    /// wait for an event recorded on `from` after all of `from`'s frees so far. A no-op when
    /// `from == into` or `from` has no slot. Returns the slot `from` had, now vacant.
    pub(crate) fn merge_stream(&mut self, from: StreamKey, into: StreamKey) -> Option<u32> {
        if from == into {
            return None;
        }
        let from_slot = self.slot_of(from)?;
        let into_slot = self.slot_or_insert(into);
        let moved = self.stream(from_slot).free_bytes;
        let freed = self.next_seq(into_slot);
        // Blocks of `from` that are not moved yet have another owner than `into`, so a moved
        // block does not merge with them now; each merges with the moved ones when its turn
        // comes, which leaves the result fully coalesced.
        while let Some((fl, sl)) = self.stream(from_slot).first_nonempty_from(0, 0) {
            let idx = self.stream(from_slot).heads[class_index(fl, sl)];
            self.unlink(idx);
            self.blocks[idx as usize].stream = into_slot;
            self.blocks[idx as usize].freed = freed;
            self.coalesce_and_link(idx);
        }
        self.stream_mut(from_slot).free_bytes = 0;
        self.stream_mut(into_slot).free_bytes += moved;
        self.remove_stream(from_slot);
        // Merging another stream's memory in is how a big enough block is made.
        self.coalesce_slot(into_slot);
        Some(from_slot)
    }

    /// Forgets every stream that owns no free block, except `keep`, if given; returns their slots, now
    /// vacant. (A stream's index is kept while it is empty, so that a stream that allocates
    /// and frees in turn does not rebuild it each time; the wrapper calls this off the fast
    /// path.)
    pub(crate) fn remove_idle_streams(&mut self, keep: Option<StreamKey>) -> Vec<u32> {
        let idle: Vec<u32> = (0..self.streams.len() as u32)
            .filter(|&slot| {
                self.streams[slot as usize]
                    .as_ref()
                    .is_some_and(|s| s.blocks == 0 && Some(s.key) != keep)
            })
            .collect();
        for &slot in &idle {
            self.remove_stream(slot);
        }
        idle
    }

    /// The slot of `stream`'s index, while it has one: a small integer, stable until the
    /// stream is removed ([`merge_stream`](Self::merge_stream),
    /// [`remove_idle_streams`](Self::remove_idle_streams)), that the wrapper uses to index its
    /// own per-stream data. Slots of removed streams are reused.
    pub(crate) fn stream_slot(&self, stream: StreamKey) -> Option<u32> {
        if self.last_stream.1 != NIL && self.last_stream.0 == stream {
            return Some(self.last_stream.1);
        }
        self.stream_slots.get(&stream.0).copied()
    }

    /// The number of stream slots, vacant or not: every slot is below it.
    pub(crate) fn stream_slot_bound(&self) -> usize {
        self.streams.len()
    }

    pub(super) fn stream(&self, slot: u32) -> &StreamFree {
        self.streams[slot as usize]
            .as_ref()
            .expect("stream slot is vacant")
    }

    pub(super) fn stream_mut(&mut self, slot: u32) -> &mut StreamFree {
        self.streams[slot as usize]
            .as_mut()
            .expect("stream slot is vacant")
    }

    /// `stream`'s slot, if it has one.
    #[inline]
    pub(super) fn slot_of(&mut self, stream: StreamKey) -> Option<u32> {
        if self.last_stream.1 != NIL && self.last_stream.0 == stream {
            return Some(self.last_stream.1);
        }
        let slot = *self.stream_slots.get(&stream.0)?;
        self.last_stream = (stream, slot);
        Some(slot)
    }

    /// `stream`'s slot, made when it has none.
    #[inline]
    pub(super) fn slot_or_insert(&mut self, stream: StreamKey) -> u32 {
        if self.last_stream.1 != NIL && self.last_stream.0 == stream {
            return self.last_stream.1;
        }
        self.slot_or_insert_slow(stream)
    }

    /// [`slot_or_insert`](Self::slot_or_insert) for another stream than the last one.
    #[cold]
    fn slot_or_insert_slow(&mut self, stream: StreamKey) -> u32 {
        if let Some(slot) = self.slot_of(stream) {
            return slot;
        }
        let index = StreamFree::new(stream);
        let slot = match self.vacant_streams.pop() {
            Some(slot) => {
                self.streams[slot as usize] = Some(index);
                slot
            }
            None => {
                let slot = u32::try_from(self.streams.len())
                    .ok()
                    .filter(|&s| s < USED)
                    .expect("too many streams");
                self.streams.push(Some(index));
                slot
            }
        };
        self.stream_slots.insert(stream.0, slot);
        self.last_stream = (stream, slot);
        slot
    }

    /// Forgets the (empty) stream in `slot`.
    pub(super) fn remove_stream(&mut self, slot: u32) {
        let index = self.streams[slot as usize]
            .take()
            .expect("stream slot is vacant");
        debug_assert!(index.blocks == 0 && index.fl_bitmap == 0 && index.free_bytes == 0);
        self.stream_slots.remove(&index.key.0);
        self.vacant_streams.push(slot);
        if self.last_stream.1 == slot {
            self.last_stream.1 = NIL;
        }
    }

    pub(super) fn add_free_bytes(&mut self, slot: u32, size: u64) {
        self.stream_mut(slot).free_bytes += size;
        self.free_bytes += size;
    }

    pub(super) fn sub_free_bytes(&mut self, slot: u32, size: u64) {
        self.stream_mut(slot).free_bytes -= size;
        self.free_bytes -= size;
    }
}
