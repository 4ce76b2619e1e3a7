//! Copies between devices: a buffer keeps its device for life, and its bytes reach another
//! device only through a copy, ordered on both sides like every other use.
//!
//! A stream may wait on an event of another device's stream (CUDA allows it within a process;
//! on the host backend a stream waits on any other queue), so a peer copy is ordered exactly
//! as a copy between two streams of one device: the destination's owner waits for the source
//! owner's work, and the read is recorded on the source, whose later writes and free wait for
//! it across the devices.

use bytemuck::Pod;

use super::device_buffer::DeviceBuffer;
use super::vec::DeviceVec;
use crate::error::{Error, Result};
use crate::resource::{into_shared, MemoryResource};
use crate::stream::Stream;

impl DeviceBuffer {
    /// Copies all of `src`, a buffer of this device or of another one, into the start of this
    /// buffer (`cuMemcpyPeerAsync` between devices; a plain copy on the host backend).
    ///
    /// # Stream ordering
    /// Enqueued on this buffer's owner, which first waits for `src`'s owner's work so far
    /// (an event of the other device) and for this buffer's recorded reads. The read of `src`
    /// is recorded on this buffer's owner, so `src`'s later writes, its hand-off and its free,
    /// on its own device, wait for the copy.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `src` is longer than this buffer; driver errors.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, HostConfig, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let (d0, d1) = (Device::host_with(HostConfig::default()), Device::host_with(HostConfig::default()));
    /// let (s0, s1) = (Stream::new(&d0)?, Stream::new(&d1)?);
    /// let mut src = DeviceBuffer::new(4, &s0, CudaResource::new(&d0)?).await?;
    /// src.fill(9)?;                                    // on device 0
    /// let mut dst = DeviceBuffer::new(6, &s1, CudaResource::new(&d1)?).await?;
    /// dst.copy_from_peer(&src)?;                       // on device 1, after the fill
    /// drop(src);                                       // freed on device 0 after the copy
    /// assert_eq!(dst.copy_to_host(vec![0u8; 6]).await?, [9, 9, 9, 9, 0, 0]);
    /// assert_eq!(dst.device(), &d1);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_from_peer(&mut self, src: &DeviceBuffer) -> Result<()> {
        if src.len > self.len {
            return Err(Error::invalid(format!(
                "copy_from_peer: the source holds {} bytes ({}), the destination only {} ({})",
                src.len,
                src.device.id(),
                self.len,
                self.device.id()
            )));
        }
        self.enqueue_copy_from(src)
    }

    /// A deep copy of the bytes in use on another device (or this one): allocated from `mr`
    /// for `stream`, which owns it, and written there by a peer copy
    /// ([`copy_from_peer`](DeviceBuffer::copy_from_peer)). The copy keeps this buffer's
    /// [`alignment`](DeviceBuffer::alignment). What PyTorch's `tensor.to(device)` does, with
    /// the resource named.
    ///
    /// # Stream ordering
    /// As [`copy_from_peer`](DeviceBuffer::copy_from_peer): `stream` waits for this buffer's
    /// owner's work so far, and this buffer's later writes and free wait for the copy.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when `mr` does not allocate on `stream`'s device (with both
    /// ids); the resource's errors; driver errors.
    ///
    /// # Cancel safety
    /// The only wait is for the allocation: dropping the future before it resolves leaves
    /// nothing allocated and nothing enqueued.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{current_device_resource_for, CudaResource, Device, DeviceBuffer, HostConfig, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let (d0, d1) = (Device::host_with(HostConfig::default()), Device::host_with(HostConfig::default()));
    /// let (s0, s1) = (Stream::new(&d0)?, Stream::new(&d1)?);
    /// let mut buf = DeviceBuffer::new(32, &s0, CudaResource::new(&d0)?).await?;
    /// buf.fill(3)?;
    /// let there = buf.try_clone_to(&s1, current_device_resource_for(&d1)).await?;
    /// assert_eq!((there.device(), there.stream()), (&d1, s1));
    /// assert_eq!(there.copy_to_host(vec![0u8; 32]).await?, vec![3; 32]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn try_clone_to(
        &self,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<DeviceBuffer> {
        let mr = into_shared(mr);
        let mut copy = Self::from_shared_aligned(self.len, self.alignment, stream, mr).await?;
        copy.copy_from_peer(self)?;
        Ok(copy)
    }
}

impl<T: Pod> DeviceVec<T> {
    /// Copies all of `src`, a vector of this device or of another one, into the start of this
    /// vector: [`DeviceBuffer::copy_from_peer`] on their bytes.
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::copy_from_peer`]: enqueued on this vector's owner after `src`'s
    /// owner's work so far; `src`'s later writes and free wait for the copy.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `src` has more elements than this vector; driver errors.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceVec, HostConfig, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let (d0, d1) = (Device::host_with(HostConfig::default()), Device::host_with(HostConfig::default()));
    /// let (s0, s1) = (Stream::new(&d0)?, Stream::new(&d1)?);
    /// let src = DeviceVec::from_host(vec![1.5f32, 2.5], &s0, CudaResource::new(&d0)?).await?;
    /// let mut dst = DeviceVec::<f32>::zeroed(3, &s1, CudaResource::new(&d1)?).await?;
    /// dst.copy_from_peer(&src)?;
    /// assert_eq!(dst.to_vec().await?, [1.5, 2.5, 0.0]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_from_peer(&mut self, src: &DeviceVec<T>) -> Result<()> {
        if src.len() > self.len() {
            return Err(Error::invalid(format!(
                "copy_from_peer: the source holds {} elements ({}), the destination only {} ({})",
                src.len(),
                src.device().id(),
                self.len(),
                self.device().id()
            )));
        }
        self.buffer_mut().copy_from_peer(src.as_buffer())
    }

    /// A deep copy on another device (or this one): allocated from `mr` for `stream`, which
    /// owns it, and written there by a peer copy; [`DeviceBuffer::try_clone_to`] on the
    /// vector's bytes. PyTorch's `tensor.to(device)`, with the resource named.
    ///
    /// # Stream ordering
    /// As [`DeviceBuffer::try_clone_to`].
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when `mr` does not allocate on `stream`'s device (with both
    /// ids); the resource's errors; driver errors.
    ///
    /// # Cancel safety
    /// As [`DeviceBuffer::try_clone_to`].
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{current_device_resource_for, CudaResource, Device, DeviceVec, HostConfig, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let (d0, d1) = (Device::host_with(HostConfig::default()), Device::host_with(HostConfig::default()));
    /// let (s0, s1) = (Stream::new(&d0)?, Stream::new(&d1)?);
    /// let v = DeviceVec::from_host(vec![7u64, 8, 9], &s0, CudaResource::new(&d0)?).await?;
    /// let w = v.try_clone_to(&s1, current_device_resource_for(&d1)).await?;
    /// assert_eq!((w.device(), w.len()), (&d1, 3));
    /// assert_eq!(w.to_vec().await?, [7, 8, 9]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn try_clone_to(
        &self,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<DeviceVec<T>> {
        DeviceVec::from_buffer(self.as_buffer().try_clone_to(stream, mr).await?)
    }
}

#[cfg(test)]
mod tests;
