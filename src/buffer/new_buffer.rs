//! Making a buffer: allocation from a resource (awaited or not), a larger alignment, and
//! adoption of memory allocated elsewhere.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use super::device_buffer::DeviceBuffer;
use super::uses::Uses;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::{
    check_resource, held, into_shared, try_without_waiting, DevicePtr, MemoryResource,
    SharedResource, ALLOCATION_ALIGNMENT,
};
use crate::stream::Stream;

impl DeviceBuffer {
    /// Allocates `bytes` from `mr` for use on `stream`, which owns the buffer. The contents are
    /// uninitialised (as RMM's; on the host backend they are zeroed).
    ///
    /// The returned [`NewBuffer`] is a builder future, awaited as it is or after a
    /// [`timeout`](NewBuffer::timeout) / [`deadline`](NewBuffer::deadline). It completes on the
    /// first poll when memory is there, and waits for memory when a bounded resource is
    /// exhausted, as [`MemoryResource::allocate`] does.
    ///
    /// # Stream ordering
    /// The memory is valid for work on `stream` enqueued from now on.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] and the other errors of the resource;
    /// [`Error::DeviceMismatch`] when `stream` is not on the resource's device;
    /// [`Error::Timeout`] (naming the size and the device) when a deadline passes first.
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves leaves nothing allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::new(1000, &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!((buf.len(), buf.capacity()), (1000, 1000));
    /// assert_eq!(buf.stream(), stream);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    // A builder future of `Self`, as `allocate` is of a pointer: the name users look for.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(bytes: usize, stream: &Stream, mr: impl MemoryResource + 'static) -> NewBuffer<'_> {
        NewBuffer::new(bytes, ALLOCATION_ALIGNMENT, stream, into_shared(mr))
    }

    /// Allocates `bytes` from `mr` for use on `stream` without waiting for memory: the
    /// synchronous fast path of [`new`](DeviceBuffer::new).
    ///
    /// # Stream ordering
    /// As [`new`](DeviceBuffer::new).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the memory is not there now; the other errors of the
    /// resource; [`Error::DeviceMismatch`] when `stream` is not on the resource's device.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, HostConfig, Stream};
    ///
    /// let device = Device::host_with(HostConfig::default().capacity(1 << 20));
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaResource::new(&device)?;
    /// let buf = DeviceBuffer::try_new(4096, &stream, mr.clone())?;
    /// assert_eq!(buf.len(), 4096);
    /// assert!(DeviceBuffer::try_new(2 << 20, &stream, mr).unwrap_err().is_out_of_memory());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn try_new(
        bytes: usize,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<DeviceBuffer> {
        let mr = shared_for(mr, stream)?;
        let ptr = mr.try_allocate(bytes, stream)?;
        Ok(Self::from_parts(ptr, bytes, mr, stream))
    }

    /// Allocates `bytes` for use on `stream` from the current resource of the stream's device
    /// ([`current_device_resource_for`](crate::current_device_resource_for)).
    ///
    /// # Stream ordering
    /// As [`new`](DeviceBuffer::new).
    ///
    /// # Errors
    /// As [`new`](DeviceBuffer::new).
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves leaves nothing allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{Device, DeviceBuffer, HostConfig, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host_with(HostConfig::default());
    /// let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::with_current_resource(512, &stream).await?;
    /// assert_eq!(buf.len(), 512);
    /// assert_eq!(device.host_controls().unwrap().allocated_bytes(), 512);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn with_current_resource(bytes: usize, stream: &Stream) -> NewBuffer<'_> {
        let mr = crate::resource::defaults::registry::current_device_resource_for(stream.device());
        NewBuffer::new(bytes, ALLOCATION_ALIGNMENT, stream, mr)
    }

    pub(super) fn from_parts(
        ptr: DevicePtr,
        bytes: usize,
        mr: SharedResource,
        stream: &Stream,
    ) -> Self {
        DeviceBuffer {
            ptr,
            len: bytes,
            capacity: bytes,
            base: ptr,
            allocated: bytes,
            alignment: ALLOCATION_ALIGNMENT,
            mr,
            device: stream.device().clone(),
            uses: Uses::new(stream.clone()),
        }
    }

    /// Allocates `bytes` from `mr` for use on `stream` at an address that is a multiple of
    /// `alignment` (RMM's `device_buffer` with an alignment). Resizes keep the alignment.
    ///
    /// Alignments up to [`ALLOCATION_ALIGNMENT`] (256) are what every resource gives anyway.
    /// A larger one is reached by asking `mr` for `bytes + alignment - 256` bytes and starting
    /// the buffer at the first aligned address inside them; the buffer remembers what it asked
    /// for and frees exactly that. A 0-byte buffer allocates nothing and has a null pointer.
    ///
    /// # Stream ordering
    /// As [`new`](DeviceBuffer::new).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `alignment` is not a power of two;
    /// [`Error::OutOfMemory`] when the padded size overflows `usize`, and the resource's errors
    /// (an out-of-memory error names the padded size); [`Error::DeviceMismatch`] when `stream`
    /// is not on the resource's device.
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves leaves nothing allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaResource::new(&device)?;
    /// let mut buf = DeviceBuffer::with_alignment(1000, 4096, &stream, mr.clone()).await?;
    /// assert!(buf.ptr().is_aligned(4096));
    /// assert_eq!((buf.len(), buf.alignment()), (1000, 4096));
    /// buf.resize(1 << 20).await?;                   // reallocated, still aligned
    /// assert!(buf.ptr().is_aligned(4096));
    /// assert!(DeviceBuffer::with_alignment(8, 3000, &stream, mr).await.is_err());
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn with_alignment(
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> NewBuffer<'_> {
        match checked_alignment(alignment) {
            Ok(alignment) => NewBuffer::new(bytes, alignment, stream, into_shared(mr)),
            Err(e) => NewBuffer::failed(e, stream),
        }
    }

    pub(super) async fn from_shared_aligned(
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        mr: SharedResource,
    ) -> Result<Self> {
        NewBuffer::new(bytes, alignment, stream, mr).await
    }

    /// [`with_alignment`](DeviceBuffer::with_alignment) without waiting for memory: the
    /// synchronous fast path.
    ///
    /// # Stream ordering
    /// As [`new`](DeviceBuffer::new).
    ///
    /// # Errors
    /// As [`with_alignment`](DeviceBuffer::with_alignment); [`Error::OutOfMemory`] also when
    /// the memory is not there now.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Error, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaResource::new(&device)?;
    /// let buf = DeviceBuffer::try_with_alignment(100, 1 << 16, &stream, mr.clone())?;
    /// assert!(buf.ptr().is_aligned(1 << 16));
    /// let odd = DeviceBuffer::try_with_alignment(100, 384, &stream, mr);
    /// assert!(matches!(odd, Err(Error::InvalidArgument(_))));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn try_with_alignment(
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<DeviceBuffer> {
        let mr = shared_for(mr, stream)?;
        let alignment = checked_alignment(alignment)?;
        let allocated = padded_size(bytes, alignment, stream.device())?;
        let base = mr.try_allocate(allocated, stream)?;
        Self::from_aligned(base, allocated, bytes, alignment, mr, stream)
    }

    /// A buffer of `bytes` at the first `alignment`-aligned address of the allocation `base`
    /// (`allocated` bytes from `mr` on `stream`). Frees the allocation on failure.
    fn from_aligned(
        base: DevicePtr,
        allocated: usize,
        bytes: usize,
        alignment: usize,
        mr: SharedResource,
        stream: &Stream,
    ) -> Result<Self> {
        let Some(ptr) = aligned_start(base, allocated, bytes, alignment) else {
            // SAFETY: allocated just now from `mr` with this size on `stream`; unused.
            unsafe { mr.deallocate(base, allocated, stream) };
            return Err(misaligned(base, mr.as_ref()));
        };
        let mut buf = Self::from_parts(ptr, bytes, mr, stream);
        buf.base = base;
        buf.allocated = allocated;
        buf.alignment = alignment;
        Ok(buf)
    }

    /// Adopts memory allocated elsewhere: the buffer owns `bytes` at `ptr`, is owned by
    /// `stream`, and frees them through `mr` (RMM's `device_buffer` over adopted memory).
    ///
    /// # Stream ordering
    /// The buffer's operations and its free are enqueued on `stream`, which must already be
    /// ordered after every earlier use of the memory (Safety, 3).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when `stream` is not on `mr`'s device. The memory is then
    /// not adopted: it stays the caller's to free.
    ///
    /// # Safety
    /// 1. `ptr` was returned by `try_allocate(bytes, ..)` (or `allocate`) of `mr` (or a clone
    ///    of it), with exactly this `bytes`, and is not deallocated yet.
    /// 2. Nothing else frees it: from a successful return on, the buffer does (on drop,
    ///    stream-ordered on its owner).
    /// 3. All work that uses the memory so far is ordered before this point of `stream`.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, MemoryResource, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaResource::new(&device)?;
    /// let p = mr.try_allocate(64, &stream)?;
    /// // SAFETY: `p` is 64 bytes from `mr`, used by nothing, freed by nobody else.
    /// let mut buf = unsafe { DeviceBuffer::from_raw_parts(p, 64, &stream, mr)? };
    /// buf.fill(1)?;
    /// assert_eq!(buf.copy_to_host(vec![0u8; 64]).await?, vec![1; 64]);
    /// drop(buf);                                        // frees `p` on `stream`
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub unsafe fn from_raw_parts(
        ptr: DevicePtr,
        bytes: usize,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<DeviceBuffer> {
        let mr = shared_for(mr, stream)?;
        Ok(Self::from_parts(ptr, bytes, mr, stream))
    }
}

/// `mr` type-erased, once it is checked to allocate on `stream`'s device.
pub(super) fn shared_for(
    mr: impl MemoryResource + 'static,
    stream: &Stream,
) -> Result<SharedResource> {
    let mr = into_shared(mr);
    check_resource(&*mr, stream, "a buffer's resource and its stream")?;
    Ok(mr)
}

/// `alignment` when it is a power of two, raised to [`ALLOCATION_ALIGNMENT`], which every
/// resource gives.
pub(super) fn checked_alignment(alignment: usize) -> Result<usize> {
    if !alignment.is_power_of_two() {
        return Err(Error::invalid(format!(
            "a buffer alignment must be a power of two, not {alignment}"
        )));
    }
    Ok(alignment.max(ALLOCATION_ALIGNMENT))
}

/// The bytes to ask a resource for so that `bytes` fit at an `alignment`-aligned address of
/// its 256-aligned block: `bytes` plus `alignment - 256`. 0 bytes need no block at all.
pub(super) fn padded_size(bytes: usize, alignment: usize, device: &Device) -> Result<usize> {
    if bytes == 0 {
        return Ok(0);
    }
    let padding = alignment.saturating_sub(ALLOCATION_ALIGNMENT);
    // A size past `usize` could never be allocated: out of memory, as `AlignedAdaptor` says.
    bytes.checked_add(padding).ok_or(Error::OutOfMemory {
        details: None,
        requested: bytes,
        available: None,
        device: device.id(),
    })
}

/// The first `alignment`-aligned address of the block `base..base + allocated` with room for
/// `bytes` before its end; `None` when there is none (a resource that broke the 256-byte
/// alignment contract).
pub(super) fn aligned_start(
    base: DevicePtr,
    allocated: usize,
    bytes: usize,
    alignment: usize,
) -> Option<DevicePtr> {
    if allocated == 0 {
        return Some(base);
    }
    let align = alignment as u64;
    let start = base.addr().checked_next_multiple_of(align)?;
    let end = base.addr().checked_add(allocated as u64)?;
    (start.checked_add(bytes as u64)? <= end).then_some(DevicePtr::from_raw(start))
}

pub(super) fn misaligned(base: DevicePtr, mr: &dyn MemoryResource) -> Error {
    Error::invalid(format!(
        "{mr:?} returned {base}, which is not {ALLOCATION_ALIGNMENT}-byte aligned"
    ))
}

/// The future of [`DeviceBuffer::new`] (and of [`with_alignment`](DeviceBuffer::with_alignment)
/// and [`with_current_resource`](DeviceBuffer::with_current_resource)): a builder that takes a
/// [`timeout`](NewBuffer::timeout) or [`deadline`](NewBuffer::deadline) before it is awaited.
///
/// Its first poll is the synchronous fast path ([`MemoryResource::try_allocate`]), with no
/// allocation of its own. When the resource is out of memory, or other requests already wait on
/// it, it waits as [`MemoryResource::allocate`] does ([`Allocate`](crate::Allocate): by priority, FIFO within one, only
/// while memory may come back), in a future it boxes then.
///
/// # Errors
/// [`Error::TooLarge`] at once when the request is above the resource's
/// [`capacity_limit`](MemoryResource::capacity_limit); [`Error::OutOfMemory`] and the other
/// errors of the resource; [`Error::DeviceMismatch`] when the stream is not on the resource's
/// device; [`Error::Timeout`] when the deadline passes first
/// (it names the size and the device); [`Error::InvalidArgument`] for a bad alignment.
///
/// # Cancel safety
/// Dropping it before it resolves leaves nothing allocated and no waiter queued.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Error, LimitingAdaptor, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 1024);
/// let held = DeviceBuffer::new(1024, &stream, mr.clone()).await?;
/// let late = DeviceBuffer::new(256, &stream, mr).timeout(Duration::from_millis(10)).await;
/// let Err(e @ Error::Timeout { requested: 256, .. }) = late else { panic!("{late:?}") };
/// assert!(e.to_string().contains(&format!("256 bytes on {}", device.id())));
/// drop(held);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[must_use = "futures do nothing unless awaited"]
pub struct NewBuffer<'a> {
    stream: &'a Stream,
    state: NewState,
    deadline: Option<Instant>,
    priority: i32,
}

enum NewState {
    /// Not polled yet.
    Start(Request),
    /// Waiting for memory: the boxed allocation future, the request it serves and the bytes it
    /// asks for (the request's size with its alignment padding).
    Waiting(BoxFuture<'static, Result<DevicePtr>>, Request, usize),
    /// Failed before it started (the error), or finished (`None`).
    Done(Option<Error>),
}

/// What a [`NewBuffer`] asks for.
struct Request {
    mr: SharedResource,
    /// Bytes of the buffer.
    bytes: usize,
    /// A power of two, at least [`ALLOCATION_ALIGNMENT`].
    alignment: usize,
}

impl<'a> NewBuffer<'a> {
    pub(crate) fn new(
        bytes: usize,
        alignment: usize,
        stream: &'a Stream,
        mr: SharedResource,
    ) -> Self {
        debug_assert!(alignment.is_power_of_two() && alignment >= ALLOCATION_ALIGNMENT);
        NewBuffer {
            stream,
            state: NewState::Start(Request {
                mr,
                bytes,
                alignment,
            }),
            deadline: None,
            priority: 0,
        }
    }

    /// A future that resolves to `error`.
    pub(crate) fn failed(error: Error, stream: &'a Stream) -> Self {
        NewBuffer {
            stream,
            state: NewState::Done(Some(error)),
            deadline: None,
            priority: 0,
        }
    }

    /// Serves this request before waiting requests of lower priority (higher first, default
    /// 0, arrival order within a priority), as [`Allocate::priority`](crate::Allocate::priority)
    /// does, whose policy it follows.
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::new(64, &stream, CudaResource::new(&device)?)
    ///     .priority(10)
    ///     .timeout(Duration::from_secs(1))
    ///     .await?;
    /// assert_eq!(buf.len(), 64);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    crate::builder::option_setters! {
        /// Gives up with [`Error::Timeout`] if the memory is not there by `deadline`.
        ///
        /// ```
        /// use std::time::{Duration, Instant};
        /// use streamalloc::{CudaResource, Device, DeviceBuffer, LimitingAdaptor, Stream};
        ///
        /// # futures::executor::block_on(async {
        /// let device = Device::host();
        /// let stream = Stream::new(&device)?;
        /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 1024);
        /// let _held = DeviceBuffer::new(1024, &stream, mr.clone()).await?;
        /// let soon = Instant::now() + Duration::from_millis(10);
        /// let late = DeviceBuffer::new(512, &stream, mr).deadline(soon).await;
        /// assert!(matches!(late, Err(streamalloc::Error::Timeout { requested: 512, .. })));
        /// # Ok::<(), streamalloc::Error>(())
        /// # }).unwrap();
        /// ```
        fn deadline(deadline: Instant) => deadline;
    }

    /// Gives up with [`Error::Timeout`] if the memory is not there within `timeout`, counted
    /// from this call.
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::new(64, &stream, CudaResource::new(&device)?)
    ///     .timeout(Duration::from_secs(1))
    ///     .await?;                                  // memory is there: no wait at all
    /// assert_eq!(buf.len(), 64);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn timeout(self, timeout: Duration) -> Self {
        self.deadline(Instant::now() + timeout)
    }

    /// The buffer over `base`, the allocation of `allocated` bytes made for `request`.
    fn finish(&self, base: DevicePtr, allocated: usize, request: Request) -> Result<DeviceBuffer> {
        let Request {
            mr,
            bytes,
            alignment,
        } = request;
        if alignment == ALLOCATION_ALIGNMENT {
            return Ok(DeviceBuffer::from_parts(base, bytes, mr, self.stream));
        }
        DeviceBuffer::from_aligned(base, allocated, bytes, alignment, mr, self.stream)
    }
}

impl Future for NewBuffer<'_> {
    type Output = Result<DeviceBuffer>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<DeviceBuffer>> {
        let this = &mut *self;
        match std::mem::replace(&mut this.state, NewState::Done(None)) {
            NewState::Done(error) => {
                Poll::Ready(Err(error.expect("a NewBuffer polled after completion")))
            }
            NewState::Start(request) => {
                if let Err(e) = check_resource(
                    &*request.mr,
                    this.stream,
                    "a buffer's resource and its stream",
                ) {
                    return Poll::Ready(Err(e));
                }
                let allocated =
                    match padded_size(request.bytes, request.alignment, this.stream.device()) {
                        Ok(n) => n,
                        Err(e) => return Poll::Ready(Err(e)),
                    };
                // The fast path, unless others wait already (those of equal or higher priority
                // go first; `allocate` passes the others).
                let queued = request.mr.availability().is_some_and(|a| a.has_waiters());
                if !queued {
                    if let Some(done) = try_without_waiting(&*request.mr, allocated, this.stream) {
                        let done = held(&*request.mr, allocated, done);
                        return Poll::Ready(
                            done.and_then(|base| this.finish(base, allocated, request)),
                        );
                    }
                }
                // Wait as `allocate` does (it tries once more first, in case memory came back
                // meanwhile).
                let (mr, stream, deadline, priority) = (
                    request.mr.clone(),
                    this.stream.clone(),
                    this.deadline,
                    this.priority,
                );
                let mut wait: BoxFuture<'static, Result<DevicePtr>> = Box::pin(async move {
                    let allocate = mr.allocate(allocated, &stream).priority(priority);
                    match deadline {
                        Some(d) => allocate.deadline(d).await,
                        None => allocate.await,
                    }
                });
                match wait.as_mut().poll(cx) {
                    Poll::Pending => {
                        this.state = NewState::Waiting(wait, request, allocated);
                        Poll::Pending
                    }
                    Poll::Ready(base) => Poll::Ready(this.finish(base?, allocated, request)),
                }
            }
            NewState::Waiting(mut wait, request, allocated) => {
                let Poll::Ready(base) = wait.as_mut().poll(cx) else {
                    this.state = NewState::Waiting(wait, request, allocated);
                    return Poll::Pending;
                };
                Poll::Ready(this.finish(base?, allocated, request))
            }
        }
    }
}

impl fmt::Debug for NewBuffer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("NewBuffer");
        if let NewState::Start(r) | NewState::Waiting(_, r, _) = &self.state {
            d.field("bytes", &r.bytes).field("alignment", &r.alignment);
        }
        d.field("stream", &self.stream.id())
            .field("waiting", &matches!(self.state, NewState::Waiting(..)))
            .field("deadline", &self.deadline)
            .field("priority", &self.priority)
            .finish()
    }
}
