//! The typed vector itself: its accessors, views, copies and conversions; making one and
//! changing its size are in [`new_vec`](super::new_vec).

use std::fmt;
use std::marker::PhantomData;
use std::mem::{align_of, size_of};
use std::ops::RangeBounds;

use bytemuck::Pod;

use super::view::{VecView, VecViewMut};
use crate::buffer::byte_range::checked_range;
use crate::buffer::device_buffer::DeviceBuffer;
use crate::buffer::guard::ReadGuard;
use crate::buffer::host_copy::{CopyFromHost, CopyFromSlice, CopyToHost, CopyToSlice, HostBuffer};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::{DevicePtr, SharedResource};
use crate::stream::Stream;

/// A typed array of `T` in device memory, freed stream-ordered (RMM's `device_uvector`).
///
/// Like `device_uvector` it is uninitialised on allocation ([`new`](DeviceVec::new),
/// [`try_new`](DeviceVec::try_new)): write it ([`copy_from_host`](DeviceVec::copy_from_host), a
/// kernel) before reading, or make it with [`zeroed`](DeviceVec::zeroed) or
/// [`from_host`](DeviceVec::from_host). It is a [`DeviceBuffer`] of `len * size_of::<T>()`
/// bytes underneath ([`as_buffer`](DeviceVec::as_buffer)), so it has the buffer's owner stream,
/// hand-off ([`set_stream`](DeviceVec::set_stream)), read tracking
/// ([`read_on`](DeviceVec::read_on)) and stream-ordered drop.
///
/// # Why `T: Pod`
/// Device memory starts uninitialised and kernels write raw bytes into it, so every bit pattern
/// must be a valid `T` (no `bool`, `char`, enums or references), and copies move bytes, so `T`
/// must have no padding and no drop glue. That is exactly [`bytemuck::Pod`]. cudarc's
/// `DeviceRepr + ValidAsZeroBits` is weaker: it admits `bool`, whose reads after a kernel
/// wrote any other byte would be undefined behaviour. Zero-sized types are refused with an
/// error.
///
/// # Stream ordering
/// As [`DeviceBuffer`]'s: the vector's operations are enqueued on its owner; other streams
/// read it inside [`read_on`](DeviceVec::read_on) and write it after
/// [`set_stream`](DeviceVec::set_stream); drop frees it on the owner after every recorded read.
///
/// # Errors
/// Element counts whose byte size overflows `usize`, zero-sized `T` and out-of-bounds ranges are
/// [`Error::InvalidArgument`] naming the numbers; nothing panics and nothing is allocated then.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceVec, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
/// let mut v = DeviceVec::<f32>::from_host(vec![1.0, 2.0, 3.0], &a, CudaResource::new(&device)?).await?;
/// v.set_stream(&b)?;                                 // `b` waits for `a`'s work on `v`
/// assert_eq!(v.to_vec().await?, [1.0, 2.0, 3.0]);    // copied on `b`
/// assert_eq!(v.slice(1..)?.to_vec().await?, [2.0, 3.0]);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[repr(transparent)]
pub struct DeviceVec<T: Pod> {
    /// `buf.len()` is a multiple of `size_of::<T>()` (never 0), and `buf.ptr` is aligned for
    /// `T`.
    buf: DeviceBuffer,
    _elem: PhantomData<T>,
}

impl<T: Pod> DeviceVec<T> {
    #[inline]
    pub(super) fn wrap(mut buf: DeviceBuffer) -> Self {
        debug_assert!(
            size_of::<T>() == 0
                || buf.len() % size_of::<T>() == 0 && buf.ptr.is_aligned(align_of::<T>())
        );
        // Reallocations (resize, reserve, a clone) keep the buffer's alignment: make it `T`'s
        // where `T` is aligned above the allocation alignment.
        buf.alignment = buf.alignment.max(align_of::<T>());
        DeviceVec {
            buf,
            _elem: PhantomData,
        }
    }

    /// The number of elements.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<u16>::try_new(5, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.len(), 5);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        // A zero-sized `T` is refused by every constructor but `Default` (empty).
        self.buf.len().checked_div(size_of::<T>()).unwrap_or(0)
    }

    /// True when the vector holds no element.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// assert!(DeviceVec::<u16>::try_new(0, &stream, CudaResource::new(&device)?)?.is_empty());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The number of elements the allocation holds; at least [`len`](DeviceVec::len).
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<u32>::new(8, &stream, CudaResource::new(&device)?).await?;
    /// v.resize(2).await?;
    /// assert_eq!((v.len(), v.capacity()), (2, 8));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn capacity(&self) -> usize {
        self.buf.capacity().checked_div(size_of::<T>()).unwrap_or(0)
    }

    /// The address of the first element (null for an empty vector of most resources).
    ///
    /// Work you enqueue through it is yours to order, as for [`DeviceBuffer::ptr`].
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<f32>::try_new(16, &stream, CudaResource::new(&device)?)?;
    /// assert!(v.ptr().is_aligned(256));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn ptr(&self) -> DevicePtr {
        self.buf.ptr()
    }

    /// The stream that owns the vector: its operations are enqueued there and it frees it.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<f32>::try_new(16, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.stream(), stream);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn stream(&self) -> Stream {
        self.buf.stream()
    }

    /// Hands the vector to `stream`, as [`DeviceBuffer::set_stream`]: `stream` waits for the
    /// old owner's work and every recorded read, then owns the vector.
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::set_stream`].
    ///
    /// # Errors
    /// As [`DeviceBuffer::set_stream`]: [`Error::DeviceMismatch`] for a stream of another
    /// device (use a copy to move data between devices).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let mut v = DeviceVec::<u8>::new(4, &a, CudaResource::new(&device)?).await?;
    /// a.enqueue_delay(Duration::from_millis(20))?;        // a slow "kernel" on `a`
    /// let _ = v.copy_from_host(vec![1, 2, 3, 4]);         // enqueued on `a` after it
    /// v.set_stream(&b)?;
    /// assert_eq!(v.to_vec().await?, [1, 2, 3, 4]);        // `b` waited for `a`
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn set_stream(&mut self, stream: &Stream) -> Result<()> {
        self.buf.set_stream(stream)
    }

    /// The device the memory belongs to.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<f32>::try_new(16, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.device(), &device);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn device(&self) -> &Device {
        self.buf.device()
    }

    /// The resource the memory came from, which frees it.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, MemoryResource, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<f32>::try_new(16, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.resource().properties().device, device.id());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn resource(&self) -> &SharedResource {
        self.buf.resource()
    }

    /// Starts a read of the vector on `stream`, as [`DeviceBuffer::read_on`]; the guard's
    /// [`len`](ReadGuard::len) is in bytes.
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::read_on`].
    ///
    /// # Errors
    /// As [`DeviceBuffer::read_on`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let v = DeviceVec::<f32>::try_new(16, &owner, CudaResource::new(&device)?)?;
    /// let read = v.read_on(&reader)?;
    /// assert_eq!((read.ptr(), read.len()), (v.ptr(), 64));
    /// // ... a kernel on `reader` reads `read.ptr()` ...
    /// drop(read);
    /// drop(v); // freed on `owner` after `reader` has passed the read
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn read_on(&self, stream: &Stream) -> Result<ReadGuard<'_>> {
        self.buf.read_on(stream)
    }

    /// The vector's bytes as a [`DeviceBuffer`].
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<f32>::try_new(16, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.as_buffer().len(), 64);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn as_buffer(&self) -> &DeviceBuffer {
        &self.buf
    }

    /// The underlying buffer, mutably, for crate code that hands it off or writes it (kernel
    /// launches). Its length must stay a multiple of `size_of::<T>()`.
    #[allow(dead_code)] // used by the interop and host-kernel modules
    pub(crate) fn buffer_mut(&mut self) -> &mut DeviceBuffer {
        &mut self.buf
    }

    /// Gives up the typing: the vector's bytes as a [`DeviceBuffer`].
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<u64>::try_new(2, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.into_buffer().len(), 16);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn into_buffer(self) -> DeviceBuffer {
        self.buf
    }

    /// A view of the elements `range` (`..`, `a..b`, `a..=b`, ...), carrying the vector's
    /// tracking: its copies are enqueued on the owner and read only the range.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the range and the length when the range is reversed or
    /// ends past [`len`](DeviceVec::len).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::from_host(vec![0u32, 1, 2, 3, 4], &stream, CudaResource::new(&device)?).await?;
    /// let mid = v.slice(1..4)?;
    /// assert_eq!((mid.len(), mid.ptr()), (3, v.ptr().offset(4)));
    /// assert_eq!(mid.to_vec().await?, [1, 2, 3]);
    /// assert!(v.slice(3..9).is_err());
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<VecView<'_, T>> {
        let range = checked_range(range, self.len(), "elements")?;
        Ok(VecView::new(&self.buf, range))
    }

    /// A mutable view of the elements `range`: its writes are enqueued on the owner, after the
    /// recorded reads, and touch only the range.
    ///
    /// # Errors
    /// As [`slice`](DeviceVec::slice).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<u32>::zeroed(5, &stream, CudaResource::new(&device)?).await?;
    /// v.slice_mut(3..)?.copy_from_host(vec![7, 8]).await?;
    /// assert_eq!(v.to_vec().await?, [0, 0, 0, 7, 8]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<VecViewMut<'_, T>> {
        let range = checked_range(range, self.len(), "elements")?;
        Ok(VecViewMut::new(&mut self.buf, range))
    }

    /// Copies the elements into the start of `host` (at least [`len`](DeviceVec::len) long) on
    /// the owner; the future hands `host` back when the copy is done.
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::copy_to_host`]: enqueued on the owner when called.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] (in elements) when `host` is shorter than the vector; driver
    /// errors.
    ///
    /// # Cancel safety
    /// As [`CopyToHost`]: dropping or forgetting the future never frees
    /// host memory under the copy.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::from_host(vec![1.5f64, 2.5], &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(v.copy_to_host(vec![0.0; 3]).await?, [1.5, 2.5, 0.0]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_to_host<B: HostBuffer<Elem = T>>(&self, host: B) -> CopyToHost<B> {
        self.whole().copy_to_host(host)
    }

    /// Copies the elements into the start of the borrowed `host`, staged through owned memory
    /// (so forgetting the future cannot leave the device writing into `host`).
    ///
    /// # Stream ordering
    /// As [`copy_to_host`](DeviceVec::copy_to_host).
    ///
    /// # Errors
    /// As [`copy_to_host`](DeviceVec::copy_to_host).
    ///
    /// # Cancel safety
    /// As [`CopyToSlice`]: `host` is written only when the future resolves.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::from_host_slice(&[1u32, 2], &stream, CudaResource::new(&device)?).await?;
    /// let mut out = [0u32; 2];
    /// v.copy_to_host_slice(&mut out).await?;
    /// assert_eq!(out, [1, 2]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_to_host_slice<'h>(&self, host: &'h mut [T]) -> CopyToSlice<'h> {
        self.whole().copy_to_host_slice(host)
    }

    /// The whole vector as a view.
    fn whole(&self) -> VecView<'_, T> {
        VecView::new(&self.buf, 0..self.len())
    }

    /// Copies all of `host` (at most [`len`](DeviceVec::len) elements) into the start of the
    /// vector on the owner; the future hands `host` back when the copy is done.
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::copy_from_host`]: enqueued on the owner when called, after every
    /// recorded read; work enqueued on the owner afterwards sees the new elements.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] (in elements) when `host` is longer than the vector; driver
    /// errors.
    ///
    /// # Cancel safety
    /// As [`CopyFromHost`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<i32>::zeroed(3, &stream, CudaResource::new(&device)?).await?;
    /// v.copy_from_host(vec![-1, -2]).await?;
    /// assert_eq!(v.to_vec().await?, [-1, -2, 0]);
    /// assert!(v.copy_from_host(vec![0; 4]).await.is_err()); // longer than the vector
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_from_host<B: HostBuffer<Elem = T>>(&mut self, host: B) -> CopyFromHost<B> {
        self.whole_mut().copy_from_host(host)
    }

    /// Copies all of the borrowed `host` (at most [`len`](DeviceVec::len) elements) into the
    /// start of the vector, staged through owned memory (so `host` may be dropped as soon as
    /// this returns).
    ///
    /// # Stream ordering
    /// As [`copy_from_host`](DeviceVec::copy_from_host).
    ///
    /// # Errors
    /// As [`copy_from_host`](DeviceVec::copy_from_host).
    ///
    /// # Cancel safety
    /// As [`CopyFromSlice`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<f32>::zeroed(3, &stream, CudaResource::new(&device)?).await?;
    /// v.copy_from_host_slice(&[0.5, 1.5]).await?;
    /// assert_eq!(v.to_vec().await?, [0.5, 1.5, 0.0]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_from_host_slice(&mut self, host: &[T]) -> CopyFromSlice {
        self.whole_mut().copy_from_host_slice(host)
    }

    /// The whole vector as a mutable view.
    fn whole_mut(&mut self) -> VecViewMut<'_, T> {
        let len = self.len();
        VecViewMut::new(&mut self.buf, 0..len)
    }

    /// The elements, copied into a new `Vec` on the owner.
    ///
    /// # Stream ordering
    /// As [`copy_to_host`](DeviceVec::copy_to_host).
    ///
    /// # Errors
    /// Driver errors.
    ///
    /// # Cancel safety
    /// As [`copy_to_host`](DeviceVec::copy_to_host).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::from_host(vec![3u16; 4], &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(v.to_vec().await?, vec![3u16; 4]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn to_vec(&self) -> CopyToHost<Vec<T>>
    where
        T: Send,
    {
        self.whole().to_vec()
    }

    /// A copy of the vector in new memory from the same resource, made on the owner.
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::try_clone`].
    ///
    /// # Errors
    /// As [`DeviceBuffer::try_clone`].
    ///
    /// # Cancel safety
    /// As [`DeviceBuffer::try_clone`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::from_host(vec![1u8, 2], &stream, CudaResource::new(&device)?).await?;
    /// let w = v.try_clone().await?;
    /// assert_ne!(v.ptr(), w.ptr());
    /// assert_eq!(w.to_vec().await?, [1, 2]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn try_clone(&self) -> Result<Self> {
        Ok(Self::wrap(self.buf.try_clone().await?))
    }
}

impl<T: Pod> TryFrom<DeviceBuffer> for DeviceVec<T> {
    type Error = Error;

    /// As [`DeviceVec::from_buffer`].
    fn try_from(buf: DeviceBuffer) -> Result<Self> {
        Self::from_buffer(buf)
    }
}

impl<T: Pod> From<DeviceVec<T>> for DeviceBuffer {
    fn from(v: DeviceVec<T>) -> Self {
        v.into_buffer()
    }
}

/// An empty vector that owns no memory, as [`DeviceBuffer::default`].
///
/// ```
/// use streamalloc::DeviceVec;
///
/// let v = DeviceVec::<f32>::default();
/// assert!(v.is_empty());
/// ```
impl<T: Pod> Default for DeviceVec<T> {
    fn default() -> Self {
        Self::wrap(DeviceBuffer::default())
    }
}

impl<T: Pod> fmt::Debug for DeviceVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceVec")
            .field("elem", &std::any::type_name::<T>())
            .field("len", &self.len())
            .field("buffer", &self.buf)
            .finish()
    }
}
