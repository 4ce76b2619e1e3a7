//! The pool's state: its two levels, the stream shards, and how it grows from its upstream.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::allocated_peak::PeakCounter;
use super::core::{align_up, ALIGN};
use super::level::{Level, SnapshotBlock};
use super::release::ReleasePolicy;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::contract::availability::Availability;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::Block;
use crate::resource::suballoc::mapped_pool::MappedPoolResource;
use crate::stream::Stream;

pub(super) struct Inner<R: MemoryResource> {
    pub(super) upstream: R,
    pub(super) device: Device,
    pub(super) maximum: Option<usize>,
    /// The level whose chunks come from the upstream.
    pub(super) global: Mutex<Level>,
    /// Granular pools (see `granular`): the level of large blocks (above [`LARGE_BLOCK`]) that the global
    /// level's free memory could not serve, each in a chunk of its own size taken from the
    /// upstream, so that when it is freed its chunk is wholly free and can go back (short-lived
    /// large blocks never strand in chunks that small blocks pin). Locked after the global
    /// level, never before. Empty in bounded pools, and in pools with a `mapped` level.
    pub(super) large: Mutex<Level>,
    /// Granular pools over plain device memory (their upstream is a
    /// [`CudaResource`](crate::CudaResource) of the pool's device) keep large blocks in an
    /// address range of their own instead of the `large` level: a mapped pool, made at the
    /// first large request (`mapped_level`), where the freed pages of a large block serve
    /// the next of any size. Holds `None` where the device has no virtual memory management.
    pub(super) mapped: OnceLock<Option<MappedPoolResource>>,
    /// Whether the pool uses `mapped`.
    pub(super) vmm: bool,
    /// Allocations `mapped` served so far (wrapping): how an idle release policy sees it used.
    pub(super) mapped_served: AtomicU64,
    /// Bytes held from the upstream: both levels' chunks. Changed under the lock of the level
    /// that takes or gives back a chunk. (The mapped level's pages are not from the upstream.)
    pub(super) held: Arc<AtomicUsize>,
    /// The stream shards, a power of two of them (none for small pools); a stream's shard is
    /// its id modulo their number. Shared (weakly) with the availability's join barrier.
    pub(super) shards: Arc<[Mutex<Shard>]>,
    /// Bytes a shard takes from the global level at a time (see `shard_layout`).
    pub(super) shard_chunk: usize,
    /// Requests up to this size go through the shards.
    pub(super) shard_limit: usize,
    pub(super) availability: Arc<Availability>,
    /// The most bytes held at once (from the upstream, and the mapped level's pages) since the
    /// pool was made or its peak reset. Written only when the pool grows or serves a large
    /// block, never on the fast path.
    pub(super) peak_reserved: AtomicUsize,
    /// Allocated bytes and their peak, counted only in pools made
    /// [`with_peak_allocated`](super::PoolResource::with_peak_allocated).
    pub(super) allocated: PeakCounter,
    /// Granular pools: the bytes grown so far for requests below [`GRANULE`] (a shard's
    /// sub-chunk counts as one request), which the next such growth matches up to
    /// [`MAX_SHARD_CHUNK`]: small blocks get geometrically larger chunks, large ones chunks
    /// of their own size. Written under the global lock.
    pub(super) small_grown: AtomicUsize,
    /// Whether the pool grows by granules and keeps large blocks in chunks of their own (the
    /// `large` level): pools that start empty, without a maximum, over an upstream that may
    /// hold [`SHARDED_CAPACITY`] or more (a device). Others grow as RMM's does: an initial
    /// size says how much the user wants reserved, and growth then amortises as RMM's.
    pub(super) granular: bool,
    /// [`ReleasePolicy::keep_free`], `usize::MAX` for none: read on the frees that reach the
    /// global levels.
    pub(super) keep_free: AtomicUsize,
    /// Free bytes of the global levels above which such a free looks for wholly free chunks
    /// under `keep_free`: raised when a look found too few (fragmented free memory), so that
    /// frees do not scan the chunks every time; reset when the free bytes fall under
    /// `keep_free`.
    pub(super) release_scan_above: AtomicUsize,
    /// The release policy set, and the generation of its idle thread (a thread whose
    /// generation is not the current one ends).
    pub(super) policy: Mutex<(ReleasePolicy, u64)>,
}

pub(super) struct Shard {
    pub(super) level: Level,
    /// Free bytes above which the shard gives wholly free sub-chunks back to the global level:
    /// raised after each attempt, so a shard whose free memory is fragmented does not search
    /// its chunks on every free.
    pub(super) release_above: usize,
}

pub(super) fn check_size(what: &str, bytes: usize) -> Result<()> {
    if bytes % ALIGN == 0 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} ({bytes}) must be a multiple of {ALIGN} bytes"
        )))
    }
}

pub(super) fn snapshot_block(b: SnapshotBlock) -> Block {
    let mut block = Block::new(DevicePtr::from_raw(b.start), b.size, b.state);
    block.stream = b.stream;
    block
}

/// Pools that may hold less than this have no shards.
pub(super) const SHARDED_CAPACITY: usize = 256 << 20;
/// The largest power of two a shard's sub-chunk starts from.
pub(super) const MAX_SHARD_CHUNK: usize = 64 << 20;
/// What an unbounded pool's chunks are multiples of: the device's large page, so a chunk
/// takes from the device what it says it takes (`cuMemAlloc` maps whole 2 MiB pages).
pub(super) const GRANULE: usize = 2 << 20;
/// Requests above this go to the global level in an unbounded pool, never a shard: W1's and
/// W3's requests (up to 1 MiB) stay on the sharded fast path, while larger, often
/// short-lived blocks do not strand in sub-chunks that long-lived small blocks pin.
pub(super) const UNBOUNDED_SHARD_LIMIT: usize = 1 << 20;
/// Requests above this in an unbounded pool that the global level's free memory cannot serve
/// get chunks of their own (the `large` level).
pub(super) const LARGE_BLOCK: usize = 1 << 20;
/// The large level keeps wholly free chunks up to this fraction of the pool's size.
pub(super) const LARGE_KEPT: usize = 8;

/// `(shard count, sub-chunk bytes, request limit)` for a pool that may hold `capacity` bytes,
/// `bounded` when that is its own maximum, `granular` when it grows by granules.
pub(super) fn shard_layout(
    capacity: usize,
    bounded: bool,
    granular: bool,
) -> (usize, usize, usize) {
    if capacity < SHARDED_CAPACITY {
        return (0, 0, 0);
    }
    let shards = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .next_power_of_two()
        .min(64);
    // capacity / 64 is at least 4 MiB here, so its log is defined.
    let base = (1 << (capacity / 64).ilog2()).min(MAX_SHARD_CHUNK);
    // With a maximum, a power of two, so that requests of any power-of-two size up to the
    // limit fill sub-chunks exactly and the pool can be filled to its maximum from several
    // shards. Without one, half a size class more (the pool's classes split each power of
    // two in 32), so that small requests carved off a fresh sub-chunk leave it in its class:
    // no relinking of the sub-chunk's free block on the fast path, at the price of a scrap
    // per sub-chunk that no request of its limit's size can use when the upstream runs out.
    let chunk = if bounded { base } else { base + base / 64 };
    let limit = if granular {
        (base / 4).min(UNBOUNDED_SHARD_LIMIT)
    } else {
        base / 4
    };
    (shards, chunk, limit)
}

impl<R: MemoryResource> Inner<R> {
    /// What changes when the pool is used: each level's served allocations and chunk bytes.
    pub(super) fn activity(&self) -> Vec<(u64, usize)> {
        let mut levels: Vec<(u64, usize)> = self
            .shards
            .iter()
            .map(|s| {
                let s = s.lock();
                (s.level.served, s.level.chunk_bytes)
            })
            .collect();
        for level in [&self.global, &self.large] {
            let l = level.lock();
            levels.push((l.served, l.chunk_bytes));
        }
        levels.push((
            self.mapped_served.load(Ordering::Relaxed),
            self.mapped_bytes(),
        ));
        levels
    }

    /// [`ReleasePolicy::keep_free`]: after a free that reached the global levels, gives wholly
    /// free chunks (the large level's first) back while their free bytes are above it.
    pub(super) fn apply_keep_free(&self) {
        let keep = self.keep_free.load(Ordering::Relaxed);
        if keep == usize::MAX {
            return;
        }
        // The mapped level first: its free pages go back without taking the levels' locks, and
        // those kept count below.
        let mapped_free = match self.mapped_made() {
            Some(level) => {
                let stats = level.statistics();
                let free = stats.reserved_bytes - stats.allocated_bytes.min(stats.reserved_bytes);
                if free > keep {
                    level.release_free_above(keep);
                }
                level.mapped_bytes() - stats.allocated_bytes.min(level.mapped_bytes())
            }
            None => 0,
        };
        let mut global = self.global.lock();
        let mut large = self.large.lock();
        let free = global.core.free_bytes() + large.core.free_bytes() + mapped_free;
        if free <= keep {
            self.release_scan_above.store(0, Ordering::Relaxed);
            return;
        }
        if free <= self.release_scan_above.load(Ordering::Relaxed) {
            return;
        }
        let excess = free - keep;
        let mut released = large.release_empty_chunks_upto(false, excess);
        let got: usize = released.iter().map(|r| r.1).sum();
        if got < excess {
            released.extend(global.release_empty_chunks_upto(false, excess - got));
        }
        // Given back under the levels' locks, so that what they hold and `held` agree for a
        // level that grows meanwhile (else it sees room the maximum does not leave).
        let bytes = self.give_back(released);
        drop(large);
        drop(global);
        if free - bytes.min(free) > keep {
            // Too few wholly free chunks: look again only once more memory is free.
            self.release_scan_above
                .store(free - bytes.min(free) + GRANULE, Ordering::Relaxed);
        }
    }
}

impl<R: MemoryResource> Inner<R> {
    /// Takes at least `min_size` more bytes from the upstream, trying `try_size` first and
    /// halving on failure (RMM's `try_to_expand`); the chunk is owned by `stream`.
    pub(super) fn expand(
        &self,
        level: &mut Level,
        mut try_size: usize,
        min_size: usize,
        stream: &Stream,
    ) -> Result<()> {
        loop {
            match self.upstream.try_allocate(try_size, stream) {
                Ok(p) => {
                    level.add_chunk(p.addr(), try_size, stream);
                    let held = self.held.fetch_add(try_size, Ordering::Relaxed) + try_size;
                    // The mapped level keeps free pages up to the peak of what both held
                    // live: with more in chunks now, it may keep fewer.
                    let mapped = self.mapped_made().map_or(0, |m| {
                        m.release_over_keep();
                        m.mapped_bytes()
                    });
                    self.peak_reserved
                        .fetch_max(held + mapped, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if e.is_out_of_memory() && try_size > min_size => {
                    try_size = (try_size / 2).max(min_size);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// How much to ask the upstream for to serve `size` more bytes; 0 when the maximum leaves
    /// no room. With a maximum, RMM's rule (half the remaining room, at least the request),
    /// rounded up to a multiple of the request.
    /// Without one, unless the pool is [`granular`](Inner::granular), RMM's rule too
    /// (`max(request, pool size)`). Granular pools do not follow RMM's
    /// doubling, which holds up to twice the memory in use: a request
    /// of [`GRANULE`] or more gets a chunk of its own, rounded up to the granule; smaller ones
    /// (and shards' sub-chunks) a chunk as large as all such growth so far, from one granule
    /// up to [`MAX_SHARD_CHUNK`], so that a run of small requests still grows geometrically.
    pub(super) fn size_to_grow(&self, size: usize, pool_size: usize) -> usize {
        match self.maximum {
            Some(max) => {
                let remaining = align_up(max.saturating_sub(pool_size)).unwrap_or(0);
                if size <= remaining {
                    // A whole number of requests, so that no sliver too small for the next
                    // one of the same size is left in the chunk, or under the maximum: with
                    // 4 MiB requests a pool bounded at 64 MiB then fills all 64 whatever its
                    // initial multiple of 4 MiB (RMM's halves alone stop at 62).
                    let half = size.max(align_up(remaining / 2).unwrap_or(0));
                    half.checked_next_multiple_of(size)
                        .unwrap_or(remaining)
                        .min(remaining)
                } else {
                    0
                }
            }
            None if !self.granular => size.max(pool_size),
            None if size >= GRANULE => size.checked_next_multiple_of(GRANULE).unwrap_or(size),
            None => {
                let grown = self.small_grown.load(Ordering::Relaxed);
                let grow = grown.clamp(GRANULE, MAX_SHARD_CHUNK);
                self.small_grown
                    .store(grown.saturating_add(grow), Ordering::Relaxed);
                grow
            }
        }
    }

    /// Serves `size` (aligned) for `stream` from the global level, growing it if need be and
    /// `may_grow`, as a sub-chunk for a shard when `lend`; `None` when neither it nor its
    /// upstream has the memory.
    pub(super) fn global_allocate(
        &self,
        size: usize,
        stream: &Stream,
        may_grow: bool,
        lend: bool,
    ) -> Result<Option<u64>> {
        let mut global = self.global.lock();
        let p = self.global_serve(&mut global, size, stream, may_grow)?;
        if let (Some(p), true) = (p, lend) {
            global.lend(p);
        }
        Ok(p)
    }

    pub(super) fn global_serve(
        &self,
        global: &mut Level,
        size: usize,
        stream: &Stream,
        may_grow: bool,
    ) -> Result<Option<u64>> {
        if let Some(p) = global.serve(size, stream)? {
            return Ok(Some(p));
        }
        if !may_grow {
            return Ok(None);
        }
        let grow = self.size_to_grow(size, global.chunk_bytes);
        if grow == 0 {
            return Ok(None);
        }
        if self.granular {
            // Chunks never merge: a wholly free chunk that could not serve this request (else
            // `serve` would have found it) goes back before the pool takes more, so that the
            // memory held tracks the memory in use instead of the history of request sizes.
            self.give_back(global.release_empty_chunks(false));
        }
        self.grow_and_serve(global, grow, size, stream)
    }

    /// Granular pools: serves `size` (aligned, above [`LARGE_BLOCK`]) for `stream` from the
    /// large level, giving its wholly free chunks back and growing it by a chunk of the
    /// request's size (rounded up to [`GRANULE`]) when its free memory cannot; `None` when the
    /// upstream has no such chunk.
    pub(super) fn large_allocate(&self, size: usize, stream: &Stream) -> Result<Option<u64>> {
        let mut large = self.large.lock();
        // Only a close fit: the rest of a larger block would pin its chunk. (Other streams'
        // free chunks are not taken: they go back upstream below, on their streams, where
        // this stream's new chunk may come from.)
        let close = size
            .saturating_add(size / 16)
            .checked_next_multiple_of(GRANULE)
            .unwrap_or(usize::MAX);
        if let Some(p) = large
            .core
            .allocate_close(size, close, super::level::key(stream))
        {
            return Ok(Some(p));
        }
        let grow = size.checked_next_multiple_of(GRANULE).unwrap_or(size);
        // Wholly free chunks go back so that the level's free memory stays within a
        // [`LARGE_KEPT`]th of what the pool holds (a bound on what it adds to the footprint),
        // while the rest stay for later requests of their sizes (each miss here is an upstream
        // allocation).
        let kept = self.held.load(Ordering::Relaxed) / LARGE_KEPT;
        let excess = (large.core.free_bytes() + grow).saturating_sub(kept);
        if excess > 0 {
            self.give_back(large.release_empty_chunks_upto(false, excess));
        }
        self.grow_and_serve(&mut large, grow, size, stream)
    }

    /// Grows `level` by a chunk of `grow` bytes and serves `size` for `stream` from it; `None`
    /// when the upstream is out of memory.
    fn grow_and_serve(
        &self,
        level: &mut Level,
        grow: usize,
        size: usize,
        stream: &Stream,
    ) -> Result<Option<u64>> {
        match self.expand(level, grow, size, stream) {
            Ok(()) => {}
            Err(e) if e.is_out_of_memory() => return Ok(None),
            Err(e) => return Err(e),
        }
        let p = level
            .core
            .allocate(size, super::level::key(stream))
            .expect("a fresh chunk serves the request");
        Ok(Some(p))
    }
}

impl<R: MemoryResource> Drop for Inner<R> {
    /// Returns every wholly free chunk to the upstream. Chunks with live allocations are leaked,
    /// never freed under memory someone still uses, and the device records an
    /// [`Error::Leaked`] (see [`PoolResource`]'s `# Errors`).
    fn drop(&mut self) {
        self.reclaim();
        self.release_empty_chunks();
        // User allocations: the global level's, less the sub-chunks lent to shards, plus the
        // shards'. Bytes: what is allocated, i.e. held and not free.
        let (mut allocations, mut bytes) = {
            let global = self.global.get_mut();
            let core = &global.core;
            (
                core.allocation_count(),
                core.chunk_bytes() - core.free_bytes(),
            )
        };
        let core = &self.large.get_mut().core;
        allocations += core.allocation_count();
        bytes += core.chunk_bytes() - core.free_bytes();
        if let Some(level) = self.mapped_made() {
            let stats = level.statistics();
            allocations += stats.live_allocations;
            bytes += stats.allocated_bytes;
        }
        for shard in self.shards.iter() {
            let core = &shard.lock().level.core;
            allocations = allocations + core.allocation_count() - core.chunk_count();
            bytes -= core.free_bytes();
        }
        if allocations > 0 {
            self.device.defer_error(Error::Leaked {
                what: "PoolResource",
                allocations,
                bytes,
                device: self.device.id(),
            });
        }
    }
}
