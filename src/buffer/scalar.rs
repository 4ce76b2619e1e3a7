//! [`DeviceScalar<T>`]: one value in device memory (RMM's `device_scalar`), for kernel
//! arguments and results.

use std::fmt;
use std::future::Future;

use bytemuck::Pod;
use futures::FutureExt;

use super::device_buffer::DeviceBuffer;
use super::guard::ReadGuard;
use super::vec::DeviceVec;
use crate::device::Device;
use crate::error::Result;
use crate::resource::{DevicePtr, MemoryResource};
use crate::stream::Stream;

/// One `T` in device memory, freed stream-ordered (RMM's `device_scalar`): a
/// [`DeviceVec<T>`] of length 1 with value accessors, so it has the vector's owner stream,
/// hand-off, read tracking and drop.
///
/// # Stream ordering
/// [`set_value`](DeviceScalar::set_value) and [`value`](DeviceScalar::value) are enqueued on
/// the owner; work enqueued there afterwards sees the new value, and `value` sees the work
/// enqueued there before it.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceScalar, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
/// let mut x = DeviceScalar::new(41u64, &a, CudaResource::new(&device)?).await?;
/// x.set_value(42)?;                     // enqueued on `a`, no wait
/// x.set_stream(&b)?;                    // `b` waits for `a`
/// assert_eq!(x.value().await?, 42);     // read on `b`
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub struct DeviceScalar<T: Pod> {
    /// Exactly one element.
    vec: DeviceVec<T>,
}

impl<T: Pod + Send> DeviceScalar<T> {
    /// Allocates one `T` from `mr` for `stream`, which owns it, and sets it to `value`
    /// (enqueued on `stream`; this waits only for memory, as [`DeviceVec::new`] does, not for
    /// the copy).
    ///
    /// # Stream ordering
    /// As [`set_value`](DeviceScalar::set_value).
    ///
    /// # Errors
    /// As [`DeviceVec::new`] and [`set_value`](DeviceScalar::set_value); [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// for a zero-sized `T`.
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves leaves nothing allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceScalar, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let x = DeviceScalar::new(1.5f32, &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(x.value().await?, 1.5);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn new(value: T, stream: &Stream, mr: impl MemoryResource + 'static) -> Result<Self> {
        let mut scalar = DeviceScalar {
            vec: DeviceVec::new(1, stream, mr).await?,
        };
        scalar.set_value(value)?;
        Ok(scalar)
    }

    /// Reads the value: a copy to the host enqueued on the owner now, resolving when it is
    /// done.
    ///
    /// # Stream ordering
    /// The copy follows the owner's work enqueued so far.
    ///
    /// # Errors
    /// Driver errors.
    ///
    /// # Cancel safety
    /// As [`CopyToHost`](crate::CopyToHost): dropping the future leaves the copy to finish into
    /// memory the future owns.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceScalar, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let x = DeviceScalar::new(-3i32, &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(x.value().await?, -3);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn value(&self) -> impl Future<Output = Result<T>> + 'static + use<T> {
        let copy = self.vec.to_vec();
        async move { Ok(copy.await?[0]) }
    }

    /// Sets the value, stream-ordered: a copy enqueued on the owner (after every recorded
    /// read), from host memory the copy owns, so this returns without waiting and nothing can
    /// free the staged value under the device.
    ///
    /// # Stream ordering
    /// Work enqueued on the owner afterwards sees `value`.
    ///
    /// # Errors
    /// Driver errors when the copy cannot be enqueued. A failure of the copy on the device
    /// later goes to the device's deferred errors
    /// ([`Device::take_deferred_error`](crate::Device::take_deferred_error)).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceScalar, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut x = DeviceScalar::new(0u8, &stream, CudaResource::new(&device)?).await?;
    /// x.set_value(9)?;
    /// assert_eq!(x.value().await?, 9);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn set_value(&mut self, value: T) -> Result<()> {
        // One poll: an enqueue failure is returned now; a copy still in flight is left to the
        // stream, which drops the staged value after it (the future's `Drop`).
        match self.vec.copy_from_host(vec![value]).now_or_never() {
            Some(done) => done.map(drop),
            None => Ok(()),
        }
    }
}

impl<T: Pod> DeviceScalar<T> {
    /// The address of the value.
    ///
    /// Work you enqueue through it is yours to order, as for [`DeviceBuffer::ptr`].
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceScalar, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let x = DeviceScalar::new(0u32, &stream, CudaResource::new(&device)?).await?;
    /// assert!(x.ptr().is_aligned(256));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn ptr(&self) -> DevicePtr {
        self.vec.ptr()
    }

    /// The stream that owns the value.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceScalar, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let x = DeviceScalar::new(0u32, &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(x.stream(), stream);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn stream(&self) -> Stream {
        self.vec.stream()
    }

    /// Hands the value to `stream`, as [`DeviceBuffer::set_stream`].
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::set_stream`].
    ///
    /// # Errors
    /// As [`DeviceBuffer::set_stream`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceScalar, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let mut x = DeviceScalar::new(5u16, &a, CudaResource::new(&device)?).await?;
    /// x.set_stream(&b)?;
    /// assert_eq!((x.stream(), x.value().await?), (b, 5));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn set_stream(&mut self, stream: &Stream) -> Result<()> {
        self.vec.set_stream(stream)
    }

    /// The device the memory belongs to.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceScalar, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let x = DeviceScalar::new(0u32, &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(x.device(), &device);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn device(&self) -> &Device {
        self.vec.device()
    }

    /// Starts a read of the value on `stream`, as [`DeviceBuffer::read_on`].
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
    /// # use streamalloc::{CudaResource, Device, DeviceScalar, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let x = DeviceScalar::new(0u32, &owner, CudaResource::new(&device)?).await?;
    /// let read = x.read_on(&reader)?;
    /// assert_eq!(read.ptr(), x.ptr());
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn read_on(&self, stream: &Stream) -> Result<ReadGuard<'_>> {
        self.vec.read_on(stream)
    }

    /// The value's bytes as a [`DeviceBuffer`].
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceScalar, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let x = DeviceScalar::new(0u64, &stream, CudaResource::new(&device)?).await?;
    /// assert_eq!(x.as_buffer().len(), 8);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn as_buffer(&self) -> &DeviceBuffer {
        self.vec.as_buffer()
    }

    /// The underlying buffer, mutably, for crate code that hands it off before a write
    /// (kernel launches).
    #[allow(dead_code)] // used by the interop and host-kernel modules
    pub(crate) fn buffer_mut(&mut self) -> &mut DeviceBuffer {
        self.vec.buffer_mut()
    }
}

impl<T: Pod> fmt::Debug for DeviceScalar<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceScalar")
            .field("elem", &std::any::type_name::<T>())
            .field("buffer", self.vec.as_buffer())
            .finish()
    }
}

#[cfg(test)]
mod tests;
