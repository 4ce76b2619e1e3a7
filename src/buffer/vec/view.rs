//! Borrowed element ranges of a [`DeviceVec`](super::DeviceVec): [`VecView`] and
//! [`VecViewMut`], typed faces of the [`ByteRange`] core.

use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;
use std::ops::{Range, RangeBounds};

use bytemuck::Pod;

use crate::buffer::byte_range::{checked_range, ByteRange, ByteRangeMut};
use crate::buffer::device_buffer::DeviceBuffer;
use crate::buffer::host_copy::Unit;
use crate::buffer::host_copy::{CopyFromHost, CopyFromSlice, CopyToHost, CopyToSlice, HostBuffer};
use crate::device::Device;
use crate::error::Result;
use crate::resource::DevicePtr;
use crate::stream::Stream;

/// The extent accessors both views have (`len`, `is_empty`, `start`), written once; each
/// example makes its view with `$make` from a vector bound `let $binding v`.
macro_rules! view_extent {
    ($binding:literal, $make:literal) => {
        #[doc = concat!(
            "The number of elements in the view.\n\n```\n",
            "# use streamalloc::{CudaResource, Device, DeviceVec, Stream};\n",
            "# let device = Device::host();\n# let stream = Stream::new(&device)?;\n",
            "let ", $binding, "v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;\n",
            "assert_eq!(v.", $make, "(2..5)?.len(), 3);\n",
            "# Ok::<(), streamalloc::Error>(())\n```"
        )]
        pub fn len(&self) -> usize {
            self.len
        }

        #[doc = concat!(
            "True when the view holds no element.\n\n```\n",
            "# use streamalloc::{CudaResource, Device, DeviceVec, Stream};\n",
            "# let device = Device::host();\n# let stream = Stream::new(&device)?;\n",
            "let ", $binding, "v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;\n",
            "assert!(v.", $make, "(8..)?.is_empty());\n",
            "# Ok::<(), streamalloc::Error>(())\n```"
        )]
        pub fn is_empty(&self) -> bool {
            self.len == 0
        }

        #[doc = concat!(
            "The index of the view's first element in its vector.\n\n```\n",
            "# use streamalloc::{CudaResource, Device, DeviceVec, Stream};\n",
            "# let device = Device::host();\n# let stream = Stream::new(&device)?;\n",
            "let ", $binding, "v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;\n",
            "assert_eq!(v.", $make, "(2..)?.", $make, "(1..)?.start(), 3);\n",
            "# Ok::<(), streamalloc::Error>(())\n```"
        )]
        pub fn start(&self) -> usize {
            self.start
        }
    };
}

/// A borrowed range of a [`DeviceVec`](super::DeviceVec)'s elements, made by
/// [`DeviceVec::slice`](super::DeviceVec::slice). Its copies are enqueued on the vector's owner
/// and read only the range.
///
/// # Stream ordering
/// As the vector's. The view borrows the vector, so the vector cannot be written, handed on or
/// dropped while the view lives.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceVec, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let data: Vec<u32> = (0..100).collect();
/// let v = DeviceVec::from_host(data, &stream, CudaResource::new(&device)?).await?;
/// let tail = v.slice(90..)?;
/// assert_eq!(tail.len(), 10);
/// assert_eq!(tail.slice(8..)?.to_vec().await?, [98, 99]);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub struct VecView<'a, T: Pod> {
    /// The elements' bytes.
    bytes: ByteRange<'a>,
    /// First element; `start + len <= buf.len() / size_of::<T>()`.
    start: usize,
    len: usize,
    _elem: PhantomData<&'a [T]>,
}

impl<T: Pod> Clone for VecView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Pod> Copy for VecView<'_, T> {}

impl<'a, T: Pod> VecView<'a, T> {
    /// The core the view is a face of (for the host-kernel and interop modules).
    pub(crate) fn bytes(&self) -> &ByteRange<'a> {
        &self.bytes
    }

    /// A view of the elements `range` of `buf`, checked by the caller to be in bounds.
    #[inline]
    pub(crate) fn new(buf: &'a DeviceBuffer, range: Range<usize>) -> Self {
        let size = size_of::<T>();
        VecView {
            bytes: ByteRange::new(buf, range.start * size, range.len() * size),
            start: range.start,
            len: range.len(),
            _elem: PhantomData,
        }
    }

    /// The address of the view's first element.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.slice(2..)?.ptr(), v.ptr().offset(16));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn ptr(&self) -> DevicePtr {
        self.bytes.ptr()
    }

    view_extent!("", "slice");

    /// The whole vector's bytes, whose tracking the view carries.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.slice(2..)?.as_buffer().len(), 64);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn as_buffer(&self) -> &'a DeviceBuffer {
        self.bytes.buffer()
    }

    /// The vector's owner, on which the view's copies are enqueued.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.slice(..)?.stream(), stream);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn stream(&self) -> Stream {
        self.bytes.stream()
    }

    /// The device of the memory.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.slice(..)?.device(), &device);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn device(&self) -> &'a Device {
        self.bytes.device()
    }

    /// A view of the elements `range` of this view.
    ///
    /// # Errors
    /// As [`DeviceVec::slice`](super::DeviceVec::slice), against this view's length.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// let view = v.slice(2..6)?;
    /// assert_eq!(view.slice(1..3)?.start(), 3);
    /// assert!(view.slice(1..5).is_err());           // past the view's 4 elements
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<VecView<'a, T>> {
        let range = checked_range(range, self.len, "elements")?;
        Ok(VecView::new(
            self.bytes.buffer(),
            self.start + range.start..self.start + range.end,
        ))
    }

    /// Copies the view's elements into the start of `host` (at least [`len`](VecView::len)
    /// long) on the owner; only the view's bytes are read.
    ///
    /// # Stream ordering
    /// As [`DeviceVec::copy_to_host`](super::DeviceVec::copy_to_host).
    ///
    /// # Errors
    /// [`Error::LengthMismatch`](crate::Error::LengthMismatch) (in elements) when `host` is
    /// shorter than the view; driver errors.
    ///
    /// # Cancel safety
    /// As [`CopyToHost`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::from_host(vec![1i8, 2, 3], &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(v.slice(1..)?.copy_to_host(vec![0; 2]).await?, [2, 3]);
    /// assert!(v.slice(..)?.copy_to_host(vec![0; 2]).await.is_err()); // too short
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_to_host<B: HostBuffer<Elem = T>>(&self, host: B) -> CopyToHost<B> {
        self.bytes.copy_to_host(Unit::Elements, host)
    }

    /// Copies the view's elements into the start of the borrowed `host`, staged through owned
    /// memory (so forgetting the future cannot leave the device writing into `host`).
    ///
    /// # Stream ordering
    /// As [`copy_to_host`](VecView::copy_to_host).
    ///
    /// # Errors
    /// As [`copy_to_host`](VecView::copy_to_host).
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
    /// let v = DeviceVec::from_host(vec![1u16, 2, 3], &stream, CudaResource::new(&device)?).await?;
    /// let mut out = [0u16; 2];
    /// v.slice(1..)?.copy_to_host_slice(&mut out).await?;
    /// assert_eq!(out, [2, 3]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_to_host_slice<'h>(&self, host: &'h mut [T]) -> CopyToSlice<'h> {
        self.bytes.copy_to_host_slice(Unit::Elements, host)
    }

    /// The view's elements, copied into a new `Vec` on the owner.
    ///
    /// # Stream ordering
    /// As [`copy_to_host`](VecView::copy_to_host).
    ///
    /// # Errors
    /// Driver errors.
    ///
    /// # Cancel safety
    /// As [`copy_to_host`](VecView::copy_to_host).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = DeviceVec::from_host(vec![1u8, 2, 3], &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(v.slice(..2)?.to_vec().await?, [1, 2]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn to_vec(&self) -> CopyToHost<Vec<T>>
    where
        T: Send,
    {
        self.copy_to_host(vec![T::zeroed(); self.len])
    }
}

impl<T: Pod> fmt::Debug for VecView<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VecView")
            .field("elem", &std::any::type_name::<T>())
            .field("ptr", &self.bytes.addr())
            .field("start", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

/// A mutably borrowed range of a [`DeviceVec`](super::DeviceVec)'s elements, made by
/// [`DeviceVec::slice_mut`](super::DeviceVec::slice_mut). Its writes are enqueued on the
/// vector's owner after every recorded read, and touch only the range.
///
/// # Stream ordering
/// As the vector's.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceVec, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mut v = DeviceVec::<f32>::zeroed(4, &stream, CudaResource::new(&device)?).await?;
/// let mut head = v.slice_mut(..2)?;
/// head.copy_from_host(vec![1.0, 2.0]).await?;
/// assert_eq!(head.to_vec().await?, [1.0, 2.0]);
/// assert_eq!(v.to_vec().await?, [1.0, 2.0, 0.0, 0.0]);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub struct VecViewMut<'a, T: Pod> {
    /// The elements' bytes.
    bytes: ByteRangeMut<'a>,
    /// First element; `start + len <= buf.len() / size_of::<T>()`.
    start: usize,
    len: usize,
    _elem: PhantomData<&'a mut [T]>,
}

impl<'a, T: Pod> VecViewMut<'a, T> {
    /// The core the view is a face of (for the host-kernel and interop modules).
    pub(crate) fn bytes_mut(&mut self) -> &mut ByteRangeMut<'a> {
        &mut self.bytes
    }

    /// As [`bytes_mut`](VecViewMut::bytes_mut), shared.
    #[cfg_attr(not(feature = "cuda-driver"), allow(dead_code))]
    pub(crate) fn bytes(&self) -> &ByteRangeMut<'a> {
        &self.bytes
    }

    /// A view of the elements `range` of `buf`, checked by the caller to be in bounds.
    #[inline]
    pub(crate) fn new(buf: &'a mut DeviceBuffer, range: Range<usize>) -> Self {
        let size = size_of::<T>();
        VecViewMut {
            bytes: ByteRangeMut::new(buf, range.start * size, range.len() * size),
            start: range.start,
            len: range.len(),
            _elem: PhantomData,
        }
    }

    /// The same range, read-only.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// let view = v.slice_mut(2..4)?;
    /// assert_eq!((view.as_view().start(), view.as_view().len()), (2, 2));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn as_view(&self) -> VecView<'_, T> {
        VecView {
            bytes: self.bytes.as_range(),
            start: self.start,
            len: self.len,
            _elem: PhantomData,
        }
    }

    /// The address of the view's first element.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// let p = v.ptr();
    /// assert_eq!(v.slice_mut(2..)?.ptr(), p.offset(16));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn ptr(&self) -> DevicePtr {
        self.as_view().ptr()
    }

    view_extent!("mut ", "slice_mut");

    /// The vector's owner, on which the view's copies are enqueued.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.slice_mut(..)?.stream(), stream);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn stream(&self) -> Stream {
        self.bytes.as_range().stream()
    }

    /// The device of the memory.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(v.slice_mut(..)?.device(), &device);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn device(&self) -> &Device {
        self.bytes.as_range().device()
    }

    /// A mutable view of the elements `range` of this view (a reborrow).
    ///
    /// # Errors
    /// As [`DeviceVec::slice`](super::DeviceVec::slice), against this view's length.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<u64>::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// let mut view = v.slice_mut(2..6)?;
    /// assert_eq!(view.slice_mut(1..)?.start(), 3);
    /// assert!(view.slice_mut(..5).is_err());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<VecViewMut<'_, T>> {
        let range = checked_range(range, self.len, "elements")?;
        let size = size_of::<T>();
        Ok(VecViewMut {
            bytes: self.bytes.range_mut(range.start * size..range.end * size),
            start: self.start + range.start,
            len: range.len(),
            _elem: PhantomData,
        })
    }

    /// Copies the view's elements into the start of `host`, as
    /// [`VecView::copy_to_host`].
    ///
    /// # Stream ordering
    /// As [`VecView::copy_to_host`].
    ///
    /// # Errors
    /// As [`VecView::copy_to_host`].
    ///
    /// # Cancel safety
    /// As [`VecView::copy_to_host`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::from_host(vec![1u8, 2, 3], &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(v.slice_mut(2..)?.copy_to_host(vec![0]).await?, [3]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_to_host<B: HostBuffer<Elem = T>>(&self, host: B) -> CopyToHost<B> {
        self.as_view().copy_to_host(host)
    }

    /// Copies the view's elements into the start of the borrowed slice `dst`, staged through an
    /// owned host buffer: [`VecView::copy_to_host_slice`](crate::VecView::copy_to_host_slice)
    /// of [`as_view`](VecViewMut::as_view).
    ///
    /// # Stream ordering
    /// As [`VecView::copy_to_host_slice`](crate::VecView::copy_to_host_slice).
    ///
    /// # Errors
    /// The future resolves to [`Error::LengthMismatch`](crate::Error::LengthMismatch) (in
    /// elements) when `dst` is shorter than the view; driver errors.
    ///
    /// # Cancel safety
    /// As [`CopyToSlice`]: `dst` is written only when the future resolves.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::from_host(vec![1i64, 2, 3], &stream, CudaResource::new(&device)?)
    ///     .await?;
    /// let mut tail = v.slice_mut(1..)?;
    /// tail.copy_from_host_slice(&[-2, -3]).await?;
    /// let mut out = [0i64; 2];
    /// tail.copy_to_host_slice(&mut out).await?;
    /// assert_eq!(out, [-2, -3]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_to_host_slice<'h>(&self, dst: &'h mut [T]) -> CopyToSlice<'h> {
        self.as_view().copy_to_host_slice(dst)
    }

    /// The view's elements, copied into a new `Vec`, as [`VecView::to_vec`].
    ///
    /// # Stream ordering
    /// As [`VecView::copy_to_host`].
    ///
    /// # Errors
    /// Driver errors.
    ///
    /// # Cancel safety
    /// As [`VecView::copy_to_host`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::from_host(vec![1u8, 2, 3], &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(v.slice_mut(..2)?.to_vec().await?, [1, 2]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn to_vec(&self) -> CopyToHost<Vec<T>>
    where
        T: Send,
    {
        self.as_view().to_vec()
    }

    /// Copies all of `host` (at most [`len`](VecViewMut::len) elements) into the start of the
    /// view on the owner; elements outside the view are not touched.
    ///
    /// # Stream ordering
    /// Enqueued on the owner when called, after every recorded read of the vector; work
    /// enqueued on the owner afterwards sees the new elements.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`](crate::Error::LengthMismatch) (in elements) when `host` is
    /// longer than the view; driver errors.
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
    /// let mut v = DeviceVec::<u8>::zeroed(4, &stream, CudaResource::new(&device)?).await?;
    /// v.slice_mut(1..3)?.copy_from_host(vec![5, 6]).await?;
    /// assert_eq!(v.to_vec().await?, [0, 5, 6, 0]);
    /// assert!(v.slice_mut(1..3)?.copy_from_host(vec![5, 6, 7]).await.is_err()); // too long
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_from_host<B: HostBuffer<Elem = T>>(&mut self, host: B) -> CopyFromHost<B> {
        self.bytes.copy_from_host(Unit::Elements, host)
    }

    /// Copies all of the borrowed `host` into the start of the view, staged through owned
    /// memory (so `host` may be dropped as soon as this returns).
    ///
    /// # Stream ordering
    /// As [`copy_from_host`](VecViewMut::copy_from_host).
    ///
    /// # Errors
    /// As [`copy_from_host`](VecViewMut::copy_from_host).
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
    /// let mut v = DeviceVec::<u16>::zeroed(3, &stream, CudaResource::new(&device)?).await?;
    /// v.slice_mut(1..)?.copy_from_host_slice(&[4, 5]).await?;
    /// assert_eq!(v.to_vec().await?, [0, 4, 5]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_from_host_slice(&mut self, host: &[T]) -> CopyFromSlice {
        self.bytes.copy_from_host_slice(Unit::Elements, host)
    }
}

impl<T: Pod> fmt::Debug for VecViewMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VecViewMut")
            .field("elem", &std::any::type_name::<T>())
            .field("ptr", &self.bytes.as_range().addr())
            .field("start", &self.start)
            .field("len", &self.len)
            .finish()
    }
}
