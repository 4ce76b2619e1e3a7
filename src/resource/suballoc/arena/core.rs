//! The allocator cores of the arena resource: [`StreamArena`] (one stream's superblocks, cut
//! into blocks by address-ordered first fit) and [`GlobalArena`] (the arena's pages, lent out as
//! superblocks or handed out whole for large requests).
//!
//! Both are plain single-threaded data structures over *addresses and sizes*: they know nothing
//! of CUDA, streams or events. What must happen on a stream before memory may be reused is an
//! opaque *fence* `F` that the cores carry along and hand back; the public wrapper turns fences
//! into event waits, puts each core behind its own lock, and decides when superblocks move.
//! All metadata lives in host memory, keyed by address (device memory is not host-writable).
//!
//! # Granularity
//! Blocks are multiples of [`ALIGN`](crate::resource::contract::size::ALIGN) (256 bytes). The
//! global arena counts in *pages* of [`PAGE_SIZE`](consts::PAGE_SIZE) (64 KiB): a superblock is
//! at least [`SUPERBLOCK_PAGES`](consts::SUPERBLOCK_PAGES) pages (1 MiB, RMM's
//! `superblock::minimum_size`) and a large request takes whole pages. The wrapper converts
//! pages to addresses.
//!
//! # Address-ordered first fit in O(log n)
//! Free blocks (and the global arena's free page ranges) live in a [`FitTree`](tree::FitTree): a
//! B+tree by address whose inner nodes know the largest free size below each child. First fit — the
//! free block with the lowest address that is large enough, RMM's and jemalloc's policy against
//! fragmentation — is one walk down the tree; a block is carved from the *head* of the block found,
//! so the remainder keeps its place in the tree. A free finds its free neighbours with one more
//! walk and merges with them, unless they lie across a superblock boundary: blocks never merge
//! across superblocks, so that a wholly free superblock is a whole range that can go back to the
//! global arena. RMM's arena scans its superblocks and their free lists linearly.
//!
//! # Frees on other streams: pending blocks
//! A block freed on the arena's own stream is reusable at once. A block freed on another stream
//! T (the memory was handed over) is *pending*: it keeps T's fence and is not reused until the
//! wrapper has made the arena's stream wait for T ([`StreamArena::reclaim_pending`]), or its
//! superblock goes back to the global arena with the fence attached.
//!
//! # Fences in the global arena
//! Every free page range carries the fences of every stream that freed memory into it (a
//! superblock brings its arena's stream and the fences of its pending blocks; a large block
//! the stream that freed it). Ranges coalesce whatever their fences, which are merged, so
//! memory freed on several streams still forms one large range; whoever takes pages waits on
//! the range's fences first.

pub(crate) mod consts;
mod fences;
mod global;
mod stream;
mod tree;

pub(crate) use self::global::{GlobalArena, Use};
#[cfg(test)]
use self::stream::Released;
pub(crate) use self::stream::{Piece, StreamArena};
pub(crate) use crate::resource::contract::size::{
    align_to_size_class, align_up, largest_size_class_within,
};

#[cfg(test)]
mod tests;
