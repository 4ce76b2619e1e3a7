use std::fmt;
use std::sync::Arc;

use crate::error::Result;
use crate::resource::ResourceIdentity;
use crate::resource::{Availability, DevicePtr, MemoryResource, Properties};
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
/// the [`MemoryResource`] contract (256-byte aligned pointers, [`DevicePtr::NULL`] for 0 bytes,
/// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when memory is short) because the
/// resource cannot check it.
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
/// let upstream = CudaResource::new(&device);
/// let live = Arc::new(AtomicUsize::new(0));
///
/// let mr = CallbackResource::new(
///     upstream.properties(),
///     {
///         let (upstream, live) = (upstream.clone(), live.clone());
///         move |bytes, stream| {
///             let p = upstream.try_allocate(bytes, stream)?;
///             live.fetch_add(bytes, Ordering::Relaxed);
///             Ok(p)
///         }
///     },
///     {
///         let live = live.clone();
///         move |ptr, bytes, stream| {
///             live.fetch_sub(bytes, Ordering::Relaxed);
///             // SAFETY: the resource calls this only under `deallocate`'s contract, and
///             // `ptr` came from `upstream.try_allocate(bytes, ..)` in the closure above.
///             unsafe { upstream.deallocate(ptr, bytes, stream) }
///         }
///     },
/// );
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
    pub fn new(
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

    /// Reports `limit` as the largest request that could ever succeed, so that awaited requests
    /// above it fail at once instead of waiting. Default: no limit.
    pub fn with_capacity_limit(mut self, limit: usize) -> Self {
        self.capacity_limit = Some(limit);
        self
    }

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
    /// let limited = LimitingAdaptor::new(CudaResource::new(&device), 4096);
    /// // Frees in `limited` wake allocations waiting here.
    /// let availability = Arc::new(Availability::new());
    /// limited.availability().unwrap().add_follower(&availability);
    ///
    /// let (a, d) = (limited.clone(), limited.clone());
    /// let mr = CallbackResource::new(
    ///     limited.properties(),
    ///     move |bytes, stream| a.try_allocate(bytes, stream),
    ///     // SAFETY: called only under `deallocate`'s contract; `ptr` came from `a`, a clone.
    ///     move |ptr, bytes, stream| unsafe { d.deallocate(ptr, bytes, stream) },
    /// )
    /// .with_availability(availability)
    /// .with_capacity_limit(4096);
    ///
    /// let p = mr.allocate(4096, &stream).await?;
    /// # unsafe { mr.deallocate(p, 4096, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn with_availability(mut self, availability: Arc<Availability>) -> Self {
        self.availability = Some(availability);
        self
    }
}

impl MemoryResource for CallbackResource {
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
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::*;
    use crate::adaptor::test_support::{self, Call, KIB, MIB};
    use crate::{CudaResource, Device, Error, HostConfig, LimitingAdaptor};

    fn host() -> (Device, Stream) {
        let device = Device::host_with(HostConfig::default());
        let stream = Stream::new(&device).unwrap();
        (device, stream)
    }

    /// RMM's `CallbackMRTest.TestCallbacksAreInvoked`: one 10 MiB allocate and free reach
    /// the closures with the request's size, pointer and stream.
    #[test]
    fn the_callbacks_are_invoked() {
        let (device, s) = host();
        let (mr, calls) = test_support::recording(&device, |_| Ok(DevicePtr::from_raw(0x1000)));
        let p = mr.try_allocate(10 * MIB, &s).unwrap();
        assert_eq!(p, DevicePtr::from_raw(0x1000));
        // SAFETY: the recording resource frees nothing; the pointer is its own.
        unsafe { mr.deallocate(p, 10 * MIB, &s) };
        assert_eq!(
            *calls.lock(),
            [
                Call::Allocate(10 * MIB, s.id()),
                Call::Deallocate(p, 10 * MIB, s.id())
            ]
        );
    }

    /// RMM's `CallbackMRTest.LoggingTest`, with a log in memory instead of stdout.
    #[test]
    fn closures_can_log() {
        let (device, s) = host();
        let log = Arc::new(Mutex::new(String::new()));
        let upstream = CudaResource::new(&device);
        let (up, l1, l2) = (upstream.clone(), log.clone(), log.clone());
        let mr = CallbackResource::new(
            upstream.properties(),
            move |bytes, stream| {
                l1.lock().push_str(&format!("Allocating {bytes} bytes\n"));
                up.try_allocate(bytes, stream)
            },
            move |ptr, bytes, stream| {
                l2.lock().push_str(&format!("Deallocating {bytes} bytes\n"));
                // SAFETY: called only under `deallocate`'s contract; `ptr` came from a clone
                // of `upstream`.
                unsafe { upstream.deallocate(ptr, bytes, stream) }
            },
        );
        let p = mr.try_allocate(10 * MIB, &s).unwrap();
        // SAFETY: allocated above with the same size, unused.
        unsafe { mr.deallocate(p, 10 * MIB, &s) };
        assert_eq!(
            *log.lock(),
            format!(
                "Allocating {} bytes\nDeallocating {} bytes\n",
                10 * MIB,
                10 * MIB
            )
        );
    }

    /// RMM's `CallbackMRAdaptorTest.EqualityAndSharedOwnership`: memory allocated through one
    /// handle is freed through a clone, which calls the same closures.
    #[test]
    fn clones_share_the_closures() {
        let (device, s) = host();
        let frees = Arc::new(AtomicUsize::new(0));
        let f = frees.clone();
        let mr = CallbackResource::new(
            CudaResource::new(&device).properties(),
            |_, _| Ok(DevicePtr::from_raw(256)),
            move |_, _, _| {
                f.fetch_add(1, Ordering::SeqCst);
            },
        );
        let copy = mr.clone();
        let p = mr.try_allocate(KIB, &s).unwrap();
        // SAFETY: the closures own no memory.
        unsafe { copy.deallocate(p, KIB, &s) };
        assert_eq!(frees.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn errors_and_properties_are_the_callers() {
        let (device, s) = host();
        let properties = Properties {
            device_accessible: false,
            host_accessible: true,
            device: device.id(),
        };
        let mr = CallbackResource::new(
            properties,
            |bytes, stream| {
                Err(Error::OutOfMemory {
                    requested: bytes,
                    available: Some(7),
                    device: stream.device().id(),
                })
            },
            |_, _, _| {},
        );
        assert_eq!(mr.properties(), properties);
        assert_eq!(mr.capacity_limit(), None);
        assert!(mr.availability().is_none());
        let e = mr.try_allocate(KIB, &s).unwrap_err();
        assert!(matches!(
            e,
            Error::OutOfMemory {
                requested: KIB,
                available: Some(7),
                ..
            }
        ));
        // Without an availability an awaited request fails instead of waiting.
        let e = futures::executor::block_on(mr.allocate(KIB, &s)).unwrap_err();
        assert!(e.is_out_of_memory());
        assert_eq!(mr.with_capacity_limit(MIB).capacity_limit(), Some(MIB));
    }

    /// With an availability that follows a bounded resource, awaited allocations wait for frees.
    #[test]
    fn a_waiting_allocation_resumes_after_a_free() {
        test_support::a_waiting_allocation_resumes_after_a_free(4 * KIB, 4 * KIB, KIB, |limited| {
            let availability = Arc::new(Availability::new());
            limited
                .availability()
                .expect("bounded")
                .add_follower(&availability);
            let limit = limited.capacity_limit().expect("bounded");
            let (a, d) = (limited.clone(), limited.clone());
            CallbackResource::new(
                limited.properties(),
                move |bytes, stream| a.try_allocate(bytes, stream),
                // SAFETY: called only under `deallocate`'s contract; `ptr` came from `a`, a
                // clone of the same adaptor.
                move |ptr, bytes, stream| unsafe { d.deallocate(ptr, bytes, stream) },
            )
            .with_availability(availability)
            .with_capacity_limit(limit)
        });
    }

    #[test]
    fn debug_names_the_settings() {
        let (device, _) = host();
        let mr = CallbackResource::new(
            CudaResource::new(&device).properties(),
            |_, _| Ok(DevicePtr::NULL),
            |_, _, _| {},
        )
        .with_capacity_limit(KIB);
        let text = format!("{mr:?}");
        assert!(
            text.contains("CallbackResource") && text.contains("1024"),
            "{text}"
        );
        let _ = LimitingAdaptor::new(mr, KIB); // composes as an upstream
    }
}
