use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::resource::ResourceIdentity;
use crate::resource::{Availability, DevicePtr, MemoryResource, Properties, SharedResource};
use crate::stream::Stream;

/// What the callback of a [`FailureCallbackAdaptor`] learns about a failed attempt.
///
/// # Examples
///
/// A policy that retries small requests up to three times and large ones never:
///
/// ```
/// use streamalloc::{AllocationFailure, CudaResource, Device, FailureCallbackAdaptor};
///
/// fn policy(f: &AllocationFailure<'_>) -> bool {
///     f.bytes < (1 << 20) && f.attempt <= 3
/// }
/// let mr = FailureCallbackAdaptor::new(CudaResource::new(&Device::host()), policy);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct AllocationFailure<'a> {
    /// The bytes requested.
    pub bytes: usize,
    /// How many attempts of this [`try_allocate`](MemoryResource::try_allocate) call have
    /// failed so far, this one included: 1 for the first failure.
    pub attempt: u32,
    /// The upstream's out-of-memory error.
    pub error: &'a Error,
    /// The stream of the request.
    pub stream: &'a Stream,
}

/// The callback of a [`FailureCallbackAdaptor`].
type Callback = dyn Fn(&AllocationFailure<'_>) -> bool + Send + Sync;

/// Calls a function when the upstream runs out of memory and retries while it says so (RMM's
/// `failure_callback_resource_adaptor`): the hook for spilling, cache eviction or a retry
/// policy.
///
/// On an [`Error::OutOfMemory`] from the upstream, the callback gets an [`AllocationFailure`]
/// (bytes, attempt, error, stream); `true` retries the upstream at once, `false` returns the
/// error. Every other error passes through untouched, without calling the callback. Frees go
/// straight to the upstream. A clone shares the upstream and the callback.
///
/// # Awaiting memory
/// The adaptor forwards the upstream's [`availability`](MemoryResource::availability) and
/// [`capacity_limit`](MemoryResource::capacity_limit), so [`allocate`](MemoryResource::allocate)
/// waits through it as it would on the upstream. The callback runs inside `try_allocate`, which
/// a waiting `allocate` calls on its first poll and again on each retry when memory may have
/// come back; every such call counts its attempts from 1 again. So:
/// - Return `true` only after doing something that frees memory (spilling a buffer, dropping a
///   cache entry): a retry comes at once, with no waiting in between, and a callback that
///   always says `true` without freeing anything spins forever.
/// - Return `false` to hand the out-of-memory error back: `try_allocate` fails, and an awaited
///   `allocate` over an upstream that can make requests wait (a bounded pool, a
///   [`LimitingAdaptor`](crate::LimitingAdaptor)) waits for a free instead of failing.
/// - The callback runs on the caller's thread, an executor thread for `allocate`: it must not
///   block waiting for memory.
///
/// # Errors
/// The upstream's out-of-memory error once the callback says `false`; any other error of the
/// upstream at once.
///
/// # Panics
/// A panic in the callback propagates to the caller; nothing is allocated.
///
/// # Examples
///
/// Spill a cached buffer when memory runs out, then retry:
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use streamalloc::{CudaResource, Device, DevicePtr, FailureCallbackAdaptor, LimitingAdaptor,
///                   MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let limited = LimitingAdaptor::new(CudaResource::new(&device), 1 << 20);
/// let cache: Arc<Mutex<Option<DevicePtr>>> = Arc::default();
/// *cache.lock().unwrap() = Some(limited.try_allocate(1 << 20, &stream)?); // fills the budget
///
/// let mr = FailureCallbackAdaptor::new(limited.clone(), {
///     let (cache, limited, stream) = (cache.clone(), limited.clone(), stream.clone());
///     move |failure| match cache.lock().unwrap().take() {
///         Some(p) => {
///             // SAFETY: the cached block came from `limited` with this size, unused.
///             unsafe { limited.deallocate(p, 1 << 20, &stream) };
///             true // spilled: retry
///         }
///         None => {
///             assert!(failure.error.is_out_of_memory());
///             false // nothing left to spill
///         }
///     }
/// });
///
/// let p = mr.try_allocate(4096, &stream)?; // spills the cache, then succeeds
/// assert!(cache.lock().unwrap().is_none());
/// assert!(mr.try_allocate(2 << 20, &stream).unwrap_err().is_out_of_memory());
/// unsafe { mr.deallocate(p, 4096, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub struct FailureCallbackAdaptor<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R> {
    upstream: R,
    callback: Box<Callback>,
}

impl<R: MemoryResource> FailureCallbackAdaptor<R> {
    /// Wraps `upstream`, calling `callback` on each of its out-of-memory failures.
    pub fn new(
        upstream: R,
        callback: impl Fn(&AllocationFailure<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        FailureCallbackAdaptor {
            inner: Arc::new(Inner {
                upstream,
                callback: Box::new(callback),
            }),
        }
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &R {
        &self.inner.upstream
    }
}

impl<R: MemoryResource> MemoryResource for FailureCallbackAdaptor<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let mut attempt = 0u32;
        loop {
            match self.inner.upstream.try_allocate(bytes, stream) {
                Err(error) if error.is_out_of_memory() => {
                    attempt = attempt.saturating_add(1);
                    let failure = AllocationFailure {
                        bytes,
                        attempt,
                        error: &error,
                        stream,
                    };
                    if !(self.inner.callback)(&failure) {
                        return Err(error);
                    }
                }
                done => return done,
            }
        }
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract; the pointer is the upstream's own.
        unsafe { self.inner.upstream.deallocate(ptr, bytes, stream) }
    }

    fn availability(&self) -> Option<&Availability> {
        self.inner.upstream.availability()
    }

    fn may_regain_memory(&self, bytes: usize) -> bool {
        self.inner.upstream.may_regain_memory(bytes)
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::of_shared(&self.inner)
    }

    fn capacity_limit(&self) -> Option<usize> {
        self.inner.upstream.capacity_limit()
    }

    fn properties(&self) -> Properties {
        self.inner.upstream.properties()
    }
}

impl<R: MemoryResource> Clone for FailureCallbackAdaptor<R> {
    fn clone(&self) -> Self {
        FailureCallbackAdaptor {
            inner: self.inner.clone(),
        }
    }
}

impl<R: MemoryResource> fmt::Debug for FailureCallbackAdaptor<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailureCallbackAdaptor")
            .field("upstream", &self.inner.upstream)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::*;
    use crate::adaptor::test_support::{self, free, host, recording, Call, KIB, MIB};
    use crate::{CudaResource, LimitingAdaptor};

    fn oom(bytes: usize, s: &Stream) -> Error {
        Error::OutOfMemory {
            requested: bytes,
            available: Some(0),
            device: s.device().id(),
        }
    }

    /// RMM's `FailureCallbackTest.RetryAllocationOnce`: over an upstream that always fails, a
    /// callback that says "retry" once and then "give up" sees two failures, and the error comes
    /// back.
    #[test]
    fn retries_once_then_returns_the_error() {
        let (device, s) = host();
        let sid = s.id();
        let (upstream, calls) = recording(&device, {
            let device = device.id();
            move |bytes| {
                Err(Error::OutOfMemory {
                    requested: bytes,
                    available: Some(0),
                    device,
                })
            }
        });
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let seen = attempts.clone();
        let mr = FailureCallbackAdaptor::new(upstream, move |f| {
            seen.lock().push((f.bytes, f.attempt, f.stream.id()));
            assert_eq!(f.error, &oom(f.bytes, f.stream));
            f.attempt == 1
        });
        let e = mr.try_allocate(MIB, &s).unwrap_err();
        assert_eq!(e, oom(MIB, &s));
        assert_eq!(*attempts.lock(), [(MIB, 1, sid), (MIB, 2, sid)]);
        assert_eq!(
            *calls.lock(),
            [Call::Allocate(MIB, sid), Call::Allocate(MIB, sid)]
        );
        // Each call counts its attempts afresh.
        mr.try_allocate(KIB, &s).unwrap_err();
        assert_eq!(attempts.lock()[2..], [(KIB, 1, sid), (KIB, 2, sid)]);
    }

    /// RMM's `FailureCallbackTest.DifferentExceptionTypes`: only out-of-memory reaches the
    /// callback; every other error passes through untouched, after a single attempt.
    #[test]
    fn other_errors_pass_through_untouched() {
        let (device, s) = host();
        let errors = [
            Error::InvalidArgument("bad size".into()),
            Error::Driver {
                call: "cuMemAlloc",
                code: 1,
                name: "CUDA_ERROR_INVALID_VALUE".into(),
                device: device.id(),
            },
            Error::DeviceMismatch {
                expected: device.id(),
                actual: device.id(),
            },
        ];
        for error in errors {
            let answer = error.clone();
            let (upstream, calls) = recording(&device, move |_| Err(answer.clone()));
            let called = Arc::new(AtomicU32::new(0));
            let c = called.clone();
            let mr = FailureCallbackAdaptor::new(upstream, move |_| {
                c.fetch_add(1, Ordering::SeqCst);
                true // would retry forever if it were asked
            });
            assert_eq!(mr.try_allocate(MIB, &s).unwrap_err(), error);
            assert_eq!(called.load(Ordering::SeqCst), 0, "{error}");
            assert_eq!(calls.lock().len(), 1, "{error}");
        }
    }

    /// RMM's `FailureCallbackTest.ForwardsAlignment`, in our terms: size, pointer and stream go
    /// to the upstream unchanged, both ways, and the callback is not involved.
    #[test]
    fn success_and_frees_are_forwarded() {
        let (device, s) = host();
        let (upstream, calls) = recording(&device, |_| Ok(DevicePtr::from_raw(0x4_0000)));
        let mr = FailureCallbackAdaptor::new(upstream, |_| panic!("no failure happened"));
        let p = mr.try_allocate(1024, &s).unwrap();
        assert_eq!(p, DevicePtr::from_raw(0x4_0000));
        free(&mr, p, 1024, &s);
        assert_eq!(
            *calls.lock(),
            [
                Call::Allocate(1024, s.id()),
                Call::Deallocate(p, 1024, s.id())
            ]
        );
    }

    /// The point of the adaptor: a callback that frees memory turns a failure into a success.
    #[test]
    fn a_callback_that_frees_memory_makes_the_retry_succeed() {
        let (device, s) = host();
        let limited = LimitingAdaptor::new(CudaResource::new(&device), 4 * KIB);
        let spill = Arc::new(Mutex::new(vec![
            limited.try_allocate(2 * KIB, &s).unwrap(),
            limited.try_allocate(2 * KIB, &s).unwrap(),
        ]));
        let (l, sp, st) = (limited.clone(), spill.clone(), s.clone());
        let mr = FailureCallbackAdaptor::new(limited.clone(), move |_| match sp.lock().pop() {
            Some(p) => {
                free(&l, p, 2 * KIB, &st);
                true
            }
            None => false,
        });
        // Needs both spilled blocks: two failures, two spills, then success.
        let p = mr.try_allocate(3 * KIB, &s).unwrap();
        assert!(spill.lock().is_empty());
        assert_eq!(limited.allocated_bytes(), 3 * KIB);
        // Nothing left to spill: the error comes back.
        assert!(mr.try_allocate(2 * KIB, &s).unwrap_err().is_out_of_memory());
        free(&mr, p, 3 * KIB, &s);
        assert_eq!(limited.allocated_bytes(), 0);
    }

    /// RMM's `SharedOwnership`: allocate through one handle, free through a clone.
    #[test]
    fn clones_share_the_upstream() {
        let (device, s) = host();
        let limited = LimitingAdaptor::new(CudaResource::new(&device), MIB);
        let mr = FailureCallbackAdaptor::new(limited.clone(), |_| false);
        let copy = mr.clone();
        let p = mr.try_allocate(KIB, &s).unwrap();
        free(&copy, p, KIB, &s);
        assert_eq!(limited.allocated_bytes(), 0);
        assert_eq!(copy.upstream().allocated_bytes(), 0);
        assert_eq!(mr.properties(), limited.properties());
        assert!(format!("{mr:?}").contains("FailureCallbackAdaptor"));
    }

    /// A callback that says "give up" lets an awaited request wait on the upstream's queue; it
    /// is consulted on the request's attempts and not after the free lets it through.
    #[test]
    fn a_waiting_allocation_resumes_after_a_free() {
        let consulted = Arc::new(AtomicUsize::new(0));
        let c = consulted.clone();
        test_support::a_waiting_allocation_resumes_after_a_free(4 * KIB, 4 * KIB, KIB, |l| {
            FailureCallbackAdaptor::new(l, move |_| {
                c.fetch_add(1, Ordering::SeqCst);
                false
            })
        });
        assert!(consulted.load(Ordering::SeqCst) >= 1);
    }
}
