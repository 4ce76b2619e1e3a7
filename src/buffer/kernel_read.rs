//! Reads of a vector, view or scalar on a stream that may not own it, as CUDA kernel
//! arguments ([`KernelRead`], made by `on(&stream)`).

use std::fmt;
use std::marker::PhantomData;

use bytemuck::Pod;
use cudarc::driver::{LaunchArgs, PushKernelArg};

use super::byte_range::ByteRange;
use super::device_buffer::DeviceBuffer;
use super::scalar::DeviceScalar;
use super::vec::{DeviceVec, VecView, VecViewMut};
use crate::error::Result;
use crate::resource::DevicePtr;
use crate::stream::Stream;

/// A read of a vector, view or scalar on a stream that may not own it, as a CUDA kernel
/// argument (the kernel gets a `const T*` to the first element). Made by `on(&stream)`:
/// [`DeviceVec::on`], [`VecView::on`], [`VecViewMut::on`], [`DeviceScalar::on`].
///
/// Plain `&v` kernel arguments are valid only on the owner stream (the builder cannot see the
/// launch stream); this is the tracked form for any other stream of the device, which must be
/// the launch stream.
///
/// # Stream ordering
/// When made, the stream waits for the owner's work so far and is registered as a reader:
/// the owner's next write, hand-off or free waits for everything enqueued on the stream until
/// then, even if the guard is forgotten. Dropping it records the read's end on the stream
/// (later, unrelated work there is then not waited for).
///
/// # Errors
/// Dropping cannot return an error: a failure to record goes to
/// [`Device::take_deferred_error`](crate::Device::take_deferred_error) (the stream stays a reader); [`finish`](KernelRead::finish)
/// returns it.
///
/// # Panics
/// Passing a guard over host-backend memory as a CUDA kernel argument panics.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceVec, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
/// let v = DeviceVec::from_host(vec![1u32, 2, 3, 4], &owner, CudaResource::new(&device).unwrap()).await?;
/// let tail = v.slice(2..)?;
/// let read = tail.on(&reader)?;          // `reader` waits for the upload
/// assert_eq!((read.len(), read.ptr()), (2, tail.ptr()));
/// // On CUDA: reader.cudarc_stream()?.launch_builder(&f).arg(&read) ...
/// read.finish()?;
/// drop(v);                               // freed on `owner` after `reader`'s reads
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[must_use = "the read is registered when the guard is made; pass it as a kernel argument"]
pub struct KernelRead<'a, T> {
    buf: &'a DeviceBuffer,
    /// The address of the first element, borrowed by the kernel argument.
    addr: DevicePtr,
    len: usize,
    stream: Stream,
    /// Set by `finish`, so `Drop` does not record a second time.
    ended: bool,
    _elem: PhantomData<&'a [T]>,
}

impl<'a, T> KernelRead<'a, T> {
    /// Starts a read of `len` elements at the start of `bytes` on `stream`.
    fn new(bytes: ByteRange<'a>, len: usize, stream: &Stream) -> Result<Self> {
        let buf = bytes.buffer();
        buf.begin_read(stream)?;
        Ok(KernelRead {
            buf,
            addr: bytes.ptr(),
            len,
            stream: stream.clone(),
            ended: false,
            _elem: PhantomData,
        })
    }

    /// The address of the first element read.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let v = DeviceVec::<u64>::try_new(8, &owner, CudaResource::new(&device).unwrap())?;
    /// assert_eq!(v.slice(1..)?.on(&reader)?.ptr(), v.ptr().offset(8));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn ptr(&self) -> DevicePtr {
        self.addr
    }

    /// The number of elements read.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let v = DeviceVec::<u64>::try_new(8, &owner, CudaResource::new(&device).unwrap())?;
    /// assert_eq!(v.on(&reader)?.len(), 8);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no element is read.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let v = DeviceVec::<u64>::try_new(8, &owner, CudaResource::new(&device).unwrap())?;
    /// assert!(v.slice(8..)?.on(&reader)?.is_empty());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stream the read belongs on: launch the kernel there.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let v = DeviceVec::<u64>::try_new(8, &owner, CudaResource::new(&device).unwrap())?;
    /// assert_eq!(v.on(&reader)?.stream(), &reader);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Ends the read now, returning the error that dropping would defer.
    ///
    /// # Errors
    /// A driver error when the event cannot be recorded (the stream then stays a reader).
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let v = DeviceVec::<u64>::try_new(8, &owner, CudaResource::new(&device).unwrap())?;
    /// v.on(&reader)?.finish()?;
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn finish(mut self) -> Result<()> {
        self.ended = true;
        self.buf.end_read(&self.stream)
    }
}

impl<T> Drop for KernelRead<'_, T> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if let Err(e) = self.buf.end_read(&self.stream) {
            // The stream stays a pending reader (the free still waits for it).
            self.buf.device().defer_error(e);
        }
    }
}

impl<T> fmt::Debug for KernelRead<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelRead")
            .field("ptr", &self.addr)
            .field("len", &self.len)
            .field("stream", &self.stream.id())
            .finish()
    }
}

// SAFETY: pushes a reference to the guard's address field, borrowed for `'b`, which outlives
// the builder; the guard's buffer is borrowed for `'c: 'b`, so the memory stays allocated.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b KernelRead<'c, T>> for LaunchArgs<'a> {
    /// A read on the guard's stream, which must be the launch stream.
    ///
    /// # Panics
    /// On host-backend memory.
    #[inline(always)]
    fn arg(&mut self, arg: &'b KernelRead<'c, T>) -> &mut Self {
        arg.buf.assert_device_memory();
        self.arg(&arg.addr)
    }
}

impl<T: Pod> DeviceVec<T> {
    /// The vector as a kernel argument read on `stream` ([`KernelRead`]): `stream` waits for
    /// the owner's work so far, and the owner's next write, hand-off or free waits for the
    /// reads (forget-safe).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`](crate::Error::DeviceMismatch) for a stream of another device; driver errors.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Error, HostConfig, Stream};
    /// let device = Device::host();
    /// let other = Device::host_with(HostConfig::default());
    /// let v = DeviceVec::<f32>::try_new(4, &Stream::new(&device)?, CudaResource::new(&device).unwrap())?;
    /// assert!(matches!(v.on(&Stream::new(&other)?), Err(Error::DeviceMismatch { .. })));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn on(&self, stream: &Stream) -> Result<KernelRead<'_, T>> {
        KernelRead::new(ByteRange::whole(self.as_buffer()), self.len(), stream)
    }
}

impl<'a, T: Pod> VecView<'a, T> {
    /// The view as a kernel argument read on `stream` ([`KernelRead`]), tracked as a read of
    /// the whole vector.
    ///
    /// # Errors
    /// As [`DeviceVec::on`].
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let v = DeviceVec::<u16>::try_new(10, &owner, CudaResource::new(&device).unwrap())?;
    /// assert_eq!(v.slice(4..)?.on(&reader)?.len(), 6);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn on(&self, stream: &Stream) -> Result<KernelRead<'a, T>> {
        KernelRead::new(*self.bytes(), self.len(), stream)
    }
}

impl<T: Pod> VecViewMut<'_, T> {
    /// The view as a kernel argument read on `stream` ([`KernelRead`]), tracked as a read of
    /// the whole vector.
    ///
    /// # Errors
    /// As [`DeviceVec::on`].
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let mut v = DeviceVec::<u16>::try_new(10, &owner, CudaResource::new(&device).unwrap())?;
    /// assert_eq!(v.slice_mut(..3)?.on(&reader)?.len(), 3);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn on(&self, stream: &Stream) -> Result<KernelRead<'_, T>> {
        KernelRead::new(self.bytes().as_range(), self.len(), stream)
    }
}

impl<T: Pod + Send> DeviceScalar<T> {
    /// The scalar as a kernel argument read on `stream` ([`KernelRead`]; the kernel gets a
    /// `const T*`).
    ///
    /// # Errors
    /// As [`DeviceVec::on`].
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceScalar, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let alpha = DeviceScalar::new(2.0f32, &owner, CudaResource::new(&device).unwrap()).await?;
    /// assert_eq!(alpha.on(&reader)?.len(), 1);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn on(&self, stream: &Stream) -> Result<KernelRead<'_, T>> {
        KernelRead::new(ByteRange::whole(self.as_buffer()), 1, stream)
    }
}
