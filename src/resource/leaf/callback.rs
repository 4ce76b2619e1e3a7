use std::fmt;
use std::sync::Arc;

use crate::error::Result;
use crate::resource::contract::availability::Availability;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::properties::{Properties, ResourceIdentity};
use crate::resource::device_ptr::DevicePtr;
use crate::stream::Stream;

/// The allocate closure of a [`CallbackResource`].
type AllocateFn = dyn Fn(usize, &Stream) -> Result<DevicePtr> + Send + Sync;
/// The deallocate closure of a [`CallbackResource`].
type DeallocateFn = dyn Fn(DevicePtr, usize, &Stream) + Send + Sync;

/// A resource made of two closures (RMM's `callback_memory_resource`): one allocates, one
/// frees, and the caller says what the memory is ([`Properties`]).
///
/// Use it to plug an allocator that is not a [`MemoryResource`] into a stack of adaptors, to
/// observe or script calls in tests, or to build a resource at run time. The closures capture
/// whatever state they need; that replaces RMM's `void*` arguments. A clone shares the closures.
///
/// Every request reaches the allocate closure, 0 bytes included, as in RMM; the closure keeps
/// the [`MemoryResource`] contract (memory that is the caller's alone, of at least the size
/// asked, 256-byte aligned, as `properties` describes it; [`DevicePtr::NULL`] for 0 bytes;
/// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when memory is short) because the
/// resource cannot check it: [`new`](CallbackResource::new) is `unsafe` for that reason.
///
/// By default allocations never wait: [`availability`](MemoryResource::availability) is
/// `None`. Give the resource an [`Availability`] to notify
/// ([`with_availability`](CallbackResource::with_availability)) and awaited allocations wait
/// for it instead of failing.
///
/// # Stream ordering
/// Whatever the closures do: the allocate closure gets the stream of the request, the
/// deallocate closure the stream of the free, and both are called on the caller's thread.
///
/// # Errors
/// [`try_allocate`](MemoryResource::try_allocate) returns what the allocate closure returns.
///
/// # Panics
/// A panic in a closure propagates to the caller of the resource.
///
/// # Safety
/// See [`new`](CallbackResource::new): its caller promises what the allocate closure returns.
/// The deallocate closure is safe Rust, yet it may rely on
/// [`MemoryResource::deallocate`]'s contract: the resource calls it only from that `unsafe fn`,
/// so it only ever sees a pointer that the allocate closure returned for the same `bytes`, not
/// freed yet, with all work on it ordered before this point of the stream. A closure that
/// forwards the free to another resource can cite that contract in its `// SAFETY:` comment, as
/// the example below does, provided the closure is moved into the resource and no copy of it is
/// kept to be called elsewhere.
///
/// # Examples
///
/// A resource that forwards to another one and counts what it hands out:
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use streamalloc::{CallbackResource, CudaResource, Device, MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let upstream = CudaResource::new(&device)?;
/// let live = Arc::new(AtomicUsize::new(0));
///
/// let count = {
///     let (upstream, live) = (upstream.clone(), live.clone());
///     move |bytes, stream: &Stream| {
///         let p = upstream.try_allocate(bytes, stream)?;
///         live.fetch_add(bytes, Ordering::Relaxed);
///         Ok(p)
///     }
/// };
/// let uncount = {
///     let (upstream, live) = (upstream.clone(), live.clone());
///     move |ptr, bytes, stream: &Stream| {
///         live.fetch_sub(bytes, Ordering::Relaxed);
///         // SAFETY: the resource calls this only under `deallocate`'s contract, and `ptr`
///         // came from `upstream.try_allocate(bytes, ..)` in `count`.
///         unsafe { upstream.deallocate(ptr, bytes, stream) }
///     }
/// };
/// // SAFETY: every pointer is one `upstream` returned for the same request, and the
/// // properties are its own: the promise is `upstream`'s.
/// let mr = unsafe { CallbackResource::new(upstream.properties(), count, uncount) };
///
/// let p = mr.try_allocate(1000, &stream)?;
/// assert_eq!(live.load(Ordering::Relaxed), 1000);
/// // SAFETY: allocated above with the same size, used by nothing.
/// unsafe { mr.deallocate(p, 1000, &stream) };
/// assert_eq!(live.load(Ordering::Relaxed), 0);
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Clone)]
pub struct CallbackResource {
    callbacks: Arc<Callbacks>,
    properties: Properties,
    capacity_limit: Option<usize>,
    availability: Option<Arc<Availability>>,
}

struct Callbacks {
    allocate: Box<AllocateFn>,
    deallocate: Box<DeallocateFn>,
}

impl CallbackResource {
    /// A resource whose `try_allocate` calls `allocate(bytes, stream)` and whose `deallocate`
    /// calls `deallocate(ptr, bytes, stream)`; `properties` is what
    /// [`properties`](MemoryResource::properties) reports.
    ///
    /// # Safety
    /// The resource implements [`MemoryResource`], an unsafe trait, by calling `allocate` and
    /// reporting `properties`, so the caller promises for them what the trait's `# Safety`
    /// asks of every resource:
    /// 1. a pointer `allocate(bytes, ..)` returns (other than [`DevicePtr::NULL`], for 0
    ///    bytes) starts at least `bytes` bytes that stay valid and are the resource user's
    ///    alone until the deallocate closure gets them back: no pointer is handed out twice
    ///    while live, and no range overlaps another live one;
    /// 2. it is 256-byte aligned and allocated for `properties.device`;
    /// 3. host code may read and write it when `properties.host_accessible` is true, and
    ///    device code and copies may use it when `properties.device_accessible` is.
    ///
    /// Containers, host kernels and the host backend's copies read and write through these
    /// pointers on that promise.
    pub unsafe fn new(
        properties: Properties,
        allocate: impl Fn(usize, &Stream) -> Result<DevicePtr> + Send + Sync + 'static,
        deallocate: impl Fn(DevicePtr, usize, &Stream) + Send + Sync + 'static,
    ) -> Self {
        CallbackResource {
            callbacks: Arc::new(Callbacks {
                allocate: Box::new(allocate),
                deallocate: Box::new(deallocate),
            }),
            properties,
            capacity_limit: None,
            availability: None,
        }
    }

    crate::builder::option_setters! {
        /// Reports `limit` as the largest request that could ever succeed, so that awaited requests
        /// above it fail at once instead of waiting. Default: no limit.
        fn with_capacity_limit(limit: usize) => capacity_limit;
        /// Lets awaited allocations wait for memory: they queue on `availability` and retry when
        /// it is [notified](Availability::notify). Default: none, so they fail with out-of-memory.
        ///
        /// Whoever frees memory notifies it: the deallocate closure, or, for closures over another
        /// resource, that resource, through
        /// [`Availability::add_follower`].
        ///
        /// ```
        /// use std::sync::Arc;
        /// use streamalloc::{Availability, CallbackResource, CudaResource, Device, LimitingAdaptor,
        ///                   MemoryResource, Stream};
        ///
        /// # futures::executor::block_on(async {
        /// let device = Device::host();
        /// let stream = Stream::new(&device)?;
        /// let limited = LimitingAdaptor::new(CudaResource::new(&device)?, 4096);
        /// // Frees in `limited` wake allocations waiting here.
        /// let availability = Arc::new(Availability::new());
        /// limited.availability().unwrap().add_follower(&availability);
        ///
        /// let (a, d) = (limited.clone(), limited.clone());
        /// // SAFETY: called only under `deallocate`'s contract; `ptr` came from `a`, a clone.
        /// let free = move |ptr, bytes, stream: &Stream| unsafe { d.deallocate(ptr, bytes, stream) };
        /// // SAFETY: every pointer is one `limited` (through `a`) returned for the same request,
        /// // and the properties are its own.
        /// let mr = unsafe {
        ///     CallbackResource::new(limited.properties(), move |b, s| a.try_allocate(b, s), free)
        /// }
        /// .with_availability(availability)
        /// .with_capacity_limit(4096);
        ///
        /// let p = mr.allocate(4096, &stream).await?;
        /// # unsafe { mr.deallocate(p, 4096, &stream) };
        /// # Ok::<(), streamalloc::Error>(())
        /// # }).unwrap();
        /// ```
        fn with_availability(availability: Arc<Availability>) => availability;
    }
}

// SAFETY: it hands out what the allocate closure returns and reports the properties it was
// given: `CallbackResource::new`, an `unsafe fn`, makes its caller promise that these keep
// the contract.
unsafe impl MemoryResource for CallbackResource {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        (self.callbacks.allocate)(bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // The closure relies on this function's contract, forwarded from the caller.
        (self.callbacks.deallocate)(ptr, bytes, stream)
    }

    fn availability(&self) -> Option<&Availability> {
        self.availability.as_deref()
    }

    fn capacity_limit(&self) -> Option<usize> {
        self.capacity_limit
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::of_shared(&self.callbacks)
    }

    fn properties(&self) -> Properties {
        self.properties
    }
}

impl fmt::Debug for CallbackResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackResource")
            .field("properties", &self.properties)
            .field("capacity_limit", &self.capacity_limit)
            .field("awaitable", &self.availability.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
