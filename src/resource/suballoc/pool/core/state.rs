//! The state of the pool core: the [`PoolCore`] struct itself. Its operations are spread over
//! the core's files by subject (`impl PoolCore` in each); the struct stands below them all.

use std::collections::BTreeMap;
use std::fmt;

use rustc_hash::FxHashMap;

use super::live::LiveMap;
use super::slab::Block;
use super::stream_free::StreamFree;
use super::types::{Chunk, StreamKey};

/// The stream-ordered free-list core of the pool: chunks from the upstream, cut into blocks
/// that are allocated or free and owned by a stream. See the [module documentation](super) for
/// the design.
pub(crate) struct PoolCore {
    /// Every block of every chunk, plus vacant slots chained through [`Block::next`] from
    /// `vacant`. The blocks of a chunk tile it exactly, in `prev_phys`/`next_phys` order, from
    /// `Chunk::first`. A free block is on exactly one class list, of its stream's index; an
    /// allocated block is in `live`. No two physically adjacent free blocks have the same
    /// stream (they are coalesced at once).
    pub(super) blocks: Vec<Block>,
    /// The first vacant slot of `blocks`, or [`NIL`](super::slab::NIL).
    pub(super) vacant: u32,
    /// Start address → slot, for every allocated block (and nothing else); the newest one
    /// outside the hash map (see `live.rs`).
    pub(super) live: LiveMap,
    /// Each stream's index, by slot; `None` for a vacant slot (listed in `vacant_streams`).
    pub(super) streams: Vec<Option<StreamFree>>,
    /// Stream key → its slot in `streams`, for every `Some` slot.
    pub(super) stream_slots: FxHashMap<u64, u32>,
    /// The vacant slots of `streams`.
    pub(super) vacant_streams: Vec<u32>,
    /// The last stream looked up and its slot, unless the slot is [`NIL`](super::slab::NIL):
    /// saves the map lookup for runs of operations on one stream. Never stale.
    pub(super) last_stream: (StreamKey, u32),
    /// Base address → chunk. Chunks never overlap.
    pub(super) chunks: BTreeMap<u64, Chunk>,
    /// The id the next chunk gets.
    pub(super) next_chunk_id: u64,
    /// Sum of the chunks' sizes.
    pub(super) chunk_bytes: u64,
    /// Sum of the free blocks' sizes (= sum of the streams' `free_bytes`).
    pub(super) free_bytes: u64,
    /// The number of free blocks (= sum of the streams' `blocks`).
    pub(super) free_count: usize,
}

impl Default for PoolCore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for PoolCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolCore")
            .field("chunk_count", &self.chunk_count())
            .field("chunk_bytes", &self.chunk_bytes())
            .field("free_bytes", &self.free_bytes())
            .field("free_block_count", &self.free_block_count())
            .field("allocation_count", &self.allocation_count())
            .field("streams", &self.stream_slots.len())
            .finish()
    }
}
