//! A current resource for one task or one call: PyTorch's `use_mem_pool`, made async.
//!
//! A scope is installed in a thread-local stack for exactly as long as its future is being
//! polled (or its closure runs), and taken off again when the poll returns or unwinds. So a
//! scope follows its task from worker thread to worker thread and across every await, never
//! leaks into another task polled on the same thread, and needs nothing from the executor:
//! tokio, `futures::executor` and any other runtime work alike.
//! [`current_device_resource_for`](super::registry::current_device_resource_for) asks
//! [`scoped_resource_for`] first and falls back to the per-device registry.

use std::cell::RefCell;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project::pin_project;

use crate::device::DeviceId;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::shared::{into_shared, SharedResource};

thread_local! {
    /// The resources of the scopes being polled (or run) on this thread, outermost first,
    /// each with its device. Polls nest, so the stack grows and shrinks in LIFO order.
    static SCOPES: RefCell<Vec<(DeviceId, SharedResource)>> = const { RefCell::new(Vec::new()) };
}

/// The innermost scoped resource of `device` on this thread, if a scope of that device is
/// being polled here.
pub(crate) fn scoped_resource_for(device: DeviceId) -> Option<SharedResource> {
    SCOPES
        .try_with(|scopes| {
            scopes
                .borrow()
                .iter()
                .rev()
                .find(|(d, _)| *d == device)
                .map(|(_, mr)| mr.clone())
        })
        .ok()
        .flatten()
}

/// A scope installed on this thread; taking it off on drop also runs when the scoped code
/// unwinds, so a panic cannot leave the resource installed for whatever runs next here.
struct Installed {
    /// The stack's length before this scope was pushed.
    depth: usize,
}

impl Installed {
    fn new(device: DeviceId, mr: &SharedResource) -> Self {
        let depth = SCOPES.with(|scopes| {
            let mut scopes = scopes.borrow_mut();
            scopes.push((device, mr.clone()));
            scopes.len() - 1
        });
        Installed { depth }
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        // `truncate`, not `pop`: whatever an inner scope left above this one (none does: each
        // takes itself off) goes with it. `try_with` fails only during thread teardown.
        let _ = SCOPES.try_with(|scopes| scopes.borrow_mut().truncate(self.depth));
    }
}

/// Runs `future` with `mr` as the current resource of `mr`'s device: every allocation inside
/// that consults the current resource uses `mr` (PyTorch's `torch.cuda.use_mem_pool`, made
/// async).
///
/// "Consults the current resource" means
/// [`current_device_resource_for`](crate::current_device_resource_for) (and
/// [`current_device_resource`](crate::current_device_resource) when `mr` is of
/// [`Device::default`](crate::Device::default)) and what is built on it, such as
/// [`DeviceBuffer::with_current_resource`](crate::DeviceBuffer::with_current_resource).
/// Allocations that name their resource are unaffected.
///
/// - The scope holds across every `.await` inside `future` and on whichever thread polls it: it
///   is installed for the duration of each poll of the returned future, so it moves with the
///   task between a multi-thread runtime's workers.
/// - It applies only to `mr`'s device
///   ([`Properties::device`](crate::Properties::device)): asked for another device, the
///   current resource is that device's own (or that of an enclosing scope of that device).
/// - Scopes nest, innermost first; scopes of different devices combine.
/// - A task spawned inside the scope (`tokio::spawn`) does **not** inherit it, as it does not
///   inherit tokio's task-locals: it is polled on its own, outside this future's polls. Wrap
///   the spawned future in its own `with_resource` to give it one.
/// - It covers the polls of `future`, not its drop.
/// - The current resource is looked up when the allocation is made: by
///   [`DeviceBuffer::with_current_resource`](crate::DeviceBuffer::with_current_resource) when
///   it is called, so its future, made inside the scope, keeps the scoped resource wherever it
///   is awaited.
///
/// # Examples
///
/// ```
/// use streamalloc::*;
///
/// # futures::executor::block_on(async {
/// let device = Device::host_with(HostConfig::default());
/// let stream = Stream::new(&device)?;
/// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, None)?;
///
/// let buf = with_resource(pool.clone(), async {
///     stream.synchronize().await?;                              // any awaits in between
///     DeviceBuffer::with_current_resource(4096, &stream).await  // from `pool`
/// })
/// .await?;
/// assert!(buf.can_be_freed_by(&pool));
///
/// // Outside the scope, the device's own current resource again.
/// let other = DeviceBuffer::with_current_resource(4096, &stream).await?;
/// assert!(!other.can_be_freed_by(&pool));
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub fn with_resource<F: IntoFuture>(
    mr: impl MemoryResource + 'static,
    future: F,
) -> WithResource<F::IntoFuture> {
    let mr = into_shared(mr);
    WithResource {
        device: mr.properties().device,
        mr,
        future: future.into_future(),
    }
}

/// Runs `f` with `mr` as the current resource of `mr`'s device: the synchronous counterpart
/// of [`with_resource`], for code outside async tasks. The scope ends when `f` returns or
/// panics.
///
/// # Examples
///
/// ```
/// use streamalloc::*;
///
/// let device = Device::host_with(HostConfig::default());
/// let stream = Stream::new(&device)?;
/// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, None)?;
///
/// let buf = with_resource_sync(pool.clone(), || {
///     DeviceBuffer::try_new(256, &stream, current_device_resource_for(&device))
/// })?;
/// assert!(buf.can_be_freed_by(&pool));
/// assert!(!current_device_resource_for(&device).is_equal(&pool));
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub fn with_resource_sync<R>(mr: impl MemoryResource + 'static, f: impl FnOnce() -> R) -> R {
    let mr = into_shared(mr);
    let _scope = Installed::new(mr.properties().device, &mr);
    f()
}

/// The future of [`with_resource`]: `future`, polled with a resource installed as the current
/// resource of its device.
///
/// # Cancel safety
/// Dropping it drops the inner future (outside the scope); the scope leaves nothing behind.
///
/// # Examples
///
/// ```
/// use streamalloc::*;
///
/// let device = Device::host_with(HostConfig::default());
/// let scoped = with_resource(ManagedResource::new(&device).unwrap(), async {
///     current_device_resource_for(&device)
/// });
/// assert_eq!(scoped.resource().properties().device, device.id());
/// let mr = futures::executor::block_on(scoped);
/// assert!(mr.is_equal(&ManagedResource::new(&device).unwrap()));
/// ```
#[pin_project]
#[must_use = "futures do nothing unless polled"]
pub struct WithResource<F> {
    device: DeviceId,
    mr: SharedResource,
    #[pin]
    future: F,
}

impl<F> WithResource<F> {
    /// The resource installed while the future is polled.
    ///
    /// ```
    /// use streamalloc::*;
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// let scoped = with_resource(CudaResource::new(&device).unwrap(), async {});
    /// assert!(scoped.resource().is_equal(&CudaResource::new(&device).unwrap()));
    /// ```
    pub fn resource(&self) -> &SharedResource {
        &self.mr
    }
}

impl<F: Future> Future for WithResource<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _scope = Installed::new(*this.device, this.mr);
        this.future.poll(cx)
    }
}

impl<F> fmt::Debug for WithResource<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithResource")
            .field("device", &self.device)
            .field("resource", &self.mr)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
