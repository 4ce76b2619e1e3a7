//! Where the stream arenas live: a slot per arena (per stream, or per thread and stream), the
//! registry that maps streams to slots and keeps each stream's free order, and a thread-local
//! cache that finds a thread's arena without the registry's lock.

use std::cell::Cell;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::thread::ThreadId;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::core::StreamArena;
use crate::resource::suballoc::stream_order::{Fence, SharedFreeOrder, SharedFreeOrders};
use crate::stream::StreamId;

/// The key of a stream arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct ArenaKey {
    pub(super) stream: StreamId,
    /// `Some` with per-thread arenas.
    pub(super) thread: Option<ThreadId>,
}

/// One stream arena's place; slots are reused after their arena is retired. Aligned so that
/// two threads' arenas never share a cache line.
#[repr(align(128))]
#[derive(Default)]
pub(super) struct Slot {
    /// The arena's stream id, 0 when vacant. Changes only while the arena holds no superblock,
    /// so a free of a block inside one may read it without the lock.
    pub(super) home: AtomicU64,
    pub(super) state: Mutex<SlotState>,
}

#[derive(Default)]
pub(super) struct SlotState {
    /// `None` when vacant.
    pub(super) key: Option<ArenaKey>,
    pub(super) record: Option<Arc<SharedFreeOrder>>,
    pub(super) core: StreamArena<Fence>,
}

pub(super) const SLOT_BUCKETS: usize = 28;
const FIRST_BUCKET: usize = 32;

/// An append-only array of slots that never moves them: bucket `b` holds `32 << b` slots,
/// allocated on first use, so a slot is found by index without a lock.
pub(super) struct Slots {
    buckets: [OnceLock<Box<[Slot]>>; SLOT_BUCKETS],
}

impl Slots {
    pub(super) fn new() -> Self {
        Slots {
            buckets: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    pub(super) fn locate(index: u32) -> (usize, usize) {
        let n = index as usize / FIRST_BUCKET + 1;
        let bucket = (usize::BITS - 1 - n.leading_zeros()) as usize;
        (bucket, index as usize - FIRST_BUCKET * ((1 << bucket) - 1))
    }

    /// The slot at `index`, which must have been made by [`Slots::make`].
    pub(super) fn get(&self, index: u32) -> &Slot {
        let (bucket, offset) = Self::locate(index);
        &self.buckets[bucket].get().expect("slot index never made")[offset]
    }

    pub(super) fn make(&self, index: u32) -> &Slot {
        let (bucket, offset) = Self::locate(index);
        &self.buckets[bucket].get_or_init(|| {
            (0..FIRST_BUCKET << bucket)
                .map(|_| Slot::default())
                .collect()
        })[offset]
    }
}

/// Which slot serves which arena, and every stream's free order.
#[derive(Default)]
pub(super) struct Registry {
    pub(super) arenas: FxHashMap<ArenaKey, u32>,
    /// The free order of every stream that frees memory into the arena or owns a stream arena.
    pub(super) orders: SharedFreeOrders,
    /// Slots below `used` whose arena was retired.
    pub(super) vacant: Vec<u32>,
    /// Slots ever made: `0..used`.
    pub(super) used: u32,
}

/// A thread's recently used stream arenas: (resource uid, stream id) → slot.
#[derive(Clone, Copy)]
struct CacheEntry {
    resource: u64,
    stream: u64,
    slot: u32,
}

const CACHE_WAYS: usize = 4;
const EMPTY: CacheEntry = CacheEntry {
    resource: 0,
    stream: 0,
    slot: 0,
};

thread_local! {
    static CACHE: [Cell<CacheEntry>; CACHE_WAYS] = const { [const { Cell::new(EMPTY) }; CACHE_WAYS] };
    static CACHE_NEXT: Cell<usize> = const { Cell::new(0) };
}

pub(super) fn cache_get(resource: u64, stream: u64) -> Option<u32> {
    CACHE.with(|ways| {
        ways.iter().find_map(|w| {
            let e = w.get();
            (e.resource == resource && e.stream == stream).then_some(e.slot)
        })
    })
}

pub(super) fn cache_put(resource: u64, stream: u64, slot: u32) {
    let i = CACHE_NEXT.with(|n| {
        let i = n.get();
        n.set((i + 1) % CACHE_WAYS);
        i
    });
    CACHE.with(|ways| {
        ways[i].set(CacheEntry {
            resource,
            stream,
            slot,
        })
    });
}

pub(super) fn cache_forget(resource: u64, stream: u64) {
    CACHE.with(|ways| {
        for w in ways {
            let e = w.get();
            if e.resource == resource && e.stream == stream {
                w.set(EMPTY);
            }
        }
    });
}
