//! The memory-resource contract and the resources that implement it.

pub(crate) mod contract;
pub(crate) mod defaults;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod inspect;
pub(crate) mod leaf;
pub(crate) mod suballoc;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

pub use contract::allocate::Allocate;
pub(crate) use contract::allocate::{held, try_without_waiting};
pub use contract::availability::Availability;
pub(crate) use contract::size::align_up;
pub use contract::size::ALLOCATION_ALIGNMENT;
pub(crate) use contract::stats::Allocated;
pub use contract::stats::{MemoryStats, WaitQueueStats};
pub use inspect::{
    Block, BlockState, Fragmentation, FreeExtentBucket, MemorySnapshot, Segment, SeriesPoint,
    Timeline, TraceAction, TraceEvent, TIMELINE_STREAMS,
};
pub use leaf::callback::CallbackResource;
pub use leaf::cuda::CudaResource;
pub use leaf::cuda_async::{CudaAsyncResource, CudaAsyncResourceBuilder, ExportHandleType};
pub use leaf::cuda_async_managed::CudaAsyncManagedResource;
pub use leaf::cuda_async_view::CudaAsyncViewResource;
pub use leaf::host::HostResource;
pub use leaf::managed::ManagedResource;
pub use leaf::pinned_host::PinnedHostResource;
pub use suballoc::arena::{ArenaConfig, ArenaDump, ArenaResource, ArenaStatistics};
pub use suballoc::binning::BinningResource;
pub use suballoc::fixed_size::FixedSizeResource;
pub use suballoc::mapped_pool::{MappedPoolConfig, MappedPoolResource, MappedPoolStatistics};
pub use suballoc::pool::{PoolResource, PoolStatistics, ReleasePolicy};

use crate::device::{Device, DeviceId};
use crate::error::{Error, Result};
use crate::stream::Stream;

/// An address in device (or device-visible) memory. A plain number: holding one owns nothing.
///
/// # Examples
///
/// ```
/// use streamalloc::DevicePtr;
///
/// let p = DevicePtr::from_raw(0x1000);
/// assert_eq!(p.offset(0x100).addr(), 0x1100);
/// assert!(p.is_aligned(256));
/// assert!(DevicePtr::NULL.is_null());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DevicePtr(u64);

impl DevicePtr {
    /// The null pointer, which resources return for 0-byte allocations.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// Wraps a raw address (a `CUdeviceptr`).
    pub const fn from_raw(addr: u64) -> Self {
        DevicePtr(addr)
    }

    /// The raw address (a `CUdeviceptr`).
    pub const fn addr(self) -> u64 {
        self.0
    }

    /// True for [`DevicePtr::NULL`].
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `bytes` further on.
    ///
    /// # Panics
    /// On address overflow, which no valid allocation reaches.
    pub fn offset(self, bytes: usize) -> Self {
        DevicePtr(
            self.0
                .checked_add(bytes as u64)
                .expect("device pointer overflow"),
        )
    }

    /// Whether the address is a multiple of `align`.
    pub fn is_aligned(self, align: usize) -> bool {
        self.0 % align as u64 == 0
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// What a resource's memory is and where it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Properties {
    /// Device code can read and write it.
    pub device_accessible: bool,
    /// Host code can read and write it through the pointer.
    pub host_accessible: bool,
    /// The device the resource allocates for.
    pub device: DeviceId,
}

impl Properties {
    /// Memory that device code and host code can both read and write through the pointer
    /// (managed and pinned host memory), of `device`.
    ///
    /// ```
    /// use streamalloc::{Device, Properties};
    ///
    /// let p = Properties::host_and_device(Device::host().id());
    /// assert!(p.device_accessible && p.host_accessible);
    /// ```
    pub fn host_and_device(device: DeviceId) -> Self {
        Properties {
            device_accessible: true,
            host_accessible: true,
            device,
        }
    }
}

/// A source of stream-ordered memory: RMM's `device_memory_resource`, made async.
///
/// Implementations are cheap `Clone` handles over shared state where they have state: a clone
/// *is* the same resource.
///
/// # Stream ordering
/// Memory returned by [`try_allocate`](MemoryResource::try_allocate) on stream `s` may be used
/// by work on `s` enqueued after the call; other streams must first wait for an event of `s`.
/// [`deallocate`](MemoryResource::deallocate) on `s` lets the memory be reused by work ordered
/// after that point of `s`.
///
/// # Safety
/// The trait is `unsafe` to implement (as allocator-api2's `Allocator` is): containers, host
/// kernels and the host backend's copies build slices and write through the addresses a
/// resource hands out, so safe code is sound only if every implementation keeps this promise.
/// A pointer that [`try_allocate(bytes, stream)`](MemoryResource::try_allocate) returns (not
/// [`DevicePtr::NULL`], which only a 0-byte request gets) is
/// 1. the start of a range of at least `bytes` bytes that stays valid until it is given
///    back with [`deallocate`](MemoryResource::deallocate), and is the caller's alone until
///    then: the resource hands out no byte of it again, and neither it nor the resources it
///    takes memory from access it meanwhile;
/// 2. aligned to [`ALLOCATION_ALIGNMENT`] (256 bytes);
/// 3. allocated for the device that [`properties().device`](MemoryResource::properties)
///    names, usable in the stream order described above;
/// 4. when [`properties()`](MemoryResource::properties) says `host_accessible`, memory that
///    host code may read and write through the address, for as long as 1 holds; when it says
///    `device_accessible`, memory that device code and copies on that device may use (on the
///    host backend, whose device code and copies run on the host, that is host memory too).
///
/// `properties()` must not change over the resource's life. The other methods (figures,
/// snapshots, waiting) are hints that safe code never relies on for soundness. An adaptor
/// that hands out what its upstream returned keeps the promise by forwarding it; a resource
/// that carves blocks out of its upstream's memory keeps it by never handing out one byte
/// twice. [`CallbackResource`] takes closures, so its constructor is an `unsafe fn` with this
/// promise as its contract.
///
/// ```
/// use streamalloc::{CudaResource, Device, DevicePtr, MemoryResource, Properties, Result, Stream};
///
/// /// Counts nothing, forwards everything: the promise holds because it is `inner`'s.
/// #[derive(Debug)]
/// struct Forwarding(CudaResource);
///
/// // SAFETY: every pointer is one `self.0` returned for the same request, and the properties
/// // are its own: `CudaResource` keeps the promise, so this does too.
/// unsafe impl MemoryResource for Forwarding {
///     fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
///         self.0.try_allocate(bytes, stream)
///     }
///     unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
///         // SAFETY: the caller's contract, and `ptr` came from `self.0`.
///         unsafe { self.0.deallocate(ptr, bytes, stream) }
///     }
///     fn properties(&self) -> Properties {
///         self.0.properties()
///     }
/// }
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = Forwarding(CudaResource::new(&device)?);
/// let p = mr.try_allocate(1000, &stream)?;
/// unsafe { mr.deallocate(p, 1000, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
///
/// The same resource without `unsafe` on its `impl` does not compile: nothing may claim to
/// keep the promise by accident.
///
/// ```compile_fail,E0200
/// use streamalloc::{CudaResource, DevicePtr, MemoryResource, Properties, Result, Stream};
///
/// #[derive(Debug)]
/// struct Forwarding(CudaResource);
///
/// impl MemoryResource for Forwarding {
///     fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
///         self.0.try_allocate(bytes, stream)
///     }
///     unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
///         // SAFETY: the caller's contract, and `ptr` came from `self.0`.
///         unsafe { self.0.deallocate(ptr, bytes, stream) }
///     }
///     fn properties(&self) -> Properties {
///         self.0.properties()
///     }
/// }
/// ```
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = CudaResource::new(&device)?;
/// let ptr = mr.allocate(1 << 20, &stream).await?;
/// assert!(ptr.is_aligned(256));
/// // SAFETY: allocated above from `mr` with the same size, used by nothing else.
/// unsafe { mr.deallocate(ptr, 1 << 20, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub unsafe trait MemoryResource: Send + Sync + fmt::Debug {
    /// Allocates `bytes` for use on `stream`, 256-byte aligned, without waiting for memory and
    /// without blocking the host. 0 bytes returns [`DevicePtr::NULL`].
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the memory is not there now; [`Error::DeviceMismatch`] when
    /// `stream` belongs to another device; driver errors.
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr>;

    /// Returns memory to the resource, stream-ordered on `stream`. Never blocks the host.
    /// Failures cannot be returned; they are recorded on the device
    /// ([`Device::take_deferred_error`]).
    ///
    /// # Safety
    /// 1. `ptr` was returned by `try_allocate(bytes, ..)` (or `allocate`) of this resource (or a
    ///    clone of it) and is not deallocated yet.
    /// 2. All work that uses the memory is ordered before this point of `stream`.
    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream);

    /// Fired when memory may have become available; `None` for resources that never make
    /// allocations wait.
    fn availability(&self) -> Option<&Availability> {
        None
    }

    /// The largest request that could ever succeed, when the resource knows one; larger
    /// requests fail at once, even when awaited.
    fn capacity_limit(&self) -> Option<usize> {
        None
    }

    /// Whether a request of `bytes` that this resource refuses now may succeed later, once
    /// memory comes back without anyone asking for more: an allocation of it is outstanding, a
    /// stream-ordered free is pending, or an upstream it follows may get memory back for it.
    ///
    /// An awaited allocation ([`allocate`](MemoryResource::allocate)) waits only while this
    /// holds; otherwise it fails at once with the out-of-memory error, as
    /// [`try_allocate`](MemoryResource::try_allocate) does, instead of waiting for a wake-up
    /// that can never come. It is asked only after a request failed (a slow path), so it may
    /// take locks. The default, for resources that do not know, is
    /// `self.availability().is_some()`: a resource that signals availability is trusted to
    /// signal it again.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, LimitingAdaptor, MemoryResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 4096);
    /// assert!(!mr.may_regain_memory(4096)); // nothing is out: nothing can come back
    /// let p = mr.try_allocate(4096, &stream)?;
    /// assert!(mr.may_regain_memory(4096)); // freeing `p` would make room
    /// unsafe { mr.deallocate(p, 4096, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    fn may_regain_memory(&self, bytes: usize) -> bool {
        let _ = bytes;
        self.availability().is_some()
    }

    /// Whether `other` is the same resource as `self` (RMM's `is_equal`): memory allocated
    /// from one may be freed through the other. Two handles (clones) of one resource are
    /// equal; so are two stateless resources of the same kind and device (two
    /// [`CudaResource`]s of one device, say), as in RMM.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource};
    ///
    /// let device = Device::host();
    /// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, None)?;
    /// assert!(pool.is_equal(&pool.clone()));
    /// let other = PoolResource::new(CudaResource::new(&device)?, 1 << 20, None)?;
    /// assert!(!pool.is_equal(&other));
    /// assert!(CudaResource::new(&device)?.is_equal(&CudaResource::new(&device)?));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    fn is_equal(&self, other: &dyn MemoryResource) -> bool {
        self.identity() == other.identity()
    }

    /// What makes this resource itself, for [`is_equal`](MemoryResource::is_equal): the
    /// address of its shared state, or its kind and device for a stateless resource. The
    /// default is the handle's own address, which suits a resource that is not cloned.
    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::Shared(self as *const Self as *const () as usize)
    }

    /// Where the memory lives and who can access it.
    fn properties(&self) -> Properties;

    /// The numbers users look for, for this resource and every one under it: allocated and
    /// reserved bytes, their peaks, live allocations, and the wait queue (PyTorch's
    /// `torch.cuda.memory_stats`). See [`MemoryStats`] for which layer gives which number.
    ///
    /// The default, for a resource that counts nothing, reports only its wait queue.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// assert_eq!(CudaResource::new(&device)?.memory_stats().allocated_bytes, None);
    /// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, None)?;
    /// let p = pool.try_allocate(1000, &stream)?;
    /// let stats = pool.memory_stats();
    /// assert_eq!(stats.allocated_bytes, Some(1024)); // as the pool rounds it
    /// assert_eq!(stats.reserved_bytes, Some(1 << 20));
    /// unsafe { pool.deallocate(p, 1000, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    fn memory_stats(&self) -> MemoryStats {
        MemoryStats {
            wait_queue: self
                .availability()
                .map(Availability::stats)
                .unwrap_or_default(),
            ..MemoryStats::default()
        }
    }

    /// Resets the peaks of [`memory_stats`](MemoryResource::memory_stats) to the current
    /// figures, in this resource and every one under it (PyTorch's
    /// `torch.cuda.reset_peak_memory_stats`). A [`StatisticsAdaptor`](crate::StatisticsAdaptor)
    /// resets the peaks of its innermost scope.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, MemoryResource, StatisticsAdaptor, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = StatisticsAdaptor::new(CudaResource::new(&device)?);
    /// let p = mr.try_allocate(4096, &stream)?;
    /// unsafe { mr.deallocate(p, 4096, &stream) };
    /// assert_eq!(mr.memory_stats().peak_allocated_bytes, Some(4096));
    /// mr.reset_peak();
    /// assert_eq!(mr.memory_stats().peak_allocated_bytes, Some(0));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    fn reset_peak(&self) {}

    /// A picture of the resource's memory now: its segments and their blocks (live, free,
    /// pending, with streams), or `None` for a resource that does not sub-allocate (the
    /// driver's resources). Adaptors pass their upstream's through; a
    /// [`TrackingAdaptor`](crate::TrackingAdaptor) adds where live blocks were allocated.
    ///
    /// It takes the resource's locks for as long as it copies its blocks: a tool for looking,
    /// not for a hot path.
    ///
    /// ```
    /// use streamalloc::{BlockState, CudaResource, Device, MemoryResource, PoolResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// assert!(CudaResource::new(&device)?.snapshot().is_none());
    /// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, None)?;
    /// let p = pool.try_allocate(4096, &stream)?;
    /// if let Some(snap) = pool.snapshot() {
    ///     assert_eq!(snap.reserved_bytes(), 1 << 20);
    ///     assert!(snap.blocks().any(|(_, b)| b.state == BlockState::Live && b.bytes == 4096));
    /// }
    /// unsafe { pool.deallocate(p, 4096, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    fn snapshot(&self) -> Option<MemorySnapshot> {
        None
    }

    /// The fragmentation figures of [`snapshot`](MemoryResource::snapshot): largest free
    /// extent (now, and after other streams' frees), free bytes per stream, pending frees, a
    /// histogram of free extents. A resource may answer it without building a whole snapshot.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource};
    ///
    /// let device = Device::host();
    /// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, None)?;
    /// if let Some(f) = pool.fragmentation() {
    ///     assert_eq!(f.largest_free_block, 1 << 20);
    /// }
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    fn fragmentation(&self) -> Option<Fragmentation> {
        self.snapshot().map(|s| s.fragmentation())
    }

    /// Allocates `bytes` for use on `stream`; a future whose first poll is the synchronous
    /// fast path ([`try_allocate`](MemoryResource::try_allocate)).
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves leaves nothing allocated.
    fn allocate<'a>(&'a self, bytes: usize, stream: &'a Stream) -> Allocate<'a, Self>
    where
        Self: Sized,
    {
        Allocate::new(self, bytes, stream)
    }

    /// [`allocate`](MemoryResource::allocate) for callers outside async code: blocks the
    /// calling thread while the request waits. Do not call it on an async executor thread.
    ///
    /// # Errors
    /// As [`allocate`](MemoryResource::allocate); and
    /// [`Error::BlockingInAsyncContext`] instead of a deadlock when the request would have to
    /// wait on a thread of a tokio `current_thread` runtime (its tasks, its `block_on`, and
    /// its `spawn_blocking` threads, which tokio does not tell apart): no task of that runtime
    /// could free memory while the thread blocks. A request served at once is served there
    /// too. (On a multi-thread runtime it blocks a worker, as any blocking call does.)
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, Error, LimitingAdaptor, MemoryResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 4096);
    /// let held = mr.allocate_blocking(4096, &stream)?; // served at once
    /// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let r = rt.block_on(async { mr.allocate_blocking(256, &stream) });
    /// assert!(matches!(r, Err(Error::BlockingInAsyncContext { requested: 256, .. })));
    /// unsafe { mr.deallocate(held, 4096, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    fn allocate_blocking(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr>
    where
        Self: Sized,
    {
        let mut future = std::pin::pin!(self.allocate(bytes, stream));
        let first = future
            .as_mut()
            .poll(&mut Context::from_waker(futures::task::noop_waker_ref()));
        match first {
            Poll::Ready(done) => done,
            Poll::Pending if on_current_thread_runtime() => Err(Error::BlockingInAsyncContext {
                call: "allocate_blocking",
                requested: bytes,
                device: stream.device().id(),
            }),
            Poll::Pending => futures::executor::block_on(future),
        }
    }
}

/// The [`memory_stats`](MemoryResource::memory_stats) of `device`'s current resource
/// ([`current_device_resource_for`](crate::current_device_resource_for)): PyTorch's
/// `torch.cuda.memory_stats(device)`.
///
/// ```
/// use streamalloc::{CudaResource, Device, HostConfig, PoolResource, StatisticsAdaptor};
///
/// let device = Device::host_with(HostConfig::default());
/// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, None)?;
/// streamalloc::set_current_device_resource_for(&device, std::sync::Arc::new(StatisticsAdaptor::new(pool)))?;
/// let stats = streamalloc::memory_stats(&device);
/// assert_eq!((stats.allocated_bytes, stats.reserved_bytes), (Some(0), Some(1 << 20)));
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub fn memory_stats(device: &Device) -> MemoryStats {
    defaults::registry::current_device_resource_for(device).memory_stats()
}

/// Whether this thread runs under a tokio `current_thread` runtime, where blocking while
/// waiting for memory would deadlock.
fn on_current_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// A type-erased, shared resource: what per-device defaults, containers and runtime-composed
/// stacks hold.
pub type SharedResource = Arc<dyn MemoryResource>;

// A shared resource is the resource it shares.
contract::forward::memory_resource!(delegate [R: MemoryResource + ?Sized] Arc<R>, |this| &**this);
// A borrowed resource is the resource it borrows: adaptors can wrap a resource the caller
// keeps (a replay stacks its recording adaptors over the resource it is given).
contract::forward::memory_resource!(delegate ['a, R: MemoryResource + ?Sized] &'a R, |this| &**this);

/// What tells one resource from another ([`MemoryResource::identity`]).
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, ResourceIdentity};
///
/// let device = Device::host();
/// assert!(matches!(CudaResource::new(&device).unwrap().identity(), ResourceIdentity::Stateless { .. }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResourceIdentity {
    /// A resource with shared state, named by that state's address: every clone shares it.
    Shared(usize),
    /// A resource with no state of its own: any two of the same kind and device are one.
    Stateless {
        /// The resource's type name.
        kind: &'static str,
        /// Its device.
        device: DeviceId,
    },
}

impl ResourceIdentity {
    /// The identity of the shared state behind `arc`.
    pub(crate) fn of_shared<T: ?Sized>(arc: &Arc<T>) -> Self {
        ResourceIdentity::Shared(Arc::as_ptr(arc) as *const () as usize)
    }

    /// The identity of a stateless resource of type `R` on `device`.
    pub(crate) fn stateless<R: ?Sized>(device: DeviceId) -> Self {
        ResourceIdentity::Stateless {
            kind: std::any::type_name::<R>(),
            device,
        }
    }
}

/// Checks that `mr` allocates on `stream`'s device: what a resource's `try_allocate` checks
/// first, for callers that hold the resource but not its device (a buffer, a queued request).
pub(crate) fn check_resource<R: MemoryResource + ?Sized>(mr: &R, stream: &Stream) -> Result<()> {
    let expected = mr.properties().device;
    let actual = stream.device().id();
    if expected == actual {
        Ok(())
    } else {
        Err(Error::DeviceMismatch { expected, actual })
    }
}

/// Checks that `stream` belongs to `device`, as every resource requires.
#[inline]
pub(crate) fn check_stream(device: &Device, stream: &Stream) -> Result<()> {
    if stream.device() == device {
        Ok(())
    } else {
        Err(Error::DeviceMismatch {
            expected: device.id(),
            actual: stream.device().id(),
        })
    }
}

/// The device of a sub-allocator's upstream, which it allocates for.
///
/// # Errors
/// [`Error::InvalidArgument`] when that device is gone.
pub(crate) fn upstream_device(upstream: &impl MemoryResource) -> Result<Device> {
    let id = upstream.properties().device;
    Device::from_id(id).ok_or_else(|| Error::invalid(format!("the upstream's device {id} is gone")))
}

/// The start of each sub-allocator's `try_allocate`: `Ok(true)` for a 0-byte request, which is
/// served with the null pointer whatever the stream; else the stream's device is checked.
#[inline]
pub(crate) fn is_empty_request(device: &Device, bytes: usize, stream: &Stream) -> Result<bool> {
    if bytes == 0 {
        return Ok(true);
    }
    check_stream(device, stream).map(|()| false)
}

/// `try_allocate` of a leaf resource over the backend's raw allocator of `kind`.
pub(crate) fn leaf_allocate(
    device: &Device,
    kind: crate::backend::MemoryKind,
    bytes: usize,
    stream: &Stream,
) -> Result<DevicePtr> {
    check_stream(device, stream)?;
    if bytes == 0 {
        return Ok(DevicePtr::NULL);
    }
    device
        .raw()
        .allocate(kind, bytes)
        .map(DevicePtr::from_raw)
        .map_err(|e| {
            // No device allocation can be larger than the device (the leaves' capacity limit).
            match kind {
                crate::backend::MemoryKind::Device => e.never_fitting(device.total_memory().ok()),
                _ => e,
            }
        })
}

/// `deallocate` of a leaf resource over the backend's raw allocator of `kind`.
///
/// # Safety
/// As [`MemoryResource::deallocate`], for memory from [`leaf_allocate`] of the same `kind`.
pub(crate) unsafe fn leaf_deallocate(
    device: &Device,
    kind: crate::backend::MemoryKind,
    ptr: DevicePtr,
    bytes: usize,
    stream: &Stream,
) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: forwarded from the caller's contract.
    if let Err(e) = unsafe { device.raw().free(kind, ptr.addr(), bytes, stream.raw()) } {
        device.defer_error(e);
    }
}

/// Type-erases a resource; a [`SharedResource`] passes through as it is instead of being
/// wrapped a second time.
pub(crate) fn into_shared<R: MemoryResource + 'static>(mr: R) -> SharedResource {
    let mut slot = Some(mr);
    if let Some(shared) =
        (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<SharedResource>>()
    {
        return shared.take().expect("filled above");
    }
    Arc::new(slot.expect("filled above"))
}

#[cfg(test)]
mod wait_tests;

// The watchdog these test runs on a timer, which the loom models leave out.
#[cfg(all(test, not(loom)))]
mod forget_tests;

#[cfg(test)]
mod equality_tests;

#[cfg(test)]
mod stats_tests;

#[cfg(test)]
mod too_large_tests;
