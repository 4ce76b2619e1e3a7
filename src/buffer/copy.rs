//! Work on a buffer's bytes: fills, copies (device to device, to and from the host, deep
//! clones) and prefetches, each ordered after the uses it must follow.

use super::byte_range::{ByteRange, ByteRangeMut};
use super::device_buffer::DeviceBuffer;
use super::host_copy::Unit;
use super::host_copy::{CopyFromHost, CopyFromSlice, CopyToHost, CopyToSlice, HostBuffer};
use crate::backend::PrefetchTarget;
use crate::error::{Error, Result};
use crate::stream::Stream;

impl DeviceBuffer {
    /// Sets every byte in use to `value` (`cuMemsetD8Async` on the owner).
    ///
    /// # Stream ordering
    /// Enqueued on the owner, after it waits for every recorded read.
    ///
    /// # Errors
    /// Driver errors when waiting or enqueuing fails.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(8, &stream, CudaResource::new(&device)?).await?;
    /// buf.fill(0xab)?;
    /// assert_eq!(buf.copy_to_host(vec![0u8; 8]).await?, vec![0xab; 8]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn fill(&mut self, value: u8) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let mut uses = self.uses.get_mut();
        uses.order_owner_after_readers()?;
        // SAFETY: `ptr..ptr + len` lies in the allocation (`len <= capacity`), which is freed
        // only on the owner after this point or on a later owner that waits for this point;
        // every recorded read is ordered before it (just above), and other streams write the
        // buffer only after a hand-off that waits for it.
        unsafe { uses.owner().raw().memset(self.ptr.addr(), value, self.len) }
    }

    /// Copies all of `src` into the start of this buffer, device to device.
    ///
    /// # Stream ordering
    /// Enqueued on this buffer's owner, which first waits for `src`'s owner's work so far and
    /// for this buffer's recorded reads; the read of `src` by this buffer's owner is recorded,
    /// so `src`'s later writes and free wait for the copy.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `src` is longer than this buffer;
    /// [`Error::DeviceMismatch`] when `src` is on another device; driver errors.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let mr = CudaResource::new(&device)?;
    /// let mut src = DeviceBuffer::new(4, &a, mr.clone()).await?;
    /// src.fill(2)?;
    /// let mut dst = DeviceBuffer::new(6, &b, mr).await?;
    /// dst.copy_from_device(&src)?;  // on `b`, after `a`'s fill
    /// assert_eq!(dst.copy_to_host(vec![0u8; 6]).await?, [2, 2, 2, 2, 0, 0]);
    /// assert!(src.copy_from_device(&dst).is_err()); // 6 bytes do not fit in 4
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_from_device(&mut self, src: &DeviceBuffer) -> Result<()> {
        if src.device != self.device {
            return Err(Error::DeviceMismatch {
                expected: self.device.id(),
                actual: src.device.id(),
                call: "DeviceBuffer::copy_from_device(src)",
            });
        }
        if src.len > self.len {
            return Err(Error::invalid(format!(
                "copy_from_device: the source holds {} bytes, the destination only {}",
                src.len, self.len
            )));
        }
        self.enqueue_copy_from(src)
    }

    /// Enqueues the copy of `src`'s bytes into the start of `self` on `self`'s owner, ordered
    /// both ways (`copy_from_device` and `copy_from_peer` after their checks): the owner waits
    /// for `src`'s owner's work so far and for `self`'s readers, and `src`'s later writes and
    /// free wait for the copy. A peer copy where the two live on different devices.
    ///
    /// The caller has checked that `self` holds at least `src.len` bytes.
    pub(super) fn enqueue_copy_from(&mut self, src: &DeviceBuffer) -> Result<()> {
        if src.len == 0 {
            return Ok(());
        }
        let mut uses = self.uses.get_mut();
        let owner = uses.owner().clone();
        let mut src_uses = src.uses.lock();
        src_uses.order_after_owner(&owner)?;
        uses.order_owner_after_readers()?;
        let (dst_addr, src_addr) = (self.ptr.addr(), src.ptr.addr());
        // SAFETY: `self` holds at least `src.len` bytes (the caller checked) and `src` holds
        // `src.len`; `self`'s recorded reads and `src`'s owner's writes so far are ordered before
        // this point of `owner` (just above, across devices where they differ); `src`'s later
        // writes and free wait for the read recorded below; the borrows keep both from being
        // handed on or dropped meanwhile. `src` is memory of its owner's device.
        unsafe {
            if src.device == self.device {
                owner.raw().copy(dst_addr, src_addr, src.len)?;
            } else {
                owner
                    .raw()
                    .copy_peer(dst_addr, src_addr, src_uses.owner().raw(), src.len)?;
            }
        }
        src_uses.add_read_now(&owner)
    }

    /// Copies the bytes in use into the start of `host`, and hands `host` back when done.
    ///
    /// The copy is enqueued on the owner now, when this is called; the returned
    /// [`CopyToHost`] future waits for it without blocking a thread and borrows nothing.
    ///
    /// # Stream ordering
    /// Enqueued on the owner, after its work so far. The owner's later writes, a later
    /// hand-off and the free come after it.
    ///
    /// # Errors
    /// The future resolves to [`Error::LengthMismatch`] when `host` is shorter than the
    /// buffer; driver errors.
    ///
    /// # Cancel safety
    /// Dropping the future does not cancel the copy and does not free `host` under it (a host
    /// function on the owner drops it after the copy); see [`CopyToHost`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(3, &stream, CudaResource::new(&device)?).await?;
    /// buf.fill(1)?;
    /// assert_eq!(buf.copy_to_host(vec![0u8; 3]).await?, [1, 1, 1]);
    /// assert!(buf.copy_to_host(vec![0u8; 2]).await.is_err()); // too short
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_to_host<B: HostBuffer<Elem = u8>>(&self, host: B) -> CopyToHost<B> {
        ByteRange::whole(self).copy_to_host(Unit::Bytes, host)
    }

    /// Copies all of `host` into the start of the buffer, and hands `host` back when done.
    ///
    /// The copy is enqueued on the owner now, when this is called; the returned
    /// [`CopyFromHost`] future waits for it without blocking a thread and borrows nothing.
    /// Work enqueued on the owner afterwards sees the new bytes.
    ///
    /// # Stream ordering
    /// Enqueued on the owner, after it waits for every recorded read.
    ///
    /// # Errors
    /// The future resolves to [`Error::LengthMismatch`] when `host` is longer than the
    /// buffer; driver errors.
    ///
    /// # Cancel safety
    /// Dropping the future does not cancel the copy and does not free `host` under it (a host
    /// function on the owner drops it after the copy); see [`CopyFromHost`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(3, &stream, CudaResource::new(&device)?).await?;
    /// let host = buf.copy_from_host(vec![7u8, 8, 9]).await?;
    /// assert_eq!(host, [7, 8, 9]);
    /// assert!(buf.copy_from_host(vec![0u8; 4]).await.is_err()); // too long
    /// buf.copy_from_host(vec![0; 3]).await?;                    // an untyped literal is bytes
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// A buffer's copies are bytes: typed host data goes through a
    /// [`DeviceVec<T>`](crate::DeviceVec), or [`bytemuck::cast_slice`] to bytes.
    ///
    /// ```compile_fail
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device).unwrap();
    /// let mut buf = DeviceBuffer::try_new(8, &stream, CudaResource::new(&device).unwrap()).unwrap();
    /// let _ = buf.copy_from_host(vec![0i32; 2]); // refused: not bytes
    /// ```
    pub fn copy_from_host<B: HostBuffer<Elem = u8>>(&mut self, host: B) -> CopyFromHost<B> {
        ByteRangeMut::whole(self).copy_from_host(Unit::Bytes, host)
    }

    /// Copies the bytes in use into the start of the borrowed slice `dst`, staged through an
    /// owned host buffer.
    ///
    /// The copy into the staging buffer is enqueued now, on the owner; the returned
    /// [`CopyToSlice`] future copies it into `dst` when it resolves. The device never writes
    /// `dst` itself, so forgetting the future cannot let it write after the borrow ends. For
    /// large or repeated copies, [`copy_to_host`](DeviceBuffer::copy_to_host) into an owned
    /// [`PinnedHostVec`](crate::PinnedHostVec) saves the staging copy.
    ///
    /// # Stream ordering
    /// As [`copy_to_host`](DeviceBuffer::copy_to_host).
    ///
    /// # Errors
    /// The future resolves to [`Error::LengthMismatch`] when `dst` holds fewer bytes than the
    /// buffer; driver errors.
    ///
    /// # Cancel safety
    /// Dropping the future leaves `dst` untouched; see [`CopyToSlice`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Error, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(8, &stream, CudaResource::new(&device)?).await?;
    /// buf.fill(0)?;
    /// let mut out = [1u8; 10];
    /// buf.copy_to_host_slice(&mut out).await?;
    /// assert_eq!(out, [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]); // 8 bytes; the rest is untouched
    /// let e = buf.copy_to_host_slice(&mut [0u8; 7]).await.unwrap_err();
    /// assert!(matches!(e, Error::LengthMismatch { device_len: 8, host_len: 7, .. }));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_to_host_slice<'a>(&self, dst: &'a mut [u8]) -> CopyToSlice<'a> {
        ByteRange::whole(self).copy_to_host_slice(Unit::Bytes, dst)
    }

    /// Copies all of the borrowed slice `src` into the start of the buffer, staged through an
    /// owned host buffer.
    ///
    /// `src` is copied into the staging buffer now, before the device copy is enqueued on the
    /// owner, so the returned [`CopyFromSlice`] future borrows nothing and the device never
    /// reads `src` itself. Work enqueued on the owner afterwards sees the new bytes.
    ///
    /// # Stream ordering
    /// As [`copy_from_host`](DeviceBuffer::copy_from_host).
    ///
    /// # Errors
    /// The future resolves to [`Error::LengthMismatch`] when `src` holds more bytes than the
    /// buffer; driver errors.
    ///
    /// # Cancel safety
    /// Dropping the future does not cancel the copy; see [`CopyFromSlice`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(8, &stream, CudaResource::new(&device)?).await?;
    /// buf.copy_from_host_slice(&0.25f64.to_ne_bytes()).await?;
    /// assert_eq!(buf.copy_to_host(vec![0u8; 8]).await?, 0.25f64.to_ne_bytes());
    /// assert!(buf.copy_from_host_slice(&[0u8; 9]).await.is_err()); // too long
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_from_host_slice(&mut self, src: &[u8]) -> CopyFromSlice {
        ByteRangeMut::whole(self).copy_from_host_slice(Unit::Bytes, src)
    }

    /// A deep copy owned by `stream`, from the same resource, of exactly
    /// [`len`](DeviceBuffer::len) bytes (RMM's `device_buffer` copy constructor).
    ///
    /// # Stream ordering
    /// The copy is allocated and written on `stream`, which first waits for the owner's work
    /// so far; the read of `self` by `stream` is recorded, so `self`'s later writes and free
    /// wait for the copy.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when `stream` is on another device; the resource's errors;
    /// driver errors.
    ///
    /// # Cancel safety
    /// The only wait is for the allocation: dropping the future before it resolves leaves
    /// nothing allocated and nothing enqueued.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let mut buf = DeviceBuffer::new(32, &a, CudaResource::new(&device)?).await?;
    /// buf.fill(4)?;
    /// let copy = buf.try_clone_on(&b).await?;
    /// drop(buf);                    // freed on `a` after `b` has copied it
    /// assert_eq!(copy.stream(), b);
    /// assert_eq!(copy.copy_to_host(vec![0u8; 32]).await?, vec![4; 32]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn try_clone_on(&self, stream: &Stream) -> Result<DeviceBuffer> {
        stream.check_on(&self.device, "DeviceBuffer::try_clone_on(stream)")?;
        let copy =
            Self::from_shared_aligned(self.len, self.alignment, stream, self.mr.clone()).await?;
        if self.len > 0 {
            let mut uses = self.uses.lock();
            uses.order_after_owner(stream)?;
            // SAFETY: `copy` holds `len` bytes, allocated on `stream` and not shared yet;
            // `self` holds `len` bytes, its owner's writes so far are ordered before this point
            // (just above), later writes and its free wait for the read recorded below, and
            // `&self` keeps it from being handed on or dropped meanwhile.
            unsafe {
                stream
                    .raw()
                    .copy(copy.ptr.addr(), self.ptr.addr(), self.len)?
            };
            uses.add_read_now(stream)?;
        }
        Ok(copy)
    }

    /// A deep copy owned by the same stream: [`try_clone_on`](DeviceBuffer::try_clone_on) the
    /// owner.
    ///
    /// # Stream ordering
    /// Allocated and copied on the owner, after its work so far.
    ///
    /// # Errors
    /// The resource's errors; driver errors.
    ///
    /// # Cancel safety
    /// As [`try_clone_on`](DeviceBuffer::try_clone_on).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(32, &stream, CudaResource::new(&device)?).await?;
    /// buf.fill(6)?;
    /// let copy = buf.try_clone().await?;
    /// assert_ne!(copy.ptr(), buf.ptr());
    /// assert_eq!(copy.copy_to_host(vec![0u8; 32]).await?, vec![6; 32]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn try_clone(&self) -> Result<DeviceBuffer> {
        let owner = self.stream();
        self.try_clone_on(&owner).await
    }

    /// Migrates the bytes in use to the buffer's device ahead of use (RMM's `prefetch`), when
    /// they are managed memory: [`prefetch_to`](DeviceBuffer::prefetch_to) the device.
    ///
    /// # Stream ordering
    /// As [`prefetch_to`](DeviceBuffer::prefetch_to).
    ///
    /// # Errors
    /// As [`prefetch_to`](DeviceBuffer::prefetch_to).
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, ManagedResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let managed = DeviceBuffer::try_new(4096, &stream, ManagedResource::new(&device)?)?;
    /// assert!(managed.prefetch(&stream)?);      // enqueued
    /// let plain = DeviceBuffer::try_new(4096, &stream, CudaResource::new(&device)?)?;
    /// assert!(!plain.prefetch(&stream)?);       // not managed: nothing to migrate
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn prefetch(&self, stream: &Stream) -> Result<bool> {
        self.prefetch_to(PrefetchTarget::Device, stream)
    }

    /// Migrates the bytes in use to `target` (the device, or host memory) ahead of use
    /// (`cuMemPrefetchAsync`; RMM's `prefetch`), a hint that spares the first accesses there
    /// their page faults. Returns whether a prefetch was enqueued.
    ///
    /// Memory that is not managed (device or pinned memory), an empty buffer, and a device
    /// that cannot prefetch (no concurrent managed access, a CUDA driver older than 12.2) make
    /// it a no-op that returns `false`, as RMM's `prefetch` ignores them. On the host backend
    /// nothing moves; a prefetch of managed memory is counted
    /// ([`HostControls::prefetches`](crate::HostControls::prefetches)).
    ///
    /// # Stream ordering
    /// Enqueued on `stream`, which need not be the owner and does not wait for it: a prefetch
    /// moves pages without changing their contents. When `stream` is not the owner, the
    /// prefetch is recorded as a read, so the owner's later writes and the free wait for it.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when `stream` is on another device; driver errors.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaAsyncManagedResource, Device, DeviceBuffer, PrefetchTarget, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaAsyncManagedResource::new(&device)?;
    /// let buf = DeviceBuffer::try_new(1 << 20, &stream, mr)?;
    /// assert!(buf.prefetch_to(PrefetchTarget::Host, &stream)?); // e.g. before host reads
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn prefetch_to(&self, target: PrefetchTarget, stream: &Stream) -> Result<bool> {
        stream.check_on(&self.device, "DeviceBuffer::prefetch_to(stream)")?;
        if self.len == 0 {
            return Ok(false);
        }
        let mut uses = self.uses.lock();
        if stream == uses.owner() {
            // A use on the owner: a later hand-off or free comes after it.
            uses.ready()?;
        }
        let enqueued =
            self.device
                .raw()
                .prefetch_to(self.ptr.addr(), self.len, target, stream.raw())?;
        if enqueued {
            uses.add_read_now(stream)?;
        }
        Ok(enqueued)
    }
}
