//! Changing a buffer's size and capacity: reallocation on the owner, the bytes in use copied
//! over, the old block freed stream-ordered.

use super::device_buffer::DeviceBuffer;
use super::new_buffer::{aligned_start, misaligned, padded_size};
use crate::error::Result;
use crate::resource::{DevicePtr, MemoryResource};
use crate::stream::Stream;

impl DeviceBuffer {
    /// Changes the size to `new_size` bytes (RMM's `device_buffer::resize`).
    ///
    /// Within the capacity only the size changes: the memory and the bytes up to the new size
    /// stay (bytes past the old size are whatever the allocation held). Past the capacity a
    /// block of exactly `new_size` bytes is allocated on the owner, the old bytes are copied
    /// into it on the owner, and the old block is freed, stream-ordered.
    ///
    /// # Stream ordering
    /// Everything is enqueued on the owner; before the old block is read and freed, the owner
    /// waits for every recorded read.
    ///
    /// # Errors
    /// The resource's errors ([`Error::OutOfMemory`](crate::Error::OutOfMemory), ...) and driver
    /// errors; the buffer is then unchanged.
    ///
    /// # Cancel safety
    /// The only wait is for the allocation: dropping the future before it resolves leaves the
    /// buffer unchanged and nothing allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(4, &stream, CudaResource::new(&device)?).await?;
    /// buf.copy_from_host(vec![1u8, 2, 3, 4]).await?;
    /// buf.resize(8).await?;                   // grows: reallocates and copies
    /// assert_eq!(buf.capacity(), 8);
    /// assert_eq!(&buf.copy_to_host(vec![0u8; 8]).await?[..4], &[1, 2, 3, 4]);
    /// buf.resize(2).await?;                   // shrinks: only the size changes
    /// assert_eq!((buf.len(), buf.capacity()), (2, 8));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn resize(&mut self, new_size: usize) -> Result<()> {
        if new_size > self.capacity {
            self.reallocate(new_size).await?;
        }
        self.len = new_size;
        Ok(())
    }

    /// Makes the capacity at least `new_capacity` bytes, keeping the size and the bytes in use
    /// (RMM's `device_buffer::reserve`). Nothing happens when the capacity already suffices.
    ///
    /// # Stream ordering
    /// As [`resize`](DeviceBuffer::resize).
    ///
    /// # Errors
    /// As [`resize`](DeviceBuffer::resize).
    ///
    /// # Cancel safety
    /// As [`resize`](DeviceBuffer::resize).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(4, &stream, CudaResource::new(&device)?).await?;
    /// buf.reserve(1024).await?;
    /// assert_eq!((buf.len(), buf.capacity()), (4, 1024));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn reserve(&mut self, new_capacity: usize) -> Result<()> {
        if new_capacity > self.capacity {
            self.reallocate(new_capacity).await?;
        }
        Ok(())
    }

    /// Reallocates to exactly [`len`](DeviceBuffer::len) bytes when the capacity is larger,
    /// keeping the bytes in use (RMM's `device_buffer::shrink_to_fit`).
    ///
    /// # Stream ordering
    /// As [`resize`](DeviceBuffer::resize).
    ///
    /// # Errors
    /// As [`resize`](DeviceBuffer::resize).
    ///
    /// # Cancel safety
    /// As [`resize`](DeviceBuffer::resize).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(1024, &stream, CudaResource::new(&device)?).await?;
    /// buf.resize(10).await?;
    /// buf.shrink_to_fit().await?;
    /// assert_eq!((buf.len(), buf.capacity()), (10, 10));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn shrink_to_fit(&mut self) -> Result<()> {
        if self.capacity != self.len {
            self.reallocate(self.len).await?;
        }
        Ok(())
    }

    /// Moves the bytes in use to a new block of `new_capacity` bytes (at least `len`) on the
    /// owner and frees the old one there.
    async fn reallocate(&mut self, new_capacity: usize) -> Result<()> {
        debug_assert!(new_capacity >= self.len);
        let owner = self.uses.get_mut().owner().clone();
        let allocated = padded_size(new_capacity, self.alignment, &self.device)?;
        let new_base = self.mr.allocate(allocated, &owner).await?;
        // No await from here on: the rest runs to completion or is undone.
        let moved = match aligned_start(new_base, allocated, new_capacity, self.alignment) {
            Some(new_ptr) => self.move_into(new_ptr, new_capacity, &owner),
            None => Err(misaligned(new_base, self.mr.as_ref())),
        };
        match moved {
            Ok(()) => {
                self.base = new_base;
                self.allocated = allocated;
                Ok(())
            }
            Err(e) => {
                // SAFETY: allocated above from `mr` with this size on `owner`; the copy into
                // it, if it was enqueued, is on `owner` before this point.
                unsafe { self.mr.deallocate(new_base, allocated, &owner) };
                Err(e)
            }
        }
    }

    /// Copies the bytes in use to `new_ptr` on the owner and frees the old allocation there.
    /// The caller sets `base` and `allocated` to the new allocation's on success.
    fn move_into(&mut self, new_ptr: DevicePtr, new_capacity: usize, owner: &Stream) -> Result<()> {
        self.uses.get_mut().order_owner_after_readers()?;
        if self.len > 0 {
            // SAFETY: both blocks hold at least `len` bytes (`len <= capacity`,
            // `len <= new_capacity`); the old one is freed only below, on `owner` after the
            // copy; the new one was just allocated on `owner`; every recorded read is ordered
            // before this point and other streams write the buffer only after a hand-off.
            unsafe {
                owner
                    .raw()
                    .copy(new_ptr.addr(), self.ptr.addr(), self.len)?
            };
        }
        self.ptr = new_ptr;
        self.capacity = new_capacity;
        // SAFETY: the old allocation came from `mr` as `allocated` bytes at `base` and is not
        // freed yet; its last uses (the copy above, earlier owner work, every recorded read) are
        // ordered before this point of `owner`.
        unsafe { self.mr.deallocate(self.base, self.allocated, owner) };
        Ok(())
    }
}
