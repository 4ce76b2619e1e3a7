//! [`DeviceBuffer`] itself: what it holds, its accessors, its default and its free. Its other
//! operations are grouped beside it: making one ([`new_buffer`](super::new_buffer)), handing it between
//! streams ([`handoff`](super::handoff)), working on its bytes ([`copy`](super::copy)) and
//! changing its size ([`resize`](super::resize)).

use std::fmt;
use std::sync::OnceLock;

use super::uses::Uses;
use crate::device::Device;
use crate::resource::{into_shared, CudaResource, DevicePtr, MemoryResource, SharedResource};
use crate::stream::Stream;

/// Owning, untyped device memory, freed stream-ordered on the stream that owns it (RMM's
/// `device_buffer`).
///
/// A buffer holds its pointer, size, capacity and resource, and its *use state*: the stream
/// that owns it, and the latest event of every other stream that read it. The owner is the
/// stream on which the buffer's own operations ([`fill`](DeviceBuffer::fill), the copies,
/// [`resize`](DeviceBuffer::resize), the free) are enqueued.
///
/// # Stream ordering
/// - Hand-off: [`set_stream`](DeviceBuffer::set_stream) records where the old owner's work
///   and every recorded read end; the new owner waits for them before its first use of the
///   buffer, without blocking the host.
/// - Reads on other streams: [`read_on`](DeviceBuffer::read_on) makes the reading stream wait
///   for the owner's work so far and records an event on it when the read ends; the owner's
///   later writes and the free wait for it.
/// - Drop: the owner waits for every recorded read, then the memory is deallocated on the
///   owner, stream-ordered. Drop never blocks and never synchronizes, except over the plain
///   [`CudaResource`](crate::CudaResource) and [`ManagedResource`](crate::ManagedResource) on
///   CUDA, whose free (`cuMemFree`) waits for the stream: use a pool or
///   [`CudaAsyncResource`](crate::CudaAsyncResource) in async code.
///
/// Work you enqueue yourself through [`ptr`](DeviceBuffer::ptr) is yours to order: enqueue it
/// on the owner, or on a stream inside a [`ReadGuard`](crate::ReadGuard) (reads only). After a hand-off, the new
/// owner waits for the old owner's work just before the buffer's first use on it (an operation,
/// a kernel argument, or a call of [`ptr`](DeviceBuffer::ptr) or
/// [`stream`](DeviceBuffer::stream)), not at [`set_stream`](DeviceBuffer::set_stream) itself:
/// work the new owner queued meanwhile for other buffers does not wait.
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
    pub(in crate::buffer) ptr: DevicePtr,
    /// Bytes in use; `len <= capacity`.
    pub(in crate::buffer) len: usize,
    /// Bytes usable from `ptr`; `base + allocated >= ptr + capacity`.
    pub(in crate::buffer) capacity: usize,
    /// What `mr` returned: `ptr` rounded down past the alignment padding (`base == ptr` unless
    /// the alignment exceeds [`ALLOCATION_ALIGNMENT`](crate::ALLOCATION_ALIGNMENT)). What
    /// `deallocate` needs.
    pub(in crate::buffer) base: DevicePtr,
    /// Bytes asked of `mr` for `base` (the size `deallocate` needs): `capacity` plus the
    /// alignment padding.
    pub(in crate::buffer) allocated: usize,
    /// The alignment of `ptr` that reallocations keep: a power of two, at least
    /// [`ALLOCATION_ALIGNMENT`](crate::ALLOCATION_ALIGNMENT).
    pub(in crate::buffer) alignment: usize,
    pub(in crate::buffer) mr: SharedResource,
    /// The device of the owner stream; fixed for the buffer's life.
    pub(in crate::buffer) device: Device,
    pub(in crate::buffer) uses: Uses,
}

impl DeviceBuffer {
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
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// assert!(buf.ptr().is_aligned(256));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn ptr(&self) -> DevicePtr {
        self.ready_for_raw_use();
        self.ptr
    }

    /// Before the address or the owner is handed out for work the crate does not enqueue
    /// itself: the owner waits for a pending hand-off now, so that work enqueued on it through
    /// [`ptr`](DeviceBuffer::ptr) or [`stream`](DeviceBuffer::stream) follows the earlier
    /// owners' work, as the buffer's own operations do. Should the driver refuse the waits,
    /// the events are waited for on this thread instead (the error goes to the device's
    /// deferred errors): ordering is never given up.
    pub(crate) fn ready_for_raw_use(&self) {
        let mut uses = self.uses.lock();
        if let Err(e) = uses.ready() {
            tracing::warn!(error = %e, "a hand-off's stream wait failed; blocking for it instead");
            self.device.defer_error(e);
            if let Err(e) = uses.block_for_hand_off() {
                self.device.defer_error(e);
            }
        }
    }

    /// The number of bytes in use.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
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
    /// let buf = DeviceBuffer::try_new(0, &stream, CudaResource::new(&device)?)?;
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
    /// let mut buf = DeviceBuffer::new(64, &stream, CudaResource::new(&device)?).await?;
    /// buf.resize(16).await?;
    /// assert_eq!((buf.len(), buf.capacity()), (16, 64));
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The alignment of [`ptr`](DeviceBuffer::ptr) that the buffer keeps across
    /// reallocations: [`ALLOCATION_ALIGNMENT`](crate::ALLOCATION_ALIGNMENT) unless made with a
    /// larger one ([`with_alignment`](DeviceBuffer::with_alignment)).
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream, ALLOCATION_ALIGNMENT};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(buf.alignment(), ALLOCATION_ALIGNMENT);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// The device the memory belongs to.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
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
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
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
    /// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, None)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, pool.clone())?;
    /// assert!(buf.can_be_freed_by(&pool));
    /// assert!(!buf.can_be_freed_by(&CudaResource::new(&device)?));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn can_be_freed_by(&self, mr: &dyn MemoryResource) -> bool {
        self.mr.is_equal(mr)
    }
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
/// [`std::mem::take`] leaves behind, and costs no device allocation and no resource call (the
/// current device resource is not looked up).
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
/// let mut buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
/// let taken = std::mem::take(&mut buf);         // `buf` is now an empty default buffer
/// assert_eq!((taken.len(), buf.len()), (64, 0));
/// # Ok::<(), streamalloc::Error>(())
/// ```
impl Default for DeviceBuffer {
    fn default() -> Self {
        let owner = default_owner();
        // `CudaResource::new` fails on no device (it checks nothing); the owner's is the host's.
        let mr = CudaResource::new(owner.device()).expect("CudaResource::new cannot fail");
        let mr = into_shared(mr);
        Self::from_parts(DevicePtr::NULL, 0, mr, owner)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let mut uses = self.uses.get_mut();
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
