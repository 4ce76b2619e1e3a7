//! How the resource finds a stream's (or thread's) arena and a stream's free order: through
//! the thread's cache, then the registry of [`slots`](super::slots), making them on first use.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::core::StreamArena;
use super::levels::Inner;
use super::slots::{cache_get, cache_put, ArenaKey};
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::suballoc::stream_order::{Fence, SharedFreeOrder};
use crate::stream::Stream;

impl<R: MemoryResource> Inner<R> {
    pub(super) fn key(&self, stream: &Stream) -> ArenaKey {
        ArenaKey {
            stream: stream.id(),
            thread: self.per_thread.then(|| std::thread::current().id()),
        }
    }

    /// The record of `stream`, made on first use.
    pub(super) fn record_of(&self, stream: &Stream) -> Arc<SharedFreeOrder> {
        let found = self.registry.read().orders.get(stream.id());
        found.unwrap_or_else(|| self.registry.write().orders.get_or_make(stream))
    }

    /// The slot of the arena for `key`: from the thread's cache, the registry, or a new one.
    /// The caller checks, under the slot's lock, that it still serves `key`.
    pub(super) fn arena_slot(&self, stream: &Stream, key: ArenaKey) -> u32 {
        let sid = stream.id().0;
        if let Some(slot) = cache_get(self.uid, sid) {
            return slot;
        }
        let found = self.registry.read().arenas.get(&key).copied();
        let slot = found.unwrap_or_else(|| self.make_arena(stream, key));
        cache_put(self.uid, sid, slot);
        slot
    }

    pub(super) fn make_arena(&self, stream: &Stream, key: ArenaKey) -> u32 {
        let mut registry = self.registry.write();
        if let Some(&slot) = registry.arenas.get(&key) {
            return slot;
        }
        let index = match registry.vacant.pop() {
            Some(index) => index,
            None => {
                let index = registry.used;
                registry.used = index.checked_add(1).expect("too many stream arenas");
                index
            }
        };
        let record = registry.orders.get_or_make(stream);
        let slot = self.slots.make(index);
        let mut state = slot.state.lock();
        debug_assert!(state.key.is_none() && state.core.superblock_count() == 0);
        state.key = Some(key);
        state.record = Some(record);
        slot.home.store(stream.id().0, Ordering::Release);
        registry.arenas.insert(key, index);
        index
    }

    /// Visits every live stream arena, each under its lock in turn.
    pub(super) fn for_each_arena(&self, mut f: impl FnMut(&ArenaKey, &StreamArena<Fence>)) {
        let registry = self.registry.read();
        for index in 0..registry.used {
            let state = self.slots.get(index).state.lock();
            if let Some(key) = &state.key {
                f(key, &state.core);
            }
        }
    }
}
