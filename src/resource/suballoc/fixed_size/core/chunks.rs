//! The chunks of a fixed-size resource, shared by the cores of all its shards, with an atomic
//! flag per block in use.
//!
//! The list of chunks only grows (until the resource gives them all back): each core keeps a
//! copy-on-write snapshot of it ([`ChunkView`]) and refreshes it under the table's lock only
//! when it meets a block of a chunk it has not seen yet, so a free finds its block without a
//! shared lock. The flags are atomics because a block handed out by one shard may be freed into
//! another. A flag per block (a byte, not a bit) is read and written with plain loads and
//! stores, where a bit would need a read-modify-write of a word other shards change: on the
//! host that profiles W1, each such instruction costs as much as taking the shard's lock. So a
//! free of a block not in use (a double free, after the first returned) is refused, but two
//! frees of one block racing on two threads into two shards may both pass: `deallocate`'s
//! contract already rules that out, and catching it is a debugging aid, not a safety net.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// One chunk: its base and a flag per block, set while the block is in use.
#[derive(Clone)]
pub(crate) struct ChunkRef {
    pub(crate) base: u64,
    in_use: Arc<[AtomicBool]>,
}

impl ChunkRef {
    /// Marks block `i`, just taken off a free list (so free), in use.
    #[inline]
    pub(crate) fn set(&self, i: usize) {
        debug_assert!(
            !self.in_use[i].load(Ordering::Relaxed),
            "a block on a free list was in use"
        );
        self.in_use[i].store(true, Ordering::Release);
    }

    /// Marks block `i` free; returns whether it was in use (false: a double free, nothing
    /// changed). Not one read-modify-write: see the [module documentation](self).
    #[inline]
    pub(crate) fn clear(&self, i: usize) -> bool {
        let flag = &self.in_use[i];
        let was = flag.load(Ordering::Acquire);
        if was {
            flag.store(false, Ordering::Release);
        }
        was
    }

    /// Whether block `i` is in use (exact only while no shard can change it: all locked).
    pub(crate) fn is_set(&self, i: usize) -> bool {
        self.in_use[i].load(Ordering::Acquire)
    }
}

/// Every chunk, sorted by base; shared by the cores of one resource.
#[derive(Default)]
struct ChunkTable {
    /// Replaced (never changed in place) when a chunk comes or all go: views hold old copies.
    chunks: Mutex<Arc<[ChunkRef]>>,
    /// `chunks.len()`, readable without the lock.
    count: AtomicUsize,
}

/// A core's copy of the chunk table. See the [module documentation](self).
pub(crate) struct ChunkView {
    table: Arc<ChunkTable>,
    seen: Arc<[ChunkRef]>,
}

impl ChunkView {
    /// A view of a new, empty table.
    pub(crate) fn new() -> Self {
        ChunkView {
            table: Arc::default(),
            seen: Arc::from([]),
        }
    }

    /// Another view of the same table.
    pub(crate) fn sibling(&self) -> Self {
        ChunkView {
            table: Arc::clone(&self.table),
            seen: self.table.chunks.lock().clone(),
        }
    }

    /// The chunks this view has seen, sorted by base.
    #[inline]
    pub(crate) fn seen(&self) -> &[ChunkRef] {
        &self.seen
    }

    /// Catches up with the table; returns whether it had chunks this view had not seen.
    #[cold]
    pub(crate) fn refresh(&mut self) -> bool {
        let now = self.table.chunks.lock().clone();
        let news = now.len() != self.seen.len();
        self.seen = now;
        news
    }

    /// Adds a chunk of `blocks` blocks at `base` to the table (and this view).
    pub(crate) fn add(&mut self, base: u64, blocks: usize) {
        let mut chunks = self.table.chunks.lock();
        let at = chunks.partition_point(|c| c.base < base);
        let new = ChunkRef {
            base,
            in_use: (0..blocks).map(|_| AtomicBool::new(false)).collect(),
        };
        let next: Arc<[ChunkRef]> = chunks[..at]
            .iter()
            .cloned()
            .chain(std::iter::once(new))
            .chain(chunks[at..].iter().cloned())
            .collect();
        *chunks = Arc::clone(&next);
        self.table.count.store(next.len(), Ordering::Release);
        self.seen = next;
    }

    /// Every chunk now, sorted by base (under the table's lock: for snapshots).
    pub(crate) fn current(&self) -> Arc<[ChunkRef]> {
        self.table.chunks.lock().clone()
    }

    /// How many chunks the table holds (every view's, not only this one's).
    pub(crate) fn count(&self) -> usize {
        self.table.count.load(Ordering::Acquire)
    }

    /// Empties the table; returns the chunks' bases. Other views keep stale copies until they
    /// refresh: for when no block is in use (and none can be freed).
    pub(crate) fn take_all(&mut self) -> Vec<u64> {
        let mut chunks = self.table.chunks.lock();
        let bases = chunks.iter().map(|c| c.base).collect();
        *chunks = Arc::from([]);
        self.table.count.store(0, Ordering::Release);
        self.seen = Arc::from([]);
        bases
    }
}
