//! The fixed-size resource's stream shards: each a lock over a core holding the free lists of
//! the streams it serves, so that streams on different shards allocate and free without
//! touching a shared lock. The chunks are shared by the cores (append-only, see
//! [`chunks`](super::core)): a block may be freed into another shard than the one that handed
//! it out, and a shard whose lists are empty takes half of another stream's list, in its own
//! shard or another, before the resource grows.
//!
//! Lock order: shards in ascending index, then `grow`, then the chunk table (inside the core).

use parking_lot::{Mutex, MutexGuard};
use rustc_hash::FxHashMap;

use super::core::FixedSizeCore;
use crate::stream::{Stream, StreamId};

use crate::resource::suballoc::stream_order::FreeOrder;

/// One shard, on cache lines of its own so that the shards' locks do not share one.
#[repr(align(128))]
pub(super) struct Shard(Mutex<FixedSizeCore<FreeOrder>>);

/// The shards of one resource.
pub(super) struct Shards {
    /// A power of two of them; a stream's is its id modulo their number.
    shards: Box<[Shard]>,
    /// Held (after the growing stream's shard) while the resource takes a chunk from the
    /// upstream, so that shards that run dry together grow once, not once each.
    pub(super) grow: Mutex<()>,
}

/// The shards to make: one per CPU (rounded up to a power of two, at most 64), as the pool's.
pub(super) fn default_count() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .next_power_of_two()
        .min(64)
}

impl Shards {
    /// `count` (a power of two) shards of `block_size`-byte blocks, `blocks_per_chunk` per
    /// chunk, with no chunk yet.
    pub(super) fn new(block_size: usize, blocks_per_chunk: usize, count: usize) -> Self {
        debug_assert!(count.is_power_of_two());
        let first = FixedSizeCore::new(block_size, blocks_per_chunk);
        let mut cores = vec![first];
        while cores.len() < count {
            let sibling = cores[0].sibling();
            cores.push(sibling);
        }
        Shards {
            shards: cores.into_iter().map(|c| Shard(Mutex::new(c))).collect(),
            grow: Mutex::new(()),
        }
    }

    /// How many shards there are.
    pub(super) fn len(&self) -> usize {
        self.shards.len()
    }

    /// The index of `stream`'s shard.
    #[inline]
    pub(super) fn index(&self, stream: StreamId) -> usize {
        stream.0 as usize & (self.shards.len() - 1)
    }

    /// Locks shard `i`.
    #[inline]
    pub(super) fn lock(&self, i: usize) -> MutexGuard<'_, FixedSizeCore<FreeOrder>> {
        self.shards[i].0.lock()
    }

    /// Locks shards `mine` and `theirs` (distinct) in the lock order; returns them in that
    /// order of the arguments.
    pub(super) fn lock_pair(
        &self,
        mine: usize,
        theirs: usize,
    ) -> (
        MutexGuard<'_, FixedSizeCore<FreeOrder>>,
        MutexGuard<'_, FixedSizeCore<FreeOrder>>,
    ) {
        debug_assert_ne!(mine, theirs);
        if mine < theirs {
            let a = self.lock(mine);
            (a, self.lock(theirs))
        } else {
            let b = self.lock(theirs);
            (self.lock(mine), b)
        }
    }

    /// Takes and lets go every shard's lock in turn: the join barrier of the resource's wait
    /// queue (frees read whether anyone waits under their shard's lock).
    pub(super) fn sweep(&self) {
        for shard in self.shards.iter() {
            drop(shard.0.lock());
        }
    }

    /// Locks every shard, for figures that must add up across them.
    pub(super) fn lock_all(&self) -> AllLocked<'_> {
        AllLocked(self.shards.iter().map(|s| s.0.lock()).collect())
    }
}

/// Every shard, locked: nothing is allocated, freed or moved meanwhile.
pub(super) struct AllLocked<'a>(Vec<MutexGuard<'a, FixedSizeCore<FreeOrder>>>);

impl AllLocked<'_> {
    /// Blocks in use.
    pub(super) fn live(&self) -> usize {
        let live: isize = self.0.iter().map(|c| c.live()).sum();
        debug_assert!(live >= 0, "more frees than allocations");
        live.max(0) as usize
    }

    /// Blocks on all free lists.
    pub(super) fn free_blocks(&self) -> usize {
        self.0.iter().map(|c| c.free_blocks()).sum()
    }

    /// Chunks held.
    pub(super) fn chunk_count(&self) -> usize {
        self.0[0].chunk_count()
    }

    /// Every list's payload.
    pub(super) fn orders_mut(&mut self) -> impl Iterator<Item = &mut FreeOrder> {
        self.0.iter_mut().flat_map(|c| c.orders_mut())
    }

    /// The streams whose free lists are free for every stream: each has passed an event
    /// recorded after its frees ([`FreeOrder::passed`]), so another stream that takes from
    /// the list waits for nothing left to run.
    pub(super) fn passed_lists(&self) -> Vec<StreamId> {
        self.0
            .iter()
            .flat_map(|c| c.orders())
            .filter(|(_, order)| order.passed())
            .map(|(s, _)| s)
            .collect()
    }

    /// Each stream's free blocks, by stream (a stream's lists are all in its shard).
    pub(super) fn free_by_stream(&self) -> Vec<(StreamId, usize)> {
        let mut out: Vec<_> = self.0.iter().flat_map(|c| c.free_by_stream()).collect();
        out.sort_unstable();
        out
    }

    /// Every chunk's base with each of its blocks' use (see [`FixedSizeCore::layout`]).
    pub(super) fn layout(&self) -> Vec<(u64, Vec<Option<StreamId>>)> {
        let on_list: FxHashMap<u64, StreamId> = self.0.iter().flat_map(|c| c.on_lists()).collect();
        self.0[0].layout(&on_list)
    }

    /// The stream of some free list, if any.
    pub(super) fn some_stream(&self) -> Option<Stream> {
        self.0
            .iter()
            .flat_map(|c| c.orders())
            .map(|(_, o)| o.stream().clone())
            .next()
    }

    /// Removes every chunk and list; returns the chunks' bases. For when no block is in use.
    pub(super) fn take_chunks(&mut self) -> Vec<u64> {
        for core in &mut self.0[1..] {
            core.clear();
        }
        self.0[0].take_chunks()
    }
}
