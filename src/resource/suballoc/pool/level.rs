//! One level of the pool: a core, the chunks it holds, and the stream-ordering state that lets
//! one stream use memory another freed. The pool has a global level, whose chunks come from the
//! upstream resource, and stream shards, whose chunks come from the global level; both run
//! this same code.

use rustc_hash::{FxHashMap, FxHashSet};

use super::core::state::PoolCore;
use super::core::types::StreamKey;
use super::core::ALIGN;
use crate::error::Result;
use crate::ids::StreamId;
use crate::resource::inspect::BlockState;
use crate::resource::suballoc::stream_order::FreeOrder;
use crate::stream::Stream;

pub(super) fn key(stream: &Stream) -> StreamKey {
    StreamKey(stream.id().0)
}

/// A level's state, behind its lock.
pub(super) struct Level {
    pub(super) core: PoolCore,
    /// Chunk base → the size asked for it. RMM's growth halves without rounding (5120, 2560,
    /// 1280, 640), so a chunk can be larger than the 256-byte multiple the core uses of it; it
    /// goes back with the size it came with.
    chunks: FxHashMap<u64, usize>,
    /// The sum of `chunks`: for the global level, RMM's `pool_size`.
    pub(super) chunk_bytes: usize,
    /// What the level needs to hand a stream's free memory to another stream, indexed by the
    /// stream's slot in the core: `slots[i]` is `Some` exactly when core slot `i` is in use.
    /// (Indexing by slot, which the core's operations return, keeps hash lookups off the free
    /// path.)
    slots: Vec<Option<FreeOrder>>,
    /// Global level only: the bases of the blocks lent to shards as sub-chunks. A user block in
    /// a shard may start at its sub-chunk's base, so a free must not take such a base for a
    /// user block of this level.
    lent: FxHashSet<u64>,
    /// Allocations served by [`serve`](Self::serve) so far (wrapping): how an idle release
    /// policy sees that the level was used.
    pub(super) served: u64,
    /// Streams whose free memory another stream took here: their frees record events at once
    /// (see [`FreeOrder`]), also after their record is dropped and made again. At most
    /// [`MAX_CROSSED`]; forgetting one only makes its next crossing lazy again.
    crossed: FxHashSet<u64>,
    /// Whether a stream whose memory crossed streams records an event at each free from then
    /// on (the global and large levels, where blocks are large and frees fewer); a shard keeps
    /// its events lazy, as a per-free record would cost its fast path (streams that share a
    /// shard and take from each other).
    eager_after_crossing: bool,
}

/// A block of a level's [`snapshot`](Level::snapshot).
pub(super) struct SnapshotBlock {
    pub(super) start: u64,
    pub(super) size: usize,
    pub(super) state: BlockState,
    pub(super) stream: Option<StreamId>,
    /// A sub-chunk the global level lent to a shard: the shard's blocks describe it.
    pub(super) lent: bool,
}

/// How many streams a level remembers in `crossed`.
const MAX_CROSSED: usize = 256;

/// A chunk given back by a level: its base, the size it came with, and the stream whose work
/// on it is ordered last (the one to give it back on).
pub(super) type Released = (u64, usize, Stream);

impl Level {
    pub(super) fn new(eager_after_crossing: bool) -> Self {
        Level {
            core: PoolCore::new(),
            chunks: FxHashMap::default(),
            chunk_bytes: 0,
            slots: Vec::new(),
            lent: FxHashSet::default(),
            served: 0,
            crossed: FxHashSet::default(),
            eager_after_crossing,
        }
    }

    /// Marks the block at `base` as lent to a shard.
    pub(super) fn lend(&mut self, base: u64) {
        let fresh = self.lent.insert(base);
        debug_assert!(fresh, "{base:#x} lent twice");
    }

    /// Frees a sub-chunk a shard gives back (see [`try_free`](Self::try_free)).
    pub(super) fn take_back(&mut self, base: u64, bytes: usize, stream: &Stream) -> bool {
        self.lent.remove(&base) && self.try_free(base, bytes, stream)
    }

    /// Shard levels: cuts the free head off every sub-chunk that has one and is not wholly
    /// free (see [`PoolCore::cut_free_heads`]); returns `(old base, head bytes, owner)` of
    /// each, for the global level's [`take_back_head`](Self::take_back_head).
    pub(super) fn cut_free_heads(&mut self, keep: &Stream) -> Vec<Released> {
        let cut = self.core.cut_free_heads();
        let mut heads = Vec::with_capacity(cut.len());
        for (base, head, owner) in cut {
            let size = self
                .chunks
                .remove(&base)
                .expect("every core chunk is recorded");
            self.chunks.insert(base + head as u64, size - head);
            self.chunk_bytes -= head;
            let stream = self
                .core
                .stream_slot(owner)
                .and_then(|slot| self.stream_of(slot))
                .cloned()
                .expect("a stream that owned free memory has a slot");
            heads.push((base, head, stream));
        }
        self.forget_idle_streams(Some(key(keep)));
        heads
    }

    /// Global level: takes back the free head (`head` bytes, freed on `stream`) of the
    /// sub-chunk lent at `base`, which stays lent from `base + head`. When the head lies just
    /// above free memory of another stream, that block becomes `stream`'s (after `stream`
    /// waits for its owner's frees), so that the two coalesce: otherwise a shard's next
    /// sub-chunk, carved from the tail of that block, would strand the head between it and
    /// the one before (the pool could not be filled to its maximum).
    ///
    /// # Errors
    /// A driver error recording or waiting on an event; the head is taken back regardless.
    pub(super) fn take_back_head(&mut self, base: u64, head: usize, stream: &Stream) -> Result<()> {
        let lent = self.lent.remove(&base);
        debug_assert!(lent, "{base:#x} is not lent");
        let rest = base + head as u64;
        self.lent.insert(rest);
        let slot = self
            .core
            .free_front(base, head, key(stream))
            .expect("a lent sub-chunk is an allocated block larger than its head");
        let seq = self.core.seq_of(slot);
        self.slot_at(slot, stream).changed_to(seq);
        if let Some(owner) = self.core.other_owner_below(rest) {
            let owner_slot = self
                .core
                .stream_slot(owner)
                .expect("a stream with free blocks has a slot");
            self.order_after(owner_slot, stream)?;
            self.core.adopt_below(rest);
            self.changed(stream);
            self.forget_idle_streams(Some(key(stream)));
        }
        Ok(())
    }

    /// Frees a user block `addr` (allocated with `bytes`) on `stream` if it is one of this
    /// level's, never a block lent to a shard.
    pub(super) fn try_free_user(&mut self, addr: u64, bytes: usize, stream: &Stream) -> bool {
        !self.lent.contains(&addr) && self.try_free(addr, bytes, stream)
    }

    /// Adds a chunk of `size` bytes at `base` (whose first `size` rounded down to 256 bytes the
    /// core uses), ordered on `stream`, which owns it.
    pub(super) fn add_chunk(&mut self, base: u64, size: usize, stream: &Stream) {
        self.core.add_chunk(base, size / ALIGN * ALIGN, key(stream));
        // The memory is ordered on `stream`: another stream must wait for it before taking
        // any of it.
        self.changed(stream);
        self.chunks.insert(base, size);
        self.chunk_bytes += size;
    }

    /// Allocates `size` (aligned) for `stream` from its own free blocks, or else from memory
    /// other streams freed in this level (see [`steal`](Self::steal)); `None` when neither
    /// has it.
    ///
    /// # Errors
    /// A driver error recording or waiting on an event.
    pub(super) fn serve(&mut self, size: usize, stream: &Stream) -> Result<Option<u64>> {
        self.served = self.served.wrapping_add(1);
        if let Some(p) = self.core.allocate(size, key(stream)) {
            return Ok(Some(p));
        }
        // A lazily coalescing stream's blocks, merged, may hold the request.
        if self.core.coalesce_stream(key(stream)) {
            if let Some(p) = self.core.allocate(size, key(stream)) {
                return Ok(Some(p));
            }
        }
        self.steal(size, stream)
    }

    /// [`serve`](Self::serve) from `stream`'s own free blocks only (`bytes` need not be
    /// aligned): the pool's fast path. `None` when they cannot serve it.
    #[inline]
    pub(super) fn serve_own(&mut self, bytes: usize, stream: &Stream) -> Option<u64> {
        self.served = self.served.wrapping_add(1);
        self.core.allocate(bytes, key(stream))
    }

    /// Frees `addr` (allocated with `bytes`) on `stream` if it is a block of this level.
    #[inline]
    pub(super) fn try_free(&mut self, addr: u64, bytes: usize, stream: &Stream) -> bool {
        let Some(slot) = self.core.try_free(addr, bytes, key(stream)) else {
            return false;
        };
        let seq = self.core.seq_of(slot);
        // The stream's record is there already unless this is its first free here.
        match self.slots.get_mut(slot as usize) {
            Some(Some(order)) => {
                debug_assert!(order.stream() == stream, "slot {slot} holds another stream");
                order.changed_to(seq);
            }
            _ => self.slot_at(slot, stream).changed_to(seq),
        }
        true
    }

    /// Serves `size` (aligned) for `stream` from memory other streams freed, after making
    /// `stream` wait for an event that covers their frees.
    ///
    /// First from one other stream that alone has a block big enough: the piece is carved
    /// from its block, and the rest stays with it. Among several such streams the cheapest is
    /// taken: one whose covering event `stream` has already waited on, then one whose latest
    /// event still covers its frees (nothing to record), then the one with the most free bytes.
    /// Failing that, against fragmentation, every other stream's free memory becomes
    /// `stream`'s at once (it may coalesce into a block big enough).
    fn steal(&mut self, size: usize, stream: &Stream) -> Result<Option<u64>> {
        let me = key(stream);
        let mut victim = self.cheapest_victim(size, stream);
        if victim.is_none() {
            // Lazily coalescing streams' blocks, merged, may hold it.
            self.core.coalesce_lazy_streams();
            victim = self.cheapest_victim(size, stream);
        }
        if let Some((victim, slot)) = victim {
            // The victim's oldest fitting free, and only that free is waited for, not the
            // victim's later work.
            let (block, stamp) = self
                .core
                .oldest_block_for(size, victim)
                .expect("the victim has a block that fits");
            self.order_after_free(slot, stream, Some(stamp))?;
            let p = self.core.allocate_block(block, size, victim);
            self.core.set_allocated_for(p, me);
            self.forget_idle_streams(Some(me));
            return Ok(Some(p));
        }
        let others: Vec<(StreamKey, u32)> = (0..self.core.stream_slot_bound() as u32)
            .filter_map(|slot| {
                let s = self.slots[slot as usize].as_ref()?;
                let k = key(s.stream());
                (k != me && self.core.free_bytes_of(k) > 0).then_some((k, slot))
            })
            .collect();
        let free_elsewhere: usize = others
            .iter()
            .map(|&(k, _)| self.core.free_bytes_of(k))
            .sum();
        if free_elsewhere + self.core.free_bytes_of(me) < size {
            return Ok(None);
        }
        for (victim, slot) in others {
            self.order_after(slot, stream)?;
            let vacated = self.core.merge_stream(victim, me);
            debug_assert_eq!(vacated, Some(slot));
            self.slots[slot as usize] = None;
            // The merged blocks are `stream`'s now, ordered after its wait: a third stream
            // must wait for an event of `stream` recorded after this point.
            self.changed(stream);
        }
        self.forget_idle_streams(Some(me));
        Ok(self.core.allocate(size, me))
    }

    /// Another stream than `stream` that alone has a block for `size` bytes, with its slot: the
    /// cheapest to wait for (one whose covering event `stream` has already waited on, then one
    /// whose latest event still covers its frees), then the one with the most free bytes.
    fn cheapest_victim(&self, size: usize, stream: &Stream) -> Option<(StreamKey, u32)> {
        let slots = &self.slots;
        self.core
            .streams_with_block(size, key(stream))
            .max_by_key(|&(victim, slot, bytes)| {
                let cost = slots[slot as usize]
                    .as_ref()
                    .expect("a stream with free blocks has a slot")
                    .wait_cost(stream.id());
                (std::cmp::Reverse(cost), bytes, std::cmp::Reverse(victim))
            })
            .map(|(victim, slot, _)| (victim, slot))
    }

    /// Takes every wholly free chunk out of the level, for its owner to give back. With
    /// `gather`, free memory is first gathered on one stream (see
    /// [`gather_free`](Self::gather_free)) so that chunks freed on several streams count.
    pub(super) fn release_empty_chunks(&mut self, gather: bool) -> Vec<Released> {
        self.release_empty_chunks_upto(gather, usize::MAX)
    }

    /// [`release_empty_chunks`](Self::release_empty_chunks), stopping once the chunks
    /// released add up to `at_least` bytes.
    pub(super) fn release_empty_chunks_upto(
        &mut self,
        gather: bool,
        at_least: usize,
    ) -> Vec<Released> {
        if gather {
            if let Err(error) = self.gather_free() {
                // What was gathered before the failure is still released below.
                tracing::error!(%error, "gathering a pool's free memory on one stream");
            }
        }
        let mut released = Vec::new();
        for (base, _, owner) in self.core.release_empty_chunks_upto(at_least) {
            let size = self
                .chunks
                .remove(&base)
                .expect("every core chunk is recorded");
            self.chunk_bytes -= size;
            let stream = self
                .core
                .stream_slot(owner)
                .and_then(|slot| self.stream_of(slot))
                .cloned();
            match stream {
                Some(stream) => released.push((base, size, stream)),
                // Every chunk is owned by a stream that has a slot while it owns free memory;
                // this is a bookkeeping bug, so leak, never free.
                None => tracing::error!(
                    base,
                    size,
                    "pool chunk without an owning stream; leaking it"
                ),
            }
        }
        self.forget_idle_streams(None);
        released
    }

    /// The level's data for `stream`, which must own a slot in the core; made on first use.
    fn slot_at(&mut self, slot: u32, stream: &Stream) -> &mut FreeOrder {
        let slot = slot as usize;
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || None);
        }
        if self.slots[slot].is_none() {
            let mut order = FreeOrder::new(stream);
            if self.crossed.contains(&stream.id().0) {
                order.set_eager();
                self.core.set_lazy_coalescing(key(stream));
            }
            self.slots[slot] = Some(order);
        }
        let entry = self.slots[slot].as_mut().expect("made above");
        debug_assert!(entry.stream() == stream, "slot {slot} holds another stream");
        entry
    }

    /// Notes that `stream`'s free memory changed in a way other streams must be ordered after
    /// (the core numbered the change).
    fn changed(&mut self, stream: &Stream) {
        let slot = self
            .core
            .stream_slot(key(stream))
            .expect("the stream was just given memory");
        let seq = self.core.seq_of(slot);
        self.slot_at(slot, stream).changed_to(seq);
    }

    /// Makes `waiter` wait, if it must, for the frees of the stream in `slot`.
    fn order_after(&mut self, slot: u32, waiter: &Stream) -> Result<()> {
        self.order_after_free(slot, waiter, None)
    }

    /// Makes `waiter` wait, if it must, for the stream in `slot` up to the free that stamped a
    /// block with `stamp` (see [`PoolCore::seq_of`]), or up to all its frees.
    fn order_after_free(&mut self, slot: u32, waiter: &Stream, stamp: Option<u32>) -> Result<()> {
        let order = self.slots[slot as usize]
            .as_mut()
            .expect("a stream with free blocks has a slot");
        let upto = stamp.map_or(u64::MAX, |stamp| order.free_of_stamp(stamp));
        order.order_upto(waiter, upto)?;
        if !self.eager_after_crossing {
            return Ok(());
        }
        order.set_eager();
        let id = order.stream().id().0;
        self.core.set_lazy_coalescing(StreamKey(id));
        if self.crossed.len() >= MAX_CROSSED {
            self.crossed.clear();
        }
        self.crossed.insert(id);
        Ok(())
    }

    /// Moves all free memory to the stream that owns the most, after it waits for each other
    /// owner, so that blocks freed on different streams coalesce.
    fn gather_free(&mut self) -> Result<()> {
        let owners: Vec<(usize, u32)> = (0..self.core.stream_slot_bound() as u32)
            .filter_map(|slot| {
                let s = self.slots[slot as usize].as_ref()?;
                let bytes = self.core.free_bytes_of(key(s.stream()));
                (bytes > 0).then_some((bytes, slot))
            })
            .collect();
        let Some(&(_, target)) = owners.iter().max() else {
            return Ok(());
        };
        let target = self.stream_of(target).expect("an owner has a slot").clone();
        for (_, slot) in owners {
            let Some(victim) = self.stream_of(slot).map(key) else {
                continue;
            };
            if victim == key(&target) {
                continue;
            }
            self.order_after(slot, &target)?;
            self.core.merge_stream(victim, key(&target));
            self.slots[slot as usize] = None;
            self.changed(&target);
        }
        Ok(())
    }

    /// Drops the handles of streams (other than `keep`) that own no free memory any more, so
    /// the level does not keep them alive.
    fn forget_idle_streams(&mut self, keep: Option<StreamKey>) {
        for slot in self.core.remove_idle_streams(keep) {
            self.slots[slot as usize] = None;
        }
    }

    /// Each stream's free bytes in this level, for those that own any.
    pub(super) fn free_by_stream(
        &self,
    ) -> impl Iterator<Item = (crate::ids::StreamId, usize)> + '_ {
        self.slots.iter().flatten().filter_map(|order| {
            let bytes = self.core.free_bytes_of(key(order.stream()));
            (bytes > 0).then(|| (order.stream().id(), bytes))
        })
    }

    /// Records an event on `stream` after its frees (and chunks) so far, for other streams
    /// to wait on (see [`FreeOrder::record`]).
    ///
    /// # Errors
    /// A driver error recording the event.
    pub(super) fn record_frees(&mut self, stream: &Stream) -> Result<()> {
        match self.core.stream_slot(key(stream)) {
            Some(slot) => self.slot_at(slot, stream).record(),
            None => Ok(()),
        }
    }

    /// The level's chunks and their blocks in address order, for a snapshot: each chunk with
    /// the size it came with, each block with its stream and state. A free block is
    /// [`Free`](BlockState::Free) once its stream has passed an event recorded after its
    /// frees (the level records one lazily, when another stream takes that stream's memory,
    /// or at each free once it has), else [`FreeOnStream`](BlockState::FreeOnStream).
    /// Blocks lent to shards (global level) are marked `lent`.
    pub(super) fn snapshot(&self) -> Vec<(u64, usize, Vec<SnapshotBlock>)> {
        let passed: FxHashMap<u64, bool> = self
            .slots
            .iter()
            .flatten()
            .map(|order| (order.stream().id().0, order.passed()))
            .collect();
        self.core
            .chunks_and_blocks()
            .into_iter()
            .map(|chunk| {
                let size = self
                    .chunks
                    .get(&chunk.base)
                    .copied()
                    .unwrap_or(chunk.size as usize);
                let blocks = chunk
                    .blocks
                    .iter()
                    .map(|b| {
                        let stream = StreamId(b.stream.0);
                        let (state, stream) = match (b.free, passed.get(&b.stream.0)) {
                            (false, _) => (BlockState::Live, Some(stream)),
                            (true, Some(true)) => (BlockState::Free, None),
                            (true, _) => (BlockState::FreeOnStream, Some(stream)),
                        };
                        SnapshotBlock {
                            start: b.start,
                            size: b.size as usize,
                            state,
                            stream,
                            lent: !b.free && self.lent.contains(&b.start),
                        }
                    })
                    .collect();
                (chunk.base, size, blocks)
            })
            .collect()
    }

    /// The stream of the core's slot `slot`.
    fn stream_of(&self, slot: u32) -> Option<&Stream> {
        self.slots
            .get(slot as usize)?
            .as_ref()
            .map(FreeOrder::stream)
    }
}
