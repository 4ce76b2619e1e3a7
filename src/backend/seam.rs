//! What every backend implements (`Backend`, `BackendStream`, `BackendEvent`,
//! `BackendMemPool`) and the plain types they share: memory kinds, completions, error sinks.

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Waker;
use std::thread::ThreadId;
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::ids::DeviceId;

use super::flags::{DeviceFlag, FlagSlab};

/// The kinds of memory a backend allocates directly (without a driver pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum MemoryKind {
    /// Device memory (`cuMemAlloc`).
    Device,
    /// Unified memory visible to host and device (`cuMemAllocManaged`).
    Managed,
    /// Page-locked host memory visible to the device (`cuMemHostAlloc`).
    PinnedHost,
}

/// A stream every context has without creating it: CUDA's legacy default stream
/// (`CU_STREAM_LEGACY`) or the calling thread's per-thread default stream
/// (`CU_STREAM_PER_THREAD`). Never destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum DefaultStream {
    Legacy,
    PerThread,
}

/// The one thread a stream handle may be used on: set for the per-thread default stream, whose
/// driver handle (`CU_STREAM_PER_THREAD`) names the stream *of the calling thread*, so that one
/// handle used on two threads would be two streams under one id. [`AnyStream`](super::AnyStream) checks it
/// before every call that reaches the driver through the handle.
#[derive(Debug)]
pub(crate) struct HomeThread {
    id: ThreadId,
    name: String,
    device: DeviceId,
}

/// A thread's name for errors.
fn thread_name(thread: &std::thread::Thread) -> String {
    thread.name().unwrap_or("<unnamed>").to_owned()
}

impl HomeThread {
    /// The calling thread, as the home of a stream of `device`.
    pub(crate) fn current(device: DeviceId) -> Self {
        let me = std::thread::current();
        HomeThread {
            id: me.id(),
            name: thread_name(&me),
            device,
        }
    }

    /// Whether the calling thread is this one.
    #[cfg_attr(not(feature = "cuda-driver"), allow(dead_code))] // the CUDA stream's drop
    pub(crate) fn is_current(&self) -> bool {
        std::thread::current().id() == self.id
    }

    /// [`Error::WrongThread`] unless the calling thread is this one.
    pub(crate) fn check(&self) -> Result<()> {
        let me = std::thread::current();
        if me.id() == self.id {
            return Ok(());
        }
        Err(Error::WrongThread {
            home: self.id,
            home_name: self.name.clone(),
            current: me.id(),
            current_name: thread_name(&me),
            device: self.device,
        })
    }
}

/// Where a prefetch moves managed memory to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PrefetchTarget {
    /// The memory's device (`CU_MEM_LOCATION_TYPE_DEVICE`): spares kernels their page faults.
    #[default]
    Device,
    /// Host memory (`CU_MEM_LOCATION_TYPE_HOST`, the old `CU_DEVICE_CPU`): spares host reads
    /// their page faults.
    Host,
}

/// Free and total memory of a device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes the device can still allocate.
    pub free: usize,
    /// Bytes the device has in all.
    pub total: usize,
}

/// How a driver pool is set up (`cuMemPoolCreate`).
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(feature = "cuda-driver"), allow(dead_code))] // the host pool ignores it
pub(crate) struct MemPoolConfig {
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
    pub(crate) release_threshold: u64,
    /// Bitmask of `CUmemAllocationHandleType` to allow exporting; 0 for none.
    pub(crate) export_handle_types: u32,
}

/// One backend's device, with its stream, event and driver-pool types (wgpu-hal's `Api` and
/// `Device` in one): called with static dispatch inside the backend; the layers above hold the
/// erased [`AnyBackend`](super::AnyBackend) and its siblings, the only place that dispatches.
pub(crate) trait Backend: Send + Sync + fmt::Debug {
    type Stream: BackendStream<Event = Self::Event>;
    type Event: BackendEvent;
    type MemPool: BackendMemPool<Stream = Self::Stream>;

    fn id(&self) -> DeviceId;
    fn name(&self) -> String;
    fn memory_info(&self) -> Result<MemoryInfo>;
    /// Allocates `bytes` (> 0) of `kind`, 256-byte aligned, synchronously.
    fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<u64>;
    /// Whether this device can allocate `kind` at all, from what the driver reports cheaply
    /// (a device attribute): [`Error::Unsupported`] where it cannot. The host backend can
    /// allocate every kind.
    fn check_kind(&self, kind: MemoryKind) -> Result<()> {
        let _ = kind;
        Ok(())
    }
    /// Frees what [`Backend::allocate`] returned, once `stream` reaches this point. (The CUDA
    /// driver's plain frees synchronize the device, which gives the same guarantee.)
    ///
    /// # Safety
    /// 1. `ptr` came from `allocate(kind, bytes)` on this backend and is not freed yet.
    /// 2. All work that uses it is ordered before this point of `stream`.
    unsafe fn free(
        &self,
        kind: MemoryKind,
        ptr: u64,
        bytes: usize,
        stream: &Self::Stream,
    ) -> Result<()>;
    /// Enqueues on `stream` a migration of `ptr..ptr + bytes` to this device's memory
    /// (`cuMemPrefetchAsync`), a hint that spares the device's first accesses their page
    /// faults. Returns whether a prefetch was enqueued: a range that is not managed memory, and
    /// a device that cannot prefetch (no concurrent managed access), make it a no-op that
    /// returns `false`, as in RMM's `prefetch` (on CUDA, so does a driver older than 12.2).
    ///
    /// Safe: a prefetch moves pages without changing their contents, and the driver checks the
    /// range.
    fn prefetch(&self, ptr: u64, bytes: usize, stream: &Self::Stream) -> Result<bool> {
        self.prefetch_to(ptr, bytes, PrefetchTarget::Device, stream)
    }
    /// [`prefetch`](Backend::prefetch) to `target`: the device or host memory.
    fn prefetch_to(
        &self,
        ptr: u64,
        bytes: usize,
        target: PrefetchTarget,
        stream: &Self::Stream,
    ) -> Result<bool>;
    fn create_stream(&self) -> Result<Arc<Self::Stream>>;
    /// A handle to one of the context's built-in streams; dropping it destroys nothing.
    fn default_stream(&self, kind: DefaultStream) -> Result<Arc<Self::Stream>>;
    fn create_mempool(&self, config: &MemPoolConfig) -> Result<Arc<Self::MemPool>>;
    /// The device's default driver pool (`cuDeviceGetDefaultMemPool`).
    fn default_mempool(&self) -> Result<Arc<Self::MemPool>>;
    /// The device's default pool of managed memory (`cuMemGetDefaultMemPool` with
    /// `CU_MEM_ALLOCATION_TYPE_MANAGED`, CUDA 13). [`Error::Unsupported`] where there is none.
    fn managed_mempool(&self) -> Result<Arc<Self::MemPool>>;
    /// Where this backend's streams, driver threads and `Drop`s put errors they cannot return.
    fn errors(&self) -> &ErrorSink;
    /// The device's completion flags, made on first use; `None` where streams cannot write
    /// them (no stream memory operations on the device, or a driver without them).
    fn flag_slab(&self) -> Option<Arc<FlagSlab>>;
    /// The granularity of virtual memory management (`cuMemGetAllocationGranularity`, minimum,
    /// pinned device memory): reservations, physical allocations and mappings are multiples of
    /// it. [`Error::Unsupported`] where the device has no virtual memory management
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` is 0).
    fn vmm_granularity(&self) -> Result<usize>;
    /// Reserves `bytes` (a multiple of the granularity) of virtual address space, aligned to
    /// the granularity, with nothing mapped (`cuMemAddressReserve`).
    fn vmm_reserve(&self, bytes: usize) -> Result<u64>;
    /// Gives back a reservation (`cuMemAddressFree`).
    ///
    /// # Safety
    /// 1. `va..va + bytes` is a whole reservation from [`vmm_reserve`](Backend::vmm_reserve).
    /// 2. Nothing in it is mapped any more.
    unsafe fn vmm_free_reservation(&self, va: u64, bytes: usize) -> Result<()>;
    /// Creates `bytes` (a multiple of the granularity) of physical device memory, counted
    /// against the device's memory (`cuMemCreate`); returns its handle. Out-of-memory is
    /// [`Error::OutOfMemory`].
    fn vmm_create(&self, bytes: usize) -> Result<u64>;
    /// Releases physical memory (`cuMemRelease`).
    ///
    /// # Safety
    /// `handle` came from `vmm_create(bytes)`, is not released yet and is mapped nowhere.
    unsafe fn vmm_release(&self, handle: u64, bytes: usize) -> Result<()>;
    /// Maps each of `handles` (each `page` bytes long) whole at consecutive pages from `va`
    /// (one `cuMemMap` per handle: the driver maps one allocation per call) and makes the
    /// run readable and writable by the device with one `cuMemSetAccess` over it (the driver
    /// takes any fully mapped range there). On failure nothing of the run stays mapped.
    ///
    /// # Safety
    /// `va..va + page * handles.len()` lies inside one reservation, granularity-aligned, with
    /// nothing mapped there; each handle came from `vmm_create(page)`, is not released and is
    /// mapped nowhere, and none appears twice.
    unsafe fn vmm_map(&self, va: u64, page: usize, handles: &[u64]) -> Result<()>;
    /// Unmaps `va..va + bytes` (`cuMemUnmap`). Not stream-ordered: it takes effect at once.
    ///
    /// # Safety
    /// 1. The range is exactly one mapping made by [`vmm_map`](Backend::vmm_map).
    /// 2. No work that uses the range is queued or running on any stream.
    unsafe fn vmm_unmap(&self, va: u64, bytes: usize) -> Result<()>;
}

/// The message of a caught panic, for the error that reports it.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a non-string payload"
    }
}

/// How many errors an [`ErrorSink`] keeps until they are taken; later ones are only counted.
pub(crate) const SINK_KEPT: usize = 64;

/// The deferred errors of one device: errors met where they could not be returned, on a
/// stream's worker or a driver thread (a stream-ordered free that failed, a host function that
/// panicked), in a `Drop`, or above the backend (a bad free, a pool dropped with allocations
/// out).
///
/// It lives in the backend, below the device, so that the backend's own threads can report
/// into it; the device defers its errors here too and hands them out
/// ([`Device::take_deferred_error`](crate::Device::take_deferred_error)), oldest first, so each
/// one reaches the user and is counted. `report` takes a lock and calls no driver function, so
/// a CUDA host function may call it.
#[derive(Debug, Default)]
pub(crate) struct ErrorSink {
    state: Mutex<SinkState>,
}

#[derive(Debug, Default)]
struct SinkState {
    /// The oldest untaken errors, at most [`SINK_KEPT`].
    errors: VecDeque<Error>,
    /// Every error ever kept or counted.
    total: u64,
}

impl ErrorSink {
    /// Keeps `error` for the device, and logs it (the device hands it out only when asked).
    pub(crate) fn report(&self, error: Error) {
        tracing::error!(%error, "deferred error");
        self.keep(error);
    }

    /// Keeps `error` without logging it (the caller has).
    pub(crate) fn keep(&self, error: Error) {
        let mut state = self.state.lock();
        state.total += 1;
        if state.errors.len() < SINK_KEPT {
            state.errors.push_back(error);
        }
    }

    /// Takes the oldest error kept.
    pub(crate) fn pop(&self) -> Option<Error> {
        self.state.lock().errors.pop_front()
    }

    /// How many errors were reported, taken or not.
    pub(crate) fn total(&self) -> u64 {
        self.state.lock().total
    }
}

/// An ordered queue of device work.
pub(crate) trait BackendStream: Send + Sync + fmt::Debug {
    type Event: BackendEvent;

    /// The driver's handle (`CUstream` as an integer), for logs and interop.
    fn raw_handle(&self) -> u64;
    /// The only thread the handle may be used on (the per-thread default stream's), if any;
    /// [`AnyStream`](super::AnyStream) refuses the others before every driver call through it.
    fn home_thread(&self) -> Option<&HomeThread>;
    /// Records an event at the current end of the queue.
    fn record(&self) -> Result<Arc<Self::Event>>;
    /// Work enqueued after this call starts only once `event` has completed.
    fn wait_event(&self, event: &Self::Event) -> Result<()>;
    /// Calls `completion.complete()` once the stream reaches this point. The call must not
    /// block later work on other streams; on CUDA it runs on a driver thread.
    fn notify(&self, completion: Arc<Completion>) -> Result<()>;
    /// Runs `f` on a backend thread once the stream reaches this point. On CUDA it runs inside
    /// a host function: the crate's driver calls made there fail instead of reaching the
    /// driver (`DeviceContext::bind` refuses them).
    fn host_fn(&self, f: Box<dyn FnOnce() + Send>) -> Result<()>;
    /// Enqueues the write of `flag`'s token into its word: the flag reads set once the stream
    /// passes this point ([`DeviceFlag`]).
    fn write_flag(&self, flag: &DeviceFlag) -> Result<()>;
    /// Enqueues a copy of `bytes` from `src` to `dst` (any mix of host and device addresses).
    ///
    /// # Safety
    /// 1. Both ranges are valid for `bytes` from the time the copy runs until it completes.
    /// 2. Nothing else writes `dst` or `src`'s range concurrently.
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// Enqueues on this stream a copy of `bytes` from `src`, memory of `src_stream`'s device, to
    /// `dst`, memory of this stream's device (`cuMemcpyPeerAsync`; the driver stages it through
    /// the host where the devices have no peer access). The default, for backends whose
    /// addresses all live in one space (host), is [`copy`](BackendStream::copy).
    ///
    /// # Safety
    /// As [`copy`](BackendStream::copy); `src_stream` only names the source device.
    unsafe fn copy_peer(&self, dst: u64, src: u64, src_stream: &Self, bytes: usize) -> Result<()> {
        let _ = src_stream;
        // SAFETY: the same contract as `copy`, forwarded from the caller.
        unsafe { self.copy(dst, src, bytes) }
    }
    /// Enqueues a copy between device memory and ordinary, pageable host memory (the host side
    /// is `dst` when `to_host`, else `src`) without making the caller wait for the stream.
    ///
    /// The CUDA driver's own copies to or from pageable memory return only once the stream has
    /// reached them, which would block an executor thread; the CUDA backend stages them through
    /// pinned memory instead. The default is [`copy`](BackendStream::copy).
    ///
    /// # Safety
    /// As [`copy`](BackendStream::copy).
    unsafe fn copy_pageable(&self, dst: u64, src: u64, bytes: usize, to_host: bool) -> Result<()> {
        let _ = to_host;
        // SAFETY: the same contract as `copy`, forwarded from the caller.
        unsafe { self.copy(dst, src, bytes) }
    }
    /// Enqueues setting `bytes` bytes at `dst` to `value`.
    ///
    /// # Safety
    /// `dst..dst + bytes` is valid device memory until the operation completes.
    unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()>;
    /// Enqueues an operation that takes `duration` (a stand-in for a kernel).
    fn delay(&self, duration: Duration) -> Result<()>;
    /// Blocks the calling thread until all enqueued work completes.
    fn synchronize_blocking(&self) -> Result<()>;
}

/// A point in a stream.
pub(crate) trait BackendEvent: Send + Sync + fmt::Debug {
    /// Non-blocking: has the stream passed this point?
    fn query(&self) -> Result<bool>;
    /// Blocks the calling thread until the stream passes this point.
    fn synchronize_blocking(&self) -> Result<()>;
}

/// A driver-managed, stream-ordered pool (`CUmemoryPool`).
pub(crate) trait BackendMemPool: Send + Sync + fmt::Debug {
    type Stream: BackendStream;

    /// The driver's handle (`CUmemoryPool` as an integer).
    fn handle(&self) -> u64;
    /// `cuMemAllocFromPoolAsync`: valid on `stream` in stream order.
    fn allocate_async(&self, bytes: usize, stream: &Self::Stream) -> Result<u64>;
    /// `cuMemFreeAsync`.
    ///
    /// # Safety
    /// `ptr` came from `allocate_async(bytes, ..)` of this pool and is not freed yet; work that
    /// uses it is ordered before this point of `stream`.
    unsafe fn free_async(&self, ptr: u64, bytes: usize, stream: &Self::Stream) -> Result<()>;
    /// Releases unused reserved memory down to `keep` bytes.
    fn trim_to(&self, keep: usize) -> Result<()>;
    /// Bytes the pool holds from the device (used and cached).
    fn reserved(&self) -> Result<usize>;
}

/// The flag a backend sets when a stream reaches a point, with the wakers waiting for it.
///
/// `complete` stores the flag before it takes the waker list and `register` checks the flag
/// while holding the list, so a waker registered before completion is always woken and one
/// registered after sees the flag: no lost wake-up. `complete` takes no allocation and calls
/// no driver function, so it is safe inside a CUDA host function.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    done: AtomicBool,
    error: OnceLock<Error>,
    wakers: Mutex<Vec<Waker>>,
}

impl Completion {
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    pub(crate) fn complete(&self) {
        self.done.store(true, Ordering::Release);
        let wakers = std::mem::take(&mut *self.wakers.lock());
        for w in wakers {
            w.wake();
        }
    }

    pub(crate) fn fail(&self, error: Error) {
        let _ = self.error.set(error);
        self.complete();
    }

    /// The error the stream reported at this point, if any.
    pub(crate) fn error(&self) -> Option<&Error> {
        self.error.get()
    }

    /// Registers `waker` unless already complete; returns whether it is complete.
    pub(crate) fn register(&self, waker: &Waker) -> bool {
        if self.is_done() {
            return true;
        }
        let mut wakers = self.wakers.lock();
        if self.is_done() {
            return true;
        }
        if !wakers.iter().any(|w| w.will_wake(waker)) {
            wakers.push(waker.clone());
        }
        false
    }
}
