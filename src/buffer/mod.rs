//! Owning device memory with stream-ordered drop and cross-stream use tracking.
//!
//! [`DeviceBuffer`] is RMM's `device_buffer` with the stream hand-off made automatic: the
//! buffer knows which stream owns it and which other streams read it ([`uses`]), and inserts
//! the event waits that a hand-off, a write after a read and the free need.

mod guard;
mod host_copy;
mod uses;

use std::fmt;
use std::sync::OnceLock;

use parking_lot::Mutex;

pub use guard::ReadGuard;
pub use host_copy::{CopyFromHost, CopyToHost, HostBuffer};

use crate::backend::PrefetchTarget;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::{
    check_stream, into_shared, CudaResource, DevicePtr, MemoryResource, SharedResource,
    ALLOCATION_ALIGNMENT,
};
use crate::stream::Stream;
use uses::Uses;

/// Owning, untyped device memory, freed stream-ordered on the stream that owns it (RMM's
/// `device_buffer`).
///
/// A buffer holds its pointer, size, capacity and resource, and its *use state*: the stream
/// that owns it, and the latest event of every other stream that read it. The owner is the
/// stream on which the buffer's own operations ([`fill`](DeviceBuffer::fill), the copies,
/// [`resize`](DeviceBuffer::resize), the free) are enqueued.
///
/// # Stream ordering
/// - Hand-off: [`set_stream`](DeviceBuffer::set_stream) makes the new owner wait for the old
///   owner's work so far and for every recorded read, without blocking the host.
/// - Reads on other streams: [`read_on`](DeviceBuffer::read_on) makes the reading stream wait
///   for the owner's work so far and records an event on it when the read ends; the owner's
///   later writes and the free wait for it.
/// - Drop: the owner waits for every recorded read, then the memory is deallocated on the
///   owner, stream-ordered. Drop never blocks and never synchronizes.
///
/// Work you enqueue yourself through [`ptr`](DeviceBuffer::ptr) is yours to order: enqueue it
/// on the owner, or on a stream inside a [`ReadGuard`] (reads only).
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaAsyncResource, Device, DeviceBuffer, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let mr = CudaAsyncResource::new(&device)?;
/// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
///
/// let mut buf = DeviceBuffer::new(1024, &a, mr).await?;
/// buf.fill(7)?;                                   // enqueued on `a`
/// buf.set_stream(&b)?;                            // `b` waits for `a`'s work on `buf`
/// let host = buf.copy_to_host(vec![0u8; 1024]).await?; // copied on `b`
/// assert!(host.iter().all(|&x| x == 7));
/// drop(buf);                                      // freed on `b`, stream-ordered
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub struct DeviceBuffer {
    /// The start of the buffer: `capacity` bytes at `alignment` inside the allocation, valid on
    /// the owner.
    ptr: DevicePtr,
    /// Bytes in use; `len <= capacity`.
    len: usize,
    /// Bytes usable from `ptr`; `base + allocated >= ptr + capacity`.
    capacity: usize,
    /// What `mr` returned: `ptr` rounded down past the alignment padding (`base == ptr` unless
    /// the alignment exceeds [`ALLOCATION_ALIGNMENT`]). What `deallocate` needs.
    base: DevicePtr,
    /// Bytes asked of `mr` for `base` (the size `deallocate` needs): `capacity` plus the
    /// alignment padding.
    allocated: usize,
    /// The alignment of `ptr` that reallocations keep: a power of two, at least
    /// [`ALLOCATION_ALIGNMENT`].
    alignment: usize,
    mr: SharedResource,
    /// The device of the owner stream; fixed for the buffer's life.
    device: Device,
    uses: Mutex<Uses>,
}

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
        let mr = into_shared(mr);
        check_resource(&mr, stream)?;
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
        check_resource(&mr, stream)?;
        let ptr = mr.allocate(bytes, stream).await?;
        Ok(Self::from_parts(ptr, bytes, mr, stream))
    }

    fn from_parts(ptr: DevicePtr, bytes: usize, mr: SharedResource, stream: &Stream) -> Self {
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

    async fn from_shared_aligned(
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        mr: SharedResource,
    ) -> Result<Self> {
        check_resource(&mr, stream)?;
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
        let mr = into_shared(mr);
        check_resource(&mr, stream)?;
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
    /// assert_eq!(buf.copy_to_host(vec![0; 64]).await?, vec![1; 64]);
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
        let mr = into_shared(mr);
        check_resource(&mr, stream)?;
        Ok(Self::from_parts(ptr, bytes, mr, stream))
    }

    /// The address of the first byte ([`DevicePtr::NULL`] for a 0-byte allocation of most
    /// resources).
    ///
    /// Work you enqueue through it must be ordered like the buffer's own: writes on the owner
    /// ([`stream`](DeviceBuffer::stream)) after [`set_stream`](DeviceBuffer::set_stream) to the
    /// owner (which orders it after recorded reads), reads on other streams inside a
    /// [`read_on`](DeviceBuffer::read_on) guard.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device))?;
    /// assert!(buf.ptr().is_aligned(256));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The number of bytes in use.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device))?;
    /// assert_eq!(buf.len(), 64);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when [`len`](DeviceBuffer::len) is 0.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(0, &stream, CudaResource::new(&device))?;
    /// assert!(buf.is_empty());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of bytes allocated; at least [`len`](DeviceBuffer::len).
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(64, &stream, CudaResource::new(&device)).await?;
    /// buf.resize(16).await?;
    /// assert_eq!((buf.len(), buf.capacity()), (16, 64));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The alignment of [`ptr`](DeviceBuffer::ptr) that the buffer keeps across
    /// reallocations: [`ALLOCATION_ALIGNMENT`] unless made with a larger one
    /// ([`with_alignment`](DeviceBuffer::with_alignment)).
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream, ALLOCATION_ALIGNMENT};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device))?;
    /// assert_eq!(buf.alignment(), ALLOCATION_ALIGNMENT);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn alignment(&self) -> usize {
        self.alignment
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
    /// let managed = DeviceBuffer::try_new(4096, &stream, ManagedResource::new(&device))?;
    /// assert!(managed.prefetch(&stream)?);      // enqueued
    /// let plain = DeviceBuffer::try_new(4096, &stream, CudaResource::new(&device))?;
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
        check_stream(&self.device, stream)?;
        if self.len == 0 {
            return Ok(false);
        }
        let mut uses = self.uses.lock();
        let enqueued =
            self.device
                .raw()
                .prefetch_to(self.ptr.addr(), self.len, target, stream.raw())?;
        if enqueued {
            uses.add_read_now(stream)?;
        }
        Ok(enqueued)
    }

    /// The stream that owns the buffer: its operations are enqueued there and it frees it.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let mut buf = DeviceBuffer::try_new(64, &a, CudaResource::new(&device))?;
    /// assert_eq!(buf.stream(), a);
    /// buf.set_stream(&b)?;
    /// assert_eq!(buf.stream(), b);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn stream(&self) -> Stream {
        self.uses.lock().owner().clone()
    }

    /// The device the memory belongs to.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device))?;
    /// assert_eq!(buf.device(), &device);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The resource the memory came from, which frees it.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, MemoryResource, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device))?;
    /// assert_eq!(buf.resource().properties().device, device.id());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn resource(&self) -> &SharedResource {
        &self.mr
    }

    /// Whether `mr` can free this buffer's memory: it is the buffer's resource, or a handle
    /// equal to it ([`MemoryResource::is_equal`], RMM's `is_equal`).
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, PoolResource, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let pool = PoolResource::new(CudaResource::new(&device), 1 << 20, None)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, pool.clone())?;
    /// assert!(buf.can_be_freed_by(&pool));
    /// assert!(!buf.can_be_freed_by(&CudaResource::new(&device)));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn can_be_freed_by(&self, mr: &dyn MemoryResource) -> bool {
        self.mr.is_equal(mr)
    }

    /// Hands ownership to `stream`: from now on the buffer's operations and its free are
    /// enqueued there.
    ///
    /// # Stream ordering
    /// When `stream` is not the owner, an event is recorded on the old owner and `stream`
    /// waits for it. In every case `stream` also waits for every recorded read, which is then
    /// forgotten: work enqueued on `stream` afterwards may write and free the memory. (So
    /// `set_stream` to the current owner orders the owner after the recorded reads, before you
    /// write through [`ptr`](DeviceBuffer::ptr).) Nothing blocks the host.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when `stream` is on another device; driver errors when
    /// recording or waiting fails, in which case the buffer keeps its owner.
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
    /// let mut buf = DeviceBuffer::new(64, &a, CudaResource::new(&device)).await?;
    /// a.enqueue_delay(Duration::from_millis(20))?; // a long "kernel" on `a`
    /// buf.fill(5)?;
    /// buf.set_stream(&b)?;
    /// assert_eq!(buf.copy_to_host(vec![0; 64]).await?, vec![5; 64]); // `b` waited
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn set_stream(&mut self, stream: &Stream) -> Result<()> {
        check_stream(&self.device, stream)?;
        self.uses.get_mut().hand_to(stream)
    }

    /// [`set_stream`](DeviceBuffer::set_stream) by value, for chaining.
    ///
    /// # Stream ordering
    /// As [`set_stream`](DeviceBuffer::set_stream).
    ///
    /// # Errors
    /// As [`set_stream`](DeviceBuffer::set_stream); the buffer is then dropped (freed on its
    /// old owner).
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let buf = DeviceBuffer::new(64, &a, CudaResource::new(&device)).await?.move_to(&b)?;
    /// assert_eq!(buf.stream(), b);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn move_to(mut self, stream: &Stream) -> Result<Self> {
        self.set_stream(stream)?;
        Ok(self)
    }

    /// Starts a read of the buffer on `stream`, which need not own it.
    ///
    /// # Stream ordering
    /// `stream` waits for the owner's work enqueued so far (nothing when it is the owner).
    /// When the returned guard is dropped, an event is recorded on `stream`; the owner's later
    /// writes, a later hand-off and the free wait for it.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when `stream` is on another device; driver errors when
    /// recording or waiting fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let (owner, reader) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let buf = DeviceBuffer::new(64, &owner, CudaResource::new(&device)).await?;
    /// let read = buf.read_on(&reader)?;
    /// // ... launch a kernel on `reader` that reads `read.ptr()` ...
    /// drop(read);
    /// drop(buf); // freed on `owner` after `reader` has passed the read
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn read_on(&self, stream: &Stream) -> Result<ReadGuard<'_>> {
        check_stream(&self.device, stream)?;
        let uses = self.uses.lock();
        if uses.handoff_waits() {
            uses.order_after_owner(stream)?;
        }
        drop(uses);
        Ok(ReadGuard::new(self, stream.clone()))
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
    /// [`Error::DeviceMismatch`] when `stream` is on another device; driver errors when
    /// recording fails.
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
    /// let buf = DeviceBuffer::new(64, &owner, CudaResource::new(&device)).await?;
    /// reader.enqueue_delay(Duration::from_millis(20))?; // a "kernel" reading `buf`
    /// buf.record_read(&reader)?;
    /// drop(buf);
    /// owner.synchronize().await?;                       // the free waited for `reader`
    /// assert_eq!(device.host_controls().unwrap().allocated_bytes(), 0);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn record_read(&self, stream: &Stream) -> Result<()> {
        check_stream(&self.device, stream)?;
        let mut uses = self.uses.lock();
        if stream == uses.owner() {
            return Ok(());
        }
        let event = stream.record()?;
        uses.add_read(event);
        Ok(())
    }

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
    /// let mut buf = DeviceBuffer::new(8, &stream, CudaResource::new(&device)).await?;
    /// buf.fill(0xab)?;
    /// assert_eq!(buf.copy_to_host(vec![0; 8]).await?, vec![0xab; 8]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn fill(&mut self, value: u8) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let uses = self.uses.get_mut();
        uses.order_owner_after_readers()?;
        // SAFETY: `ptr..ptr + len` lies in the allocation (`len <= capacity`), which is freed
        // only on the owner after this point or on a later owner that waits for this point;
        // every recorded read is ordered before it (just above), and other streams write the
        // buffer only after a hand-off that waits for it.
        unsafe { uses.owner().raw().memset(self.ptr.addr(), value, self.len) }
    }

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
    /// The resource's errors ([`Error::OutOfMemory`], ...) and driver errors; the buffer is then
    /// unchanged.
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
    /// let mut buf = DeviceBuffer::new(4, &stream, CudaResource::new(&device)).await?;
    /// buf.copy_from_host(vec![1, 2, 3, 4]).await?;
    /// buf.resize(8).await?;                   // grows: reallocates and copies
    /// assert_eq!(buf.capacity(), 8);
    /// assert_eq!(&buf.copy_to_host(vec![0; 8]).await?[..4], &[1, 2, 3, 4]);
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
    /// let mut buf = DeviceBuffer::new(4, &stream, CudaResource::new(&device)).await?;
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
    /// let mut buf = DeviceBuffer::new(1024, &stream, CudaResource::new(&device)).await?;
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
    /// let mut buf = DeviceBuffer::new(32, &a, CudaResource::new(&device)).await?;
    /// buf.fill(4)?;
    /// let copy = buf.try_clone_on(&b).await?;
    /// drop(buf);                    // freed on `a` after `b` has copied it
    /// assert_eq!(copy.stream(), b);
    /// assert_eq!(copy.copy_to_host(vec![0; 32]).await?, vec![4; 32]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn try_clone_on(&self, stream: &Stream) -> Result<DeviceBuffer> {
        check_stream(&self.device, stream)?;
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
    /// let mut buf = DeviceBuffer::new(32, &stream, CudaResource::new(&device)).await?;
    /// buf.fill(6)?;
    /// let copy = buf.try_clone().await?;
    /// assert_ne!(copy.ptr(), buf.ptr());
    /// assert_eq!(copy.copy_to_host(vec![0; 32]).await?, vec![6; 32]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn try_clone(&self) -> Result<DeviceBuffer> {
        let owner = self.stream();
        self.try_clone_on(&owner).await
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
    /// let mr = CudaResource::new(&device);
    /// let mut src = DeviceBuffer::new(4, &a, mr.clone()).await?;
    /// src.fill(2)?;
    /// let mut dst = DeviceBuffer::new(6, &b, mr).await?;
    /// dst.copy_from_device(&src)?;  // on `b`, after `a`'s fill
    /// assert_eq!(dst.copy_to_host(vec![0; 6]).await?, [2, 2, 2, 2, 0, 0]);
    /// assert!(src.copy_from_device(&dst).is_err()); // 6 bytes do not fit in 4
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_from_device(&mut self, src: &DeviceBuffer) -> Result<()> {
        if src.device != self.device {
            return Err(Error::DeviceMismatch {
                expected: self.device.id(),
                actual: src.device.id(),
            });
        }
        if src.len > self.len {
            return Err(Error::invalid(format!(
                "copy_from_device: the source holds {} bytes, the destination only {}",
                src.len, self.len
            )));
        }
        if src.len == 0 {
            return Ok(());
        }
        let uses = self.uses.get_mut();
        let owner = uses.owner().clone();
        let mut src_uses = src.uses.lock();
        src_uses.order_after_owner(&owner)?;
        uses.order_owner_after_readers()?;
        // SAFETY: `self` holds at least `src.len` bytes (checked above) and `src` holds
        // `src.len`; `self`'s recorded reads and `src`'s owner's writes so far are ordered before
        // this point of `owner` (just above); `src`'s later writes and free wait for the read
        // recorded below; the borrows keep both from being handed on or dropped meanwhile.
        unsafe { owner.raw().copy(self.ptr.addr(), src.ptr.addr(), src.len)? };
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
    /// The future resolves to [`Error::InvalidArgument`] when `host` is shorter than the
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
    /// let mut buf = DeviceBuffer::new(3, &stream, CudaResource::new(&device)).await?;
    /// buf.fill(1)?;
    /// assert_eq!(buf.copy_to_host(vec![0u8; 3]).await?, [1, 1, 1]);
    /// assert!(buf.copy_to_host(vec![0u8; 2]).await.is_err()); // too short
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_to_host<B: HostBuffer>(&self, host: B) -> CopyToHost<B> {
        let uses = self.uses.lock();
        // SAFETY: `ptr..ptr + len` lies in the allocation, which is freed, and written by other
        // streams, only after a point of the owner that follows this copy (the free is on the
        // owner, or on a later owner that waits for the old owner's work); the owner's own
        // later writes are stream-ordered after it. The lock keeps the owner fixed meanwhile.
        unsafe { CopyToHost::start(uses.owner(), self.ptr, self.len, host) }
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
    /// The future resolves to [`Error::InvalidArgument`] when `host` is longer than the
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
    /// let mut buf = DeviceBuffer::new(3, &stream, CudaResource::new(&device)).await?;
    /// let host = buf.copy_from_host(vec![7u8, 8, 9]).await?;
    /// assert_eq!(host, [7, 8, 9]);
    /// assert!(buf.copy_from_host(vec![0u8; 4]).await.is_err()); // too long
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn copy_from_host<B: HostBuffer>(&mut self, host: B) -> CopyFromHost<B> {
        let uses = self.uses.get_mut();
        if let Err(e) = uses.order_owner_after_readers() {
            return CopyFromHost::failed(e);
        }
        // SAFETY: `ptr..ptr + len` lies in the allocation, which is freed, read or written by
        // other streams only after a point of the owner that follows this copy (the free is on
        // the owner or a later owner that waits for this one; other streams read it only after
        // a `read_on` that waits for the owner); every recorded read is ordered before it.
        unsafe { CopyFromHost::start(uses.owner(), self.ptr, self.len, host) }
    }

    /// Negative control for tests: [`set_stream`](DeviceBuffer::set_stream) and
    /// [`read_on`](DeviceBuffer::read_on) of this buffer (only) skip their event waits, to show
    /// that a hand-off test fails without them. The free stays ordered after the old owners.
    ///
    /// # Safety
    /// Without the waits, work on the old and new owner (or the reader) may access the memory
    /// at the same time. The caller orders them itself (e.g. by blocking the old owner until
    /// the new owner's reads are done), so that no two accesses of which one writes overlap.
    ///
    /// # Examples
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let mut buf = DeviceBuffer::try_new(64, &a, CudaResource::new(&device))?;
    /// // SAFETY: nothing was enqueued on `a`, so nothing can overlap with `b`'s work.
    /// unsafe { buf.__disable_handoff_waits() };
    /// buf.set_stream(&b)?; // no wait enqueued on `b`
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    #[doc(hidden)]
    pub unsafe fn __disable_handoff_waits(&mut self) {
        self.uses.get_mut().disable_handoff_waits();
    }
}

/// Checks that `mr` allocates on `stream`'s device.
fn check_resource(mr: &SharedResource, stream: &Stream) -> Result<()> {
    let expected = mr.properties().device;
    let actual = stream.device().id();
    if expected == actual {
        Ok(())
    } else {
        Err(Error::DeviceMismatch { expected, actual })
    }
}

/// `alignment` when it is a power of two, raised to [`ALLOCATION_ALIGNMENT`], which every
/// resource gives.
fn checked_alignment(alignment: usize) -> Result<usize> {
    if !alignment.is_power_of_two() {
        return Err(Error::invalid(format!(
            "a buffer alignment must be a power of two, not {alignment}"
        )));
    }
    Ok(alignment.max(ALLOCATION_ALIGNMENT))
}

/// The bytes to ask a resource for so that `bytes` fit at an `alignment`-aligned address of
/// its 256-aligned block: `bytes` plus `alignment - 256`. 0 bytes need no block at all.
fn padded_size(bytes: usize, alignment: usize, device: &Device) -> Result<usize> {
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
fn aligned_start(
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

fn misaligned(base: DevicePtr, mr: &dyn MemoryResource) -> Error {
    Error::invalid(format!(
        "{mr:?} returned {base}, which is not {ALLOCATION_ALIGNMENT}-byte aligned"
    ))
}

/// The owner of every [`Default`] buffer: the process-wide host device's legacy stream.
fn default_owner() -> &'static Stream {
    static OWNER: OnceLock<Stream> = OnceLock::new();
    OWNER.get_or_init(|| {
        Stream::legacy_default(&Device::host())
            .expect("the host backend's legacy default stream cannot fail")
    })
}

/// An empty buffer that owns no memory: size and capacity 0, a null pointer. It is what
/// [`std::mem::take`] leaves behind, and costs no allocation and no resource call (the current
/// device resource is not looked up).
///
/// Having no device of its own, it belongs to the process-wide host device
/// ([`Device::host`]): its owner is that device's [`legacy default
/// stream`](Stream::legacy_default) and its resource a [`CudaResource`] of it, so growing it
/// allocates host-backend memory. For an empty buffer on your own device, stream and resource,
/// use [`DeviceBuffer::try_new`] with 0 bytes (which allocates nothing either).
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, DevicePtr, Stream};
///
/// let empty = DeviceBuffer::default();
/// assert_eq!((empty.len(), empty.capacity(), empty.ptr()), (0, 0, DevicePtr::NULL));
/// assert_eq!(empty.device(), &Device::host());
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mut buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device))?;
/// let taken = std::mem::take(&mut buf);         // `buf` is now an empty default buffer
/// assert_eq!((taken.len(), buf.len()), (64, 0));
/// # Ok::<(), streamalloc::Error>(())
/// ```
impl Default for DeviceBuffer {
    fn default() -> Self {
        let owner = default_owner();
        let mr = into_shared(CudaResource::new(owner.device()));
        Self::from_parts(DevicePtr::NULL, 0, mr, owner)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let uses = self.uses.get_mut();
        if let Err(e) = uses.order_owner_after_readers() {
            // Freeing now could free under a pending read: leak instead.
            tracing::warn!(error = %e, ptr = %self.base, bytes = self.allocated,
                "leaking a device buffer: its owner could not wait for its readers");
            self.device.defer_error(e);
            return;
        }
        // SAFETY: the memory came from `mr` as `allocated` bytes at `base` and is freed once,
        // here; every recorded read is ordered before this point of the owner (just above), the
        // owner's own work is stream-ordered before it, and earlier owners' work is ordered
        // before it by the hand-off waits.
        unsafe { self.mr.deallocate(self.base, self.allocated, uses.owner()) };
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let uses = self.uses.lock();
        f.debug_struct("DeviceBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("alignment", &self.alignment)
            .field("device", &self.device.id())
            .field("stream", &uses.owner().id())
            .field("readers", &uses.reader_count())
            .finish()
    }
}

#[cfg(test)]
mod tests;
