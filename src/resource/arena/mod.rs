//! `ArenaResource`: RMM's arena allocator — a global arena of superblocks and an arena per
//! stream — stream-ordered, scalable across threads, and awaitable.

pub(crate) mod core;

use std::cell::Cell;
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::ThreadId;

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use self::core::{
    align_to_size_class, align_up, largest_size_class_within, GlobalArena, StreamArena, Use,
    PAGE_SIZE, SUPERBLOCK_SIZE,
};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::registry::percent_of_free_device_memory;
use crate::resource::ResourceIdentity;
use crate::resource::{
    check_stream, Availability, DevicePtr, MemoryResource, Properties, SharedResource,
};
use crate::stream::{Event, Stream, StreamId};

/// RMM's arena allocator (`arena_memory_resource`) over any upstream resource: a global arena
/// taken from the upstream once, lent out in superblocks to an arena per stream, so that
/// threads working on their own streams allocate without contending on one lock.
///
/// # How it allocates
/// At construction the resource takes one block of `arena_size` bytes from its upstream (by
/// default half of the device's free memory) and never grows. Requests up to 1 MiB are served
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
/// # Errors
/// [`Error::InvalidArgument`] from construction when the arena would be smaller than one
/// superblock; [`Error::OutOfMemory`] with the request and the bytes free in the arena when it
/// cannot serve a request.
///
/// # Panics
/// [`deallocate`](MemoryResource::deallocate) of a pointer this arena did not hand out, of one
/// already freed, or with another size than it was allocated with.
///
/// # Examples
///
/// ```
/// use streamalloc::{ArenaResource, CudaResource, Device, MemoryResource, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let arena = ArenaResource::new(CudaResource::new(&device), Some(64 << 20))?;
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

/// Where an [`ArenaResource`] describes its state when a request fails with out-of-memory
/// ([`ArenaConfig::dump_on_failure`]): the arena's size, free, pending and live bytes, the
/// largest free block and the fragmentation (RMM's figures), then every free range of the global
/// arena and every stream arena.
///
/// Every failed [`try_allocate`](MemoryResource::try_allocate) dumps, including the retries of
/// an awaited allocation that is waiting for memory; use it to debug, not in steady state.
///
/// # Examples
///
/// ```
/// use streamalloc::{ArenaConfig, ArenaDump};
///
/// let to_log = ArenaConfig::default().dump_on_failure(ArenaDump::Tracing);
/// let to_file = ArenaConfig::default()
///     .dump_on_failure(ArenaDump::File(std::env::temp_dir().join("arena_dump.log")));
/// assert_eq!(to_log.get_dump_on_failure(), Some(&ArenaDump::Tracing));
/// # let _ = to_file;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArenaDump {
    /// A `tracing` event at `WARN` level with target `streamalloc::arena`; the dump is its
    /// `dump` field.
    Tracing,
    /// Appended to this file, which is created if missing (RMM writes
    /// `rmm_arena_memory_dump.log`).
    File(PathBuf),
}

/// Settings of an [`ArenaResource`] ([`ArenaResource::with_config`]): `Option` fields with
/// documented defaults and by-value setters.
///
/// # Examples
///
/// ```
/// use streamalloc::{ArenaConfig, ArenaResource, CudaResource, Device};
///
/// let device = Device::host();
/// let config = ArenaConfig::default().arena_size(16 << 20).size_classes(true);
/// let arena = ArenaResource::with_config(CudaResource::new(&device), config)?;
/// assert_eq!(arena.arena_size(), 16 << 20);
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArenaConfig {
    arena_size: Option<usize>,
    dump_on_failure: Option<ArenaDump>,
    size_classes: Option<bool>,
    per_thread_arenas: Option<bool>,
}

impl ArenaConfig {
    /// The bytes taken from the upstream, rounded down to a multiple of 64 KiB; at least 1 MiB.
    pub fn arena_size(mut self, bytes: usize) -> Self {
        self.arena_size = Some(bytes);
        self
    }

    /// The arena size if set; `None` means half of the device's free memory at construction
    /// (RMM's default).
    pub fn get_arena_size(&self) -> Option<usize> {
        self.arena_size
    }

    /// Describes the arena's state in `dump` whenever a request fails with out-of-memory.
    pub fn dump_on_failure(mut self, dump: ArenaDump) -> Self {
        self.dump_on_failure = Some(dump);
        self
    }

    /// Where failures are dumped; default `None`, no dump.
    pub fn get_dump_on_failure(&self) -> Option<&ArenaDump> {
        self.dump_on_failure.as_ref()
    }

    /// Rounds requests up to RMM's jemalloc-style size classes (256 B steps to 2 KiB, then four
    /// classes per doubling, up to 256 GiB) instead of to 256 bytes: more waste inside blocks,
    /// less fragmentation between them. RMM builds with them under `RMM_ARENA_USE_SIZE_CLASSES`.
    pub fn size_classes(mut self, on: bool) -> Self {
        self.size_classes = Some(on);
        self
    }

    /// Whether size classes are used; default `false` (256-byte rounding, as RMM's default
    /// build).
    pub fn get_size_classes(&self) -> bool {
        self.size_classes.unwrap_or(false)
    }

    /// Gives every (thread, stream) pair its own arena instead of every stream, for threads
    /// that share a stream. A thread's arenas keep their superblocks after the thread exits
    /// until they are wholly free and the arena is defragmented.
    pub fn per_thread_arenas(mut self, on: bool) -> Self {
        self.per_thread_arenas = Some(on);
        self
    }

    /// Whether arenas are per (thread, stream); default `false` (per stream).
    pub fn get_per_thread_arenas(&self) -> bool {
        self.per_thread_arenas.unwrap_or(false)
    }
}

/// A snapshot of an arena's accounting ([`ArenaResource::statistics`]).
///
/// `free_bytes + pending_bytes + live_bytes == arena_size` always holds.
///
/// # Examples
///
/// ```
/// use streamalloc::{ArenaResource, CudaResource, Device, MemoryResource, Stream};
///
/// let device = Device::host();
/// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
/// let arena = ArenaResource::new(CudaResource::new(&device), Some(4 << 20))?;
/// let p = arena.try_allocate(1 << 20, &a)?; // a whole superblock of `a`'s arena
/// b.wait(&a.record()?)?;
/// unsafe { arena.deallocate(p, 1 << 20, &b) }; // freed on another stream than its arena's
/// let stats = arena.statistics();
/// assert_eq!((stats.pending_bytes, stats.live_allocations), (1 << 20, 0));
/// assert_eq!(stats.events_recorded, 0); // nothing crossed streams yet
/// let q = arena.try_allocate(1 << 20, &a)?; // `a` waits for `b`, then reuses the block
/// assert_eq!((q, arena.statistics().events_recorded), (p, 1));
/// unsafe { arena.deallocate(q, 1 << 20, &a) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaStatistics {
    /// The bytes taken from the upstream.
    pub arena_size: usize,
    /// Bytes free for reuse: in the global arena and in the stream arenas.
    pub free_bytes: usize,
    /// Of those, the bytes free in the global arena.
    pub global_free_bytes: usize,
    /// The largest free block, in the global arena or any stream arena.
    pub largest_free_block: usize,
    /// Bytes freed on another stream than the arena they lie in, not reusable until that
    /// arena's stream waits for the freeing stream (or they go back to the global arena).
    pub pending_bytes: usize,
    /// Bytes of live allocations, as rounded (to 256 bytes or a size class; large ones to
    /// whole pages of 64 KiB).
    pub live_bytes: usize,
    /// How many allocations are live.
    pub live_allocations: usize,
    /// How many stream arenas there are.
    pub stream_arenas: usize,
    /// How many superblocks the stream arenas hold.
    pub superblocks: usize,
    /// Events recorded so that memory freed on one stream could be used on another.
    pub events_recorded: u64,
    /// Stream waits inserted for the same purpose (events already complete need none).
    pub stream_waits: u64,
}

/// Every stream that frees memory into the arena or owns a stream arena: what is needed to
/// order another stream after its frees. Aligned so that the flag written on every free does
/// not share a cache line with another stream's.
#[repr(align(128))]
struct StreamRecord {
    stream: Stream,
    /// Set by every free on the stream; cleared when an event is recorded after it.
    dirty: AtomicBool,
    /// The latest event recorded for another stream to wait on, and its generation (1, 2, ...).
    event: Mutex<Option<(Event, u64)>>,
    /// For each other stream, the generation of its latest event this stream already waits
    /// for, so that taking more memory behind the same event adds no second wait.
    waited: Mutex<FxHashMap<StreamId, u64>>,
}

impl StreamRecord {
    fn new(stream: Stream) -> Arc<Self> {
        Arc::new(StreamRecord {
            stream,
            // No event recorded yet.
            dirty: AtomicBool::new(true),
            event: Mutex::new(None),
            waited: Mutex::new(FxHashMap::default()),
        })
    }

    /// Notes a free on the stream, before the freed block becomes visible to anyone else.
    fn note_free(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// An event on the stream after every free on it that happened before this call: the
    /// cached one when no free came since, else a new one. With its generation, and whether
    /// it is new.
    fn covering_event(&self) -> Result<(Event, u64, bool)> {
        let mut cached = self.event.lock();
        if !self.dirty.swap(false, Ordering::AcqRel) {
            if let Some((e, g)) = &*cached {
                return Ok((e.clone(), *g, false));
            }
        }
        match self.stream.record() {
            Ok(e) => {
                static GENERATION: AtomicU64 = AtomicU64::new(1);
                let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
                *cached = Some((e.clone(), generation));
                Ok((e, generation, true))
            }
            Err(err) => {
                self.dirty.store(true, Ordering::Release);
                Err(err)
            }
        }
    }
}

/// What the cores carry: the stream whose frees must be waited for.
#[derive(Clone)]
struct Fence(Arc<StreamRecord>);

impl PartialEq for Fence {
    fn eq(&self, other: &Fence) -> bool {
        self.0.stream.id() == other.0.stream.id()
    }
}

/// The key of a stream arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ArenaKey {
    stream: StreamId,
    /// `Some` with per-thread arenas.
    thread: Option<ThreadId>,
}

/// One stream arena's place; slots are reused after their arena is retired. Aligned so that
/// two threads' arenas never share a cache line.
#[repr(align(128))]
#[derive(Default)]
struct Slot {
    /// The arena's stream id, 0 when vacant. Changes only while the arena holds no superblock,
    /// so a free of a block inside one may read it without the lock.
    home: AtomicU64,
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    /// `None` when vacant.
    key: Option<ArenaKey>,
    record: Option<Arc<StreamRecord>>,
    core: StreamArena<Fence>,
}

const SLOT_BUCKETS: usize = 28;
const FIRST_BUCKET: usize = 32;

/// An append-only array of slots that never moves them: bucket `b` holds `32 << b` slots,
/// allocated on first use, so a slot is found by index without a lock.
struct Slots {
    buckets: [OnceLock<Box<[Slot]>>; SLOT_BUCKETS],
}

impl Slots {
    fn new() -> Self {
        Slots {
            buckets: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    fn locate(index: u32) -> (usize, usize) {
        let n = index as usize / FIRST_BUCKET + 1;
        let bucket = (usize::BITS - 1 - n.leading_zeros()) as usize;
        (bucket, index as usize - FIRST_BUCKET * ((1 << bucket) - 1))
    }

    /// The slot at `index`, which must have been made by [`Slots::make`].
    fn get(&self, index: u32) -> &Slot {
        let (bucket, offset) = Self::locate(index);
        &self.buckets[bucket].get().expect("slot index never made")[offset]
    }

    fn make(&self, index: u32) -> &Slot {
        let (bucket, offset) = Self::locate(index);
        &self.buckets[bucket].get_or_init(|| {
            (0..FIRST_BUCKET << bucket)
                .map(|_| Slot::default())
                .collect()
        })[offset]
    }
}

#[derive(Default)]
struct Registry {
    arenas: FxHashMap<ArenaKey, u32>,
    records: FxHashMap<StreamId, Weak<StreamRecord>>,
    /// Slots below `used` whose arena was retired.
    vacant: Vec<u32>,
    /// Slots ever made: `0..used`.
    used: u32,
    /// `records` is pruned of dead entries when it reaches this length.
    prune_at: usize,
}

impl Registry {
    fn record(&mut self, stream: &Stream) -> Arc<StreamRecord> {
        if let Some(r) = self.records.get(&stream.id()).and_then(Weak::upgrade) {
            return r;
        }
        if self.records.len() >= self.prune_at {
            self.records.retain(|_, r| r.strong_count() > 0);
            self.prune_at = (2 * self.records.len()).max(64);
        }
        let r = StreamRecord::new(stream.clone());
        self.records.insert(stream.id(), Arc::downgrade(&r));
        r
    }
}

/// [`Inner::owners`] of a page in the global arena (free or part of a large block).
const GLOBAL: u32 = u32::MAX;
/// How many other streams' waited-for events a stream remembers.
const WAITED_LIMIT: usize = 256;

struct Inner<R: MemoryResource> {
    /// Process-unique, never 0: keys the thread-local arena cache.
    uid: u64,
    upstream: R,
    device: Device,
    /// The arena's memory: one upstream allocation of `size` bytes.
    base: u64,
    size: usize,
    /// The largest request that can ever succeed.
    capacity: usize,
    size_classes: bool,
    per_thread: bool,
    dump: Option<ArenaDump>,
    /// Page → the slot of the stream arena it is lent to, or [`GLOBAL`].
    owners: Box<[AtomicU32]>,
    global: Mutex<GlobalArena<Fence>>,
    slots: Slots,
    registry: RwLock<Registry>,
    /// The stream the arena was allocated on; it gives the arena back.
    home: Stream,
    availability: Arc<Availability>,
    events_recorded: AtomicU64,
    stream_waits: AtomicU64,
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

fn cache_get(resource: u64, stream: u64) -> Option<u32> {
    CACHE.with(|ways| {
        ways.iter().find_map(|w| {
            let e = w.get();
            (e.resource == resource && e.stream == stream).then_some(e.slot)
        })
    })
}

fn cache_put(resource: u64, stream: u64, slot: u32) {
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

fn cache_forget(resource: u64, stream: u64) {
    CACHE.with(|ways| {
        for w in ways {
            let e = w.get();
            if e.resource == resource && e.stream == stream {
                w.set(EMPTY);
            }
        }
    });
}

impl<R: MemoryResource> ArenaResource<R> {
    /// An arena of `arena_size` bytes over `upstream` (`None`: half of the device's free
    /// memory), with the other settings at their defaults.
    ///
    /// # Errors
    /// As [`with_config`](ArenaResource::with_config).
    ///
    /// ```
    /// use streamalloc::{ArenaResource, CudaResource, Device, Error};
    ///
    /// let mr = CudaResource::new(&Device::host());
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

    /// An arena over `upstream` with the settings of `config`. Takes the whole arena from the
    /// upstream now, on a stream of its own, and waits until it is there (as RMM does).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the arena size, rounded down to 64 KiB, is below 1 MiB
    /// (one superblock) or the upstream's device is gone; the upstream's error (out-of-memory)
    /// when it cannot provide the arena.
    ///
    /// ```
    /// use streamalloc::{ArenaConfig, ArenaDump, ArenaResource, CudaResource, Device};
    ///
    /// let device = Device::host();
    /// let config = ArenaConfig::default()
    ///     .arena_size(8 << 20)
    ///     .dump_on_failure(ArenaDump::Tracing)
    ///     .per_thread_arenas(true);
    /// let arena = ArenaResource::with_config(CudaResource::new(&device), config)?;
    /// assert_eq!(arena.statistics().free_bytes, 8 << 20);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn with_config(upstream: R, config: ArenaConfig) -> Result<Self> {
        let id = upstream.properties().device;
        let device = Device::from_id(id)
            .ok_or_else(|| Error::invalid(format!("the upstream's device {id} is gone")))?;
        let requested = match config.arena_size {
            Some(bytes) => bytes,
            None => percent_of_free_device_memory(&device, 50)?,
        };
        let size = requested / PAGE_SIZE * PAGE_SIZE;
        if size < SUPERBLOCK_SIZE {
            return Err(Error::invalid(format!(
                "the arena size ({requested} bytes) is below one superblock ({SUPERBLOCK_SIZE} bytes)"
            )));
        }
        let size_classes = config.get_size_classes();
        let per_thread = config.get_per_thread_arenas();
        let home = Stream::new(&device)?;
        let base = upstream.try_allocate(size, &home)?.addr();
        // Ready for every stream, as RMM's `allocate_sync` makes it: no stream has to wait for
        // `home` before its first use of the arena.
        if let Err(e) = home.synchronize_blocking() {
            // SAFETY: just allocated on `home`, never handed out.
            unsafe { upstream.deallocate(DevicePtr::from_raw(base), size, &home) };
            return Err(e);
        }
        let pages = (size / PAGE_SIZE) as u64;
        static NEXT_UID: AtomicU64 = AtomicU64::new(1);
        Ok(ArenaResource {
            inner: Arc::new(Inner {
                uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
                upstream,
                device,
                base,
                size,
                capacity: if size_classes {
                    largest_size_class_within(size)
                } else {
                    size
                },
                size_classes,
                per_thread,
                dump: config.dump_on_failure,
                owners: (0..pages).map(|_| AtomicU32::new(GLOBAL)).collect(),
                global: Mutex::new(GlobalArena::new(pages, Vec::new())),
                slots: Slots::new(),
                registry: RwLock::new(Registry {
                    prune_at: 64,
                    ..Registry::default()
                }),
                home,
                availability: Arc::new(Availability::new()),
                events_recorded: AtomicU64::new(0),
                stream_waits: AtomicU64::new(0),
            }),
        })
    }

    /// The bytes taken from the upstream.
    pub fn arena_size(&self) -> usize {
        self.inner.size
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &R {
        &self.inner.upstream
    }

    /// A snapshot of the arena's accounting. Takes every stream arena's lock in turn.
    ///
    /// ```
    /// use streamalloc::{ArenaResource, CudaResource, Device, MemoryResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let arena = ArenaResource::new(CudaResource::new(&device), Some(4 << 20))?;
    /// let p = arena.try_allocate(1000, &stream)?;
    /// let stats = arena.statistics();
    /// assert_eq!((stats.live_allocations, stats.live_bytes), (1, 1024));
    /// assert_eq!((stats.stream_arenas, stats.superblocks), (1, 1));
    /// assert_eq!(stats.free_bytes + stats.pending_bytes + stats.live_bytes, stats.arena_size);
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
    /// let arena = ArenaResource::new(CudaResource::new(&device), Some(4 << 20))?;
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

impl<R: MemoryResource> Inner<R> {
    /// `bytes` as the arena rounds it: to 256 or to a size class; `None` when that overflows
    /// or there is no class.
    fn round(&self, bytes: usize) -> Option<usize> {
        if self.size_classes {
            align_to_size_class(bytes)
        } else {
            align_up(bytes)
        }
    }

    fn page_addr(&self, page: u64) -> u64 {
        self.base + page * PAGE_SIZE as u64
    }

    /// The page of `addr`.
    ///
    /// # Panics
    /// When `addr` lies outside the arena.
    fn page_of(&self, addr: u64) -> u64 {
        let offset = addr.wrapping_sub(self.base);
        assert!(
            offset < self.size as u64,
            "{addr:#x} is not allocated from this arena"
        );
        offset / PAGE_SIZE as u64
    }

    fn set_owner(&self, base: u64, bytes: u64, owner: u32) {
        let first = self.page_of(base) as usize;
        let pages = (bytes / PAGE_SIZE as u64) as usize;
        for page in &self.owners[first..first + pages] {
            page.store(owner, Ordering::Release);
        }
    }

    fn key(&self, stream: &Stream) -> ArenaKey {
        ArenaKey {
            stream: stream.id(),
            thread: self.per_thread.then(|| std::thread::current().id()),
        }
    }

    /// The record of `stream`, made on first use.
    fn record_of(&self, stream: &Stream) -> Arc<StreamRecord> {
        let found = self
            .registry
            .read()
            .records
            .get(&stream.id())
            .and_then(Weak::upgrade);
        found.unwrap_or_else(|| self.registry.write().record(stream))
    }

    /// The slot of the arena for `key`: from the thread's cache, the registry, or a new one.
    /// The caller checks, under the slot's lock, that it still serves `key`.
    fn arena_slot(&self, stream: &Stream, key: ArenaKey) -> u32 {
        let sid = stream.id().0;
        if let Some(slot) = cache_get(self.uid, sid) {
            return slot;
        }
        let found = self.registry.read().arenas.get(&key).copied();
        let slot = found.unwrap_or_else(|| self.make_arena(stream, key));
        cache_put(self.uid, sid, slot);
        slot
    }

    fn make_arena(&self, stream: &Stream, key: ArenaKey) -> u32 {
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
        let record = registry.record(stream);
        let slot = self.slots.make(index);
        let mut state = slot.state.lock();
        debug_assert!(state.key.is_none() && state.core.superblock_count() == 0);
        state.key = Some(key);
        state.record = Some(record);
        slot.home.store(stream.id().0, Ordering::Release);
        registry.arenas.insert(key, index);
        index
    }

    /// Makes `taker`'s stream wait for every fence of another stream, recording events lazily
    /// and skipping events it already waits for or that are complete.
    fn wait_fences(&self, taker: &StreamRecord, fences: &[Fence]) -> Result<()> {
        for Fence(record) in fences {
            let id = record.stream.id();
            if id == taker.stream.id() {
                continue;
            }
            let (event, generation, fresh) = record.covering_event()?;
            if fresh {
                self.events_recorded.fetch_add(1, Ordering::Relaxed);
            }
            let mut waited = taker.waited.lock();
            if waited.get(&id).is_some_and(|&g| g >= generation) {
                continue;
            }
            if !event.is_complete()? {
                taker.stream.wait(&event)?;
                // What the taker hands on from now must be ordered after this wait too.
                taker.note_free();
                self.stream_waits.fetch_add(1, Ordering::Relaxed);
            }
            if waited.len() >= WAITED_LIMIT {
                // Forgetting only costs a redundant wait later.
                waited.clear();
            }
            waited.insert(id, generation);
        }
        Ok(())
    }

    /// Serves a request of at most one superblock from `stream`'s arena.
    fn allocate_small(&self, size: u64, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let key = self.key(stream);
        for attempt in 0..2 {
            loop {
                let index = self.arena_slot(stream, key);
                let mut state = self.slots.get(index).state.lock();
                if state.key != Some(key) {
                    // The cached arena was retired; look again.
                    drop(state);
                    cache_forget(self.uid, stream.id().0);
                    continue;
                }
                if let Some(p) = state.core.allocate(size) {
                    return Ok(DevicePtr::from_raw(p));
                }
                if let Some(p) = self.refill(index, &mut state, size)? {
                    return Ok(DevicePtr::from_raw(p));
                }
                break;
            }
            if attempt == 0 {
                // Exhausted: gather every wholly free superblock and retry once.
                self.defragment();
            }
        }
        if let Some(p) = self.borrow(size, stream)? {
            return Ok(DevicePtr::from_raw(p));
        }
        Err(self.out_of_memory(bytes, size as usize, stream))
    }

    /// Grows the arena in `slot` (`state`) for `size` bytes: with its pending frees when they
    /// could serve it, else with a superblock from the global arena, else with any pending
    /// frees. Returns the block, or `None` when none of that serves it.
    fn refill(&self, slot: u32, state: &mut SlotState, size: u64) -> Result<Option<u64>> {
        if state.core.pending_bytes() >= size {
            self.reclaim(state)?;
            if let Some(p) = state.core.allocate(size) {
                return Ok(Some(p));
            }
        }
        {
            let mut global = self.global.lock();
            if let Some(c) = global.find(Use::Superblock, 0) {
                let me = state.record.as_ref().expect("a live arena has a stream");
                self.wait_fences(me, global.fences(&c))?;
                global.take(c);
                drop(global);
                let (base, bytes) = (self.page_addr(c.start), c.pages * PAGE_SIZE as u64);
                self.set_owner(base, bytes, slot);
                state.core.add_superblock(base, bytes);
                let p = state.core.allocate(size);
                debug_assert!(p.is_some(), "a fresh superblock serves a small request");
                return Ok(p);
            }
        }
        if state.core.pending_bytes() > 0 {
            self.reclaim(state)?;
            return Ok(state.core.allocate(size));
        }
        Ok(None)
    }

    /// Makes the pending frees of the arena in `state` reusable, after `stream` (the arena's)
    /// waits for the streams that freed them.
    fn reclaim(&self, state: &mut SlotState) -> Result<()> {
        let me = state.record.as_ref().expect("a live arena has a stream");
        self.wait_fences(me, &state.core.pending_fences())?;
        state.core.reclaim_pending();
        Ok(())
    }

    /// The last resort of a small request: a free block of any stream arena, after `stream`
    /// waits for that arena's stream. The block stays in that arena's superblock.
    fn borrow(&self, size: u64, stream: &Stream) -> Result<Option<u64>> {
        let me = self.record_of(stream);
        let used = self.registry.read().used;
        for index in 0..used {
            let mut state = self.slots.get(index).state.lock();
            let Some(record) = state.record.clone() else {
                continue;
            };
            if state.core.pending_bytes() >= size {
                // Memory other streams freed into this arena serves no one until the arena's
                // stream waits for them: wait now, so that a borrower can have it too (after
                // waiting on an event of that stream recorded after this wait).
                self.reclaim(&mut state)?;
            }
            if let Some(p) = state.core.allocate(size) {
                if let Err(e) = self.wait_fences(&me, &[Fence(record)]) {
                    state.core.free(p, size);
                    return Err(e);
                }
                return Ok(Some(p));
            }
        }
        Ok(None)
    }

    /// Serves a request of more than one superblock from the global arena, in whole pages.
    fn allocate_large(&self, size: u64, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let pages = size.div_ceil(PAGE_SIZE as u64);
        let me = self.record_of(stream);
        for attempt in 0..2 {
            {
                let mut global = self.global.lock();
                if let Some(c) = global.find(Use::Large, pages) {
                    self.wait_fences(&me, global.fences(&c))?;
                    global.take(c);
                    return Ok(DevicePtr::from_raw(self.page_addr(c.start)));
                }
            }
            if attempt == 0 {
                self.defragment();
            }
        }
        Err(self.out_of_memory(bytes, size as usize, stream))
    }

    /// Moves every wholly free superblock of every stream arena to the global arena and
    /// retires the arenas left without superblocks; returns the bytes moved.
    fn defragment(&self) -> usize {
        let mut registry = self.registry.write();
        let mut returned = Vec::new();
        for index in 0..registry.used {
            let slot = self.slots.get(index);
            let mut state = slot.state.lock();
            let Some(record) = state.record.clone() else {
                continue;
            };
            for r in state.core.release_free_superblocks(&Fence(record)) {
                self.set_owner(r.base, r.size, GLOBAL);
                returned.push(r);
            }
            if state.core.superblock_count() == 0 {
                slot.home.store(0, Ordering::Release);
                state.record = None;
                let key = state.key.take().expect("a live slot has a key");
                registry.arenas.remove(&key);
                registry.vacant.push(index);
            }
        }
        let mut global = self.global.lock();
        let mut moved = 0;
        for r in returned {
            moved += r.size as usize;
            global.return_superblock(self.page_of(r.base), r.size / PAGE_SIZE as u64, r.fences);
        }
        moved
    }

    /// Visits every live stream arena, each under its lock in turn.
    fn for_each_arena(&self, mut f: impl FnMut(&ArenaKey, &StreamArena<Fence>)) {
        let registry = self.registry.read();
        for index in 0..registry.used {
            let state = self.slots.get(index).state.lock();
            if let Some(key) = &state.key {
                f(key, &state.core);
            }
        }
    }

    fn statistics(&self) -> ArenaStatistics {
        let mut stats = ArenaStatistics {
            arena_size: self.size,
            free_bytes: 0,
            global_free_bytes: 0,
            largest_free_block: 0,
            pending_bytes: 0,
            live_bytes: 0,
            live_allocations: 0,
            stream_arenas: 0,
            superblocks: 0,
            events_recorded: self.events_recorded.load(Ordering::Relaxed),
            stream_waits: self.stream_waits.load(Ordering::Relaxed),
        };
        self.for_each_arena(|_, core| {
            stats.free_bytes += core.free_bytes() as usize;
            stats.largest_free_block = stats.largest_free_block.max(core.largest_free() as usize);
            stats.pending_bytes += core.pending_bytes() as usize;
            stats.live_bytes += core.live_bytes() as usize;
            stats.live_allocations += core.live_count();
            stats.stream_arenas += 1;
            stats.superblocks += core.superblock_count();
        });
        let global = self.global.lock();
        let page = PAGE_SIZE;
        stats.global_free_bytes = global.free_pages() as usize * page;
        stats.free_bytes += stats.global_free_bytes;
        stats.largest_free_block = stats
            .largest_free_block
            .max(global.largest_free_pages() as usize * page);
        stats.live_bytes += global.large_pages() as usize * page;
        stats.live_allocations += global.large_count();
        stats
    }

    /// The out-of-memory error for a request of `bytes` (`rounded` as a block), after the
    /// configured dump.
    fn out_of_memory(&self, bytes: usize, rounded: usize, stream: &Stream) -> Error {
        let free = self.statistics().free_bytes;
        if let Some(dump) = &self.dump {
            self.write_dump(dump, bytes, rounded, stream);
        }
        Error::OutOfMemory {
            requested: bytes,
            available: Some(free),
            device: self.device.id(),
        }
    }

    fn write_dump(&self, dump: &ArenaDump, bytes: usize, rounded: usize, stream: &Stream) {
        let text = self.dump_text(bytes, rounded, stream);
        match dump {
            ArenaDump::Tracing => {
                tracing::warn!(target: "streamalloc::arena", requested = bytes, dump = %text, "arena out of memory");
            }
            ArenaDump::File(path) => {
                let written = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .and_then(|mut f| f.write_all(text.as_bytes()));
                if let Err(e) = written {
                    tracing::warn!(path = %path.display(), error = %e, "cannot write the arena dump");
                }
            }
        }
    }

    /// RMM's `dump_memory_log`, with the stream arenas too.
    fn dump_text(&self, bytes: usize, rounded: usize, stream: &Stream) -> String {
        const LIMIT: usize = 100;
        let stats = self.statistics();
        let mut out = String::new();
        let fragmentation = if stats.free_bytes == 0 {
            0.0
        } else {
            (1.0 - stats.largest_free_block as f64 / stats.free_bytes as f64) * 100.0
        };
        let _ = writeln!(
            out,
            "arena out of memory: {bytes} bytes ({rounded} as a block) requested on {}",
            stream.id()
        );
        let _ = writeln!(
            out,
            "  arena size: {} bytes at {:#x}; free {} (global {}), pending {}, live {} in {} allocations",
            stats.arena_size,
            self.base,
            stats.free_bytes,
            stats.global_free_bytes,
            stats.pending_bytes,
            stats.live_bytes,
            stats.live_allocations
        );
        let _ = writeln!(
            out,
            "  largest free block: {} bytes; fragmentation: {fragmentation:.2}%",
            stats.largest_free_block
        );
        {
            let global = self.global.lock();
            let ranges = global.free_ranges();
            let _ = writeln!(
                out,
                "  global arena: {} free ranges, {} large blocks ({} bytes), {} bytes lent as superblocks",
                ranges.len(),
                global.large_count(),
                global.large_pages() as usize * PAGE_SIZE,
                global.lent_pages() as usize * PAGE_SIZE
            );
            for (i, (start, pages, fences)) in ranges.iter().take(LIMIT).enumerate() {
                let _ = writeln!(
                    out,
                    "    free range {i}: {:#x}, {} bytes, freed on {} streams",
                    self.page_addr(*start),
                    *pages as usize * PAGE_SIZE,
                    fences.len()
                );
            }
            if ranges.len() > LIMIT {
                let _ = writeln!(out, "    ... {} more", ranges.len() - LIMIT);
            }
        }
        let _ = writeln!(out, "  stream arenas: {}", stats.stream_arenas);
        let mut listed = 0;
        self.for_each_arena(|key, core| {
            listed += 1;
            if listed > LIMIT {
                return;
            }
            let thread = key.thread.map(|t| format!(" {t:?}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "    {}{thread}: {} superblocks ({} bytes), free {} in {} blocks (largest {}), live {} in {} blocks, pending {}",
                key.stream,
                core.superblock_count(),
                core.superblock_bytes(),
                core.free_bytes(),
                core.free_block_count(),
                core.largest_free(),
                core.live_bytes(),
                core.live_count(),
                core.pending_bytes()
            );
        });
        if listed > LIMIT {
            let _ = writeln!(out, "    ... {} more", listed - LIMIT);
        }
        out
    }
}

impl<R: MemoryResource> MemoryResource for ArenaResource<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        check_stream(&self.inner.device, stream)?;
        let inner = &*self.inner;
        let size = match inner.round(bytes) {
            Some(size) if size <= inner.size => size as u64,
            rounded => return Err(inner.out_of_memory(bytes, rounded.unwrap_or(bytes), stream)),
        };
        if size > SUPERBLOCK_SIZE as u64 {
            inner.allocate_large(size, bytes, stream)
        } else {
            inner.allocate_small(size, bytes, stream)
        }
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if ptr.is_null() {
            return;
        }
        let inner = &*self.inner;
        let addr = ptr.addr();
        let size = inner
            .round(bytes)
            .unwrap_or_else(|| panic!("{addr:#x} freed with {bytes} bytes, more than any block"))
            as u64;
        let page = inner.page_of(addr);
        let owner = inner.owners[page as usize].load(Ordering::Acquire);
        if owner == GLOBAL {
            let record = inner.record_of(stream);
            record.note_free();
            let pages = size.div_ceil(PAGE_SIZE as u64);
            inner.global.lock().free_large(page, pages, Fence(record));
        } else {
            let slot = inner.slots.get(owner);
            if slot.home.load(Ordering::Acquire) == stream.id().0 {
                let mut state = slot.state.lock();
                state
                    .record
                    .as_ref()
                    .expect("an arena that holds pages has a stream")
                    .note_free();
                state.core.free(addr, size);
            } else {
                let record = inner.record_of(stream);
                record.note_free();
                slot.state
                    .lock()
                    .core
                    .free_pending(addr, size, Fence(record));
            }
        }
        inner.availability.notify();
    }

    fn availability(&self) -> Option<&Availability> {
        Some(&self.inner.availability)
    }

    fn capacity_limit(&self) -> Option<usize> {
        Some(self.inner.capacity)
    }

    /// The arena never grows: only a live allocation or a pending free can bring memory back.
    fn may_regain_memory(&self, bytes: usize) -> bool {
        let _ = bytes;
        let stats = self.statistics();
        stats.live_allocations > 0 || stats.pending_bytes > 0
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::of_shared(&self.inner)
    }

    fn properties(&self) -> Properties {
        self.inner.upstream.properties()
    }
}

impl<R: MemoryResource> Clone for ArenaResource<R> {
    fn clone(&self) -> Self {
        ArenaResource {
            inner: self.inner.clone(),
        }
    }
}

impl<R: MemoryResource> fmt::Debug for ArenaResource<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArenaResource")
            .field("device", &self.inner.device.id())
            .field("arena_size", &self.inner.size)
            .field("statistics", &self.statistics())
            .finish()
    }
}

impl<R: MemoryResource> Drop for Inner<R> {
    /// Gives the arena back to the upstream, ordered after every free, if nothing is live;
    /// else leaks it rather than free memory someone still uses, and the device records an
    /// [`Error::Leaked`].
    fn drop(&mut self) {
        self.defragment();
        let mut live = 0;
        self.for_each_arena(|_, core| live += core.live_count());
        let global = self.global.get_mut();
        live += global.large_count();
        if live > 0 || global.free_pages() != global.pages() {
            let stats = self.statistics();
            self.device.defer_error(Error::Leaked {
                what: "ArenaResource",
                allocations: stats.live_allocations,
                bytes: stats.live_bytes,
                device: self.device.id(),
            });
            return;
        }
        let fences: Vec<Fence> = global
            .free_ranges()
            .iter()
            .flat_map(|(_, _, f)| f.iter().cloned())
            .collect();
        let home = self.record_of(&self.home);
        if let Err(e) = self.wait_fences(&home, &fences) {
            tracing::error!(error = %e, "cannot order the arena's release after its frees; leaking it");
            self.device.defer_error(e);
            return;
        }
        // SAFETY: the block came from `upstream.try_allocate(size, home)` (construction),
        // nothing in it is live, and `home` now waits for every stream that freed memory in it,
        // so all work that used it is ordered before this point of `home`.
        unsafe {
            self.upstream
                .deallocate(DevicePtr::from_raw(self.base), self.size, &self.home)
        };
    }
}

#[cfg(test)]
mod tests;
