//! Borrowed byte ranges of a buffer: [`BufferView`], a thin public face of the
//! [`ByteRange`] core.

use std::fmt;
use std::ops::RangeBounds;

use super::byte_range::{checked_range, ByteRange};
use super::device_buffer::DeviceBuffer;
use super::host_copy::Unit;
use super::host_copy::{CopyToHost, CopyToSlice, HostBuffer};
use crate::device::Device;
use crate::error::Result;
use crate::resource::DevicePtr;
use crate::stream::Stream;

/// A borrowed byte range of a [`DeviceBuffer`], made by [`DeviceBuffer::slice`]: its copies
/// read only the range, with the buffer's tracking.
///
/// # Stream ordering
/// As the buffer's: the view's copies are enqueued on the buffer's owner. The view borrows the
/// buffer, so it cannot be handed on or dropped while the view lives.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mut buf = DeviceBuffer::new(8, &stream, CudaResource::new(&device)?).await?;
/// buf.copy_from_host(vec![0u8, 1, 2, 3, 4, 5, 6, 7]).await?;
/// let view = buf.slice(2..5)?;
/// assert_eq!((view.len(), view.ptr()), (3, buf.ptr().offset(2)));
/// assert_eq!(view.copy_to_host(vec![0u8; 3]).await?, [2, 3, 4]); // 3 bytes copied
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Copy)]
pub struct BufferView<'a> {
    bytes: ByteRange<'a>,
}

impl DeviceBuffer {
    /// A view of the bytes `range` of the buffer (`..`, `a..b`, `a..=b`, `a..`, ...).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming the range and the length when the range is reversed or
    /// ends past [`len`](DeviceBuffer::len).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(buf.slice(16..)?.len(), 48);
    /// assert!(buf.slice(60..70).is_err());           // out of bounds: an error, no panic
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<BufferView<'_>> {
        let range = checked_range(range, self.len, "bytes")?;
        Ok(BufferView {
            bytes: ByteRange::new(self, range.start, range.len()),
        })
    }
}

impl<'a> BufferView<'a> {
    /// The address of the view's first byte.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(buf.slice(8..)?.ptr(), buf.ptr().offset(8));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn ptr(&self) -> DevicePtr {
        self.bytes.ptr()
    }

    /// The number of bytes in the view.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(buf.slice(8..=9)?.len(), 2);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True when the view holds no byte.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// assert!(buf.slice(64..)?.is_empty());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.bytes.len() == 0
    }

    /// The view's byte offset in its buffer.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(buf.slice(8..)?.slice(4..)?.offset(), 12);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn offset(&self) -> usize {
        self.bytes.offset()
    }

    /// The buffer the view borrows.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(buf.slice(8..)?.buffer().len(), 64);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn buffer(&self) -> &'a DeviceBuffer {
        self.bytes.buffer()
    }

    /// The buffer's owner, on which the view's copies are enqueued.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(buf.slice(..)?.stream(), stream);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn stream(&self) -> Stream {
        self.bytes.stream()
    }

    /// The device of the memory.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(buf.slice(..)?.device(), &device);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn device(&self) -> &'a Device {
        self.bytes.device()
    }

    /// A view of the bytes `range` of this view.
    ///
    /// # Errors
    /// As [`DeviceBuffer::slice`], against this view's length.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// let inner = buf.slice(8..24)?.slice(..4)?;
    /// assert_eq!((inner.offset(), inner.len()), (8, 4));
    /// assert!(buf.slice(8..24)?.slice(..17).is_err());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<BufferView<'a>> {
        let range = checked_range(range, self.len(), "bytes")?;
        Ok(BufferView {
            bytes: self.bytes.range(range),
        })
    }

    /// Copies the view's bytes into the start of `host`, on the buffer's owner; only the view's
    /// bytes are read. As [`DeviceBuffer::copy_to_host`] otherwise.
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::copy_to_host`].
    ///
    /// # Errors
    /// As [`CopyToHost`]: [`Error::LengthMismatch`](crate::Error::LengthMismatch) (in bytes) when
    /// `host` is shorter than the view.
    ///
    /// # Cancel safety
    /// As [`CopyToHost`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(5 << 20, &stream, CudaResource::new(&device)?).await?;
    /// buf.fill(9)?;
    /// let head = buf.slice(..64)?.copy_to_host(vec![0u8; 64]).await?; // 64 bytes, not 5 MiB
    /// assert_eq!(head, vec![9u8; 64]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_to_host<B: HostBuffer<Elem = u8>>(&self, host: B) -> CopyToHost<B> {
        self.bytes.copy_to_host(Unit::Bytes, host)
    }

    /// Copies the view's bytes into the start of the borrowed slice `dst`, staged through an
    /// owned host buffer; only the view's bytes are read. As
    /// [`DeviceBuffer::copy_to_host_slice`](crate::DeviceBuffer::copy_to_host_slice)
    /// otherwise.
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::copy_to_host`](crate::DeviceBuffer::copy_to_host).
    ///
    /// # Errors
    /// The future resolves to [`Error::LengthMismatch`](crate::Error::LengthMismatch) (in
    /// bytes) when `dst` holds fewer bytes than the view; driver errors.
    ///
    /// # Cancel safety
    /// As [`CopyToSlice`]: `dst` is written only when the future resolves.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(1 << 20, &stream, CudaResource::new(&device)?).await?;
    /// buf.copy_from_host_slice(bytemuck::cast_slice(&[1u32, 2, 3, 4])).await?; // bytes of u32s
    /// let mut middle = [0u32; 2];
    /// let view = buf.slice(4..12)?;                                   // 8 bytes, not 1 MiB
    /// view.copy_to_host_slice(bytemuck::cast_slice_mut(&mut middle)).await?;
    /// assert_eq!(middle, [2, 3]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_to_host_slice<'h>(&self, dst: &'h mut [u8]) -> CopyToSlice<'h> {
        self.bytes.copy_to_host_slice(Unit::Bytes, dst)
    }

    /// The core the view is a face of (for the host-kernel and interop modules).
    #[cfg_attr(not(feature = "cuda-driver"), allow(dead_code))]
    pub(crate) fn bytes(&self) -> &ByteRange<'a> {
        &self.bytes
    }
}

impl fmt::Debug for BufferView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferView")
            .field("ptr", &self.bytes.addr())
            .field("offset", &self.bytes.offset())
            .field("len", &self.bytes.len())
            .finish()
    }
}
