//! Making a [`DeviceVec`]: element counts checked into bytes, the allocation (awaited through
//! [`NewVec`] or not), adoption of a buffer, and changes of its size.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::mem::{align_of, size_of};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytemuck::Pod;

use super::device_vec::DeviceVec;
use crate::buffer::device_buffer::DeviceBuffer;
use crate::buffer::host_copy::HostBuffer;
use crate::buffer::new_buffer::{shared_for, NewBuffer};
use crate::error::{Error, Result};
use crate::resource::{into_shared, MemoryResource, SharedResource, ALLOCATION_ALIGNMENT};
use crate::stream::Stream;

/// The bytes of `len` elements of `T`: an error for a zero-sized `T` and for a byte size past
/// `usize`.
#[inline]
pub(crate) fn elem_bytes<T>(len: usize) -> Result<usize> {
    let size = size_of::<T>();
    if size == 0 {
        return Err(zero_sized::<T>());
    }
    match len.checked_mul(size) {
        Some(bytes) => Ok(bytes),
        None => Err(overflow::<T>(len)),
    }
}

#[cold]
#[inline(never)]
fn overflow<T>(len: usize) -> Error {
    Error::invalid(format!(
        "{len} elements of {} ({} bytes each) overflow usize",
        std::any::type_name::<T>(),
        size_of::<T>()
    ))
}

#[cold]
#[inline(never)]
fn zero_sized<T>() -> Error {
    Error::invalid(format!(
        "device containers of the zero-sized type {} are not supported",
        std::any::type_name::<T>()
    ))
}

/// The alignment a vector of `T` keeps: `T`'s, at least [`ALLOCATION_ALIGNMENT`].
fn vec_alignment<T>() -> usize {
    align_of::<T>().max(ALLOCATION_ALIGNMENT)
}

impl<T: Pod> DeviceVec<T> {
    /// Allocates room for `len` elements from `mr` for use on `stream`, which owns the vector.
    /// The contents are uninitialised (on the host backend they are zeroed).
    ///
    /// The returned [`NewVec`] is a builder future, awaited as it is or after a
    /// [`timeout`](NewVec::timeout) / [`deadline`](NewVec::deadline); it waits for memory as
    /// [`DeviceBuffer::new`] does.
    ///
    /// # Stream ordering
    /// The memory is valid for work on `stream` enqueued from now on.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `len * size_of::<T>()` overflows or `T` is zero-sized;
    /// otherwise as [`DeviceBuffer::new`] ([`Error::Timeout`] names the size in bytes and the
    /// device).
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves leaves nothing allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaResource::new(&device)?;
    /// let v = DeviceVec::<u32>::new(1000, &stream, mr.clone()).await?;
    /// assert_eq!((v.len(), v.as_buffer().len()), (1000, 4000));
    /// let w = DeviceVec::<u64>::new(10, &stream, mr.clone()).timeout(Duration::from_secs(1)).await?;
    /// assert_eq!(w.len(), 10);
    /// assert!(DeviceVec::<u64>::new(usize::MAX / 4, &stream, mr).await.is_err()); // overflow
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    // A builder future of `Self`, as `allocate` is of a pointer: the name users look for.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(len: usize, stream: &Stream, mr: impl MemoryResource + 'static) -> NewVec<'_, T> {
        NewVec::new(len, stream, into_shared(mr), false)
    }

    /// Allocates room for `len` elements, all bytes zero (valid values: `T` is `Pod`). As
    /// [`new`](DeviceVec::new), with a memset enqueued on `stream` after the allocation.
    ///
    /// # Stream ordering
    /// The memset is enqueued on `stream`; work enqueued there afterwards sees zeros.
    ///
    /// # Errors
    /// As [`new`](DeviceVec::new); driver errors of the memset (the memory is then freed).
    ///
    /// # Cancel safety
    /// As [`new`](DeviceVec::new).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<i16>::zeroed(4, &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(v.to_vec().await?, [0; 4]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn zeroed(len: usize, stream: &Stream, mr: impl MemoryResource + 'static) -> NewVec<'_, T> {
        NewVec::new(len, stream, into_shared(mr), true)
    }

    /// Allocates room for `len` elements without waiting for memory: the synchronous fast
    /// path of [`new`](DeviceVec::new).
    ///
    /// # Stream ordering
    /// As [`new`](DeviceVec::new).
    ///
    /// # Errors
    /// As [`DeviceBuffer::try_new`]; [`Error::InvalidArgument`] when `len * size_of::<T>()`
    /// overflows or `T` is zero-sized.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceVec, Error, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaResource::new(&device)?;
    /// let v = DeviceVec::<f64>::try_new(0, &stream, mr.clone())?;   // zero length works
    /// assert!(v.is_empty());
    /// let e = DeviceVec::<f64>::try_new(usize::MAX, &stream, mr.clone()).unwrap_err();
    /// assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("overflow"));
    /// assert!(DeviceVec::<()>::try_new(1, &stream, mr).is_err()); // zero-sized: an error
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    #[inline]
    pub fn try_new(len: usize, stream: &Stream, mr: impl MemoryResource + 'static) -> Result<Self> {
        let bytes = elem_bytes::<T>(len)?;
        if align_of::<T>() > ALLOCATION_ALIGNMENT {
            return DeviceBuffer::try_with_alignment(bytes, align_of::<T>(), stream, mr)
                .map(Self::wrap);
        }
        // `DeviceBuffer::try_new` written out, so that the buffer is built in place rather than
        // moved out of one `Result` into another (measured: ~8 ns of a ~100 ns pair).
        let mr = shared_for(mr, stream)?;
        let ptr = mr.try_allocate(bytes, stream)?;
        Ok(Self::wrap(DeviceBuffer::from_parts(ptr, bytes, mr, stream)))
    }

    /// A vector of `host`'s elements on `stream`: allocates (waiting for memory as
    /// [`new`](DeviceVec::new) does) and copies `host` in — a `Vec<T>`, a `Box<[T]>` or a
    /// [`PinnedHostVec<T>`](crate::PinnedHostVec) — resolving once the copy is done (`host` is
    /// then dropped).
    ///
    /// # Stream ordering
    /// The copy is enqueued on `stream`, the owner.
    ///
    /// # Errors
    /// As [`new`](DeviceVec::new) and [`copy_from_host`](DeviceVec::copy_from_host).
    ///
    /// # Cancel safety
    /// Dropping the future frees what it allocated (stream-ordered, after the copy) and never
    /// frees `host` under the copy.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::from_host(vec![7u8, 8, 9], &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(v.to_vec().await?, [7, 8, 9]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn from_host<B: HostBuffer<Elem = T>>(
        host: B,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<Self> {
        let mut v = Self::new(host.elem_len(), stream, mr).await?;
        v.copy_from_host(host).await?;
        Ok(v)
    }

    /// A vector of the borrowed `host`'s elements on `stream`, as
    /// [`from_host`](DeviceVec::from_host); the elements are staged through owned memory.
    ///
    /// # Stream ordering
    /// As [`from_host`](DeviceVec::from_host).
    ///
    /// # Errors
    /// As [`from_host`](DeviceVec::from_host).
    ///
    /// # Cancel safety
    /// As [`from_host`](DeviceVec::from_host).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let data = [1.0f64, 2.0];
    /// let v = DeviceVec::from_host_slice(&data, &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(v.to_vec().await?, data);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn from_host_slice(
        host: &[T],
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<Self> {
        let mut v = Self::new(host.len(), stream, mr).await?;
        v.copy_from_host_slice(host).await?;
        Ok(v)
    }

    /// A vector over `buf`'s bytes, which become `buf.len() / size_of::<T>()` elements.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (and `buf` is dropped, freed stream-ordered) when its length
    /// is not a multiple of `size_of::<T>()`, its address is not aligned for `T`, or `T` is
    /// zero-sized.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mr = CudaResource::new(&device)?;
    /// let v = DeviceVec::<u32>::from_buffer(DeviceBuffer::try_new(16, &stream, mr.clone())?)?;
    /// assert_eq!(v.len(), 4);
    /// let odd = DeviceBuffer::try_new(10, &stream, mr)?;
    /// assert!(DeviceVec::<u32>::from_buffer(odd).is_err()); // 10 bytes are not whole u32s
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn from_buffer(buf: DeviceBuffer) -> Result<Self> {
        let size = size_of::<T>();
        if size == 0 {
            return Err(zero_sized::<T>());
        }
        if buf.len() % size != 0 {
            return Err(Error::invalid(format!(
                "DeviceVec<{}>::from_buffer: {} bytes are not a multiple of the element size {size}",
                std::any::type_name::<T>(),
                buf.len()
            )));
        }
        if !buf.ptr.is_aligned(align_of::<T>()) {
            return Err(Error::invalid(format!(
                "DeviceVec<{}>::from_buffer: the address {} is not aligned to {}",
                std::any::type_name::<T>(),
                buf.ptr,
                align_of::<T>()
            )));
        }
        Ok(Self::wrap(buf))
    }

    /// Changes the length to `new_len` elements, as [`DeviceBuffer::resize`]: past the capacity
    /// it reallocates on the owner and copies the elements over; new elements are
    /// uninitialised.
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::resize`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `new_len * size_of::<T>()` overflows; as
    /// [`DeviceBuffer::resize`] otherwise. The vector is then unchanged.
    ///
    /// # Cancel safety
    /// As [`DeviceBuffer::resize`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::from_host(vec![1u32, 2], &stream, CudaResource::new(&device)?).await?;
    /// v.resize(4).await?;
    /// assert_eq!(&v.to_vec().await?[..2], &[1, 2]);
    /// assert_eq!(v.len(), 4);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn resize(&mut self, new_len: usize) -> Result<()> {
        let bytes = elem_bytes::<T>(new_len)?;
        self.buffer_mut().resize(bytes).await
    }

    /// Makes the capacity at least `new_capacity` elements, keeping the elements, as
    /// [`DeviceBuffer::reserve`].
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::resize`].
    ///
    /// # Errors
    /// As [`resize`](DeviceVec::resize).
    ///
    /// # Cancel safety
    /// As [`DeviceBuffer::resize`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<u64>::new(1, &stream, CudaResource::new(&device)?).await?;
    /// v.reserve(100).await?;
    /// assert_eq!((v.len(), v.capacity()), (1, 100));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn reserve(&mut self, new_capacity: usize) -> Result<()> {
        let bytes = elem_bytes::<T>(new_capacity)?;
        self.buffer_mut().reserve(bytes).await
    }

    /// Reallocates to exactly [`len`](DeviceVec::len) elements when the capacity is larger, as
    /// [`DeviceBuffer::shrink_to_fit`].
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::resize`].
    ///
    /// # Errors
    /// As [`DeviceBuffer::resize`].
    ///
    /// # Cancel safety
    /// As [`DeviceBuffer::resize`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<u64>::new(100, &stream, CudaResource::new(&device)?).await?;
    /// v.resize(3).await?;
    /// v.shrink_to_fit().await?;
    /// assert_eq!((v.len(), v.capacity()), (3, 3));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn shrink_to_fit(&mut self) -> Result<()> {
        self.buffer_mut().shrink_to_fit().await
    }
}

/// The future of [`DeviceVec::new`] and [`DeviceVec::zeroed`]: a builder that takes a
/// [`timeout`](NewVec::timeout) or [`deadline`](NewVec::deadline) before it is awaited, as
/// [`NewBuffer`] does.
///
/// # Errors
/// As [`DeviceVec::new`].
///
/// # Cancel safety
/// Dropping it before it resolves leaves nothing allocated and no waiter queued.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamalloc::{CudaResource, Device, DeviceVec, Error, LimitingAdaptor, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 4096);
/// let _held = DeviceVec::<f32>::new(1024, &stream, mr.clone()).await?; // all 4096 bytes
/// let late = DeviceVec::<f32>::new(16, &stream, mr).timeout(Duration::from_millis(10)).await;
/// assert!(matches!(late, Err(Error::Timeout { requested: 64, .. }))); // 16 f32 = 64 bytes
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[must_use = "futures do nothing unless awaited"]
pub struct NewVec<'a, T: Pod> {
    inner: NewBuffer<'a>,
    zeroed: bool,
    _elem: PhantomData<fn() -> T>,
}

impl<'a, T: Pod> NewVec<'a, T> {
    fn new(len: usize, stream: &'a Stream, mr: SharedResource, zeroed: bool) -> Self {
        let inner = match elem_bytes::<T>(len) {
            Ok(bytes) => NewBuffer::new(bytes, vec_alignment::<T>(), stream, mr),
            Err(e) => NewBuffer::failed(e, stream),
        };
        NewVec {
            inner,
            zeroed,
            _elem: PhantomData,
        }
    }

    /// Gives up with [`Error::Timeout`] if the memory is not there by `deadline`.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let soon = Instant::now() + Duration::from_secs(1);
    /// let v = DeviceVec::<u8>::new(8, &stream, CudaResource::new(&device)?).deadline(soon).await?;
    /// assert_eq!(v.len(), 8);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.inner = self.inner.deadline(deadline);
        self
    }

    /// Gives up with [`Error::Timeout`] if the memory is not there within `timeout`, counted
    /// from this call.
    ///
    /// ```
    /// use std::time::Duration;
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<u8>::new(8, &stream, CudaResource::new(&device)?)
    ///     .timeout(Duration::from_secs(1))
    ///     .await?;
    /// assert_eq!(v.len(), 8);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.timeout(timeout);
        self
    }

    /// Serves this request before waiting requests of lower priority, as
    /// [`NewBuffer::priority`] does.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<u8>::new(8, &stream, CudaResource::new(&device)?).priority(-1).await?;
    /// assert_eq!(v.len(), 8);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn priority(mut self, priority: i32) -> Self {
        self.inner = self.inner.priority(priority);
        self
    }
}

impl<T: Pod> Future for NewVec<'_, T> {
    type Output = Result<DeviceVec<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<DeviceVec<T>>> {
        let mut buf = ready!(Pin::new(&mut self.inner).poll(cx))?;
        if self.zeroed {
            buf.fill(0)?;
        }
        Poll::Ready(Ok(DeviceVec::wrap(buf)))
    }
}

impl<T: Pod> fmt::Debug for NewVec<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewVec")
            .field("elem", &std::any::type_name::<T>())
            .field("inner", &self.inner)
            .field("zeroed", &self.zeroed)
            .finish()
    }
}
