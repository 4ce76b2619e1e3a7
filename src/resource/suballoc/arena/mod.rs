//! `ArenaResource`: RMM's arena allocator — a global arena of superblocks and an arena per
//! stream — stream-ordered, scalable across threads, and awaitable.
//!
//! The resource (this file) is a thin wrapper; [`levels`] moves requests between the stream
//! arenas and the global arena, [`slots`] keeps the stream arenas and [`lookup`] finds a stream's (or thread's), [`stats`]
//! reports and dumps, and [`core`] holds the allocator cores that work on addresses alone.

mod config;
pub(crate) mod core;
mod extents;
mod levels;
mod lookup;
mod slots;
mod snapshot;
mod stats;

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

pub use self::config::{ArenaConfig, ArenaDump};
#[cfg(test)]
use self::core::align_up;
use self::core::consts::{PAGE_SIZE, SUPERBLOCK_SIZE};
use self::core::{largest_size_class_within, GlobalArena};
use self::extents::GLOBAL;
use self::extents::{Extent, Extents};
use self::levels::{Growth, Inner};
#[cfg(test)]
use self::slots::SLOT_BUCKETS;
use self::slots::{Registry, Slots};
pub use self::stats::ArenaStatistics;
use crate::error::{Error, Result};
use crate::resource::contract::availability::Availability;
use crate::resource::contract::checks::is_empty_request;
use crate::resource::contract::forward::memory_resource;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::shared::SharedResource;
use crate::resource::contract::stats::{Allocated, MemoryStats};
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::MemorySnapshot;
use crate::resource::suballoc::stream_order::{Fence, OrderCounters};
use crate::stream::Stream;

/// What a device mismatch of a request names.
const TRY_ALLOCATE: &str = "ArenaResource::try_allocate(stream)";

/// RMM's arena allocator (`arena_memory_resource`) over any upstream resource: a global arena
/// taken from the upstream once, lent out in superblocks to an arena per stream, so that
/// threads working on their own streams allocate without contending on one lock.
///
/// # How much it takes from the upstream
/// By default (no [`ArenaConfig::arena_size`]) the arena starts empty and grows on demand: when
/// nothing it holds serves a request it takes an *extent* of at least
/// [`ArenaConfig::growth_step`] (2 MiB), or an eighth of what it holds for superblocks when
/// that is more (at most 32 MiB: a few tens of growths for hundreds of megabytes of small
/// blocks; a large request takes one of its own size), up to
/// [`ArenaConfig::maximum_size`] (the device's memory), and it gives wholly free extents back
/// before it grows again and on [`trim`](ArenaResource::trim). RMM's default — half of the
/// device's free memory taken at construction — held 154 times the peak of live bytes on the
/// footprint workload W4 on an H100 and leaves others half of the device before anything is
/// allocated; it is one call away (`Some(percent_of_free_device_memory(&device, 50)?)`).
/// With an arena size the resource takes that block at construction and never grows, as RMM's.
///
/// # How it allocates
/// Requests up to 1 MiB are served
/// by the arena of the calling stream: address-ordered first fit over its superblocks (at least
/// 1 MiB each), with coalescing. When nothing fits, the stream's arena takes a superblock from
/// the global arena. Larger requests are served by the global arena directly, in whole pages of
/// 64 KiB. When the global arena is exhausted, every stream arena returns its wholly free
/// superblocks (they coalesce there) and the request is retried once; a small request may then
/// also use a free block of another stream's arena. Only then does it fail with
/// out-of-memory, after an optional dump of the arena's state ([`ArenaDump`]).
///
/// First fit, frees and merges are O(log n) in the blocks of one arena (a B+tree by address
/// that knows the largest free block below each child), never a scan; the arena that owns a
/// freed pointer is found through a page table without any shared lock. Each stream arena has its own
/// lock; the global arena's lock is taken only when superblocks or large blocks move.
///
/// # Stream ordering
/// A block freed on stream S is reusable at once by later work on S. A block freed on another
/// stream T than the arena it lies in waits, unused, until the arena's stream has waited for T.
/// Memory crosses streams only with an event wait in between, recorded lazily — when memory
/// actually moves (a superblock or large block taken from the global arena after another stream
/// freed it, frees of another stream reclaimed, a block borrowed from another stream's arena),
/// never on a free — and one event covers every free on its stream before it (RMM records an
/// event on every free and makes large frees synchronize the stream). The resource keeps a
/// handle to each stream that has freed memory into it while that memory may still need the
/// wait, and to each stream arena's stream until the arena is retired (when it holds no
/// superblock at the next exhaustion or [`defragment`](ArenaResource::defragment)).
///
/// # Per-thread arenas
/// RMM keeps a per-thread arena for its per-thread default stream; this crate has no default
/// stream (every [`Stream`] is an owned stream), so arenas are per stream, which gives threads
/// that each use their own stream their own arena. Threads that share one stream share its
/// arena unless [`ArenaConfig::per_thread_arenas`] gives each (thread, stream) pair an arena of
/// its own (sound, since all of them order on the same stream).
///
/// # Awaiting memory
/// The resource has a wait queue ([`Availability`]): an awaited
/// [`allocate`](MemoryResource::allocate) that finds the arena exhausted waits for a free.
/// Requests larger than the arena fail at once ([`capacity_limit`](MemoryResource::capacity_limit)).
///
/// # Snapshots
/// [`snapshot`](MemoryResource::snapshot) shows the arena's extents (what it holds from the
/// upstream), each cut at the edges of every superblock that holds a live block: such a
/// superblock is a [`Segment`](crate::Segment) of its own, on its arena's stream, since free
/// memory never joins across its edges while it stays in that arena. Every byte is in one
/// block:
/// - [`Live`](crate::BlockState::Live): on the stream it was allocated on (a block borrowed
///   from another stream's arena, on the borrower's).
/// - [`Free`](crate::BlockState::Free): a free range of the global arena whose freeing streams
///   (if any: fresh memory has none) have all passed an event recorded after their frees, so
///   a request on any stream takes it with nothing left to wait for.
/// - [`FreeOnStream`](crate::BlockState::FreeOnStream), on the range's stream: a free range of
///   the global arena that a stream freed into (a large block, or a superblock given back)
///   and has not passed yet (the arena records the event lazily, when another stream takes
///   that memory, so a stream that frees and synchronizes still reads as the owner). A request
///   on another stream takes it at once, its stream made to wait, on the device and without
///   blocking the host, for that stream's event; where several streams freed into one range,
///   the first that has not passed is named, and a request on it still waits for the others.
/// - [`FreeOnStream`](crate::BlockState::FreeOnStream), on the arena's stream: a free block of
///   a stream arena, which that stream reuses at once. This includes the blocks other streams
///   freed into that arena ([`ArenaStatistics::pending_bytes`]): the arena's stream reclaims
///   them when its free blocks no longer serve a request, then waiting (on the device) for
///   the freeing streams' events, which costs nothing once they have passed. Another stream
///   gets them only on exhaustion, after an event of the arena's stream: a wholly free
///   superblock goes back to the global arena, where it joins its free neighbours; a block of
///   a superblock in use may be borrowed as the last resort.
///
/// No block is [`Pending`](crate::BlockState::Pending). So a wholly free arena reads as one
/// free extent of its size whichever streams freed it, as a request of that size gets it
/// ([`Fragmentation::largest_free_block`](crate::Fragmentation::largest_free_block)). Two
/// limits the figures do not show: a superblock that holds live blocks serves requests of up
/// to 1 MiB only (larger ones come from the global arena), and a free range of the global
/// arena below 1 MiB serves no request until a neighbour joins it.
/// [`capacity`](crate::MemorySnapshot::capacity) is the arena's size, or a growing arena's
/// maximum. A snapshot takes every stream arena's lock and the global arena's at once, for as
/// long as it copies their blocks.
///
/// ```
/// use streamalloc::{ArenaResource, BlockState, CudaResource, Device, MemoryResource, Stream};
///
/// let device = Device::host();
/// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
/// let arena = ArenaResource::new(CudaResource::new(&device)?, Some(4 << 20))?;
/// let p = arena.try_allocate(1000, &a)?; // from `a`'s arena, in a superblock of its own
/// let snap = arena.snapshot().unwrap();
/// assert_eq!((snap.resource.as_str(), snap.reserved_bytes()), ("arena", 4 << 20));
/// let (_, block) = snap.blocks().find(|(_, blk)| blk.address == p).unwrap();
/// assert_eq!((block.state, block.bytes, block.stream), (BlockState::Live, 1024, Some(a.id())));
///
/// b.wait(&a.record()?)?;
/// unsafe { arena.deallocate(p, 1000, &b) }; // freed on `b`: `a` reclaims it when it needs it
/// let f = arena.fragmentation().unwrap();
/// assert_eq!(f.largest_free_block, 4 << 20); // one extent, whichever streams freed it
/// assert_eq!(f.largest_free_now, 3 << 20); // any stream, now: the global arena's
/// assert_eq!(f.largest_free_for(a.id()), 4 << 20);
/// # Ok::<(), streamalloc::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidArgument`] from construction when the arena would be smaller than one
/// superblock; [`Error::OutOfMemory`] with the request, the bytes free in the arena and its
/// [`OutOfMemoryDetails`](crate::OutOfMemoryDetails) (largest free block, free, held and pending
/// bytes) when it cannot serve a request. [`deallocate`](MemoryResource::deallocate) of a pointer this arena
/// did not hand out, of one already freed, or with another size than it was allocated with
/// frees nothing and records an [`Error::InvalidArgument`] naming the pointer on the device
/// ([`Device::take_deferred_error`](crate::Device::take_deferred_error)).
///
/// # Examples
///
/// ```
/// use streamalloc::{ArenaResource, CudaResource, Device, MemoryResource, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let arena = ArenaResource::new(CudaResource::new(&device)?, Some(64 << 20))?;
/// let small = arena.allocate(1000, &stream).await?;   // from this stream's arena
/// let large = arena.allocate(8 << 20, &stream).await?; // from the global arena
/// assert!(small.is_aligned(256) && large.is_aligned(256));
/// unsafe {
///     arena.deallocate(small, 1000, &stream);
///     arena.deallocate(large, 8 << 20, &stream);
/// }
/// assert_eq!(arena.statistics().free_bytes, 64 << 20);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub struct ArenaResource<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

impl<R: MemoryResource> ArenaResource<R> {
    /// An arena of `arena_size` bytes over `upstream`, taken now (`None`: an arena that
    /// starts empty and grows on demand), with the other settings at their defaults.
    ///
    /// # Errors
    /// As [`with_config`](ArenaResource::with_config).
    ///
    /// ```
    /// use streamalloc::{ArenaResource, CudaResource, Device, Error};
    ///
    /// let mr = CudaResource::new(&Device::host())?;
    /// let arena = ArenaResource::new(mr.clone(), Some(4 << 20))?;
    /// assert_eq!(arena.arena_size(), 4 << 20);
    /// // An arena holds at least one superblock (1 MiB).
    /// assert!(matches!(ArenaResource::new(mr, Some(256)), Err(Error::InvalidArgument(_))));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn new(upstream: R, arena_size: Option<usize>) -> Result<Self> {
        let config = ArenaConfig {
            arena_size,
            ..ArenaConfig::default()
        };
        Self::with_config(upstream, config)
    }

    /// An arena over `upstream` with the settings of `config`. With an arena size, takes the
    /// whole arena from the upstream now, on a stream of its own, and waits until it is there
    /// (as RMM does); without, takes nothing until a request needs it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the arena size or the maximum size, rounded down to
    /// 64 KiB, is below 1 MiB (one superblock), when the growth step is not a multiple of
    /// 64 KiB of at least 1 MiB, or when the upstream's device is gone; the upstream's error
    /// (out-of-memory) when it cannot provide an arena of a given size.
    ///
    /// ```
    /// use streamalloc::{ArenaConfig, ArenaDump, ArenaResource, CudaResource, Device};
    ///
    /// let device = Device::host();
    /// let config = ArenaConfig::default()
    ///     .arena_size(8 << 20)
    ///     .dump_on_failure(ArenaDump::Tracing)
    ///     .per_thread_arenas(true);
    /// let arena = ArenaResource::with_config(CudaResource::new(&device)?, config)?;
    /// assert_eq!(arena.statistics().free_bytes, 8 << 20);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn with_config(upstream: R, config: ArenaConfig) -> Result<Self> {
        let device = crate::resource::contract::checks::upstream_device(&upstream)?;
        let home = Stream::new(&device)?;
        let (extents, growth, global, limit) = match config.arena_size {
            Some(requested) => {
                let size = requested / PAGE_SIZE * PAGE_SIZE;
                if size < SUPERBLOCK_SIZE {
                    return Err(Error::invalid(format!(
                        "the arena size ({requested} bytes) is below one superblock ({SUPERBLOCK_SIZE} bytes)"
                    )));
                }
                let base = upstream.try_allocate(size, &home)?.addr();
                // Ready for every stream, as RMM's `allocate_sync` makes it: no stream has to
                // wait for `home` before its first use of the arena.
                if let Err(e) = home.synchronize_blocking() {
                    // SAFETY: just allocated on `home`, never handed out.
                    unsafe { upstream.deallocate(DevicePtr::from_raw(base), size, &home) };
                    return Err(e);
                }
                let pages = (size / PAGE_SIZE) as u64;
                let global = GlobalArena::new(pages, Vec::new());
                (
                    Extents::Fixed(Extent::new(base, size, 0)),
                    None,
                    global,
                    size,
                )
            }
            None => {
                let step = config.get_growth_step();
                if step < SUPERBLOCK_SIZE || step % PAGE_SIZE != 0 {
                    return Err(Error::invalid(format!(
                        "the growth step ({step} bytes) is not a multiple of 64 KiB of at least \
                         one superblock ({SUPERBLOCK_SIZE} bytes)"
                    )));
                }
                let maximum = match config.get_maximum_size() {
                    Some(bytes) => bytes / PAGE_SIZE * PAGE_SIZE,
                    None => device.total_memory()? / PAGE_SIZE * PAGE_SIZE,
                };
                if maximum < SUPERBLOCK_SIZE {
                    return Err(Error::invalid(format!(
                        "the maximum arena size ({maximum} bytes) is below one superblock \
                         ({SUPERBLOCK_SIZE} bytes)"
                    )));
                }
                let growth = Growth { step, maximum };
                let extents = Extents::Growing(Default::default());
                (extents, Some(growth), GlobalArena::empty(), maximum)
            }
        };
        let size_classes = config.get_size_classes();
        let per_thread = config.get_per_thread_arenas();
        static NEXT_UID: AtomicU64 = AtomicU64::new(1);
        Ok(ArenaResource {
            inner: Arc::new(Inner {
                uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
                upstream,
                device,
                extents,
                growth,
                capacity: if size_classes {
                    largest_size_class_within(limit)
                } else {
                    limit
                },
                size_classes,
                per_thread,
                dump: config.dump_on_failure,
                global: Mutex::new(global),
                slots: Slots::new(),
                registry: RwLock::new(Registry::default()),
                home,
                availability: Arc::new(Availability::new()),
                counters: OrderCounters::default(),
                superblocks_held: AtomicUsize::new(0),
            }),
        })
    }

    /// The bytes now held from the upstream: the whole arena for an arena of a given size;
    /// what a growing arena has taken so far.
    pub fn arena_size(&self) -> usize {
        self.inner.extents.held()
    }

    /// The most bytes a growing arena may hold ([`ArenaConfig::maximum_size`]); `None` for an
    /// arena of a given size, which never grows.
    pub fn maximum_size(&self) -> Option<usize> {
        self.inner.growth.map(|g| g.maximum)
    }

    /// Gives every wholly free extent of a growing arena back to the upstream (after moving
    /// wholly free superblocks to the global arena, as [`defragment`](Self::defragment) does);
    /// returns the bytes given back. An arena of a given size gives nothing back (0).
    ///
    /// # Stream ordering
    /// Each extent goes back on the arena's own stream after it waits for every stream that
    /// freed memory into it.
    ///
    /// ```
    /// use streamalloc::{ArenaResource, CudaResource, Device, HostConfig, MemoryResource, Stream};
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// let stream = Stream::new(&device)?;
    /// let arena = ArenaResource::new(CudaResource::new(&device)?, None)?; // grows on demand
    /// let p = arena.try_allocate(8 << 20, &stream)?;
    /// assert_eq!(arena.arena_size(), 8 << 20);
    /// unsafe { arena.deallocate(p, 8 << 20, &stream) };
    /// assert_eq!(arena.trim(), 8 << 20);
    /// assert_eq!(arena.arena_size(), 0);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn trim(&self) -> usize {
        self.inner.defragment();
        self.inner.release_free_extents()
    }

    /// A snapshot of the arena's accounting. Takes every stream arena's lock in turn.
    ///
    /// ```
    /// use streamalloc::{ArenaResource, CudaResource, Device, MemoryResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let arena = ArenaResource::new(CudaResource::new(&device)?, Some(4 << 20))?;
    /// let p = arena.try_allocate(1000, &stream)?;
    /// let stats = arena.statistics();
    /// assert_eq!((stats.live_allocations, stats.live_bytes), (1, 1024));
    /// assert_eq!((stats.stream_arenas, stats.superblocks), (1, 1));
    /// assert_eq!(stats.free_bytes + stats.pending_bytes + stats.live_bytes, stats.reserved_bytes);
    /// unsafe { arena.deallocate(p, 1000, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn statistics(&self) -> ArenaStatistics {
        self.inner.statistics()
    }

    /// Returns every wholly free superblock of every stream arena to the global arena, where
    /// they coalesce (RMM's `defragment`, which runs only on exhaustion there; here it also runs
    /// on exhaustion, and on request). Retires stream arenas left without superblocks. Returns
    /// the bytes moved.
    ///
    /// # Stream ordering
    /// Nothing is waited for now: each returned superblock carries the streams that freed into
    /// it, and whoever takes it from the global arena waits for them first.
    ///
    /// ```
    /// use streamalloc::{ArenaResource, CudaResource, Device, MemoryResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let arena = ArenaResource::new(CudaResource::new(&device)?, Some(4 << 20))?;
    /// let p = arena.try_allocate(1000, &stream)?;
    /// unsafe { arena.deallocate(p, 1000, &stream) };
    /// assert_eq!(arena.statistics().global_free_bytes, 3 << 20); // one superblock lent out
    /// assert_eq!(arena.defragment(), 1 << 20);
    /// assert_eq!(arena.statistics().global_free_bytes, 4 << 20);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn defragment(&self) -> usize {
        let moved = self.inner.defragment();
        if moved > 0 {
            self.inner.availability.notify();
        }
        moved
    }
}

memory_resource!(shared [R: MemoryResource] ArenaResource<R>);

// SAFETY: a pointer it hands out is a block carved by the arena's core out of superblocks,
// each an allocation of the upstream held until the resource returns it wholly free: blocks
// are at least the request, at 256-aligned offsets of 256-aligned superblocks, and the core
// hands out no byte twice until it is freed. The properties are the upstream's.
unsafe impl<R: MemoryResource> crate::resource::suballoc::base::SubAllocator for Inner<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if is_empty_request(&self.device, bytes, stream, TRY_ALLOCATE)? {
            return Ok(DevicePtr::NULL);
        }
        let size = match self.round(bytes) {
            Some(size) if size <= self.capacity => size as u64,
            rounded => return Err(self.out_of_memory(bytes, rounded.unwrap_or(bytes), stream)),
        };
        if size > SUPERBLOCK_SIZE as u64 {
            self.allocate_large(size, bytes, stream)
        } else {
            self.allocate_small(size, bytes, stream)
        }
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if ptr.is_null() {
            return;
        }
        let addr = ptr.addr();
        // A pointer outside the arena or a size no block has frees nothing: the caller hears
        // of it through the device's deferred errors (a panic here could abort a `Drop`).
        let found = self.round(bytes).and_then(|size| {
            self.extents.by_addr(addr, |e| {
                let page = e.page_of(addr);
                (size as u64, page, e.owner(page).load(Ordering::Acquire))
            })
        });
        let Some((size, page, owner)) = found else {
            self.device.defer_error(Error::invalid(format!(
                "{ptr} ({bytes} bytes) is not allocated from this arena"
            )));
            return;
        };
        let freed = if owner == GLOBAL {
            let pages = size.div_ceil(PAGE_SIZE as u64);
            // The stream's record before the global lock, in the lock order of the old code
            // (the record table is never locked under the global arena's lock).
            let record = self.record_of(stream);
            let mut global = self.global.lock();
            let live = global.is_large(page, pages);
            if live {
                record.note_free();
                global.free_large(page, pages, Fence(record));
            }
            live
        } else {
            let slot = self.slots.get(owner);
            if slot.home.load(Ordering::Acquire) == stream.id().0 {
                let mut state = slot.state.lock();
                let live = state.core.is_live_with(addr, size);
                if live {
                    state
                        .record
                        .as_ref()
                        .expect("an arena that holds pages has a stream")
                        .note_free();
                    state.core.free(addr, size);
                }
                live
            } else {
                let record = self.record_of(stream);
                let mut state = slot.state.lock();
                let live = state.core.is_live_with(addr, size);
                if live {
                    record.note_free();
                    state.core.free_pending(addr, size, Fence(record));
                }
                live
            }
        };
        if !freed {
            self.device.defer_error(Error::invalid(format!(
                "{ptr} ({bytes} bytes) is not a live allocation of this arena (double free?)"
            )));
            return;
        }
        self.availability.notify();
    }

    fn wait_queue(&self) -> &Availability {
        &self.availability
    }

    fn capacity_limit(&self) -> Option<usize> {
        Some(self.capacity)
    }

    /// Reserved: the bytes held from the upstream (the peak is not tracked: the current
    /// figure); allocated: the live allocations, as the arena rounded them.
    fn memory_stats(&self) -> MemoryStats {
        let stats = self.statistics();
        self.upstream
            .memory_stats()
            .with_reserved(stats.reserved_bytes, stats.reserved_bytes)
            .with_allocated(Allocated {
                bytes: stats.live_bytes,
                peak: None,
                allocations: Some(stats.live_allocations),
            })
    }

    /// See [`ArenaResource`]'s section on snapshots.
    fn snapshot(&self) -> Option<MemorySnapshot> {
        Some(self.take_snapshot())
    }

    /// Only a live allocation or a pending free can bring memory back (a growing arena that
    /// could grow has already tried).
    fn may_regain_memory(&self, bytes: usize) -> bool {
        let _ = bytes;
        let stats = self.statistics();
        stats.live_allocations > 0 || stats.pending_bytes > 0
    }
}

impl<R: MemoryResource> fmt::Debug for ArenaResource<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArenaResource")
            .field("device", &self.inner.device.id())
            .field("arena_size", &self.inner.extents.held())
            .field("maximum_size", &self.maximum_size())
            .field("statistics", &self.statistics())
            .finish()
    }
}

#[cfg(test)]
mod tests;
