//! The memory-resource contract: [`MemoryResource`] and the future of its `allocate`,
//! [`Allocate`], which name each other (so they share a file).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_timer::Delay;

use super::availability::{Availability, WaitEnd, Waiter};
use super::properties::{Properties, ResourceIdentity};
use super::stats::MemoryStats;
use crate::error::{Error, Result};
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::{Fragmentation, MemorySnapshot};
use crate::stream::Stream;

/// A source of stream-ordered memory: RMM's `device_memory_resource`, made async.
///
/// Implementations are cheap `Clone` handles over shared state where they have state: a clone
/// *is* the same resource.
///
/// # Allocation and observation
/// Only `try_allocate`, `deallocate` and `properties` are required. Every other method has a
/// default derived from them (fragmentation from the snapshot, the wait queue's figures from
/// `availability`); adaptors forward what they do not change and sub-allocators share a base,
/// so no resource restates a default. (Observation is not a second trait, so that existing
/// implementations keep compiling.)
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
/// 2. aligned to [`ALLOCATION_ALIGNMENT`](crate::ALLOCATION_ALIGNMENT) (256 bytes);
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
/// twice. [`CallbackResource`](crate::CallbackResource) takes closures, so its constructor is an `unsafe fn` with this
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
    /// ([`Device::take_deferred_error`](crate::Device::take_deferred_error)).
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
    /// [`CudaResource`](crate::CudaResource)s of one device, say), as in RMM.
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

/// Whether this thread runs under a tokio `current_thread` runtime, where blocking while
/// waiting for memory would deadlock.
fn on_current_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// Checks that `mr` allocates on `stream`'s device: what a resource's `try_allocate` checks
/// first, for callers that hold the resource but not its device (a buffer, a queued request);
/// an error names `call`.
pub(crate) fn check_resource<R: MemoryResource + ?Sized>(
    mr: &R,
    stream: &Stream,
    call: &'static str,
) -> Result<()> {
    let expected = mr.properties().device;
    let actual = stream.device().id();
    if expected == actual {
        Ok(())
    } else {
        Err(Error::DeviceMismatch {
            expected,
            actual,
            call,
        })
    }
}

/// The future of [`MemoryResource::allocate`].
///
/// Its first poll is the synchronous fast path, [`MemoryResource::try_allocate`]: when memory
/// is there it resolves at once, with no allocation or lock of its own. When the resource is
/// out of memory, the request could ever fit
/// ([`capacity_limit`](MemoryResource::capacity_limit)) and the resource signals
/// [`availability`](MemoryResource::availability), the future joins the resource's wait
/// queue and resolves when memory comes back (see [`Availability`] for the
/// fairness policy). It waits only while memory may come back for it
/// ([`may_regain_memory`](MemoryResource::may_regain_memory): an allocation is outstanding, a
/// free pending); otherwise it resolves to the out-of-memory error at once. A request behind
/// other waiters is checked as [`try_allocate`](MemoryResource::try_allocate) would check it
/// (its stream's device, its size against the capacity limit) before it joins the queue.
///
/// It works under any executor (tokio, `futures::executor::block_on`, …); deadlines use a
/// runtime-independent timer.
///
/// # Errors
/// [`Error::TooLarge`] at once, with the maximum, when the request is above the resource's
/// [`capacity_limit`](MemoryResource::capacity_limit) (whatever out-of-memory error the
/// resource itself gave); [`Error::OutOfMemory`] at once when nothing can come back for it or
/// the resource cannot make it wait; [`Error::DeviceMismatch`] before any wait when the
/// stream is of another device; [`Error::Timeout`] when a [`deadline`](Allocate::deadline) passes first;
/// [`Error::WouldDeadlock`] when it would wait for ever (below); any other error of
/// `try_allocate`.
///
/// # Deadlock detection
/// Off by default; a resource's wait queue turns it on with
/// [`Availability::set_deadlock_detection`](crate::Availability::set_deadlock_detection)
/// (the "reported wrongly" case below is why it is not on for everyone: a producer that hands
/// its buffers to a consumer and waits for more would be told it deadlocks). With it on, a
/// request that would wait for ever because every byte of a bounded resource is held by
/// tasks that are themselves waiting on it gets [`Error::WouldDeadlock`] instead (the head of
/// the queue checks when its retry fails, any other waiter once as it joins the queue).
/// Exactly, it is reported when all of these hold:
/// - the resource has a [`capacity_limit`](MemoryResource::capacity_limit) and reports its
///   allocated bytes ([`memory_stats`](MemoryResource::memory_stats)), and the request does not
///   fit beside them (`allocated + requested > limit`): only a free of the resource's own can
///   help, not its upstream;
/// - every waiter in the queue runs in a tokio task;
/// - the bytes those tasks got from awaited allocations of this resource
///   ([`allocate`](MemoryResource::allocate), `DeviceBuffer::new`, `DeviceVec::new`, …) since
///   the last time memory came back to it add up to all it has allocated.
///
/// Not detected (it waits, as before): holders outside tokio tasks (threads, `block_on`);
/// memory from [`try_allocate`](MemoryResource::try_allocate) or allocated before the last
/// free, growth or trim of the resource (each one forgets the counts, since it may have
/// returned any of them); sizes the resource rounds up (a [`LimitingAdaptor`] charges 256-byte
/// units: a task holding 1000 bytes counts 1000, the resource 1024, and the two no longer
/// match); waits spread over several resources (a cycle through two pools); a resource full
/// below its limit (fragmentation) or blocked by its upstream.
///
/// Reported wrongly (the limits of attributing memory to the task that awaited it): a task
/// that waits here while *another part of itself* (a branch of `join!`/`select!`) would free
/// what it holds, or while memory it allocated has been handed to another task or thread that
/// will free it. Such programs should not rely on a wait for memory they hold themselves;
/// the error says how much the waiters hold.
///
/// Cost, with detection on (off, nothing is counted): an awaited allocation that succeeds
/// inside a tokio task on a resource with a wait queue counts its bytes in its worker thread's own shard (a lock no other thread takes,
/// while there are no more threads than shards) and sets a shared flag if it is clear; the next
/// free after it clears the flag with one compare-exchange. No lock is shared between workers;
/// only a deadlock check sums the shards. Outside tasks, a thread-local read.
/// [`try_allocate`](MemoryResource::try_allocate) pays nothing.
///
/// [`LimitingAdaptor`]: crate::LimitingAdaptor
///
/// # Cancel safety
/// Dropping it before it resolves leaves nothing allocated, nothing reserved, and no waiter in
/// the queue; if it was the oldest waiter, the next one is woken in its place. Forgetting it
/// (`mem::forget`) while it waits leaks only its small waiter record: if it was told to retry,
/// its turn passes to the next waiter after a second (see
/// [`Availability`]'s fairness), so later requests are not held.
#[must_use = "futures do nothing unless awaited"]
pub struct Allocate<'a, R: MemoryResource + ?Sized> {
    pub(super) mr: &'a R,
    pub(super) bytes: usize,
    pub(super) stream: &'a Stream,
    pub(super) deadline: Option<Instant>,
    pub(super) priority: i32,
    /// Boxed: a request served at its first poll (most) moves and drops one word, not this.
    pub(super) wait: Option<Box<Wait>>,
}

/// The state of a request that is queued.
pub(super) struct Wait {
    // The loom-checked `Arc` where the wait queue is modelled.
    pub(super) waiter: crate::sync::Arc<Waiter>,
    pub(super) since: Instant,
    pub(super) timer: Option<Delay>,
}

impl<'a, R: MemoryResource + ?Sized> Allocate<'a, R> {
    pub(crate) fn new(mr: &'a R, bytes: usize, stream: &'a Stream) -> Self {
        Allocate {
            mr,
            bytes,
            stream,
            deadline: None,
            priority: 0,
            wait: None,
        }
    }

    /// The number of bytes requested.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    crate::builder::option_setters! {
        /// Gives up with [`Error::Timeout`] if the memory is not there by `deadline`.
        ///
        /// ```
        /// use std::time::{Duration, Instant};
        /// use streamalloc::{CudaResource, Device, LimitingAdaptor, MemoryResource, Stream};
        ///
        /// # futures::executor::block_on(async {
        /// let device = Device::host();
        /// let stream = Stream::new(&device)?;
        /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 1024);
        /// let held = mr.allocate(1024, &stream).await?;
        /// let err = mr.allocate(256, &stream).deadline(Instant::now() + Duration::from_millis(10)).await;
        /// assert!(matches!(err, Err(streamalloc::Error::Timeout { requested: 256, .. })));
        /// unsafe { mr.deallocate(held, 1024, &stream) };
        /// # Ok::<(), streamalloc::Error>(())
        /// # }).unwrap();
        /// ```
        fn deadline(deadline: Instant) => deadline;
    }

    /// Gives up with [`Error::Timeout`] if the memory is not there within `timeout`, counted
    /// from this call.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.deadline(Instant::now() + timeout)
    }

    /// Serves this request before waiting requests of lower priority: higher is first, the
    /// default is 0, and requests of one priority are served in arrival order.
    ///
    /// A request that finds waiters of equal or higher priority queues behind them (it does
    /// not take the fast path past them); one that finds only waiters of lower priority
    /// passes them and tries at once. Priority ages: a waiting request that requests of
    /// higher priority have passed over [`age_step`](crate::Availability::age_step) times
    /// (128 by default) is raised one level, so a low-priority request under a steady stream of
    /// high-priority ones is served after a bounded number of them (the bound is under
    /// "Fairness" on [`Availability`]); [`set_age_step(None)`](crate::Availability::set_age_step)
    /// makes priority strict. While a large request waits at the head, requests of lower
    /// priority behind it wait too, even those that would fit. Set before the first poll; a
    /// request already queued keeps its place.
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{CudaResource, Device, LimitingAdaptor, MemoryResource, Stream};
    ///
    /// # let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    /// # rt.block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 1024);
    /// let held = mr.allocate(1024, &stream).await?;
    /// let (m, s) = (mr.clone(), stream.clone());
    /// let queue = mr.availability().unwrap();
    /// let waiting = |n| async move {
    ///     while queue.stats().waiting < n {
    ///         tokio::time::sleep(Duration::from_millis(1)).await;
    ///     }
    /// };
    /// let low = tokio::spawn(async move { m.allocate(1024, &s).await });
    /// waiting(1).await;                                    // `low` waits first...
    /// let (m, s) = (mr.clone(), stream.clone());
    /// let high = tokio::spawn(async move { m.allocate(1024, &s).priority(1).await });
    /// waiting(2).await;
    /// unsafe { mr.deallocate(held, 1024, &stream) };
    /// let p = high.await.unwrap()?;                        // ...but `high` is served first
    /// assert!(!low.is_finished());
    /// unsafe { mr.deallocate(p, 1024, &stream) };
    /// let p = low.await.unwrap()?;
    /// unsafe { mr.deallocate(p, 1024, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }
}

/// Whether a request of `bytes` may wait for memory on `mr`: `mr` signals availability and
/// the request is within its capacity limit.
pub(super) fn can_wait<R: MemoryResource + ?Sized>(mr: &R, bytes: usize) -> bool {
    mr.availability().is_some() && mr.capacity_limit().is_none_or(|limit| bytes <= limit)
}

/// An out-of-memory outcome for a request above the capacity limit, made
/// [`Error::TooLarge`] whatever the resource said.
pub(super) fn never_fitting<R: MemoryResource + ?Sized>(
    mr: &R,
    done: Result<DevicePtr>,
) -> Result<DevicePtr> {
    done.map_err(|e| e.never_fitting(mr.capacity_limit()))
}

/// `done`, with its bytes counted as held by the current tokio task when it is an allocation
/// from a resource that makes requests wait (for deadlock detection). Outside a task, or for
/// a resource that never makes requests wait, one thread-local read.
#[inline]
pub(crate) fn held<R: MemoryResource + ?Sized>(
    mr: &R,
    bytes: usize,
    done: Result<DevicePtr>,
) -> Result<DevicePtr> {
    if let (Ok(_), Some(a)) = (&done, mr.availability()) {
        if bytes > 0 {
            a.record_held(bytes);
        }
    }
    done
}

/// The fast path of every allocation future (an [`Allocate`]'s first poll, a buffer's
/// constructor): `Some(outcome)` when the request is decided without waiting, `None` when it is
/// out of memory and may wait for more.
#[inline]
pub(crate) fn try_without_waiting<R: MemoryResource + ?Sized>(
    mr: &R,
    bytes: usize,
    stream: &Stream,
) -> Option<Result<DevicePtr>> {
    match mr.try_allocate(bytes, stream) {
        Err(e) if e.is_out_of_memory() && can_wait(mr, bytes) => None,
        done => Some(never_fitting(mr, done)),
    }
}

impl<R: MemoryResource + ?Sized> Future for Allocate<'_, R> {
    type Output = Result<DevicePtr>;

    /// The fast path, inlined into the caller: a first poll that finds nobody queued and the
    /// memory there. Everything else (queueing, deadlines, retries) is `poll_wait`, out of line.
    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<DevicePtr>> {
        let this = &mut *self;
        if this.wait.is_some() {
            return this.poll_wait(cx, false);
        }
        // Waiters go first, unless all are of lower priority: then this request becomes the
        // head when it queues, and tries at once (in `poll_wait`).
        if this.mr.availability().is_some_and(|a| a.has_waiters()) {
            return this.poll_wait(cx, false);
        }
        // `try_without_waiting` and `held`, with the pointer alone moved on success: the
        // error makes the `Result` nine words, which copying costs on every allocation.
        match this.mr.try_allocate(this.bytes, this.stream) {
            Ok(ptr) => {
                if let (Some(a), true) = (this.mr.availability(), this.bytes > 0) {
                    a.record_held(this.bytes);
                }
                Poll::Ready(Ok(ptr))
            }
            Err(e) => this.poll_failed(cx, e),
        }
    }
}

impl<R: MemoryResource + ?Sized> Drop for Allocate<'_, R> {
    #[inline]
    fn drop(&mut self) {
        // Taken here, not in `leave_queue`, so that the field's drop glue sees `None`.
        if let Some(wait) = self.wait.take() {
            self.leave(&wait, WaitEnd::Cancelled);
        }
    }
}

impl<R: MemoryResource + ?Sized> fmt::Debug for Allocate<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocate")
            .field("bytes", &self.bytes)
            .field("stream", &self.stream.id())
            .field("priority", &self.priority)
            .field("waiting", &self.wait.is_some())
            .finish()
    }
}
