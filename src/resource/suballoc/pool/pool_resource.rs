//! [`PoolResource`]: the handle, its public methods and the memory-resource contract.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::allocated_peak::PeakCounter;
use super::core::align_up;
use super::inner::{check_size, shard_layout, Inner, Shard, LARGE_BLOCK, SHARDED_CAPACITY};
use super::level::Level;
use super::release::ReleasePolicy;
use super::statistics::PoolStatistics;
use crate::error::{Error, Result};
use crate::resource::contract::availability::Availability;
use crate::resource::contract::checks::is_empty_request;
use crate::resource::contract::forward::memory_resource;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::properties::ResourceIdentity;
use crate::resource::contract::shared::SharedResource;
use crate::resource::contract::stats::{Allocated, MemoryStats};
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::MemorySnapshot;
use crate::resource::leaf::cuda::CudaResource;
use crate::stream::Stream;

/// What a device mismatch of a request names.
const TRY_ALLOCATE: &str = "PoolResource::try_allocate(stream)";

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
/// up to twice the memory in use. Requests of up to 1 MiB and shards' sub-chunks grow by
/// chunks doubling from 2 MiB up to 64 MiB, and before they grow, wholly free chunks go back
/// to the upstream. A request above 1 MiB that the global level's free memory cannot serve
/// goes to a level of large blocks:
/// - Over plain device memory (a [`CudaResource`] of the pool's device), an address range of
///   the pool's own, as a [`MappedPoolResource`](crate::MappedPoolResource) (CUDA virtual
///   memory management), reserved at the first such request: large blocks are packed in it,
///   the pages under a freed one stay mapped and serve the next large block of any size, and
///   pages are unmapped only when the mapped memory goes more than a 32nd (and a page) above
///   the most the level has had live at once, or by [`trim`](PoolResource::trim) and the
///   [`ReleasePolicy`]. Most large requests then make no driver call: on workload W4, a page
///   mapped or unmapped per hundred steps, and 1.06× the peak of live bytes held (RMM's pool
///   1.64×; doubling 2.00×). A pool dropped waits for the streams that freed large blocks
///   into it before it unmaps their pages.
/// - Over any other upstream (one that must see every byte the pool takes, such as an
///   adaptor that counts or limits), or a device without virtual memory management, a chunk
///   of its own (its size rounded up to 2 MiB, the device's large page) that serves only
///   close fits, so that the chunk is wholly free again when the block is freed, and goes
///   back to the upstream when the level's free chunks exceed an eighth of the pool.
///
/// That holds for a pool that starts empty (`initial_size` 0); one given an
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
/// [`OutOfMemoryDetails`](crate::OutOfMemoryDetails) (largest free block, free and reserved bytes, other streams' free
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
/// [`Device::take_deferred_error`](crate::Device::take_deferred_error). A free of a pointer the pool does not hold as allocated
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
    pub(super) inner: Arc<Inner<R>>,
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
        // Plain device memory (a stateless `CudaResource` of the pool's device): large blocks
        // may live in the pool's own address space instead, where nothing above the pool
        // (an adaptor counting or limiting the upstream) would miss them.
        let vmm = granular
            && upstream.identity() == ResourceIdentity::stateless::<CudaResource>(device.id());
        let (shards, shard_chunk, shard_limit) =
            shard_layout(capacity, maximum_size.is_some(), granular);
        let shards: Arc<[Mutex<Shard>]> = (0..shards)
            .map(|_| {
                Mutex::new(Shard {
                    level: Level::new(false),
                    release_above: 2 * shard_chunk,
                })
            })
            .collect();
        // A free into a shard reads whether anyone waits under the shard's lock, with no
        // fence (see `Availability::nobody_to_notify`): a joining waiter takes every one.
        let swept = Arc::downgrade(&shards);
        availability.set_join_barrier(move || {
            for shard in swept.upgrade().iter().flat_map(|s| s.iter()) {
                drop(shard.lock());
            }
        });
        let pool = PoolResource {
            inner: Arc::new(Inner {
                upstream,
                device,
                maximum: maximum_size,
                global: Mutex::new(Level::new(true)),
                large: Mutex::new(Level::new(true)),
                mapped: OnceLock::new(),
                vmm,
                mapped_served: AtomicU64::new(0),
                held: Arc::new(AtomicUsize::new(0)),
                shards,
                shard_chunk,
                shard_limit,
                availability,
                peak_reserved: AtomicUsize::new(0),
                allocated: PeakCounter::default(),
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

    /// Bytes held from the upstream, every chunk, allocated or free (RMM's `pool_size`), and
    /// the pages the pool maps for large blocks in its own address range (see `# Growth`).
    pub fn pool_size(&self) -> usize {
        self.inner.held.load(Ordering::Relaxed) + self.inner.mapped_bytes()
    }

    /// The maximum pool size, if any.
    pub fn maximum_size(&self) -> Option<usize> {
        self.inner.maximum
    }

    /// This pool, counting its allocated bytes and their peak, which [`memory_stats`] then
    /// reports (PyTorch's `memory_allocated` and `max_memory_allocated`, and what
    /// [`reset_peak`] resets), counted as the pool rounds requests (to 256 bytes).
    ///
    /// Not by default: the count is one shared counter that every allocation and free
    /// updates, while the pool's fast path otherwise writes nothing that threads allocating on
    /// different streams share. A count of one thread costs a few nanoseconds per
    /// allocation; threads on many streams at once contend for it. A
    /// [`StatisticsAdaptor`](crate::StatisticsAdaptor) over the pool counts the same, as
    /// requested, and more.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let pool = PoolResource::new(CudaResource::new(&device)?, 0, None)?.with_peak_allocated();
    /// let a = pool.try_allocate(1000, &stream)?;
    /// let b = pool.try_allocate(3000, &stream)?;
    /// unsafe { pool.deallocate(a, 1000, &stream) };
    /// let stats = pool.memory_stats();
    /// assert_eq!(stats.allocated_bytes, Some(3072));
    /// assert_eq!(stats.peak_allocated_bytes, Some(1024 + 3072));
    /// pool.reset_peak();
    /// assert_eq!(pool.memory_stats().peak_allocated_bytes, Some(3072));
    /// unsafe { pool.deallocate(b, 3000, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    ///
    /// [`memory_stats`]: MemoryResource::memory_stats
    /// [`reset_peak`]: MemoryResource::reset_peak
    #[must_use]
    pub fn with_peak_allocated(self) -> Self {
        // Owned, so nothing allocates meanwhile: the count starts exact.
        let stats = self.inner.statistics_with(false);
        self.inner
            .allocated
            .start(stats.reserved_bytes - stats.free_bytes);
        self
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

memory_resource!(shared [R: MemoryResource] PoolResource<R>);

/// The pool's rounding of a request, as its blocks have it (a live block's `bytes` rounds).
fn rounded(bytes: usize) -> usize {
    align_up(bytes).unwrap_or(bytes)
}

impl<R: MemoryResource> Inner<R> {
    /// [`MemoryResource::try_allocate`], uncounted.
    #[inline(always)]
    fn serve(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        use crate::resource::suballoc::base::SubAllocator;
        // The fast path: a request for the stream's shard that the stream's own free blocks
        // there serve, under one lock, with no `Result` to build on the way. Anything else (a
        // 0-byte request, another device's stream, a miss) takes the full path below, which
        // tries the stream's own blocks again before it steals or grows.
        if bytes.wrapping_sub(1) < self.shard_limit && stream.device() == &self.device {
            if let Some(p) = self.shard_of(stream).lock().level.serve_own(bytes, stream) {
                return Ok(DevicePtr::from_raw(p));
            }
        }
        if is_empty_request(&self.device, bytes, stream, TRY_ALLOCATE)? {
            return Ok(DevicePtr::NULL);
        }
        let Some(size) = align_up(bytes) else {
            return Err(Error::OutOfMemory {
                details: None,
                requested: bytes,
                available: None,
                device: self.device.id(),
            }
            .never_fitting(SubAllocator::capacity_limit(self)));
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
                None if large => self.large_or_mapped_allocate(size, stream)?,
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
        let could_fit = SubAllocator::capacity_limit(self).is_none_or(|limit| bytes <= limit);
        if could_fit && self.release_empty_chunks() > 0 {
            if let Some(p) = self.global_allocate(size, stream, true, false)? {
                return Ok(DevicePtr::from_raw(p));
            }
        }
        Err(self.out_of_memory(bytes, stream))
    }
}

// SAFETY: a pointer it hands out is a block carved by the pool's core out of its chunks,
// each an allocation of the upstream held until `trim` or the drop returns it wholly free:
// blocks are at least the request, at 256-aligned offsets of 256-aligned chunks, and the core
// hands out no byte twice until it is freed. The properties are the upstream's.
unsafe impl<R: MemoryResource> crate::resource::suballoc::base::SubAllocator for Inner<R> {
    #[inline]
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let p = self.serve(bytes, stream)?;
        if !p.is_null() {
            self.allocated.add(rounded(bytes));
        }
        Ok(p)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if ptr.is_null() {
            return;
        }
        // Counted out before the block can serve anyone (and back in if it is not freed), so
        // that the count never holds a block twice and its peak is never above the truth.
        self.allocated.sub(rounded(bytes));
        // Small blocks are most likely in the stream's shard (the fast path: one lock), large
        // ones in the global level; but under pressure either may have been served by the
        // other (see `try_allocate`), and a block may be freed on another stream than the
        // one it was allocated on.
        let small = bytes.wrapping_sub(1) < self.shard_limit;
        if small {
            let mut shard = self.shard_of(stream).lock();
            if shard.level.try_free(ptr.addr(), bytes, stream) {
                // Read under the shard's lock, which the join barrier takes: no fence.
                let quiet = self.availability.nobody_to_notify();
                self.shard_freed(shard);
                if !quiet {
                    self.availability.notify();
                }
                return;
            }
        }
        let global_free = |this: &Self| {
            this.global.lock().try_free_user(ptr.addr(), bytes, stream)
                || this.large_free(ptr.addr(), bytes, stream)
        };
        // SAFETY: the caller's contract.
        let mapped = (!small).then(|| unsafe { self.mapped_free(ptr, bytes, stream) });
        let (freed, in_global) = if let Some(Some(freed)) = mapped {
            (freed, true)
        } else if small {
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
            self.allocated.add(rounded(bytes));
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

    fn wait_queue(&self) -> &Availability {
        &self.availability
    }

    /// A live allocation may come back; so may the upstream's memory, which the pool follows.
    /// (A request that fails has first made the pool give back its wholly free chunks, so the
    /// upstream's outstanding memory is not only the pool's own free memory.)
    fn may_regain_memory(&self, bytes: usize) -> bool {
        self.statistics_with(false).live_allocations > 0 || self.upstream.may_regain_memory(bytes)
    }

    /// Reserved: the bytes held from the upstream; allocated: the live allocations, as the
    /// pool rounded them. Their peak only in a pool made
    /// [`with_peak_allocated`](PoolResource::with_peak_allocated) (a [`StatisticsAdaptor`]
    /// over any pool has it too).
    ///
    /// [`StatisticsAdaptor`]: crate::StatisticsAdaptor
    fn memory_stats(&self) -> MemoryStats {
        let stats = self.statistics_with(false);
        let (bytes, peak) = match self.allocated.figures() {
            Some((bytes, peak)) => (bytes, Some(peak)),
            None => (stats.reserved_bytes - stats.free_bytes, None),
        };
        self.upstream
            .memory_stats()
            .with_reserved(
                stats.reserved_bytes,
                self.peak_reserved.load(Ordering::Relaxed),
            )
            .with_allocated(Allocated {
                bytes,
                peak,
                allocations: Some(stats.live_allocations),
            })
    }

    fn reset_peak(&self) {
        let global = self.global.lock();
        let held = self.held.load(Ordering::Relaxed) + self.mapped_bytes();
        self.peak_reserved.store(held, Ordering::Relaxed);
        drop(global);
        self.allocated.reset_peak();
        self.upstream.reset_peak();
    }

    /// The pool's chunks (see [`PoolResource::snapshot`]).
    fn snapshot(&self) -> Option<MemorySnapshot> {
        Some(self.take_snapshot())
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
