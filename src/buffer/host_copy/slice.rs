//! Copies to and from borrowed host slices, staged through owned memory so that a forgotten
//! future can never let the device touch a borrow that has ended.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytemuck::Pod;

use super::owned::{CopyFromHost, CopyToHost, EnqueuedCopy, Unit};
use crate::error::{Error, Result};
use crate::resource::DevicePtr;
use crate::stream::{Event, Stream};

/// The future of [`DeviceBuffer::copy_to_host_slice`](crate::DeviceBuffer::copy_to_host_slice):
/// resolves once the device's bytes are in the borrowed slice.
///
/// The copy is enqueued when the future is made, into an owned staging buffer; the future
/// copies the staging buffer into the slice when it resolves. The device never writes the
/// slice itself, so forgetting the future (`mem::forget`), which ends the borrow without
/// running any code, cannot let the device write into memory the caller got back.
///
/// # Errors
/// [`Error::LengthMismatch`] when the slice is shorter than the device data (nothing was
/// enqueued); driver errors.
///
/// # Cancel safety
/// Dropping the future leaves the slice as it was (or filled, if it resolved); the copy into
/// the staging buffer still runs, and the staging buffer is freed after it, as for
/// [`CopyToHost`]. Forgetting it leaks the staging buffer.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mut buf = DeviceBuffer::new(4, &stream, CudaResource::new(&device)?).await?;
/// buf.copy_from_host_slice(&[1, 2, 3, 4]).await?;
/// let mut out = [0u8; 4];
/// buf.copy_to_host_slice(&mut out).await?;
/// assert_eq!(out, [1, 2, 3, 4]);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[must_use = "the slice is filled only by awaiting the future"]
pub struct CopyToSlice<'a> {
    staged: CopyToHost<Vec<u8>>,
    /// The slice's bytes that receive the copy: exactly as many as were staged.
    dst: Option<&'a mut [u8]>,
}

impl<'a> CopyToSlice<'a> {
    /// Enqueues a copy of `len` elements of `T` from `src` into a staging buffer on `stream`;
    /// the future fills the start of `dst` from it when it resolves. A slice of fewer elements
    /// is an [`Error::LengthMismatch`] counted in `unit` (nothing was enqueued).
    ///
    /// # Safety
    /// As [`CopyToHost::start`]: `src..src + len * size_of::<T>()` (a product that does not
    /// overflow) is device memory that is freed, and written by other streams, only after work
    /// on `stream` enqueued now has completed.
    pub(crate) unsafe fn start<T: Pod>(
        unit: Unit,
        stream: &Stream,
        src: DevicePtr,
        len: usize,
        dst: &'a mut [T],
    ) -> Self {
        if dst.len() < len {
            return Self::failed(unit.mismatch::<T>("copy_to_host_slice", len, dst.len()));
        }
        let bytes = len * std::mem::size_of::<T>();
        let dst: &'a mut [u8] = bytemuck::cast_slice_mut(dst);
        // SAFETY: forwarded from the caller; the staging buffer holds exactly `bytes`.
        let staged =
            unsafe { CopyToHost::start(Unit::Bytes, stream, src, bytes, vec![0u8; bytes]) };
        CopyToSlice {
            staged,
            dst: Some(&mut dst[..bytes]),
        }
    }
}

impl EnqueuedCopy for CopyToSlice<'_> {
    fn failed(error: Error) -> Self {
        CopyToSlice {
            staged: CopyToHost::failed(error),
            dst: None,
        }
    }

    fn done_event(&self) -> Option<Event> {
        self.staged.done_event()
    }
}

impl Future for CopyToSlice<'_> {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        let staged = ready!(Pin::new(&mut this.staged).poll(cx))?;
        if let Some(dst) = this.dst.take() {
            dst.copy_from_slice(&staged);
        }
        Poll::Ready(Ok(()))
    }
}

impl fmt::Debug for CopyToSlice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CopyToSlice")
            .field("staged", &self.staged)
            .field("bytes", &self.dst.as_ref().map(|d| d.len()))
            .finish()
    }
}

/// The future of
/// [`DeviceBuffer::copy_from_host_slice`](crate::DeviceBuffer::copy_from_host_slice): resolves
/// once the slice's bytes, copied into a staging buffer when the future was made, have reached
/// the device.
///
/// The slice is read synchronously, before the copy is enqueued, so the future borrows
/// nothing: the slice may be changed or dropped at once, and work enqueued on the owner
/// afterwards sees the bytes as they were at the call.
///
/// # Errors
/// [`Error::LengthMismatch`] when the slice is longer than the device memory (nothing was
/// enqueued); driver errors.
///
/// # Cancel safety
/// As [`CopyFromHost`]: dropping the future does not cancel the copy; the staging buffer is
/// freed after it. Forgetting it leaks the staging buffer.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mut buf = DeviceBuffer::new(2, &stream, CudaResource::new(&device)?).await?;
/// let mut data = vec![7u8, 9];
/// let copy = buf.copy_from_host_slice(&data);
/// data[0] = 0;                               // the copy took the bytes already
/// copy.await?;
/// assert_eq!(buf.copy_to_host(vec![0u8; 2]).await?, [7, 9]);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[must_use = "the copy is enqueued, but its outcome is known only by awaiting the future"]
pub struct CopyFromSlice {
    staged: CopyFromHost<Vec<u8>>,
}

impl CopyFromSlice {
    /// Copies `src` into a staging buffer, then enqueues its copy to the start of `dst`, room
    /// for `capacity` elements of `T`, on `stream`. A slice of more elements is an
    /// [`Error::LengthMismatch`] counted in `unit` (nothing was enqueued).
    ///
    /// # Safety
    /// As [`CopyFromHost::start`]: `dst..dst + capacity * size_of::<T>()` (a product that does
    /// not overflow) is device memory that is freed, read or written by other streams only
    /// after work on `stream` enqueued now has completed.
    pub(crate) unsafe fn start<T: Pod>(
        unit: Unit,
        stream: &Stream,
        dst: DevicePtr,
        capacity: usize,
        src: &[T],
    ) -> Self {
        if src.len() > capacity {
            return Self::failed(unit.mismatch::<T>("copy_from_host_slice", capacity, src.len()));
        }
        let bytes = capacity * std::mem::size_of::<T>();
        let src: &[u8] = bytemuck::cast_slice(src);
        // SAFETY: forwarded from the caller; the staging buffer is no longer than `bytes`.
        let staged = unsafe { CopyFromHost::start(Unit::Bytes, stream, dst, bytes, src.to_vec()) };
        CopyFromSlice { staged }
    }
}

impl EnqueuedCopy for CopyFromSlice {
    fn failed(error: Error) -> Self {
        CopyFromSlice {
            staged: CopyFromHost::failed(error),
        }
    }

    fn done_event(&self) -> Option<Event> {
        self.staged.done_event()
    }
}

impl Future for CopyFromSlice {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        ready!(Pin::new(&mut self.get_mut().staged).poll(cx))?;
        Poll::Ready(Ok(()))
    }
}

impl fmt::Debug for CopyFromSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CopyFromSlice")
            .field("staged", &self.staged)
            .finish()
    }
}
