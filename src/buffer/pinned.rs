//! Page-locked host memory with a typed, safe face: the host side of truly asynchronous copies.

use std::fmt;
use std::mem::{self, ManuallyDrop};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use bytemuck::Pod;

use super::host_copy::{sealed, HostBuffer};
use crate::error::{Error, Result};
use crate::resource::{into_shared, DevicePtr, MemoryResource, SharedResource};
use crate::stream::Stream;

/// A vector of `T` in page-locked host memory, from a [`PinnedHostResource`] or any resource
/// whose memory both the host and the device can access (a [`PoolResource`] over a
/// `PinnedHostResource`, say, so that a staging buffer is reused batch after batch without a
/// `cuMemHostAlloc` each time).
///
/// It dereferences to `[T]` for host code and is a [`HostBuffer`], so
/// [`DeviceVec::copy_to_host`](crate::DeviceVec::copy_to_host) and
/// [`copy_from_host`](crate::DeviceVec::copy_from_host) take it by value and hand it back
/// when the copy is done. On CUDA such a copy is a plain `cuMemcpyAsync`, truly asynchronous,
/// where a pageable `Vec<T>` is staged by the driver stream through a small pinned buffer.
///
/// Its length is fixed at creation. `T` is [`bytemuck::Pod`]: copies write raw bytes into it.
///
/// # Stream ordering
/// The memory is allocated stream-ordered on the stream given to the constructor, and the
/// constructor waits (without blocking a thread) until that stream has reached the allocation:
/// memory a resource hands out stream-ordered may still be read by device work queued before
/// its last free, and host code, which is not stream-ordered, must not write it before then.
/// A dropped `PinnedHostVec` is freed on that same stream; one dropped while a copy still uses
/// it (its copy future was dropped) is freed stream-ordered on the copy's stream, after the
/// copy.
///
/// Which resources qualify: those whose [`properties`](crate::MemoryResource::properties) say
/// both host- and device-accessible — [`PinnedHostResource`] and managed memory, and adaptors
/// and pools over them. Device memory ([`CudaResource`](crate::CudaResource) on CUDA) and
/// pageable memory ([`HostResource`](crate::HostResource) on CUDA, which the copy engines
/// cannot reach directly) are refused with [`Error::NotHostAccessible`]. On the host backend
/// every resource qualifies.
///
/// Since the constructor waits for its stream, give it a stream that is not busy with long
/// kernels (a staging stream, or the copy stream itself). Dropping one never blocks the
/// thread: the leaf [`PinnedHostResource`]'s `cuMemFreeHost`, which needs the stream idle and
/// takes milliseconds for large vectors, runs on a driver thread once the stream has passed
/// the free. Allocating is the slow part (`cuMemHostAlloc` pins pages: 25 ms for 16 MiB on an
/// H100): a pool over the resource makes later vectors cheap.
///
/// # Examples
///
/// ```
/// use streamalloc::{
///     CudaResource, Device, DeviceVec, PinnedHostResource, PinnedHostVec, PoolResource,
///     Stream,
/// };
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let staging = PoolResource::new(PinnedHostResource::new(&device)?, 1 << 20, None)?;
/// let mut v = DeviceVec::<f32>::new(256, &stream, CudaResource::new(&device)?).await?;
/// for batch in 0..3 {
///     let mut host = PinnedHostVec::<f32>::new(256, &stream, staging.clone()).await?;
///     host.fill(batch as f32);
///     let host = v.copy_from_host(host).await?;    // a direct, asynchronous copy
///     let back = v.copy_to_host(host).await?;
///     assert!(back.iter().all(|&x| x == batch as f32));
/// }                                                // each batch reuses the pool's block
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
///
/// [`PinnedHostResource`]: crate::PinnedHostResource
/// [`PoolResource`]: crate::PoolResource
pub struct PinnedHostVec<T: Pod> {
    /// `len` elements at `ptr` (dangling when `bytes == 0`), `align_of::<T>()`-aligned.
    ptr: NonNull<T>,
    len: usize,
    /// What `mr` returned and must get back.
    base: DevicePtr,
    /// `len * size_of::<T>()`: what was asked of `mr`.
    bytes: usize,
    mr: SharedResource,
    /// The stream the memory was allocated on, and is freed on.
    stream: Stream,
}

// SAFETY: a `PinnedHostVec<T>` uniquely owns its elements, like a `Vec<T>`; the resource and
// the stream are `Send + Sync` handles.
unsafe impl<T: Pod + Send> Send for PinnedHostVec<T> {}
// SAFETY: `&PinnedHostVec<T>` gives shared access to `[T]` only, like `&Vec<T>`.
unsafe impl<T: Pod + Sync> Sync for PinnedHostVec<T> {}

impl<T: Pod> PinnedHostVec<T> {
    /// `len` elements from `mr`, allocated on `stream`, whose contents are whatever the memory
    /// held (any bit pattern is a valid `T`; fresh memory of the crate's resources is zeroed,
    /// reused memory holds its last user's data). Waits for memory when `mr` is a bounded pool
    /// that is exhausted.
    ///
    /// # Stream ordering
    /// Allocated on `stream`; resolves once `stream` has reached the allocation, so that no
    /// device work queued before the memory's last free still uses it.
    ///
    /// # Errors
    /// [`Error::NotHostAccessible`] when `mr`'s memory is not accessible to both the host and
    /// the device ([`Properties`](crate::Properties)); [`Error::InvalidArgument`] when
    /// `len * size_of::<T>()` overflows or the memory is not aligned for `T`; the resource's
    /// errors ([`Error::OutOfMemory`], a [`Timeout`](Error::Timeout) never: it waits);
    /// driver errors.
    ///
    /// # Cancel safety
    /// Dropping the future frees whatever it allocated, stream-ordered on `stream`.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, Error, PinnedHostResource, PinnedHostVec, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let v = PinnedHostVec::<u32>::new(1000, &stream, PinnedHostResource::new(&device)?).await?;
    /// assert_eq!(v.len(), 1000);
    /// assert!(PinnedHostVec::<u32>::new(usize::MAX, &stream, PinnedHostResource::new(&device)?)
    ///     .await
    ///     .is_err()); // 4 * usize::MAX bytes overflow
    /// # Ok::<(), Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn new(
        len: usize,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<Self> {
        Self::allocate(len, stream, into_shared(mr)).await
    }

    /// `len` zeroed elements: [`new`](PinnedHostVec::new), then zero-filled on the host.
    ///
    /// # Errors
    /// As [`new`](PinnedHostVec::new).
    ///
    /// # Cancel safety
    /// As [`new`](PinnedHostVec::new).
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{Device, PinnedHostResource, PinnedHostVec, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let v = PinnedHostVec::<f64>::zeroed(64, &stream, PinnedHostResource::new(&device)?).await?;
    /// assert!(v.iter().all(|&x| x == 0.0));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn zeroed(
        len: usize,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<Self> {
        let mut v = Self::allocate(len, stream, into_shared(mr)).await?;
        v.fill(T::zeroed());
        Ok(v)
    }

    /// A copy of `src` in pinned memory: [`new`](PinnedHostVec::new) of `src.len()`, then
    /// filled from `src` on the host.
    ///
    /// # Errors
    /// As [`new`](PinnedHostVec::new).
    ///
    /// # Cancel safety
    /// As [`new`](PinnedHostVec::new).
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{Device, PinnedHostResource, PinnedHostVec, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let v = PinnedHostVec::from_slice(&[1u16, 2, 3], &stream, PinnedHostResource::new(&device)?)
    ///     .await?;
    /// assert_eq!(&v[..], &[1, 2, 3]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn from_slice(
        src: &[T],
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<Self> {
        let mut v = Self::allocate(src.len(), stream, into_shared(mr)).await?;
        v.copy_from_slice(src);
        Ok(v)
    }

    async fn allocate(len: usize, stream: &Stream, mr: SharedResource) -> Result<Self> {
        let props = mr.properties();
        if !(props.host_accessible && props.device_accessible) {
            return Err(Error::NotHostAccessible {
                what: "PinnedHostVec",
                host_accessible: props.host_accessible,
                device_accessible: props.device_accessible,
                device: props.device,
            });
        }
        let bytes = len.checked_mul(mem::size_of::<T>()).ok_or_else(|| {
            Error::invalid(format!(
                "PinnedHostVec of {len} elements of {} bytes: the size overflows usize",
                mem::size_of::<T>()
            ))
        })?;
        let base = mr.allocate(bytes, stream).await?;
        // From here on, dropping `v` (an error below, or this future) frees the memory.
        let mut v = PinnedHostVec {
            ptr: NonNull::dangling(),
            len: 0,
            base,
            bytes,
            mr,
            stream: stream.clone(),
        };
        if bytes == 0 {
            v.len = len;
            return Ok(v);
        }
        if !base.is_aligned(mem::align_of::<T>()) {
            return Err(Error::invalid(format!(
                "PinnedHostVec: the resource returned {base}, not aligned to {} bytes",
                mem::align_of::<T>()
            )));
        }
        v.ptr = NonNull::new(base.addr() as *mut T).ok_or_else(|| {
            Error::invalid(format!(
                "PinnedHostVec: the resource returned a null pointer for {bytes} bytes"
            ))
        })?;
        v.len = len;
        // Host code is not stream-ordered: wait until device work queued before this
        // allocation (a copy still reading the memory before its last free) has finished.
        // Nothing reads the elements before then: `v` is not handed out yet.
        stream.record()?.await?;
        Ok(v)
    }

    /// The number of elements.
    ///
    /// ```
    /// # use streamalloc::{Device, PinnedHostResource, PinnedHostVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = PinnedHostVec::<u64>::zeroed(5, &stream, PinnedHostResource::new(&device)?).await?;
    /// assert_eq!(v.len(), 5);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when [`len`](PinnedHostVec::len) is 0.
    ///
    /// ```
    /// # use streamalloc::{Device, PinnedHostResource, PinnedHostVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = PinnedHostVec::<u8>::new(0, &stream, PinnedHostResource::new(&device)?).await?;
    /// assert!(v.is_empty());
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements.
    ///
    /// ```
    /// # use streamalloc::{Device, PinnedHostResource, PinnedHostVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = PinnedHostVec::from_slice(&[4i32, 5], &stream, PinnedHostResource::new(&device)?)
    ///     .await?;
    /// assert_eq!(v.as_slice(), &[4, 5]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `ptr` is aligned and non-null and, for `len > 0`, points at `len` elements of
        // host-accessible memory that this value owns; no copy uses them while the host holds
        // the value (copies own it until they complete), and any bit pattern is a valid `T`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The elements, mutably.
    ///
    /// ```
    /// # use streamalloc::{Device, PinnedHostResource, PinnedHostVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut v = PinnedHostVec::<i32>::zeroed(2, &stream, PinnedHostResource::new(&device)?)
    ///     .await?;
    /// v.as_mut_slice()[1] = 7;
    /// assert_eq!(&v[..], &[0, 7]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`; `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The stream the memory was allocated on, which frees it when the vector is dropped.
    ///
    /// ```
    /// # use streamalloc::{Device, PinnedHostResource, PinnedHostVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let v = PinnedHostVec::<u8>::new(8, &stream, PinnedHostResource::new(&device)?).await?;
    /// assert_eq!(v.stream(), &stream);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The resource the memory came from, which frees it.
    ///
    /// ```
    /// # use streamalloc::{Device, MemoryResource, PinnedHostResource, PinnedHostVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let v = PinnedHostVec::<u8>::new(8, &stream, PinnedHostResource::new(&device)?).await?;
    /// assert!(v.resource().properties().host_accessible);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn resource(&self) -> &SharedResource {
        &self.mr
    }

    /// Frees the memory stream-ordered on `stream` instead of its own.
    ///
    /// # Safety
    /// Every device access to the memory is ordered before this point of `stream`, and host
    /// code no longer accesses it.
    unsafe fn free_on(mut self, stream: &Stream) {
        // The drop below frees on `self.stream`.
        self.stream = stream.clone();
    }
}

impl<T: Pod> Deref for PinnedHostVec<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Pod> DerefMut for PinnedHostVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.as_mut_slice()
    }
}

impl<T: Pod> Drop for PinnedHostVec<T> {
    fn drop(&mut self) {
        // SAFETY: `base` came from `mr.allocate(bytes, ..)` and is freed once, here. Device
        // accesses are copies whose futures own the value until the copy has completed (or
        // free it on the copy's stream, `free_on`), so none is pending; host accesses ended
        // with the borrow of `self`.
        unsafe { self.mr.deallocate(self.base, self.bytes, &self.stream) };
    }
}

impl<T: Pod> fmt::Debug for PinnedHostVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHostVec")
            .field("ptr", &self.base)
            .field("len", &self.len)
            .field("bytes", &self.bytes)
            .field("stream", &self.stream.id())
            .finish()
    }
}

impl<T: Pod + Send> sealed::Sealed for PinnedHostVec<T> {
    type Raw = ManuallyDrop<PinnedHostVec<T>>;

    fn byte_len(&self) -> usize {
        self.bytes
    }

    fn elem_len(&self) -> usize {
        self.len
    }

    fn page_locked(&self) -> bool {
        true
    }

    fn into_raw(self) -> Self::Raw {
        ManuallyDrop::new(self)
    }

    fn raw_addr(raw: &Self::Raw) -> u64 {
        raw.ptr.as_ptr() as u64
    }

    unsafe fn from_raw(raw: Self::Raw) -> Self {
        ManuallyDrop::into_inner(raw)
    }

    unsafe fn release_after(raw: Self::Raw, stream: &Stream) {
        // Not in a host function (a free may call the driver, which host functions must not):
        // a stream-ordered free on the copy's stream orders the reuse after the copy, and the
        // constructor's wait keeps host code off reused memory until the device is done.
        // SAFETY: the caller orders every device access before this point of `stream`; host
        // code gave the value up to the copy.
        unsafe { ManuallyDrop::into_inner(raw).free_on(stream) }
    }
}

impl<T: Pod + Send> HostBuffer for PinnedHostVec<T> {
    type Elem = T;
}

#[cfg(test)]
mod tests;
