//! What a pool reports: [`PoolStatistics`], its snapshot, and out-of-memory details.

use std::sync::atomic::Ordering;

use rustc_hash::FxHashMap;

use super::inner::{snapshot_block, Inner};
use super::level::{Level, SnapshotBlock};
use crate::error::{Error, OutOfMemoryDetails};
use crate::ids::StreamId;
use crate::resource::contract::forward::Forward;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::{Fragmentation, MemorySnapshot, Segment};
use crate::stream::Stream;

/// A snapshot of a pool's accounting ([`PoolResource::statistics`](crate::PoolResource::statistics)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatistics {
    /// Bytes held from the upstream (every chunk, allocated or free): the pool's reserved
    /// bytes, as [`MemoryStats::reserved_bytes`](crate::MemoryStats::reserved_bytes) spells them.
    pub reserved_bytes: usize,
    /// The old spelling of `reserved_bytes` (RMM's `pool_size`), kept for one release.
    #[deprecated(note = "renamed `reserved_bytes`, as in `MemoryStats`")]
    #[doc(hidden)]
    pub pool_size: usize,
    /// Bytes free in the pool.
    pub free_bytes: usize,
    /// The largest free block once the pool gathers the free memory of every stream: the
    /// largest run of address-adjacent free blocks of one level, whichever streams freed
    /// them. (The pool keeps blocks freed on different streams apart until a request needs
    /// them joined; it then makes the requesting stream wait for the others' frees and
    /// joins them. So a wholly free pool reads as one block, not as fragmentation.) Reading
    /// it walks the blocks; [`MemoryResource::fragmentation`] tells what is usable now by
    /// which stream.
    pub largest_free_block: usize,
    /// How many free blocks there are.
    pub free_blocks: usize,
    /// How many allocations are live.
    pub live_allocations: usize,
    /// How many chunks the pool holds from its upstream.
    pub upstream_chunks: usize,
}

impl<R: MemoryResource> Inner<R> {
    /// [`PoolResource::statistics`].
    pub(super) fn statistics(&self) -> PoolStatistics {
        self.statistics_with(true)
    }

    /// [`statistics`](Self::statistics); with `extents`, `largest_free_block` is the largest
    /// run of free blocks of any streams (O(blocks)), else only the largest of one stream's
    /// (O(streams)), for callers that do not read it.
    pub(super) fn statistics_with(&self, extents: bool) -> PoolStatistics {
        let largest = |core: &super::core::state::PoolCore| {
            if extents {
                core.largest_free_extent()
            } else {
                core.largest_free_block()
            }
        };
        // Every level at once, so that no sub-chunk moves while it is counted: the shards in
        // order, then the global level. (Nothing else holds two shards, and the global level is
        // only ever locked after a shard, so this cannot deadlock.)
        let shards: Vec<_> = self.shards.iter().map(|s| s.lock()).collect();
        let global = self.global.lock();
        let large = self.large.lock();
        let core = &global.core;
        // The old spelling is filled in until it goes.
        #[allow(deprecated)]
        let mut stats = PoolStatistics {
            reserved_bytes: global.chunk_bytes + large.chunk_bytes,
            pool_size: global.chunk_bytes + large.chunk_bytes,
            free_bytes: core.free_bytes(),
            largest_free_block: largest(core),
            free_blocks: core.free_block_count(),
            live_allocations: core.allocation_count(),
            upstream_chunks: core.chunk_count(),
        };
        if let Some(level) = self.mapped_made() {
            // Its mapped pages: what it holds of the device, and their free part.
            let m = level.statistics();
            stats.reserved_bytes += m.reserved_bytes;
            #[allow(deprecated)]
            {
                stats.pool_size += m.reserved_bytes;
            }
            stats.free_bytes += m.reserved_bytes.saturating_sub(m.allocated_bytes);
            stats.live_allocations += m.live_allocations;
        }
        let core = &large.core;
        stats.free_bytes += core.free_bytes();
        stats.largest_free_block = stats.largest_free_block.max(largest(core));
        stats.free_blocks += core.free_block_count();
        stats.live_allocations += core.allocation_count();
        stats.upstream_chunks += core.chunk_count();
        for shard in &shards {
            let core = &shard.level.core;
            stats.free_bytes += core.free_bytes();
            stats.largest_free_block = stats.largest_free_block.max(largest(core));
            stats.free_blocks += core.free_block_count();
            // The shard's sub-chunks are allocations of the global level, not of the user.
            stats.live_allocations += core.allocation_count();
            stats.live_allocations -= core.chunk_count();
        }
        stats
    }

    /// [`MemoryResource::snapshot`]: every level's chunks, each a segment; a sub-chunk the
    /// global level lent to a shard is described by the shard's blocks. Every level is locked
    /// at once (in [`statistics`](Self::statistics)' order), so no sub-chunk moves while the
    /// blocks are copied; and a shard gives sub-chunks back under its own lock
    /// ([`return_to_global`](Self::return_to_global)), so every lent block has a shard that
    /// describes it (else the lent block would read as one live block).
    pub(super) fn take_snapshot(&self) -> MemorySnapshot {
        let shards: Vec<_> = self.shards.iter().map(|s| s.lock()).collect();
        let global = self.global.lock();
        let large = self.large.lock();
        let mut lent: FxHashMap<u64, Vec<SnapshotBlock>> = FxHashMap::default();
        for shard in &shards {
            for (base, _, blocks) in shard.level.snapshot() {
                lent.insert(base, blocks);
            }
        }
        let mut snapshot = MemorySnapshot::new(self.device.id(), "pool");
        snapshot.capacity = self.maximum;
        for (base, bytes, blocks) in global.snapshot().into_iter().chain(large.snapshot()) {
            let mut segment = Segment::new(DevicePtr::from_raw(base), bytes);
            for b in blocks {
                match lent.remove(&b.start).filter(|_| b.lent) {
                    Some(sub) => segment.blocks.extend(sub.into_iter().map(snapshot_block)),
                    None => {
                        debug_assert!(!b.lent, "a lent block no shard describes: {:#x}", b.start);
                        segment.blocks.push(snapshot_block(b));
                    }
                }
            }
            snapshot.segments.push(segment);
        }
        drop((shards, global, large));
        if let Some(level) = self.mapped_made() {
            let mapped = level.snapshot().expect("a mapped pool takes snapshots");
            snapshot.segments.extend(mapped.segments);
        }
        snapshot.sort();
        snapshot
    }

    /// Out-of-memory for `requested` bytes on `stream`, with [`OutOfMemoryDetails`]: the
    /// largest free block, the free and reserved bytes, and, as pending frees, the free bytes
    /// of every other stream (usable by `stream` only in stream order after that stream's
    /// frees). One lock per level.
    ///
    /// The largest free block joins free blocks of any streams (the pool hands any of them to
    /// any stream, after a wait where it crosses streams), which walks every block (O(blocks)),
    /// unless an allocation waits on the pool (or on a resource over it) and a free may still
    /// come: then the failed try is most likely the waiter's retry at a free, whose error is
    /// dropped, and walking every block at each of N frees would cost O(N × blocks) under the
    /// pool's locks. Such details give the largest block of one stream (O(streams)), as
    /// before snapshots. A waiter's retry whose error ends its wait (nothing live, so no free
    /// can come) joins them again.
    pub(super) fn out_of_memory(&self, requested: usize, stream: &Stream) -> Error {
        let joined =
            !self.availability.anyone_waiting() || !Forward::may_regain_memory(self, requested);
        Error::out_of_memory_with(requested, self.device.id(), self.details(stream, joined))
            .never_fitting(self.capacity_limit())
    }

    /// Whether `size` is larger than all free memory and the room left under the pool's
    /// maximum together, so that it cannot fit however the pool gathers, gives back and
    /// regrows (never for an unbounded pool). One lock per level.
    pub(super) fn cannot_fit(&self, size: usize) -> bool {
        let Some(maximum) = self.maximum else {
            return false;
        };
        let room = maximum.saturating_sub(self.held.load(Ordering::Relaxed));
        if size <= room {
            return false;
        }
        let mut free = self.global.lock().core.free_bytes();
        free += self.large.lock().core.free_bytes();
        for shard in self.shards.iter() {
            free += shard.lock().level.core.free_bytes();
        }
        size > free.saturating_add(room)
    }

    /// [`out_of_memory`](Self::out_of_memory)'s details, read from the pool's fragmentation
    /// figures as counted for the request (see
    /// [`Fragmentation::out_of_memory_details`]): every stream's free bytes as free on that
    /// stream, so that the requester's own are usable and the others' pending. With
    /// `joined`, the largest free extent is the largest run of free blocks of any streams
    /// (O(blocks)), else the largest block of one stream (O(streams)).
    pub(super) fn details(&self, stream: &Stream, joined: bool) -> OutOfMemoryDetails {
        let mut figures = Fragmentation {
            reserved_bytes: self.held.load(Ordering::Relaxed) + self.mapped_bytes(),
            ..Fragmentation::default()
        };
        let mut free = 0;
        let mut by_stream: Vec<(StreamId, usize)> = Vec::new();
        let mut count = |level: &Level| {
            free += level.core.free_bytes();
            // Runs of free blocks of any streams: the pool joins them for a request (after
            // waiting for their streams' frees), so one stream's largest block would
            // understate what fits and read as fragmentation.
            figures.largest_free_block = figures.largest_free_block.max(if joined {
                level.core.largest_free_extent()
            } else {
                level.core.largest_free_block()
            });
            for (id, bytes) in level.free_by_stream() {
                match by_stream.iter_mut().find(|(s, _)| *s == id) {
                    Some((_, b)) => *b += bytes,
                    None => by_stream.push((id, bytes)),
                }
            }
        };
        for shard in self.shards.iter() {
            count(&shard.lock().level);
        }
        count(&self.global.lock());
        count(&self.large.lock());
        by_stream.sort_unstable();
        let on_streams: usize = by_stream.iter().map(|&(_, b)| b).sum();
        figures.free_now_bytes = free.saturating_sub(on_streams);
        figures.free_on_stream = by_stream;
        figures.out_of_memory_details(stream.id())
    }
}
