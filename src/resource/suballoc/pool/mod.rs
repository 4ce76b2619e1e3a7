//! `PoolResource`: a coalescing, stream-ordered sub-allocator over any upstream resource.

pub(crate) mod core;
mod level;
mod release;

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use rustc_hash::FxHashMap;

use self::core::{align_up, ALIGN};
use self::level::{Level, Released, SnapshotBlock};
pub use self::release::ReleasePolicy;
use crate::device::Device;
use crate::error::{Error, OutOfMemoryDetails, Result};
use crate::ids::StreamId;
use crate::resource::contract::availability::Availability;
use crate::resource::contract::checks::is_empty_request;
use crate::resource::contract::forward::{memory_resource, Forward};
use crate::resource::contract::memory_resource::{MemoryResource, SharedResource};
use crate::resource::contract::stats::{Allocated, MemoryStats};
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::{Block, Fragmentation, MemorySnapshot, Segment};
use crate::stream::Stream;

/// A coalescing pool sub-allocator over any upstream resource (RMM's `pool_memory_resource`),
/// stream-ordered, fast, and awaitable.
///
/// The pool takes memory from its upstream in chunks and hands out pieces of them; metadata
/// lives in host memory, and every operation is O(1) (a TLSF-style size-class index with
/// bitmaps per stream), never a scan of the free blocks.
///
/// # Growth
/// `PoolResource::new(upstream, initial_size, maximum_size)` takes `initial_size` at once. When
/// a request does not fit, a pool with a maximum grows as RMM's does, by
/// `max(request, remaining / 2)` while the request fits the remaining room. A pool without one
/// that starts empty over an upstream that may hold 256 MiB or more (a device) does not double, which would hold
/// up to twice the memory in use: a request above 1 MiB that the global level's free memory
/// cannot serve gets a chunk of its own (its size rounded up to 2 MiB, the device's large
/// page) in a level of large blocks that serves only close fits, so that the chunk is wholly
/// free again when the block is freed; smaller requests and shards' sub-chunks grow by chunks
/// doubling from 2 MiB up to 64 MiB; and before either grows, its wholly free chunks go back
/// to the upstream. (On workload W4 that holds 1.06× the peak of live bytes, against 2.00×
/// when doubling.) That holds for a pool that starts empty (`initial_size` 0); one given an
/// initial size, or over a smaller upstream, grows by `max(request, pool size)` as RMM's: its
/// initial size says how much to reserve, and growth amortises the upstream's cost. If the
/// upstream refuses, the attempt is halved down to the request. Chunks never merge, so before it gives up with [`Error::OutOfMemory`]
/// on a request that could fit its capacity, the pool gives its wholly free chunks back to the
/// upstream and tries once more (else a pool that is all free could refuse a request within
/// its maximum for ever). Unlike RMM's pool, [`trim`](PoolResource::trim) returns wholly free
/// chunks to the upstream on request too, and a [`ReleasePolicy`]
/// ([`set_release_policy`](PoolResource::set_release_policy)) does so on its own: above a
/// threshold of free bytes, or once the pool is idle.
///
/// # Stream ordering
/// A block freed on stream S is reusable at once by later work on S. Another stream T takes
/// memory freed on S only after T waits for an event recorded on S after the free. That event
/// is recorded lazily — when T actually needs S's memory, not on every free (which is what
/// costs RMM's pool ~0.4 µs per free) — and one event covers every free on S before it; a
/// stream that has waited on it does not wait again until S frees more. T first takes just
/// the piece it needs from one of S's blocks; only when no single stream has a block big
/// enough does T take over every other stream's free memory at once, so that it coalesces.
/// Once S's memory has crossed to another stream, each of S's frees records its event at once,
/// and each free block remembers which free it came from, so that a taker waits for S's work
/// up to the free of the block it takes only, not for work S queued after it (the frees of
/// other blocks included), and not at all once S has passed that free (only the first
/// crossing waits for an event recorded at the take). Among S's blocks that fit, T takes the
/// one freed first, and S's frees from then on stay unmerged with their free neighbours until a
/// request needs them merged (a merged block is as recent as its newest part).
/// Memory freed on a stream that then goes quiet is therefore never stranded there (RMM issues
/// #2039, #850): before a shard's refill makes the pool grow, the other shards give their
/// wholly free sub-chunks back, so T finds S's memory within its first miss. The pool keeps a handle to each stream that owns free memory in it, so such a
/// stream outlives its last user while its free blocks are in the pool.
///
/// # Threads
/// A large pool (one that may hold 256 MiB or more: its maximum, else its upstream's capacity
/// limit) puts *shards* in front of its global level, as many as the machine has CPUs (a power
/// of two), a stream's shard being its id modulo their number. Requests of up to about a 256th
/// of the capacity (at most 16 MiB; 1 MiB without a maximum) are served by the stream's shard,
/// under the shard's own lock, from sub-chunks the shard takes from the global level (about a
/// 64th of the capacity, at most 64 MiB — without a maximum, from 2 MiB doubling up to
/// 65 MiB — at a time), so threads that use different streams rarely meet on a lock. With a maximum, before it takes another, a shard gives the
/// unused rests of its sub-chunks back, where the newest joins the global level's free
/// memory, so the requests of one stream are packed without gaps. A shard gives wholly free sub-chunks back
/// to the global level once it holds more than two sub-chunks' worth of free memory, and all
/// shards give theirs back before a request fails; [`trim`](PoolResource::trim) takes them
/// all back first. Smaller pools have the global level only. A sharded pool therefore grows
/// by at least a sub-chunk where RMM's would grow by the request alone.
///
/// # Filling to the maximum
/// A pool with a maximum holds any set of requests whose sizes rounded up to 256 bytes add up
/// to its maximum when they come from one stream and the maximum was taken at once, and
/// requests of one power-of-two size (up to the shard limit, or any size above it) from
/// several streams at once, grown from empty or not. A mix of sizes from several streams at
/// once may leave pieces of one shard's sub-chunk that no other free memory joins; see the
/// book's pool chapter.
///
/// # Snapshots
/// [`snapshot`](MemoryResource::snapshot) (resource name `"pool"`, capacity the maximum)
/// shows each chunk held from the upstream as a segment, tiled by its blocks: live ones with
/// the stream they were allocated for, free ones [`Free`](crate::BlockState::Free) when any
/// stream may use them without waiting (their stream has passed an event the pool recorded
/// after the frees) or [`FreeOnStream`](crate::BlockState::FreeOnStream) on the stream that
/// freed them (the pool records such events only when memory crosses streams, so a stream
/// that frees and synchronizes still owns its free blocks). Blocks of different streams
/// stay apart until a request needs them joined, so
/// [`fragmentation`](MemoryResource::fragmentation) merges adjacent free blocks of any
/// streams into one extent, as [`PoolStatistics::largest_free_block`] does: a wholly free
/// pool reads as one block.
///
/// ```
/// use streamalloc::{BlockState, CudaResource, Device, MemoryResource, PoolResource, Stream};
///
/// let device = Device::host();
/// let (s, t) = (Stream::new(&device)?, Stream::new(&device)?);
/// let pool = PoolResource::new(CudaResource::new(&device)?, 4 << 20, Some(4 << 20))?;
/// let a = pool.try_allocate(2 << 20, &s)?;
/// let b = pool.try_allocate(2 << 20, &t)?;
/// unsafe { pool.deallocate(a, 2 << 20, &s) };
/// unsafe { pool.deallocate(b, 2 << 20, &t) };
/// let snap = pool.snapshot().unwrap();
/// assert_eq!((snap.segments.len(), snap.reserved_bytes()), (1, 4 << 20));
/// let states: Vec<_> = snap.blocks().map(|(_, b)| (b.state, b.stream)).collect();
/// assert_eq!(states, [
///     (BlockState::FreeOnStream, Some(t.id())),
///     (BlockState::FreeOnStream, Some(s.id())),
/// ]);
/// let f = snap.fragmentation();
/// assert_eq!(f.largest_free_block, 4 << 20); // one extent, after the frees' events
/// assert_eq!(f.largest_free_for(s.id()), 2 << 20); // what `s` gets without waiting
/// assert_eq!(pool.statistics().largest_free_block, 4 << 20);
/// # Ok::<(), streamalloc::Error>(())
/// ```
///
/// # Awaiting memory
/// The pool has a wait queue ([`Availability`]): an awaited [`allocate`](MemoryResource::allocate)
/// that finds the pool at its maximum (or the upstream exhausted) waits for a free instead of
/// failing. With a maximum, requests larger than it fail at once.
///
/// # Errors
/// [`Error::InvalidArgument`] from `new` when a size is not a multiple of 256 or the initial
/// size exceeds the maximum; [`Error::OutOfMemory`] with the request and the pool's
/// [`OutOfMemoryDetails`] (largest free block, free and reserved bytes, other streams' free
/// bytes) when neither the pool nor its upstream can serve a request; [`Error::TooLarge`] with the
/// maximum for a request above the pool's maximum (or its upstream's capacity limit), which
/// can never fit. The details' largest free block joins address-adjacent free blocks of any
/// streams, as [`fragmentation`](MemoryResource::fragmentation) and
/// [`PoolStatistics::largest_free_block`] do (finding it walks every block, O(blocks)),
/// except while an allocation waits on the pool (or on a resource over it) and a free may
/// still come: a failed try then gives the largest block of one stream (O(streams)), since
/// it is most likely the waiter's retry at a free, whose error nobody reads, and a walk at
/// every free would hold the pool's locks O(frees × blocks). Read
/// [`fragmentation`](MemoryResource::fragmentation) for the joined figure at any time.
/// A pool dropped (its last clone)
/// while allocations are still out leaks the chunks under them and records an
/// [`Error::Leaked`] with their number and bytes on its device: take it with
/// [`Device::take_deferred_error`]. A free of a pointer the pool does not hold as allocated
/// with that size (a double free, a wrong size, a foreign pointer) frees nothing and records an
/// [`Error::InvalidArgument`] naming the pointer there too.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, Some(16 << 20))?;
/// let p = pool.allocate(1000, &stream).await?;
/// assert!(p.is_aligned(256));
/// assert_eq!(pool.pool_size(), 1 << 20);
/// unsafe { pool.deallocate(p, 1000, &stream) };
/// assert_eq!(pool.statistics().free_bytes, 1 << 20);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub struct PoolResource<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R: MemoryResource> {
    upstream: R,
    device: Device,
    maximum: Option<usize>,
    /// The level whose chunks come from the upstream.
    global: Mutex<Level>,
    /// Granular pools (see `granular`): the level of large blocks (above [`LARGE_BLOCK`]) that the global
    /// level's free memory could not serve, each in a chunk of its own size taken from the
    /// upstream, so that when it is freed its chunk is wholly free and can go back (short-lived
    /// large blocks never strand in chunks that small blocks pin). Locked after the global
    /// level, never before. Empty in bounded pools.
    large: Mutex<Level>,
    /// Bytes held from the upstream: both levels' chunks. Changed under the lock of the level
    /// that takes or gives back a chunk.
    held: AtomicUsize,
    /// The stream shards, a power of two of them (none for small pools); a stream's shard is
    /// its id modulo their number.
    shards: Box<[Mutex<Shard>]>,
    /// Bytes a shard takes from the global level at a time (see `shard_layout`).
    shard_chunk: usize,
    /// Requests up to this size go through the shards.
    shard_limit: usize,
    availability: Arc<Availability>,
    /// The most bytes held from the upstream at once since the pool was made or its peak
    /// reset. Written only when the pool grows (under the global lock), never on the fast path.
    peak_reserved: AtomicUsize,
    /// Granular pools: the bytes grown so far for requests below [`GRANULE`] (a shard's
    /// sub-chunk counts as one request), which the next such growth matches up to
    /// [`MAX_SHARD_CHUNK`]: small blocks get geometrically larger chunks, large ones chunks
    /// of their own size. Written under the global lock.
    small_grown: AtomicUsize,
    /// Whether the pool grows by granules and keeps large blocks in chunks of their own (the
    /// `large` level): pools that start empty, without a maximum, over an upstream that may
    /// hold [`SHARDED_CAPACITY`] or more (a device). Others grow as RMM's does: an initial
    /// size says how much the user wants reserved, and growth then amortises as RMM's.
    granular: bool,
    /// [`ReleasePolicy::keep_free`], `usize::MAX` for none: read on the frees that reach the
    /// global levels.
    keep_free: AtomicUsize,
    /// Free bytes of the global levels above which such a free looks for wholly free chunks
    /// under `keep_free`: raised when a look found too few (fragmented free memory), so that
    /// frees do not scan the chunks every time; reset when the free bytes fall under
    /// `keep_free`.
    release_scan_above: AtomicUsize,
    /// The release policy set, and the generation of its idle thread (a thread whose
    /// generation is not the current one ends).
    policy: Mutex<(ReleasePolicy, u64)>,
}

struct Shard {
    level: Level,
    /// Free bytes above which the shard gives wholly free sub-chunks back to the global level:
    /// raised after each attempt, so a shard whose free memory is fragmented does not search
    /// its chunks on every free.
    release_above: usize,
}

/// A snapshot of a pool's accounting ([`PoolResource::statistics`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatistics {
    /// Bytes held from the upstream (every chunk, allocated or free).
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

fn check_size(what: &str, bytes: usize) -> Result<()> {
    if bytes % ALIGN == 0 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} ({bytes}) must be a multiple of {ALIGN} bytes"
        )))
    }
}

fn snapshot_block(b: SnapshotBlock) -> Block {
    let mut block = Block::new(DevicePtr::from_raw(b.start), b.size, b.state);
    block.stream = b.stream;
    block
}

/// Pools that may hold less than this have no shards.
const SHARDED_CAPACITY: usize = 256 << 20;
/// The largest power of two a shard's sub-chunk starts from.
const MAX_SHARD_CHUNK: usize = 64 << 20;
/// What an unbounded pool's chunks are multiples of: the device's large page, so a chunk
/// takes from the device what it says it takes (`cuMemAlloc` maps whole 2 MiB pages).
const GRANULE: usize = 2 << 20;
/// Requests above this go to the global level in an unbounded pool, never a shard: W1's and
/// W3's requests (up to 1 MiB) stay on the sharded fast path, while larger, often
/// short-lived blocks do not strand in sub-chunks that long-lived small blocks pin.
const UNBOUNDED_SHARD_LIMIT: usize = 1 << 20;
/// Requests above this in an unbounded pool that the global level's free memory cannot serve
/// get chunks of their own (the `large` level).
const LARGE_BLOCK: usize = 1 << 20;
/// The large level keeps wholly free chunks up to this fraction of the pool's size.
const LARGE_KEPT: usize = 8;

/// `(shard count, sub-chunk bytes, request limit)` for a pool that may hold `capacity` bytes,
/// `bounded` when that is its own maximum, `granular` when it grows by granules.
fn shard_layout(capacity: usize, bounded: bool, granular: bool) -> (usize, usize, usize) {
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

impl<R: MemoryResource> PoolResource<R> {
    /// A pool over `upstream` that takes `initial_size` bytes now and grows up to
    /// `maximum_size` (unbounded when `None`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a size is not a multiple of 256 or
    /// `initial_size > maximum_size`; the upstream's error when the initial chunk cannot be
    /// allocated.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, Error, PoolResource};
    /// let mr = CudaResource::new(&Device::host()).unwrap();
    /// assert!(matches!(PoolResource::new(mr.clone(), 1000, None), Err(Error::InvalidArgument(_))));
    /// assert!(matches!(PoolResource::new(mr, 1 << 20, Some(1 << 10)), Err(Error::InvalidArgument(_))));
    /// ```
    pub fn new(upstream: R, initial_size: usize, maximum_size: Option<usize>) -> Result<Self> {
        check_size("the initial pool size", initial_size)?;
        if let Some(max) = maximum_size {
            check_size("the maximum pool size", max)?;
            if initial_size > max {
                return Err(Error::invalid(format!(
                    "the initial pool size ({initial_size}) exceeds the maximum ({max})"
                )));
            }
        }
        let device = crate::resource::contract::checks::upstream_device(&upstream)?;
        let availability = Availability::following(upstream.availability());
        let capacity = maximum_size
            .or(upstream.capacity_limit())
            .unwrap_or(usize::MAX);
        let granular = maximum_size.is_none() && initial_size == 0 && capacity >= SHARDED_CAPACITY;
        let (shards, shard_chunk, shard_limit) =
            shard_layout(capacity, maximum_size.is_some(), granular);
        let pool = PoolResource {
            inner: Arc::new(Inner {
                upstream,
                device,
                maximum: maximum_size,
                global: Mutex::new(Level::new(true)),
                large: Mutex::new(Level::new(true)),
                held: AtomicUsize::new(0),
                shards: (0..shards)
                    .map(|_| {
                        Mutex::new(Shard {
                            level: Level::new(false),
                            release_above: 2 * shard_chunk,
                        })
                    })
                    .collect(),
                shard_chunk,
                shard_limit,
                availability,
                peak_reserved: AtomicUsize::new(0),
                small_grown: AtomicUsize::new(0),
                granular,
                keep_free: AtomicUsize::new(usize::MAX),
                release_scan_above: AtomicUsize::new(0),
                policy: Mutex::new((ReleasePolicy::default(), 0)),
            }),
        };
        if initial_size > 0 {
            let home = Stream::new(&pool.inner.device)?;
            let mut global = pool.inner.global.lock();
            pool.inner
                .expand(&mut global, initial_size, initial_size, &home)?;
            // The initial chunk is ordered on a stream of the pool's own that runs nothing
            // else: its event, recorded now, has passed by the time anyone looks, so
            // snapshots show the chunk free for every stream (and the first stream to take
            // from it need not record one).
            global.record_frees(&home)?;
        }
        Ok(pool)
    }

    /// Bytes held from the upstream: every chunk, allocated or free (RMM's `pool_size`).
    pub fn pool_size(&self) -> usize {
        self.inner.held.load(Ordering::Relaxed)
    }

    /// The maximum pool size, if any.
    pub fn maximum_size(&self) -> Option<usize> {
        self.inner.maximum
    }

    /// How the pool gives memory back on its own: see [`ReleasePolicy`]. Replaces the policy
    /// set before (an idle thread of the old policy ends at its next check).
    ///
    /// # Errors
    /// [`Error::Io`] when the thread of an [`idle`](ReleasePolicy::idle) policy cannot be
    /// started; the rest of the policy is in force then.
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource, ReleasePolicy, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let pool = PoolResource::new(CudaResource::new(&device)?, 0, None)?;
    /// pool.set_release_policy(ReleasePolicy::default().idle(Duration::from_millis(20)))?;
    /// let p = pool.try_allocate(1 << 20, &stream)?;
    /// unsafe { pool.deallocate(p, 1 << 20, &stream) };
    /// assert!(pool.pool_size() > 0);
    /// std::thread::sleep(Duration::from_millis(200));
    /// assert_eq!(pool.pool_size(), 0, "trimmed once idle");
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn set_release_policy(&self, policy: ReleasePolicy) -> Result<()>
    where
        R: 'static,
    {
        let generation = {
            let mut current = self.inner.policy.lock();
            current.0 = policy;
            current.1 += 1;
            current.1
        };
        self.inner.keep_free.store(
            policy.get_keep_free().unwrap_or(usize::MAX),
            Ordering::Relaxed,
        );
        self.inner.release_scan_above.store(0, Ordering::Relaxed);
        self.inner.apply_keep_free();
        match policy.get_idle() {
            Some(idle) => spawn_idle_release(Arc::downgrade(&self.inner), idle, generation),
            None => Ok(()),
        }
    }

    /// The release policy in force ([`ReleasePolicy::default`] unless set).
    pub fn release_policy(&self) -> ReleasePolicy {
        self.inner.policy.lock().0
    }

    /// A snapshot of the pool's accounting (over the global level and every shard, each read
    /// under its own lock).
    pub fn statistics(&self) -> PoolStatistics {
        self.inner.statistics()
    }

    /// Returns every wholly free chunk to the upstream; returns the bytes released. RMM's pool
    /// never shrinks.
    ///
    /// # Stream ordering
    /// Free memory is first gathered on one stream (the one that owns the most), which waits
    /// for an event of each other stream that owns free memory, so that blocks freed on
    /// different streams coalesce; each chunk then goes back to the upstream on that stream,
    /// so work that used it is ordered before the upstream reuses it. Other streams that
    /// allocate from the pool afterwards wait once for that stream, as for any memory that
    /// crosses streams. The shards first give back their wholly free sub-chunks the same way.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, HostConfig, MemoryResource, PoolResource, Stream};
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// let stream = Stream::new(&device)?;
    /// let pool = PoolResource::new(CudaResource::new(&device)?, 0, None)?;
    /// let p = pool.try_allocate(1 << 20, &stream)?;
    /// unsafe { pool.deallocate(p, 1 << 20, &stream) };
    /// let size = pool.pool_size();
    /// assert!(size >= 1 << 20);
    /// assert_eq!(pool.trim(), size);
    /// assert_eq!(pool.pool_size(), 0);
    /// stream.synchronize_blocking()?;
    /// assert_eq!(device.host_controls().unwrap().allocated_bytes(), 0);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn trim(&self) -> usize {
        self.inner.reclaim();
        self.inner.release_empty_chunks()
    }
}

/// Starts the thread of an idle release policy: every `idle`, it trims the pool if no level
/// served an allocation and no chunk came or went since its last look. It holds the pool only
/// while it looks, and ends when the pool is gone or another policy is set.
fn spawn_idle_release<R: MemoryResource + 'static>(
    pool: Weak<Inner<R>>,
    idle: Duration,
    generation: u64,
) -> Result<()> {
    let mut last = None;
    std::thread::Builder::new()
        .name("streamalloc-pool-release".into())
        .spawn(move || loop {
            std::thread::sleep(idle);
            let Some(inner) = pool.upgrade() else { return };
            if inner.policy.lock().1 != generation {
                return;
            }
            let now = inner.activity();
            if last.as_ref() == Some(&now) {
                inner.reclaim();
                inner.release_empty_chunks();
                last = Some(inner.activity());
            } else {
                last = Some(now);
            }
        })
        .map(drop)
        .map_err(|e| Error::io("starting the pool's idle release thread", &e))
}

impl<R: MemoryResource> Inner<R> {
    /// What changes when the pool is used: each level's served allocations and chunk bytes.
    fn activity(&self) -> Vec<(u64, usize)> {
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
        levels
    }

    /// [`ReleasePolicy::keep_free`]: after a free that reached the global levels, gives wholly
    /// free chunks (the large level's first) back while their free bytes are above it.
    fn apply_keep_free(&self) {
        let keep = self.keep_free.load(Ordering::Relaxed);
        if keep == usize::MAX {
            return;
        }
        let mut global = self.global.lock();
        let mut large = self.large.lock();
        let free = global.core.free_bytes() + large.core.free_bytes();
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

    /// [`PoolResource::statistics`].
    fn statistics(&self) -> PoolStatistics {
        self.statistics_with(true)
    }

    /// [`statistics`](Self::statistics); with `extents`, `largest_free_block` is the largest
    /// run of free blocks of any streams (O(blocks)), else only the largest of one stream's
    /// (O(streams)), for callers that do not read it.
    fn statistics_with(&self, extents: bool) -> PoolStatistics {
        let largest = |core: &self::core::PoolCore| {
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
        let mut stats = PoolStatistics {
            pool_size: global.chunk_bytes + large.chunk_bytes,
            free_bytes: core.free_bytes(),
            largest_free_block: largest(core),
            free_blocks: core.free_block_count(),
            live_allocations: core.allocation_count(),
            upstream_chunks: core.chunk_count(),
        };
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
    fn take_snapshot(&self) -> MemorySnapshot {
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
        snapshot.sort();
        snapshot
    }

    /// Takes at least `min_size` more bytes from the upstream, trying `try_size` first and
    /// halving on failure (RMM's `try_to_expand`); the chunk is owned by `stream`.
    fn expand(
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
                    self.peak_reserved.fetch_max(held, Ordering::Relaxed);
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
    /// no room. With a maximum, RMM's rule (half the remaining room, at least the request).
    /// Without one, unless the pool is [`granular`](Inner::granular), RMM's rule too
    /// (`max(request, pool size)`). Granular pools do not follow RMM's
    /// doubling, which holds up to twice the memory in use: a request
    /// of [`GRANULE`] or more gets a chunk of its own, rounded up to the granule; smaller ones
    /// (and shards' sub-chunks) a chunk as large as all such growth so far, from one granule
    /// up to [`MAX_SHARD_CHUNK`], so that a run of small requests still grows geometrically.
    fn size_to_grow(&self, size: usize, pool_size: usize) -> usize {
        match self.maximum {
            Some(max) => {
                let remaining = align_up(max.saturating_sub(pool_size)).unwrap_or(0);
                if size <= remaining {
                    size.max(align_up(remaining / 2).unwrap_or(0))
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
    fn global_allocate(
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

    fn global_serve(
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
        match self.expand(global, grow, size, stream) {
            Ok(()) => {}
            Err(e) if e.is_out_of_memory() => return Ok(None),
            Err(e) => return Err(e),
        }
        let p = global
            .core
            .allocate(size, level::key(stream))
            .expect("a fresh chunk serves the request");
        Ok(Some(p))
    }

    /// Granular pools: serves `size` (aligned, above [`LARGE_BLOCK`]) for `stream` from the
    /// large level, giving its wholly free chunks back and growing it by a chunk of the
    /// request's size (rounded up to [`GRANULE`]) when its free memory cannot; `None` when the
    /// upstream has no such chunk.
    fn large_allocate(&self, size: usize, stream: &Stream) -> Result<Option<u64>> {
        let mut large = self.large.lock();
        // Only a close fit: the rest of a larger block would pin its chunk. (Other streams'
        // free chunks are not taken: they go back upstream below, on their streams, where
        // this stream's new chunk may come from.)
        let close = size
            .saturating_add(size / 16)
            .checked_next_multiple_of(GRANULE)
            .unwrap_or(usize::MAX);
        if let Some(p) = large.core.allocate_close(size, close, level::key(stream)) {
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
        match self.expand(&mut large, grow, size, stream) {
            Ok(()) => {}
            Err(e) if e.is_out_of_memory() => return Ok(None),
            Err(e) => return Err(e),
        }
        let p = large
            .core
            .allocate(size, level::key(stream))
            .expect("a fresh chunk serves the request");
        Ok(Some(p))
    }

    /// Serves `size` (aligned, at most `shard_limit`) for `stream` from `stream`'s shard,
    /// refilling it from the global level with a sub-chunk: the largest piece of
    /// `shard_chunk`, halved down to `size`, that the global level has free, and only if none
    /// of them is there, one that the global level grows for.
    fn shard_allocate(&self, size: usize, stream: &Stream) -> Result<Option<u64>> {
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
    fn refill(
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
                let p = shard.level.core.allocate(size, level::key(stream));
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
    fn return_heads(&self, shard: &mut Shard, stream: &Stream) -> Result<()> {
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
    fn shard_index(&self, stream: &Stream) -> usize {
        stream.id().0 as usize & (self.shards.len() - 1)
    }

    fn shard_of(&self, stream: &Stream) -> &Mutex<Shard> {
        &self.shards[self.shard_index(stream)]
    }

    /// Frees `addr` on `stream` into the shard that holds it, trying `stream`'s shard first
    /// (`skip` 0) or not at all (`skip` 1: the caller tried it); false when no shard holds it.
    fn shard_free(&self, addr: u64, bytes: usize, stream: &Stream, skip: usize) -> bool {
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
    fn shard_freed(&self, shard: MutexGuard<'_, Shard>) {
        if shard.level.core.free_bytes() > shard.release_above {
            self.shard_release(shard);
        }
    }

    #[cold]
    fn shard_release(&self, mut shard: MutexGuard<'_, Shard>) {
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
    fn large_free(&self, addr: u64, bytes: usize, stream: &Stream) -> bool {
        self.granular && self.large.lock().try_free(addr, bytes, stream)
    }

    /// Gives sub-chunks a shard released back to the global level, locking it while the
    /// shard's lock (`_held`) is still held (a shard, then the global level: the pool's lock order), so
    /// that every sub-chunk is at all times either described by a shard or free in the global
    /// level: a snapshot or statistics taken in between would otherwise find the global
    /// level's lent block described by no shard. True when there were any: the caller then
    /// calls [`returned_to_global`](Self::returned_to_global) once the shard is unlocked.
    fn return_to_global(&self, _held: &mut Shard, released: Vec<Released>) -> bool {
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
    fn returned_to_global(&self) {
        self.availability.notify();
        self.apply_keep_free();
    }

    /// Takes every wholly free sub-chunk back from the shards, after gathering each shard's
    /// free memory on one stream (which records events and waits) so that sub-chunks freed
    /// piecewise on several streams count.
    fn reclaim(&self) {
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
    fn release_empty_chunks(&self) -> usize {
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
        if bytes > 0 {
            self.availability.notify();
        }
        bytes
    }

    /// Gives chunks the global level released back to the upstream, each on the stream that
    /// owns its free memory; returns their bytes.
    fn give_back(&self, released: Vec<Released>) -> usize {
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
    fn out_of_memory(&self, requested: usize, stream: &Stream) -> Error {
        let joined =
            !self.availability.anyone_waiting() || !Forward::may_regain_memory(self, requested);
        Error::out_of_memory_with(requested, self.device.id(), self.details(stream, joined))
            .never_fitting(self.capacity_limit())
    }

    /// Whether `size` is larger than all free memory and the room left under the pool's
    /// maximum together, so that it cannot fit however the pool gathers, gives back and
    /// regrows (never for an unbounded pool). One lock per level.
    fn cannot_fit(&self, size: usize) -> bool {
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

    /// [`out_of_memory`](Self::out_of_memory)'s details; with `joined`, the largest free block
    /// is the largest run of free blocks of any streams (O(blocks)), else the largest block of
    /// one stream (O(streams)).
    fn details(&self, stream: &Stream, joined: bool) -> OutOfMemoryDetails {
        let mut details = OutOfMemoryDetails::default();
        let (mut free, mut largest) = (0, 0);
        let mut pending: Vec<(StreamId, usize)> = Vec::new();
        let mut count = |level: &Level| {
            free += level.core.free_bytes();
            // Runs of free blocks of any streams: the pool joins them for a request (after
            // waiting for their streams' frees), so one stream's largest block would
            // understate what fits and read as fragmentation.
            largest = largest.max(if joined {
                level.core.largest_free_extent()
            } else {
                level.core.largest_free_block()
            });
            for (id, bytes) in level.free_by_stream() {
                if id == stream.id() {
                    continue;
                }
                match pending.iter_mut().find(|(s, _)| *s == id) {
                    Some((_, b)) => *b += bytes,
                    None => pending.push((id, bytes)),
                }
            }
        };
        for shard in self.shards.iter() {
            count(&shard.lock().level);
        }
        count(&self.global.lock());
        count(&self.large.lock());
        pending.sort_unstable();
        details.largest_free_block = Some(largest);
        details.free_bytes = Some(free);
        details.reserved_bytes = Some(self.held.load(Ordering::Relaxed));
        details.pending_frees = pending;
        details
    }
}

memory_resource!(shared [R: MemoryResource] PoolResource<R>);

// SAFETY: a pointer it hands out is a block carved by the pool's core out of its chunks,
// each an allocation of the upstream held until `trim` or the drop returns it wholly free:
// blocks are at least the request, at 256-aligned offsets of 256-aligned chunks, and the core
// hands out no byte twice until it is freed. The properties are the upstream's.
unsafe impl<R: MemoryResource> Forward for Inner<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        // The fast path: a request for the stream's shard that the stream's own free blocks
        // there serve, under one lock, with no `Result` to build on the way. Anything else (a
        // 0-byte request, another device's stream, a miss) takes the full path below, which
        // tries the stream's own blocks again before it steals or grows.
        if bytes.wrapping_sub(1) < self.shard_limit && stream.device() == &self.device {
            if let Some(p) = self.shard_of(stream).lock().level.serve_own(bytes, stream) {
                return Ok(DevicePtr::from_raw(p));
            }
        }
        if is_empty_request(&self.device, bytes, stream)? {
            return Ok(DevicePtr::NULL);
        }
        let Some(size) = align_up(bytes) else {
            return Err(Error::OutOfMemory {
                details: None,
                requested: bytes,
                available: None,
                device: self.device.id(),
            }
            .never_fitting(self.capacity_limit()));
        };
        if size > self.shard_limit && self.cannot_fit(size) {
            // Large requests are checked first: the answer comes without the work below.
            return Err(self.out_of_memory(bytes, stream));
        }
        let first = if size <= self.shard_limit {
            self.shard_allocate(size, stream)?
        } else {
            if !self.shards.is_empty() && self.maximum.is_some() {
                // The stream's shard gives back the rest of its newest sub-chunk first, so
                // that this block is carved next to it rather than strand it.
                self.return_heads(&mut self.shard_of(stream).lock(), stream)?;
            }
            let large = self.granular && size > LARGE_BLOCK;
            // A large block goes to the global level only if its free memory (an initial
            // chunk, say) serves it without growing.
            match self.global_allocate(size, stream, !large, false)? {
                None if large => self.large_allocate(size, stream)?,
                p => p,
            }
        };
        if let Some(p) = first {
            return Ok(DevicePtr::from_raw(p));
        }
        if self.cannot_fit(size) {
            return Err(self.out_of_memory(bytes, stream));
        }
        // Under pressure: wholly free sub-chunks go back to the global level (gathered first,
        // so that one freed piecewise on several streams counts; once gathered, a shard has
        // nothing to gather again until it frees more), then the request is served from any
        // level that can.
        if !self.shards.is_empty() {
            self.reclaim();
            if let Some(p) = self.global_allocate(size, stream, true, false)? {
                return Ok(DevicePtr::from_raw(p));
            }
            for shard in self.shards.iter() {
                if let Some(p) = shard.lock().level.serve(size, stream)? {
                    return Ok(DevicePtr::from_raw(p));
                }
            }
        }
        // Chunks never merge, so wholly free chunks may be all that keeps the pool from growing
        // by one large enough (under its maximum, or in a crowded upstream): give them back and
        // try once more. Without this a pool that is all free could refuse a request within its
        // maximum for ever, and an awaited one would wait for ever. A request that could never
        // fit changes nothing.
        let could_fit = self.capacity_limit().is_none_or(|limit| bytes <= limit);
        if could_fit && self.release_empty_chunks() > 0 {
            if let Some(p) = self.global_allocate(size, stream, true, false)? {
                return Ok(DevicePtr::from_raw(p));
            }
        }
        Err(self.out_of_memory(bytes, stream))
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if ptr.is_null() {
            return;
        }
        // Small blocks are most likely in the stream's shard (the fast path: one lock), large
        // ones in the global level; but under pressure either may have been served by the
        // other (see `try_allocate`), and a block may be freed on another stream than the
        // one it was allocated on.
        let small = bytes.wrapping_sub(1) < self.shard_limit;
        if small {
            let mut shard = self.shard_of(stream).lock();
            if shard.level.try_free(ptr.addr(), bytes, stream) {
                self.shard_freed(shard);
                self.availability.notify();
                return;
            }
        }
        let global_free = |this: &Self| {
            this.global.lock().try_free_user(ptr.addr(), bytes, stream)
                || this.large_free(ptr.addr(), bytes, stream)
        };
        let (freed, in_global) = if small {
            if self.shard_free(ptr.addr(), bytes, stream, 1) {
                (true, false)
            } else {
                (global_free(self), true)
            }
        } else if global_free(self) {
            (true, true)
        } else {
            let in_shard = !self.shards.is_empty() && self.shard_free(ptr.addr(), bytes, stream, 0);
            (in_shard, false)
        };
        if !freed {
            // A double free or a foreign pointer: nothing is freed, and the caller hears of it
            // through the device's deferred errors (a panic here could abort a `Drop`).
            self.device.defer_error(Error::invalid(format!(
                "{ptr} ({bytes} bytes) is not allocated from this pool with that size (double free?)"
            )));
            return;
        }
        self.availability.notify();
        if in_global {
            self.apply_keep_free();
        }
    }

    fn availability(&self) -> Option<&Availability> {
        Some(&self.availability)
    }

    /// A live allocation may come back; so may the upstream's memory, which the pool follows.
    /// (A request that fails has first made the pool give back its wholly free chunks, so the
    /// upstream's outstanding memory is not only the pool's own free memory.)
    fn may_regain_memory(&self, bytes: usize) -> bool {
        self.statistics_with(false).live_allocations > 0 || self.upstream.may_regain_memory(bytes)
    }

    /// Reserved: the bytes held from the upstream; allocated: the live allocations, as the
    /// pool rounded them (it keeps no peak of those: a [`StatisticsAdaptor`] over it does).
    ///
    /// [`StatisticsAdaptor`]: crate::StatisticsAdaptor
    fn memory_stats(&self) -> MemoryStats {
        let stats = self.statistics_with(false);
        self.upstream
            .memory_stats()
            .with_reserved(stats.pool_size, self.peak_reserved.load(Ordering::Relaxed))
            .with_allocated(Allocated {
                bytes: stats.pool_size - stats.free_bytes,
                peak: None,
                allocations: Some(stats.live_allocations),
            })
    }

    fn reset_peak(&self) {
        let global = self.global.lock();
        self.peak_reserved
            .store(self.held.load(Ordering::Relaxed), Ordering::Relaxed);
        drop(global);
        self.upstream.reset_peak();
    }

    /// The pool's chunks (see [`PoolResource::snapshot`]).
    fn snapshot(&self) -> Option<MemorySnapshot> {
        Some(self.take_snapshot())
    }

    /// Read from the snapshot (its free extents merge the streams' free memory).
    fn fragmentation(&self) -> Option<Fragmentation> {
        Some(self.take_snapshot().fragmentation())
    }

    fn capacity_limit(&self) -> Option<usize> {
        let up = self.upstream.capacity_limit();
        match (self.maximum, up) {
            (Some(m), Some(u)) => Some(m.min(u)),
            (m, u) => m.or(u),
        }
    }
}

impl<R: MemoryResource> fmt::Debug for PoolResource<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolResource")
            .field("device", &self.inner.device.id())
            .field("maximum", &self.inner.maximum)
            .field("shards", &self.inner.shards.len())
            .field("statistics", &self.statistics())
            .finish()
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
        for shard in self.shards.iter_mut() {
            let core = &shard.get_mut().level.core;
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

#[cfg(test)]
mod tests;

#[cfg(test)]
mod footprint_tests;

#[cfg(test)]
mod release_tests;
