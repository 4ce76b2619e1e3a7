//! The stream shards' fast path, and giving free memory back to the global level and the upstream.

use std::sync::atomic::Ordering;

use parking_lot::{Mutex, MutexGuard};

use super::core::align_up;
use super::inner::{Inner, Shard, GRANULE};
use super::level::Released;
use crate::error::Result;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::device_ptr::DevicePtr;
use crate::stream::Stream;

impl<R: MemoryResource> Inner<R> {
    /// Serves `size` (aligned, at most `shard_limit`) for `stream` from `stream`'s shard,
    /// refilling it from the global level with a sub-chunk: the largest piece of
    /// `shard_chunk`, halved down to `size`, that the global level has free, and only if none
    /// of them is there, one that the global level grows for.
    pub(super) fn shard_allocate(&self, size: usize, stream: &Stream) -> Result<Option<u64>> {
        let mut shard = self.shard_of(stream).lock();
        if let Some(p) = shard.level.serve(size, stream)? {
            return Ok(Some(p));
        }
        self.return_heads(&mut shard, stream)?;
        // The lock order is a shard, then the global level; never the other way round.
        // Granular pools size sub-chunks like the shard's holdings so far (a granule at
        // first, doubling up to `shard_chunk`), so that a stream with a few small blocks does
        // not hold a whole `shard_chunk` of the device.
        let first_want = if self.granular {
            shard.level.chunk_bytes.clamp(GRANULE, self.shard_chunk)
        } else {
            self.shard_chunk
        };
        if let Some(p) = self.refill(&mut shard, size, first_want, stream, false)? {
            return Ok(Some(p));
        }
        if self.shards.len() > 1 {
            // Before the pool grows, other shards' wholly free sub-chunks come back to the
            // global level, so that memory another stream freed serves this one within this
            // one miss instead of stranding in that stream's shard (RMM issue #2039). (The
            // shard's lock is let go meanwhile: shards are never locked two at a time.)
            drop(shard);
            self.reclaim();
            shard = self.shard_of(stream).lock();
            if let Some(p) = shard.level.serve(size, stream)? {
                return Ok(Some(p));
            }
            if let Some(p) = self.refill(&mut shard, size, first_want, stream, false)? {
                return Ok(Some(p));
            }
        }
        self.refill(&mut shard, size, first_want, stream, true)
    }

    /// Takes a sub-chunk for `shard` from the global level (growing it if `may_grow`): the
    /// largest piece of `want`, halved down to `size`, that it can, and serves `size` from it.
    pub(super) fn refill(
        &self,
        shard: &mut Shard,
        size: usize,
        want: usize,
        stream: &Stream,
        may_grow: bool,
    ) -> Result<Option<u64>> {
        let mut want = want.max(size);
        loop {
            if let Some(base) = self.global_allocate(want, stream, may_grow, true)? {
                shard.level.add_chunk(base, want, stream);
                let p = shard.level.core.allocate(size, super::level::key(stream));
                debug_assert!(p.is_some(), "a fresh sub-chunk serves the request");
                return Ok(p);
            }
            if want == size {
                return Ok(None);
            }
            want = align_up(want / 2).unwrap_or(size).max(size);
        }
    }

    /// Gives the unused heads of the shard's sub-chunks back to the global level before it
    /// carves more from its free memory: the newest sub-chunk lies just above that memory and
    /// its head joins it, so that one stream's requests are packed without gaps (else each
    /// sub-chunk would strand its rest, and the pool could not be filled to its maximum).
    ///
    /// Bounded pools only: an unbounded one can grow instead, and keeps its sub-chunks whole
    /// (which keeps the layout that a repeated sequence of requests finds free again).
    pub(super) fn return_heads(&self, shard: &mut Shard, stream: &Stream) -> Result<()> {
        if self.maximum.is_none() {
            return Ok(());
        }
        let heads = shard.level.cut_free_heads(stream);
        if heads.is_empty() {
            return Ok(());
        }
        let mut global = self.global.lock();
        let mut result = Ok(());
        for (base, head, owner) in heads {
            // Every head is taken back even if ordering one of them fails.
            result = result.and(global.take_back_head(base, head, &owner));
        }
        result
    }

    /// The index of `stream`'s shard: its id modulo the (power-of-two) number of shards.
    pub(super) fn shard_index(&self, stream: &Stream) -> usize {
        stream.id().0 as usize & (self.shards.len() - 1)
    }

    pub(super) fn shard_of(&self, stream: &Stream) -> &Mutex<Shard> {
        &self.shards[self.shard_index(stream)]
    }

    /// Frees `addr` on `stream` into the shard that holds it, trying `stream`'s shard first
    /// (`skip` 0) or not at all (`skip` 1: the caller tried it); false when no shard holds it.
    pub(super) fn shard_free(&self, addr: u64, bytes: usize, stream: &Stream, skip: usize) -> bool {
        let home = self.shard_index(stream);
        let order = (skip..self.shards.len()).map(|i| (home + i) & (self.shards.len() - 1));
        for i in order {
            let mut shard = self.shards[i].lock();
            if !shard.level.try_free(addr, bytes, stream) {
                continue;
            }
            self.shard_freed(shard);
            return true;
        }
        false
    }

    /// After a free into `shard`: gives its wholly free sub-chunks back to the global level
    /// once it holds more than `release_above` free bytes.
    #[inline]
    pub(super) fn shard_freed(&self, shard: MutexGuard<'_, Shard>) {
        if shard.level.core.free_bytes() > shard.release_above {
            self.shard_release(shard);
        }
    }

    #[cold]
    pub(super) fn shard_release(&self, mut shard: MutexGuard<'_, Shard>) {
        let released = shard.level.release_empty_chunks(false);
        let free = shard.level.core.free_bytes();
        shard.release_above = (2 * self.shard_chunk).max(free + self.shard_chunk);
        let returned = self.return_to_global(&mut shard, released);
        drop(shard);
        if returned {
            self.returned_to_global();
        }
    }

    /// Frees `addr` on `stream` into the large level if it holds it.
    pub(super) fn large_free(&self, addr: u64, bytes: usize, stream: &Stream) -> bool {
        self.granular && self.large.lock().try_free(addr, bytes, stream)
    }

    /// Gives sub-chunks a shard released back to the global level, locking it while the
    /// shard's lock (`_held`) is still held (a shard, then the global level: the pool's lock order), so
    /// that every sub-chunk is at all times either described by a shard or free in the global
    /// level: a snapshot or statistics taken in between would otherwise find the global
    /// level's lent block described by no shard. True when there were any: the caller then
    /// calls [`returned_to_global`](Self::returned_to_global) once the shard is unlocked.
    pub(super) fn return_to_global(&self, _held: &mut Shard, released: Vec<Released>) -> bool {
        if released.is_empty() {
            return false;
        }
        let mut global = self.global.lock();
        for (base, size, stream) in released {
            assert!(
                global.take_back(base, size, &stream),
                "a shard's sub-chunk {base:#x} is not lent by the global level"
            );
        }
        true
    }

    /// After sub-chunks came back to the global level (no lock held): wakes a waiting
    /// allocation (one that retried while they were on their way found them in neither
    /// level) and applies the release policy.
    pub(super) fn returned_to_global(&self) {
        self.availability.notify();
        self.apply_keep_free();
    }

    /// Takes every wholly free sub-chunk back from the shards, after gathering each shard's
    /// free memory on one stream (which records events and waits) so that sub-chunks freed
    /// piecewise on several streams count.
    pub(super) fn reclaim(&self) {
        let mut returned = false;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let released = shard.level.release_empty_chunks(true);
            shard.release_above = 2 * self.shard_chunk;
            returned |= self.return_to_global(&mut shard, released);
        }
        if returned {
            self.returned_to_global();
        }
    }

    /// Gives every wholly free chunk of the global level back to the upstream, on the stream
    /// that owns its free memory, and wakes a waiting allocation (the pool may now grow by
    /// more); returns the bytes released.
    pub(super) fn release_empty_chunks(&self) -> usize {
        // Each level gives its chunks back under its lock: released but not yet subtracted
        // from `held`, a chunk would let a growing level see room the maximum does not leave
        // (an H100 soak once held more than its pool's maximum).
        let mut bytes = {
            let mut global = self.global.lock();
            let released = global.release_empty_chunks(true);
            self.give_back(released)
        };
        bytes += {
            let mut large = self.large.lock();
            let released = large.release_empty_chunks(true);
            self.give_back(released)
        };
        // The mapped level's free pages whose streams have passed their frees (the others
        // go at a later free or release).
        if let Some(level) = self.mapped_made() {
            bytes += level.release_free_above(0);
        }
        if bytes > 0 {
            self.availability.notify();
        }
        bytes
    }

    /// Gives chunks the global level released back to the upstream, each on the stream that
    /// owns its free memory; returns their bytes.
    pub(super) fn give_back(&self, released: Vec<Released>) -> usize {
        let mut bytes = 0;
        for (base, size, stream) in released {
            // SAFETY: the chunk came from `upstream.try_allocate(size, ..)` (`expand`), the core
            // no longer hands out any of it, and every block of it was freed on `stream` or
            // merged into it after a wait, so all work using it is ordered before this point.
            unsafe {
                self.upstream
                    .deallocate(DevicePtr::from_raw(base), size, &stream)
            };
            bytes += size;
        }
        self.held.fetch_sub(bytes, Ordering::Relaxed);
        bytes
    }
}
