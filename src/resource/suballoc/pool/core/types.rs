//! The core's small shared types: the keys of streams and chunks, the record of a chunk, and
//! the log2 of the alignment. Every file of the core uses them; they use nothing of the core.

use crate::resource::contract::size::ALIGN;

/// log2 of [`ALIGN`]: sizes shifted right by it are counted in 256-byte units.
pub(super) const ALIGN_LOG2: u32 = ALIGN.trailing_zeros();

/// A stream as the core sees it: an opaque key (the wrapper uses the stream's id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct StreamKey(pub(crate) u64);

/// Names a chunk obtained from the upstream resource, in the order the pool received them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ChunkId(pub(crate) u64);

/// A chunk obtained from the upstream resource.
#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    /// For tests; the wrapper keys chunks by base address.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) id: ChunkId,
    pub(super) size: u64,
    /// The slab slot of the chunk's first block (at the chunk's base); only
    /// [`cut_free_heads`](super::state::PoolCore::cut_free_heads) changes it while
    /// the chunk is in the pool.
    pub(super) first: u32,
}
