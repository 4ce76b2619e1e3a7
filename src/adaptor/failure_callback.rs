use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::resource::contract::forward::{memory_resource, Forward};
use crate::resource::{DevicePtr, MemoryResource, SharedResource};
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
/// let mr = FailureCallbackAdaptor::new(CudaResource::new(&Device::host()).unwrap(), policy);
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
/// let limited = LimitingAdaptor::new(CudaResource::new(&device)?, 1 << 20);
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
}

memory_resource!(shared [R: MemoryResource] FailureCallbackAdaptor<R>);

// SAFETY: every pointer it hands out is one the upstream returned for the same request (the
// callback only decides whether to ask again), and its properties are the upstream's.
unsafe impl<R: MemoryResource> Forward for Inner<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let mut attempt = 0u32;
        loop {
            match self.upstream.try_allocate(bytes, stream) {
                Err(error) if error.is_out_of_memory() => {
                    attempt = attempt.saturating_add(1);
                    let failure = AllocationFailure {
                        bytes,
                        attempt,
                        error: &error,
                        stream,
                    };
                    if !(self.callback)(&failure) {
                        return Err(error);
                    }
                }
                done => return done,
            }
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
mod tests;
