//! `MappedPoolResource`: a pool over CUDA virtual memory management that grows in place.

mod config;
mod for_pool;
mod free_list;
mod page_state;
mod pages;
mod report;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

pub use self::config::{MappedPoolConfig, MappedPoolStatistics};
use self::free_list::{BadFree, FreeList, Owner};
use self::page_state::{Page, PendingRelease, Status};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ids::BackendKind;
use crate::resource::contract::availability::Availability;
use crate::resource::contract::checks::is_empty_request;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::properties::{Properties, ResourceIdentity};
use crate::resource::contract::stats::MemoryStats;
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::{Fragmentation, MemorySnapshot};
use crate::resource::suballoc::stream_order::FreeOrder;
use crate::stream::{Event, Stream, StreamId};

/// What a device mismatch of a request names.
const TRY_ALLOCATE: &str = "MappedPoolResource::try_allocate(stream)";

/// Every block is a multiple of this and aligned to it.
const ALIGN: u64 = 256;

/// Blocks up to this size are placed from the top of the range down, larger ones from the
/// bottom up (the size a [`PoolResource`](crate::PoolResource) serves from its shards).
const SMALL_BLOCK: u64 = 1 << 20;

/// A pool that maps physical memory on demand into one reserved virtual address range, so it
/// grows in place and gives back what is free page by page: PyTorch's expandable segments,
/// over CUDA virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
/// `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`).
///
/// A [`PoolResource`](crate::PoolResource) holds chunks from its upstream that never merge:
/// a large request that fits none of them needs a new chunk while the free memory of the
/// others stays held (W4's 2.00 peak device memory per peak live byte). Here the whole
/// capacity is one address range, reserved once, with an address-ordered, coalescing free
/// list: blocks above 1 MiB are placed lowest address first, smaller ones highest address
/// first, so that long-lived small blocks gather at the top and pin no page between large
/// ones. Pages (the driver's granularity, 2 MiB on an H100) are mapped under a block when it
/// is handed out and stay mapped when it is freed, for the next block of any size there;
/// wholly free pages are unmapped and their physical memory released only when the mapped
/// memory goes above the pool's peak of live bytes by more than a 32nd (plus one page), or
/// above the release threshold when one is set ([`MappedPoolConfig::release_threshold`]).
/// Free space never strands: the free block at the edge of the used memory just extends,
/// and the device holds little more than the most the pool ever had live at once.
///
/// On the host backend the same calls are emulated with `mmap` (the physical bytes count
/// against the device's capacity and show in
/// [`HostControls::allocated_bytes`](crate::HostControls::allocated_bytes)).
///
/// # When to use it
/// Workloads whose sizes vary widely, where footprint matters: every page mapped or released
/// is a driver call (microseconds on a GPU), but pages kept mapped serve blocks of any size,
/// so once the pool has reached its peak, requests rarely map anything (on workload W4, one
/// page mapped per hundred steps). Kept free pages are neither unmapped nor fenced with an
/// event (so a steady allocate+free loop makes no driver call); once they are over the
/// limit, they are fenced with an event on each stream that freed into them and released a
/// little below it (down to half a set threshold), so that a loop at the boundary does not
/// map and unmap at every pair. [`trim`](MappedPoolResource::trim) releases them all (and
/// measures the peak afresh from what is live then).
///
/// # Stream ordering
/// A block freed on stream S is reusable at once by later work on S. Another stream T uses
/// memory freed on S only after T waits on an event recorded on S after the free, recorded
/// lazily when T takes such memory (one event covering all of S's frees before it, as in the
/// other pools). Unmapping is not stream-ordered on the GPU (it takes effect at once), so a
/// wholly free page is released only once an event recorded after the free that emptied it
/// has completed on every stream that freed into it: at once when those streams are idle,
/// else at a later allocation, free or [`trim`](MappedPoolResource::trim).
///
/// # Awaiting memory
/// The pool has a wait queue ([`Availability`]): an awaited
/// [`allocate`](MemoryResource::allocate) that finds the range full (or the device out of
/// physical memory) waits for a free. Requests larger than the range (or the device) fail at
/// once ([`Error::TooLarge`]).
///
/// # Errors
/// [`Error::Unsupported`] from `new` when the device has no virtual memory management;
/// [`Error::OutOfMemory`] when neither the range nor the device has room for a request. A
/// free of a pointer the pool does not hold as allocated with that size frees nothing and
/// records an [`Error::InvalidArgument`] on the device
/// ([`Device::take_deferred_error`](crate::Device::take_deferred_error)); a pool dropped with
/// allocations out leaks its mappings and records an [`Error::Leaked`] there. The error of a
/// stream that failed goes there too, when the pool meets it releasing pages (the pages
/// then stay mapped) or waiting for its streams as it is dropped.
///
/// # Examples
///
/// ```
/// use streamalloc::{Device, HostConfig, MappedPoolResource, MemoryResource, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host_with(HostConfig::default());
/// let controls = device.host_controls().unwrap();
/// let stream = Stream::new(&device)?;
/// let pool = MappedPoolResource::new(&device)?;
/// assert_eq!(controls.allocated_bytes(), 0); // nothing is mapped yet
///
/// let p = pool.allocate(5 << 19, &stream).await?; // 2.5 MiB
/// assert_eq!(controls.allocated_bytes(), 4 << 20); // two 2 MiB pages
/// let q = pool.allocate(3 << 19, &stream).await?;
/// assert_eq!(q.addr(), p.addr() + (5 << 19)); // in place, right above `p`
/// assert_eq!(controls.allocated_bytes(), 4 << 20); // it fits the pages mapped already
///
/// unsafe { pool.deallocate(p, 5 << 19, &stream) };
/// // The pages stay mapped (the pool needed them at its peak) and serve any size again.
/// assert_eq!(controls.allocated_bytes(), 4 << 20);
/// let r = pool.allocate(2 << 20, &stream).await?;
/// assert_eq!((r, controls.allocated_bytes()), (p, 4 << 20));
/// unsafe { pool.deallocate(q, 3 << 19, &stream) };
/// unsafe { pool.deallocate(r, 2 << 20, &stream) };
/// // `trim` releases them, once the stream has passed the frees (at once: it is idle).
/// assert_eq!(pool.trim(), 4 << 20);
/// assert_eq!(pool.statistics().reserved_bytes, 0);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub struct MappedPoolResource {
    inner: Arc<Inner>,
}

impl Clone for MappedPoolResource {
    fn clone(&self) -> Self {
        MappedPoolResource {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner {
    device: Device,
    /// The start of the reserved range.
    base: u64,
    /// Its length, a multiple of `granularity`.
    reserved: usize,
    /// The largest request that can ever fit: the range, or the device's memory if smaller.
    capacity: usize,
    granularity: usize,
    /// In bytes; `None`: up to the peak of live bytes (see `keep_pages`).
    release_threshold: Option<usize>,
    state: Mutex<State>,
    /// The mapped pages' bytes, as `State::mapped_pages` says, readable without the lock.
    mapped_bytes: AtomicUsize,
    /// Shared with the host functions that wake waiters when pending releases complete.
    availability: Arc<Availability>,
    /// Whether the drop records [`Error::Leaked`] for allocations still out (a
    /// [`PoolResource`](crate::PoolResource) whose large level this is counts them itself).
    report_leaks: bool,
    /// Bytes of device memory held outside the pool that the default release policy counts
    /// as live (a [`PoolResource`](crate::PoolResource)'s chunks, when this is its level of
    /// large blocks): free pages are then kept while the two together stay within the peak
    /// of what was live in both, not the peak of each (which could add up to more).
    outside: Option<Arc<AtomicUsize>>,
}

struct State {
    list: FreeList,
    pages: Vec<Page>,
    mapped_pages: usize,
    peak_mapped_pages: usize,
    /// The most bytes live at once (as rounded) since the pool was made or last trimmed: the
    /// default release policy keeps free pages mapped up to a 32nd above it (`keep_pages`).
    peak_live: u64,
    /// The most bytes allocated at once (as rounded) since the pool was made or its peak
    /// reset: `peak_allocated_bytes` in `memory_stats` (unlike `peak_live`, a trim keeps it).
    peak_allocated: u64,
    /// Pages in status `Idle`.
    idle: BTreeSet<usize>,
    /// Pages in status `Unfenced`.
    unfenced: BTreeSet<usize>,
    pending: Vec<PendingRelease>,
    /// The id of the next pending release. Pages are matched to their release by id, so ids
    /// must never come round while a release is pending: 64 bits, which no run counts through.
    next_pending: u64,
    /// Each stream that freed into the pool, by owner number (kept for the pool's life, as
    /// [`PoolResource`](crate::PoolResource) keeps the streams that own its free memory).
    orders: Vec<FreeOrder>,
    owner_of: FxHashMap<StreamId, Owner>,
}

impl State {
    /// A free list over `reserved` bytes of address space, `pages` pages of it, none mapped.
    fn new(reserved: usize, pages: usize) -> Self {
        State {
            list: FreeList::new(reserved as u64),
            pages: vec![Page::Unmapped; pages],
            mapped_pages: 0,
            peak_mapped_pages: 0,
            peak_live: 0,
            peak_allocated: 0,
            idle: BTreeSet::new(),
            unfenced: BTreeSet::new(),
            pending: Vec::new(),
            next_pending: 0,
            orders: Vec::new(),
            owner_of: FxHashMap::default(),
        }
    }
}

fn align_up(bytes: usize) -> Option<u64> {
    let bytes = u64::try_from(bytes).ok()?;
    bytes.checked_add(ALIGN - 1).map(|b| b & !(ALIGN - 1))
}

impl MappedPoolResource {
    /// A pool over `device` with the default [`MappedPoolConfig`]: twice the device's total
    /// memory reserved as address space, nothing mapped yet, wholly free pages kept while the
    /// mapped memory is within a 32nd (plus a page) of the peak of live bytes.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device has no virtual memory management
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` is 0, or a host without
    /// `mmap`); the driver's error when the range cannot be reserved.
    pub fn new(device: &Device) -> Result<Self> {
        Self::with_config(device, MappedPoolConfig::default())
    }

    /// A pool over `device` set up by `config`.
    ///
    /// # Errors
    /// As [`new`](Self::new); [`Error::InvalidArgument`] for a reserve of 0 bytes.
    ///
    /// ```
    /// use streamalloc::{Device, MappedPoolConfig, MappedPoolResource, MemoryResource};
    ///
    /// let device = Device::host();
    /// let pool = MappedPoolResource::with_config(&device, MappedPoolConfig::default().reserve(64 << 20))?;
    /// assert_eq!(pool.capacity_limit(), Some(64 << 20));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn with_config(device: &Device, config: MappedPoolConfig) -> Result<Self> {
        Self::build(device, &config, Arc::new(Availability::new()), true, None)
    }

    /// [`with_config`](Self::with_config) with the wait queue to wake, and whether the pool
    /// reports its own leaks when dropped (a pool it serves counts them instead).
    fn build(
        device: &Device,
        config: &MappedPoolConfig,
        availability: Arc<Availability>,
        report_leaks: bool,
        outside: Option<Arc<AtomicUsize>>,
    ) -> Result<Self> {
        let raw = device.raw();
        let granularity = raw.vmm_granularity()?;
        let wanted = match config.get_reserve() {
            Some(bytes) => bytes,
            None => device.total_memory()?.saturating_mul(2),
        };
        if wanted == 0 {
            return Err(Error::invalid(
                "a mapped pool must reserve more than 0 bytes",
            ));
        }
        let reserved = wanted
            .checked_next_multiple_of(granularity)
            .ok_or_else(|| Error::invalid(format!("a reserve of {wanted} bytes is too large")))?;
        let capacity = reserved.min(device.total_memory()?);
        let base = raw.vmm_reserve(reserved)?;
        let pages = reserved / granularity;
        Ok(MappedPoolResource {
            inner: Arc::new(Inner {
                device: device.clone(),
                base,
                reserved,
                capacity,
                granularity,
                release_threshold: config.get_release_threshold(),
                state: Mutex::new(State::new(reserved, pages)),
                mapped_bytes: AtomicUsize::new(0),
                availability,
                report_leaks,
                outside,
            }),
        })
    }

    /// The device it allocates on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Releases every wholly free page whose frees the streams have passed, whatever the
    /// release threshold; returns the bytes released. Pages whose frees are still queued
    /// are released by a later call once the streams pass them (or by
    /// [`trim_blocking`](Self::trim_blocking) now).
    ///
    /// ```
    /// use streamalloc::{Device, MappedPoolConfig, MappedPoolResource, MemoryResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let config = MappedPoolConfig::default().release_threshold(usize::MAX); // keep pages
    /// let pool = MappedPoolResource::with_config(&device, config)?;
    /// let p = pool.try_allocate(4 << 20, &stream)?;
    /// unsafe { pool.deallocate(p, 4 << 20, &stream) };
    /// assert_eq!(pool.statistics().reserved_bytes, 4 << 20);
    /// assert_eq!(pool.trim(), 4 << 20);
    /// assert_eq!(pool.statistics().reserved_bytes, 0);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn trim(&self) -> usize {
        let released = {
            let mut state = self.inner.state.lock();
            // What is kept from now on is measured from what is live now, not the old peak.
            state.peak_live = state.list.live_bytes();
            self.inner.collect(&mut state, 0, 0)
        };
        if released > 0 {
            self.inner.availability.notify();
        }
        released
    }

    /// [`trim`](Self::trim) after waiting (blocking the calling thread) for the streams to
    /// pass every free whose pages are wholly free: those pending release, and those kept
    /// under the release threshold (fenced with an event first).
    ///
    /// # Errors
    /// A driver error waiting for an event; nothing is released then.
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{Device, MappedPoolResource, MemoryResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let pool = MappedPoolResource::new(&device)?;
    /// let p = pool.try_allocate(2 << 20, &stream)?;
    /// stream.enqueue_delay(Duration::from_millis(20))?; // a kernel still using `p`
    /// unsafe { pool.deallocate(p, 2 << 20, &stream) };
    /// // Kept mapped under the default release threshold, with no event recorded yet.
    /// assert_eq!(pool.statistics().reserved_bytes, 2 << 20);
    /// assert_eq!(pool.statistics().pending_release_bytes, 0);
    /// assert_eq!(pool.trim_blocking()?, 2 << 20);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn trim_blocking(&self) -> Result<usize> {
        let events: Vec<Event> = {
            let mut state = self.inner.state.lock();
            let kept: Vec<usize> = std::mem::take(&mut state.unfenced).into_iter().collect();
            self.inner.fence(&mut state, kept);
            state
                .pending
                .iter()
                .flat_map(|p| p.events.iter().cloned())
                .collect()
        };
        for e in events {
            e.synchronize_blocking()?;
        }
        Ok(self.trim())
    }
}

impl Inner {
    fn capacity(&self) -> usize {
        self.capacity
    }

    /// What `outside` holds now (0 without it).
    fn outside_bytes(&self) -> u64 {
        self.outside
            .as_ref()
            .map_or(0, |b| b.load(std::sync::atomic::Ordering::Relaxed) as u64)
    }

    fn owner(state: &mut State, stream: &Stream) -> Owner {
        if let Some(&o) = state.owner_of.get(&stream.id()) {
            return o;
        }
        let o = state.orders.len() as Owner;
        state.orders.push(FreeOrder::new(stream));
        state.owner_of.insert(stream.id(), o);
        o
    }

    /// The pages that `offset..offset + size` touches.
    fn pages_of(&self, offset: u64, size: u64) -> std::ops::Range<usize> {
        let g = self.granularity as u64;
        (offset / g) as usize..(offset + size).div_ceil(g) as usize
    }

    /// Serves `size` (aligned) for `stream`; `None` when the range has no free block of that
    /// size or the device no physical memory for its pages.
    fn serve(&self, state: &mut State, size: u64, stream: &Stream) -> Result<Option<u64>> {
        // Small blocks from the top of the range, large ones from the bottom: long-lived small
        // blocks then never pin the pages between large ones, which the pool keeps mapped for
        // the next large block of any size.
        let small = size <= SMALL_BLOCK;
        let found = if small {
            state.list.find_high(size)
        } else {
            state.list.find(size)
        };
        let Some(block) = found else {
            return Ok(None);
        };
        let me = Self::owner(state, stream);
        // Ordered after every other stream whose frees the block holds.
        let (_, len, owners) = state.list.block_containing(block).expect("found free");
        let start = if small { block + len - size } else { block };
        let others: Vec<Owner> = owners.iter().filter(|&o| o != me).collect();
        for o in others {
            state.orders[o as usize].order(stream)?;
        }
        let pages = self.pages_of(start, size);
        // Claim the mapped pages under the block first: releasing idle pages for physical
        // memory (`map_run`) must never take one of them. Their old status is kept only
        // when something is to be mapped, the one way the request can still fail.
        let must_map = pages.clone().any(|i| state.pages[i] == Page::Unmapped);
        let mut claimed: Vec<(usize, Status)> = Vec::new();
        for i in pages.clone() {
            if let Page::Mapped { handle, status } = state.pages[i] {
                match status {
                    Status::InUse => continue,
                    Status::Idle => {
                        state.idle.remove(&i);
                    }
                    Status::Unfenced => {
                        state.unfenced.remove(&i);
                    }
                    Status::Pending(_) => {}
                }
                if must_map {
                    claimed.push((i, status));
                }
                state.pages[i] = Page::Mapped {
                    handle,
                    status: Status::InUse,
                };
            }
        }
        // Map each run of unmapped pages (one access grant per run on the GPU).
        let mut fresh = Vec::new();
        let mut i = pages.start;
        while i < pages.end {
            if state.pages[i] != Page::Unmapped {
                i += 1;
                continue;
            }
            let run_start = i;
            while i < pages.end && state.pages[i] == Page::Unmapped {
                i += 1;
            }
            if let Err(e) = self.map_run(state, run_start..i) {
                // Give back what this request mapped (nothing ever used it) and claimed.
                for j in fresh {
                    if !self.release_page(state, j) {
                        state.idle.insert(j);
                    }
                }
                Self::unclaim(state, claimed);
                return if e.is_out_of_memory() {
                    Ok(None)
                } else {
                    Err(e)
                };
            }
            fresh.extend(run_start..i);
        }
        state.peak_mapped_pages = state.peak_mapped_pages.max(state.mapped_pages);
        if small {
            state.list.allocate_tail_for(block, size, me);
        } else {
            state.list.allocate_for(block, size, me);
        }
        state.peak_allocated = state.peak_allocated.max(state.list.live_bytes());
        let live = state.list.live_bytes() + self.outside_bytes();
        state.peak_live = state.peak_live.max(live);
        if !fresh.is_empty() {
            // Mapping went up: free pages elsewhere (where this request's end of the range
            // does not reach) go if the mapped memory is now over what the pool keeps. Only
            // here and at frees, and rare: mapping is the slow path already.
            let (high, low) = self.keep_pages(state);
            self.collect(state, high, low);
        }
        Ok(Some(self.base + start))
    }

    /// Out-of-memory with the pool's details: the largest free block of the range (any
    /// stream may use any block, after a wait), its free bytes, the mapped bytes, and, per
    /// stream, the bytes of pages whose physical memory waits for that stream to pass frees.
    fn out_of_memory(&self, state: &State, requested: usize, stream: &Stream) -> Error {
        let mut pending: Vec<(Option<StreamId>, usize)> = Vec::new();
        for p in &state.pending {
            let pages = p
                .pages
                .clone()
                .filter(|&i| {
                    matches!(state.pages[i], Page::Mapped { status: Status::Pending(id), .. } if id == p.id)
                })
                .count();
            for e in &p.events {
                let id = Some(e.stream().id());
                match pending.iter_mut().find(|(s, _)| *s == id) {
                    Some((_, bytes)) => *bytes += pages * self.granularity,
                    None => pending.push((id, pages * self.granularity)),
                }
            }
        }
        pending.sort_unstable();
        // Free blocks over pages pending release are free like any other (a request takes
        // them after a wait); the pages' bytes are what waits for the streams.
        let free = state.list.free_bytes() as usize;
        let figures = Fragmentation {
            reserved_bytes: state.mapped_pages * self.granularity,
            free_now_bytes: free.saturating_sub(pending.iter().map(|&(_, b)| b).sum()),
            pending_bytes: pending,
            largest_free_block: state.list.largest_free() as usize,
            ..Fragmentation::default()
        };
        let details = figures.out_of_memory_details(stream.id());
        Error::out_of_memory_with(requested, self.device.id(), details)
            .never_fitting(Some(self.capacity()))
    }

    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if is_empty_request(&self.device, bytes, stream, TRY_ALLOCATE)? {
            return Ok(DevicePtr::NULL);
        }
        let mut state = self.state.lock();
        let size = match align_up(bytes) {
            Some(size) if size as u128 <= self.capacity() as u128 => size,
            _ => return Err(self.out_of_memory(&state, bytes, stream)),
        };
        match self.serve(&mut state, size, stream)? {
            Some(p) => Ok(DevicePtr::from_raw(p)),
            None => {
                self.arm_wakeups(&mut state);
                Err(self.out_of_memory(&state, bytes, stream))
            }
        }
    }

    fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if ptr.is_null() {
            return;
        }
        if let Err(why) = self.free(ptr, bytes, stream) {
            self.device.defer_error(Error::invalid(format!(
                "{ptr} ({bytes} bytes) is not allocated from this mapped pool with that size: \
                 {why}"
            )));
        }
    }

    /// Frees `ptr` (not null); why not, when it is no allocation of `bytes` here.
    fn free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> std::result::Result<(), String> {
        let (Some(size), Some(offset)) = (align_up(bytes), ptr.addr().checked_sub(self.base))
        else {
            return Err("outside its range".into());
        };
        let mut state = self.state.lock();
        let me = Self::owner(&mut state, stream);
        let (lo, hi) = match state.list.free(offset, size, me) {
            Ok(merged) => merged,
            Err(BadFree::Unknown) => return Err("no allocation starts there (double free?)".into()),
            Err(BadFree::WrongSize(len)) => return Err(format!("it was allocated as {len}")),
        };
        state.orders[me as usize].changed();
        // The pages this free emptied: inside the merged free block, touched by the freed one.
        let g = self.granularity as u64;
        let touched = self.pages_of(offset, size);
        let first = (lo.div_ceil(g) as usize).max(touched.start);
        let end = ((hi / g) as usize).min(touched.end);
        if first < end {
            if self.release_threshold == Some(0) {
                self.fence(&mut state, (first..end).collect());
            } else {
                for i in first..end {
                    if let Page::Mapped { handle, status } = state.pages[i] {
                        debug_assert_eq!(status, Status::InUse, "page {i} emptied twice");
                        state.pages[i] = Page::Mapped {
                            handle,
                            status: Status::Unfenced,
                        };
                        state.unfenced.insert(i);
                    }
                }
            }
            let (high, low) = self.keep_pages(&state);
            self.collect(&mut state, high, low);
        }
        drop(state);
        self.availability.notify();
        Ok(())
    }
}

// SAFETY: a pointer it hands out is `base` plus the start of a block of at least `bytes`
// bytes (a multiple of 256 at a 256-aligned offset of the granule-aligned reservation) that
// the free list hands out once until it is freed, with every page under it mapped (`serve`)
// and kept mapped while the block is live (pages are released only when wholly free). It
// says host-accessible only on the host backend, whose mappings are host memory.
unsafe impl MemoryResource for MappedPoolResource {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        self.inner.try_allocate(bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        self.inner.deallocate(ptr, bytes, stream)
    }

    fn availability(&self) -> Option<&Availability> {
        Some(&self.inner.availability)
    }

    /// The reserved range, or the device's memory if that is smaller.
    fn capacity_limit(&self) -> Option<usize> {
        Some(self.inner.capacity())
    }

    /// A live allocation may come back, and pages pending release free physical memory.
    fn may_regain_memory(&self, bytes: usize) -> bool {
        let _ = bytes;
        let state = self.inner.state.lock();
        state.list.live_allocations() > 0 || !state.pending.is_empty()
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::of_shared(&self.inner)
    }

    /// A segment per run of mapped pages (reserved address space that is not mapped is no
    /// segment), with the live and free blocks in it. Pages waiting for their streams to pass
    /// frees before they are unmapped hold free blocks like any other: a request takes them
    /// (after waiting for those frees), so they are not [`BlockState::Pending`](crate::BlockState::Pending). A free block
    /// is [`Free`](crate::BlockState::Free) once every stream that freed into it has passed an event
    /// recorded after its frees (the pool records one when another stream takes the memory),
    /// else [`FreeOnStream`](crate::BlockState::FreeOnStream) on one such stream that has not (free
    /// blocks of several streams coalesce here, so a request on that stream may still wait
    /// for another's).
    ///
    /// ```
    /// use streamalloc::{BlockState, Device, MappedPoolResource, MemoryResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let pool = MappedPoolResource::new(&device)?;
    /// let p = pool.try_allocate(3 << 20, &stream)?; // two 2 MiB pages are mapped
    /// let snap = pool.snapshot().unwrap();
    /// assert_eq!((snap.segments.len(), snap.reserved_bytes()), (1, 4 << 20));
    /// let blocks: Vec<_> = snap.blocks().map(|(_, b)| (b.bytes, b.state)).collect();
    /// assert_eq!(blocks, [(3 << 20, BlockState::Live), (1 << 20, BlockState::Free)]);
    /// unsafe { pool.deallocate(p, 3 << 20, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    fn snapshot(&self) -> Option<MemorySnapshot> {
        Some(self.inner.snapshot(&self.inner.state.lock()))
    }

    fn properties(&self) -> Properties {
        Properties {
            device_accessible: true,
            host_accessible: self.inner.device.backend() == BackendKind::Host,
            device: self.inner.device.id(),
        }
    }

    /// Reserved: the mapped bytes (the device memory the pool holds) and their peak;
    /// allocated: the live allocations as the pool rounded them, and their peak (PyTorch's
    /// `max_memory_allocated`: one lock serves every stream, so it is exact at no cost).
    fn memory_stats(&self) -> MemoryStats {
        self.inner.memory_stats()
    }

    /// Resets both peaks to what is mapped and allocated now.
    fn reset_peak(&self) {
        self.reset_peak_mapped();
        let mut state = self.inner.state.lock();
        state.peak_allocated = state.list.live_bytes();
    }
}

impl fmt::Debug for MappedPoolResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedPoolResource")
            .field("device", &self.inner.device.id())
            .field("base", &format_args!("{:#x}", self.inner.base))
            .field("statistics", &self.statistics())
            .finish()
    }
}

impl Drop for Inner {
    /// Waits for the streams that freed into the pool (unmapping is not stream-ordered), then
    /// unmaps and releases every page and gives the range back. With allocations still out,
    /// it leaks everything instead (their memory must stay valid) and records an
    /// [`Error::Leaked`]. The error of a stream that failed, and of a driver call that fails
    /// here, is recorded on the device too.
    fn drop(&mut self) {
        let state = self.state.get_mut();
        let allocations = state.list.live_allocations();
        if allocations > 0 {
            if !self.report_leaks {
                return;
            }
            self.device.defer_error(Error::Leaked {
                what: "MappedPoolResource",
                allocations,
                bytes: state.list.live_bytes() as usize,
                device: self.device.id(),
            });
            return;
        }
        for order in &state.orders {
            if let Err(e) = order.stream().synchronize_blocking() {
                // A failed stream has stopped running work: its pages are unused. The drop
                // cannot return the error, so the device keeps it.
                self.device.defer_error(e);
            }
        }
        let mut state = std::mem::replace(&mut *self.state.get_mut(), State::new(0, 0));
        let mut stuck = false;
        for i in 0..state.pages.len() {
            stuck |= !self.release_page(&mut state, i);
        }
        if stuck {
            return; // the range keeps the pages the driver would not unmap
        }
        // SAFETY: the range is the pool's own reservation, and nothing is mapped in it now.
        if let Err(e) = unsafe {
            self.device
                .raw()
                .vmm_free_reservation(self.base, self.reserved)
        } {
            self.device.defer_error(e);
        }
    }
}

#[cfg(test)]
mod tests;
