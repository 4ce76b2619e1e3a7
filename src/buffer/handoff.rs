//! Which stream owns a buffer and which streams read it: the hand-off to another owner and
//! reads on other streams, with the event waits they need (the algorithm is
//! [`Uses`](super::uses::Uses)'s).

use super::device_buffer::DeviceBuffer;
use super::guard::ReadGuard;
use crate::error::Result;
use crate::stream::Stream;

impl DeviceBuffer {
    /// The stream that owns the buffer: its operations are enqueued there and it frees it.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let mut buf = DeviceBuffer::try_new(64, &a, CudaResource::new(&device)?)?;
    /// assert_eq!(buf.stream(), a);
    /// buf.set_stream(&b)?;
    /// assert_eq!(buf.stream(), b);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn stream(&self) -> Stream {
        // Handed out for work on the buffer: the owner takes over now (see `set_stream`).
        self.ready_for_raw_use();
        self.uses.owner().clone()
    }

    /// Hands the buffer to `stream` for work the crate enqueues there at once (a write through
    /// a kernel argument): [`set_stream`](DeviceBuffer::set_stream), and `stream` waits for the
    /// hand-off now.
    pub(crate) fn take_for(&mut self, stream: &Stream) -> Result<()> {
        stream.check_on(&self.device, "DeviceBuffer::take_for(stream)")?;
        self.uses.hand_to(stream)?;
        self.uses.get_mut().ready()?;
        Ok(())
    }

    /// Hands ownership to `stream`: from now on the buffer's operations and its free are
    /// enqueued there.
    ///
    /// # Stream ordering
    /// When `stream` is not the owner, an event is recorded on the old owner now, right after
    /// its work on the buffer. `stream` is to wait for it, and for every recorded read, which
    /// is then forgotten; the wait is enqueued on `stream` just before the buffer's first use
    /// there (one of its operations, a kernel argument, a drop, a further hand-off that carries
    /// it on, or a call of [`ptr`](DeviceBuffer::ptr) or [`stream`](DeviceBuffer::stream)), where
    /// CUDA code written by hand would put its `cuStreamWaitEvent`. So handing batches on as soon
    /// as they are produced does not make the new owner's earlier work wait for them. Work
    /// enqueued on `stream` for this buffer, through its API or its pointer, may then write and
    /// free the memory. (So `set_stream` to the current owner orders the owner after the
    /// recorded reads, before you write through [`ptr`](DeviceBuffer::ptr).) Nothing blocks the
    /// host.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`](crate::Error::DeviceMismatch) when `stream` is on another
    /// device; driver errors when recording or waiting fails, in which case the buffer keeps its
    /// owner.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let mut buf = DeviceBuffer::new(64, &a, CudaResource::new(&device)?).await?;
    /// a.enqueue_delay(Duration::from_millis(20))?; // a long "kernel" on `a`
    /// buf.fill(5)?;
    /// buf.set_stream(&b)?;
    /// assert_eq!(buf.copy_to_host(vec![0u8; 64]).await?, vec![5; 64]); // `b` waited
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn set_stream(&mut self, stream: &Stream) -> Result<()> {
        stream.check_on(&self.device, "DeviceBuffer::set_stream(stream)")?;
        self.uses.hand_to(stream)
    }

    /// Starts a read of the buffer on `stream`, which need not own it.
    ///
    /// # Stream ordering
    /// `stream` waits for the owner's work enqueued so far (nothing when it is the owner).
    /// When the returned guard is dropped, an event is recorded on `stream`; the owner's later
    /// writes, a later hand-off and the free wait for it.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`](crate::Error::DeviceMismatch) when `stream` is on another
    /// device; driver errors when recording or waiting fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let buf = DeviceBuffer::new(64, &owner, CudaResource::new(&device)?).await?;
    /// let read = buf.read_on(&reader)?;
    /// // ... launch a kernel on `reader` that reads `read.ptr()` ...
    /// drop(read);
    /// drop(buf); // freed on `owner` after `reader` has passed the read
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn read_on(&self, stream: &Stream) -> Result<ReadGuard<'_>> {
        self.begin_read(stream)?;
        Ok(ReadGuard::new(self, stream.clone()))
    }

    /// Starts reads on `stream` that the caller enqueues itself, forget-safe: `stream` waits
    /// for the owner's work so far and stays a pending reader, so the owner's next write,
    /// hand-off or free waits for everything `stream` enqueued until then, even when the guard
    /// or argument that called this is forgotten.
    pub(crate) fn begin_read(&self, stream: &Stream) -> Result<()> {
        stream.check_on(&self.device, "a read of a DeviceBuffer on a stream")?;
        self.uses.lock().begin_read(stream)
    }

    /// Ends reads started by [`begin_read`](DeviceBuffer::begin_read): records an event on
    /// `stream` now.
    pub(crate) fn end_read(&self, stream: &Stream) -> Result<()> {
        self.uses.lock().end_read(stream)
    }

    /// Records that work enqueued on `stream` so far reads the buffer: an event is recorded
    /// there and kept in the use state (replacing the stream's earlier one). Nothing when
    /// `stream` is the owner.
    ///
    /// This does not make `stream` wait for the owner; [`read_on`](DeviceBuffer::read_on) does
    /// both.
    ///
    /// # Stream ordering
    /// The owner's later writes, a later hand-off and the free wait for the recorded event.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`](crate::Error::DeviceMismatch) when `stream` is on another
    /// device; driver errors when recording fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, HostConfig, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host_with(HostConfig::default());
    /// let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let buf = DeviceBuffer::new(64, &owner, CudaResource::new(&device)?).await?;
    /// reader.enqueue_delay(Duration::from_millis(20))?; // a "kernel" reading `buf`
    /// buf.record_read(&reader)?;
    /// drop(buf);
    /// owner.synchronize().await?;                       // the free waited for `reader`
    /// assert_eq!(device.host_controls().unwrap().allocated_bytes(), 0);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn record_read(&self, stream: &Stream) -> Result<()> {
        stream.check_on(&self.device, "DeviceBuffer::record_read(stream)")?;
        let mut uses = self.uses.lock();
        if stream == uses.owner() {
            return Ok(());
        }
        let event = stream.record()?;
        uses.add_read(event);
        Ok(())
    }

    /// Negative control for tests: [`set_stream`](DeviceBuffer::set_stream) and
    /// [`read_on`](DeviceBuffer::read_on) of this buffer (only) skip their event waits, to show
    /// that a hand-off test fails without them. The free stays ordered after the old owners.
    ///
    /// # Safety
    /// Without the waits, work on the old and new owner (or the reader) may access the memory
    /// at the same time. The caller orders them itself (e.g. by blocking the old owner until
    /// the new owner's reads are done), so that no two accesses of which one writes overlap.
    #[cfg(test)]
    pub(crate) unsafe fn disable_handoff_waits(&mut self) {
        self.uses.disable_handoff_waits();
    }
}
