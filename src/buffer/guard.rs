//! A scoped read of a buffer on a stream other than its owner.

use std::fmt;

use crate::error::Result;
use crate::resource::DevicePtr;
use crate::stream::Stream;

use super::device_buffer::DeviceBuffer;

/// A read of a [`DeviceBuffer`] on a stream that may not own it, from
/// [`DeviceBuffer::read_on`].
///
/// While the guard lives, enqueue work on [`stream`](ReadGuard::stream) that reads through
/// [`ptr`](ReadGuard::ptr); the shared borrow keeps the buffer from being written, handed on,
/// resized or dropped meanwhile. When the guard is dropped (or [`finish`](ReadGuard::finish)ed),
/// an event is recorded on the stream and kept in the buffer's use state, so the owner's later
/// writes and the free wait for those reads.
/// Forgetting the guard is safe as well: the stream is registered as a reader when the guard is
/// made, and the owner's next write, hand-off or free waits for everything enqueued on it by
/// then.
///
/// # Stream ordering
/// The reading stream already waits for the owner's work enqueued before `read_on`. Reads
/// enqueued on it after the guard is gone are not tracked; call
/// [`DeviceBuffer::record_read`] for those.
///
/// # Errors
/// Dropping the guard cannot return an error: if recording the event fails, the error goes to
/// [`Device::take_deferred_error`](crate::Device::take_deferred_error). Use
/// [`finish`](ReadGuard::finish) to get it instead.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
/// let mut buf = DeviceBuffer::new(256, &owner, CudaResource::new(&device)?).await?;
/// buf.fill(1)?;
/// {
///     let read = buf.read_on(&reader)?;     // `reader` now waits for the fill
///     assert_eq!(read.len(), 256);
///     // ... launch a kernel on `read.stream()` that reads `read.ptr()` ...
/// }                                          // the read is recorded here
/// drop(buf);                                 // the free on `owner` waits for `reader`
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[must_use = "the read is recorded when the guard is dropped; dropping it at once records nothing useful"]
pub struct ReadGuard<'a> {
    buf: &'a DeviceBuffer,
    stream: Stream,
    /// Set by `finish`, so `Drop` does not record a second time.
    recorded: bool,
}

impl<'a> ReadGuard<'a> {
    pub(crate) fn new(buf: &'a DeviceBuffer, stream: Stream) -> Self {
        ReadGuard {
            buf,
            stream,
            recorded: false,
        }
    }

    /// The buffer read (for the kernel-argument impls, which push its pointer field).
    #[cfg_attr(not(feature = "cuda-driver"), allow(dead_code))]
    pub(super) fn buffer(&self) -> &'a DeviceBuffer {
        self.buf
    }

    /// The address of the buffer's first byte, to read on [`stream`](ReadGuard::stream).
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let buf = DeviceBuffer::new(64, &owner, CudaResource::new(&device)?).await?;
    /// assert_eq!(buf.read_on(&reader)?.ptr(), buf.ptr());
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn ptr(&self) -> DevicePtr {
        self.buf.ptr()
    }

    /// The number of bytes that may be read.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let buf = DeviceBuffer::new(64, &owner, CudaResource::new(&device)?).await?;
    /// assert_eq!(buf.read_on(&reader)?.len(), 64);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when there is nothing to read.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let buf = DeviceBuffer::new(0, &owner, CudaResource::new(&device)?).await?;
    /// assert!(buf.read_on(&reader)?.is_empty());
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The stream the reads belong on.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let buf = DeviceBuffer::new(64, &owner, CudaResource::new(&device)?).await?;
    /// assert_eq!(buf.read_on(&reader)?.stream(), &reader);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Ends the read now and records it, returning the error that dropping would defer.
    ///
    /// # Errors
    /// A driver error when the event cannot be recorded.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let buf = DeviceBuffer::new(64, &owner, CudaResource::new(&device)?).await?;
    /// let read = buf.read_on(&reader)?;
    /// // ... enqueue reads on `reader` ...
    /// read.finish()?;
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn finish(mut self) -> Result<()> {
        self.recorded = true;
        self.buf.end_read(&self.stream)
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        if self.recorded {
            return;
        }
        if let Err(e) = self.buf.end_read(&self.stream) {
            // The stream stays a pending reader (the free still waits for it); report the
            // error, never block in a drop.
            self.buf.device().defer_error(e);
        }
    }
}

impl fmt::Debug for ReadGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadGuard")
            .field("ptr", &self.buf.ptr)
            .field("len", &self.buf.len())
            .field("stream", &self.stream.id())
            .finish()
    }
}
