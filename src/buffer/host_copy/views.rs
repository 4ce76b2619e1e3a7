//! Borrowed-slice copies of the views that lack them elsewhere: [`BufferView`] (bytes) and
//! [`VecViewMut`] (typed, read through its shared view).

use bytemuck::Pod;

use super::{CopyToSlice, EnqueuedCopy, Unit};
use crate::buffer::{BufferView, VecViewMut};

impl<'a> BufferView<'a> {
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
        let ptr = self.buffer().ptr.offset(self.offset());
        let mut uses = self.buffer().uses.lock();
        let owner = match uses.ready() {
            Ok(owner) => owner,
            Err(e) => return CopyToSlice::failed(e),
        };
        // SAFETY: `ptr..ptr + len` lies inside the buffer (a view never outgrows it), whose
        // memory is freed, and written by other streams, only after a point of the owner that
        // follows this copy; the owner's own later writes are stream-ordered after it, its
        // earlier owners' before it (`ready`). The owner changes only through `&mut`, so not meanwhile.
        let copy = unsafe { CopyToSlice::start(Unit::Bytes, owner, ptr, self.len(), dst) };
        uses.used_until(copy.done_event());
        copy
    }
}

impl<'a, T: Pod> VecViewMut<'a, T> {
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
}
