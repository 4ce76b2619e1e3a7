//! Borrowed byte ranges of a buffer: [`BufferView`], and the range checks every view shares.

use std::fmt;
use std::ops::{Bound, Range, RangeBounds};

use super::host_copy::{EnqueuedCopy, Unit};
use super::{CopyToHost, DeviceBuffer, HostBuffer};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::DevicePtr;
use crate::stream::Stream;

/// `range` resolved against a length of `len` units (`what` names them in errors): the
/// start and end, checked to be in order and in bounds.
pub(crate) fn checked_range(
    range: impl RangeBounds<usize>,
    len: usize,
    what: &str,
) -> Result<Range<usize>> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    let (Some(start), Some(end)) = (start, end) else {
        return Err(Error::invalid(format!(
            "slice: a range bound past usize::MAX does not fit {len} {what}"
        )));
    };
    if start > end {
        return Err(Error::invalid(format!(
            "slice: the range {start}..{end} is reversed (start > end)"
        )));
    }
    if end > len {
        return Err(Error::invalid(format!(
            "slice: the range {start}..{end} is out of bounds of {len} {what}"
        )));
    }
    Ok(start..end)
}

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
    buf: &'a DeviceBuffer,
    /// Byte offset into the buffer; `offset + len <= buf.len()`.
    offset: usize,
    /// Bytes in the view.
    len: usize,
}

impl DeviceBuffer {
    /// A view of the bytes `range` of the buffer (`..`, `a..b`, `a..=b`, `a..`, ...).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the range and the length when the range is reversed or
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
            buf: self,
            offset: range.start,
            len: range.len(),
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
        self.buf.ready_for_raw_use();
        self.buf.ptr.offset(self.offset)
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
        self.len
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
        self.len == 0
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
        self.offset
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
        self.buf
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
        self.buf.stream()
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
        &self.buf.device
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
        let range = checked_range(range, self.len, "bytes")?;
        Ok(BufferView {
            buf: self.buf,
            offset: self.offset + range.start,
            len: range.len(),
        })
    }

    /// Copies the view's bytes into the start of `host`, on the buffer's owner; only the view's
    /// bytes are read. As [`DeviceBuffer::copy_to_host`] otherwise.
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::copy_to_host`].
    ///
    /// # Errors
    /// As [`CopyToHost`]: [`Error::InvalidArgument`] when `host` is shorter than the view.
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
        let ptr = self.buf.ptr.offset(self.offset);
        let mut uses = self.buf.uses.lock();
        let owner = match uses.ready() {
            Ok(owner) => owner,
            Err(e) => return CopyToHost::failed(e),
        };
        // SAFETY: `ptr..ptr + len` lies inside the buffer (`offset + len <= buf.len`), whose
        // memory is freed, and written by other streams, only after a point of the owner that
        // follows this copy (the free is on the owner or on a later owner that waits for this
        // one); the owner's own later writes are stream-ordered after it, its earlier owners'
        // before it (`ready`). The owner changes only through `&mut`, so not meanwhile.
        let copy = unsafe { CopyToHost::start(Unit::Bytes, owner, ptr, self.len, host) };
        uses.used_until(copy.done_event());
        copy
    }
}

impl fmt::Debug for BufferView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferView")
            .field("ptr", &self.buf.ptr.offset(self.offset))
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}
