//! Making a buffer: allocation from a resource (awaited or not), a larger alignment, and
//! adoption of memory allocated elsewhere.

use parking_lot::Mutex;

use super::uses::Uses;
use super::DeviceBuffer;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::{
    check_resource, into_shared, DevicePtr, MemoryResource, SharedResource, ALLOCATION_ALIGNMENT,
};
use crate::stream::Stream;

impl DeviceBuffer {
    /// Allocates `bytes` from `mr` for use on `stream`, which owns the buffer. The contents are
    /// uninitialised (as RMM's; on the host backend they are zeroed).
    ///
    /// Awaits [`MemoryResource::allocate`]: it completes on the first poll when memory is
    /// there, and waits for memory when a bounded resource is exhausted.
    ///
    /// # Stream ordering
    /// The memory is valid for work on `stream` enqueued from now on.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] and the other errors of the resource;
    /// [`Error::DeviceMismatch`] when `stream` is not on the resource's device.
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves leaves nothing allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::new(1000, &stream, CudaResource::new(&device)).await?;
    /// assert_eq!((buf.len(), buf.capacity()), (1000, 1000));
    /// assert_eq!(buf.stream(), stream);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn new(
        bytes: usize,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<DeviceBuffer> {
        Self::from_shared(bytes, stream, into_shared(mr)).await
    }

    /// Allocates `bytes` from `mr` for use on `stream` without waiting for memory: the
    /// synchronous fast path of [`new`](DeviceBuffer::new).
    ///
    /// # Stream ordering
    /// As [`new`](DeviceBuffer::new).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the memory is not there now; the other errors of the
    /// resource; [`Error::DeviceMismatch`] when `stream` is not on the resource's device.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, HostConfig, Stream};
    ///
    /// let device = Device::host_with(HostConfig::default().capacity(1 << 20));
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaResource::new(&device);
    /// let buf = DeviceBuffer::try_new(4096, &stream, mr.clone())?;
    /// assert_eq!(buf.len(), 4096);
    /// assert!(DeviceBuffer::try_new(2 << 20, &stream, mr).unwrap_err().is_out_of_memory());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn try_new(
        bytes: usize,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<DeviceBuffer> {
        let mr = shared_for(mr, stream)?;
        let ptr = mr.try_allocate(bytes, stream)?;
        Ok(Self::from_parts(ptr, bytes, mr, stream))
    }

    /// Allocates `bytes` for use on `stream` from the current resource of the stream's device
    /// ([`current_device_resource_for`](crate::current_device_resource_for)).
    ///
    /// # Stream ordering
    /// As [`new`](DeviceBuffer::new).
    ///
    /// # Errors
    /// As [`new`](DeviceBuffer::new).
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves leaves nothing allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{Device, DeviceBuffer, HostConfig, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host_with(HostConfig::default());
    /// let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::with_current_resource(512, &stream).await?;
    /// assert_eq!(buf.len(), 512);
    /// assert_eq!(device.host_controls().unwrap().allocated_bytes(), 512);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn with_current_resource(bytes: usize, stream: &Stream) -> Result<DeviceBuffer> {
        Self::from_shared(
            bytes,
            stream,
            crate::resource::registry::current_device_resource_for(stream.device()),
        )
        .await
    }

    async fn from_shared(bytes: usize, stream: &Stream, mr: SharedResource) -> Result<Self> {
        check_resource(&*mr, stream)?;
        let ptr = mr.allocate(bytes, stream).await?;
        Ok(Self::from_parts(ptr, bytes, mr, stream))
    }

    pub(super) fn from_parts(
        ptr: DevicePtr,
        bytes: usize,
        mr: SharedResource,
        stream: &Stream,
    ) -> Self {
        DeviceBuffer {
            ptr,
            len: bytes,
            capacity: bytes,
            base: ptr,
            allocated: bytes,
            alignment: ALLOCATION_ALIGNMENT,
            mr,
            device: stream.device().clone(),
            uses: Mutex::new(Uses::new(stream.clone())),
        }
    }

    /// Allocates `bytes` from `mr` for use on `stream` at an address that is a multiple of
    /// `alignment` (RMM's `device_buffer` with an alignment). Resizes keep the alignment.
    ///
    /// Alignments up to [`ALLOCATION_ALIGNMENT`] (256) are what every resource gives anyway.
    /// A larger one is reached by asking `mr` for `bytes + alignment - 256` bytes and starting
    /// the buffer at the first aligned address inside them; the buffer remembers what it asked
    /// for and frees exactly that. A 0-byte buffer allocates nothing and has a null pointer.
    ///
    /// # Stream ordering
    /// As [`new`](DeviceBuffer::new).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `alignment` is not a power of two;
    /// [`Error::OutOfMemory`] when the padded size overflows `usize`, and the resource's errors
    /// (an out-of-memory error names the padded size); [`Error::DeviceMismatch`] when `stream`
    /// is not on the resource's device.
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves leaves nothing allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaResource::new(&device);
    /// let mut buf = DeviceBuffer::with_alignment(1000, 4096, &stream, mr.clone()).await?;
    /// assert!(buf.ptr().is_aligned(4096));
    /// assert_eq!((buf.len(), buf.alignment()), (1000, 4096));
    /// buf.resize(1 << 20).await?;                   // reallocated, still aligned
    /// assert!(buf.ptr().is_aligned(4096));
    /// assert!(DeviceBuffer::with_alignment(8, 3000, &stream, mr).await.is_err());
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn with_alignment(
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<DeviceBuffer> {
        let alignment = checked_alignment(alignment)?;
        Self::from_shared_aligned(bytes, alignment, stream, into_shared(mr)).await
    }

    pub(super) async fn from_shared_aligned(
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        mr: SharedResource,
    ) -> Result<Self> {
        check_resource(&*mr, stream)?;
        let allocated = padded_size(bytes, alignment, stream.device())?;
        let base = mr.allocate(allocated, stream).await?;
        Self::from_aligned(base, allocated, bytes, alignment, mr, stream)
    }

    /// [`with_alignment`](DeviceBuffer::with_alignment) without waiting for memory: the
    /// synchronous fast path.
    ///
    /// # Stream ordering
    /// As [`new`](DeviceBuffer::new).
    ///
    /// # Errors
    /// As [`with_alignment`](DeviceBuffer::with_alignment); [`Error::OutOfMemory`] also when
    /// the memory is not there now.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Error, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaResource::new(&device);
    /// let buf = DeviceBuffer::try_with_alignment(100, 1 << 16, &stream, mr.clone())?;
    /// assert!(buf.ptr().is_aligned(1 << 16));
    /// let odd = DeviceBuffer::try_with_alignment(100, 384, &stream, mr);
    /// assert!(matches!(odd, Err(Error::InvalidArgument(_))));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn try_with_alignment(
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<DeviceBuffer> {
        let mr = shared_for(mr, stream)?;
        let alignment = checked_alignment(alignment)?;
        let allocated = padded_size(bytes, alignment, stream.device())?;
        let base = mr.try_allocate(allocated, stream)?;
        Self::from_aligned(base, allocated, bytes, alignment, mr, stream)
    }

    /// A buffer of `bytes` at the first `alignment`-aligned address of the allocation `base`
    /// (`allocated` bytes from `mr` on `stream`). Frees the allocation on failure.
    fn from_aligned(
        base: DevicePtr,
        allocated: usize,
        bytes: usize,
        alignment: usize,
        mr: SharedResource,
        stream: &Stream,
    ) -> Result<Self> {
        let Some(ptr) = aligned_start(base, allocated, bytes, alignment) else {
            // SAFETY: allocated just now from `mr` with this size on `stream`; unused.
            unsafe { mr.deallocate(base, allocated, stream) };
            return Err(misaligned(base, mr.as_ref()));
        };
        let mut buf = Self::from_parts(ptr, bytes, mr, stream);
        buf.base = base;
        buf.allocated = allocated;
        buf.alignment = alignment;
        Ok(buf)
    }

    /// Adopts memory allocated elsewhere: the buffer owns `bytes` at `ptr`, is owned by
    /// `stream`, and frees them through `mr` (RMM's `device_buffer` over adopted memory).
    ///
    /// # Stream ordering
    /// The buffer's operations and its free are enqueued on `stream`, which must already be
    /// ordered after every earlier use of the memory (Safety, 3).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when `stream` is not on `mr`'s device. The memory is then
    /// not adopted: it stays the caller's to free.
    ///
    /// # Safety
    /// 1. `ptr` was returned by `try_allocate(bytes, ..)` (or `allocate`) of `mr` (or a clone
    ///    of it), with exactly this `bytes`, and is not deallocated yet.
    /// 2. Nothing else frees it: from a successful return on, the buffer does (on drop,
    ///    stream-ordered on its owner).
    /// 3. All work that uses the memory so far is ordered before this point of `stream`.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, MemoryResource, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaResource::new(&device);
    /// let p = mr.try_allocate(64, &stream)?;
    /// // SAFETY: `p` is 64 bytes from `mr`, used by nothing, freed by nobody else.
    /// let mut buf = unsafe { DeviceBuffer::from_raw_parts(p, 64, &stream, mr)? };
    /// buf.fill(1)?;
    /// assert_eq!(buf.copy_to_host(vec![0u8; 64]).await?, vec![1; 64]);
    /// drop(buf);                                        // frees `p` on `stream`
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub unsafe fn from_raw_parts(
        ptr: DevicePtr,
        bytes: usize,
        stream: &Stream,
        mr: impl MemoryResource + 'static,
    ) -> Result<DeviceBuffer> {
        let mr = shared_for(mr, stream)?;
        Ok(Self::from_parts(ptr, bytes, mr, stream))
    }
}

/// `mr` type-erased, once it is checked to allocate on `stream`'s device.
fn shared_for(mr: impl MemoryResource + 'static, stream: &Stream) -> Result<SharedResource> {
    let mr = into_shared(mr);
    check_resource(&*mr, stream)?;
    Ok(mr)
}

/// `alignment` when it is a power of two, raised to [`ALLOCATION_ALIGNMENT`], which every
/// resource gives.
pub(super) fn checked_alignment(alignment: usize) -> Result<usize> {
    if !alignment.is_power_of_two() {
        return Err(Error::invalid(format!(
            "a buffer alignment must be a power of two, not {alignment}"
        )));
    }
    Ok(alignment.max(ALLOCATION_ALIGNMENT))
}

/// The bytes to ask a resource for so that `bytes` fit at an `alignment`-aligned address of
/// its 256-aligned block: `bytes` plus `alignment - 256`. 0 bytes need no block at all.
pub(super) fn padded_size(bytes: usize, alignment: usize, device: &Device) -> Result<usize> {
    if bytes == 0 {
        return Ok(0);
    }
    let padding = alignment.saturating_sub(ALLOCATION_ALIGNMENT);
    // A size past `usize` could never be allocated: out of memory, as `AlignedAdaptor` says.
    bytes.checked_add(padding).ok_or(Error::OutOfMemory {
        requested: bytes,
        available: None,
        device: device.id(),
    })
}

/// The first `alignment`-aligned address of the block `base..base + allocated` with room for
/// `bytes` before its end; `None` when there is none (a resource that broke the 256-byte
/// alignment contract).
pub(super) fn aligned_start(
    base: DevicePtr,
    allocated: usize,
    bytes: usize,
    alignment: usize,
) -> Option<DevicePtr> {
    if allocated == 0 {
        return Some(base);
    }
    let align = alignment as u64;
    let start = base.addr().checked_next_multiple_of(align)?;
    let end = base.addr().checked_add(allocated as u64)?;
    (start.checked_add(bytes as u64)? <= end).then_some(DevicePtr::from_raw(start))
}

pub(super) fn misaligned(base: DevicePtr, mr: &dyn MemoryResource) -> Error {
    Error::invalid(format!(
        "{mr:?} returned {base}, which is not {ALLOCATION_ALIGNMENT}-byte aligned"
    ))
}
