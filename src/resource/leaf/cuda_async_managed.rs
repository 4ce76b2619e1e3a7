use std::fmt;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::properties::{Properties, ResourceIdentity};
use crate::resource::device_ptr::DevicePtr;
use crate::resource::leaf::cuda_async_view::CudaAsyncViewResource;
use crate::stream::Stream;

/// Stream-ordered allocation of managed (unified) memory from the device's default managed
/// memory pool: `cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on the pool that CUDA 13's
/// `cuMemGetDefaultMemPool(.., CU_MEM_ALLOCATION_TYPE_MANAGED)` returns (RMM's
/// `cuda_async_managed_memory_resource`).
///
/// The memory is accessible from host and device, like [`ManagedResource`]'s, but allocation and
/// free are stream-ordered and cached by the driver's pool instead of synchronizing the device.
/// Clones share the pool, which belongs to the driver and is never destroyed.
///
/// Where it exists: CUDA builds with CUDA 13 headers (the default `cuda` feature), a driver of
/// CUDA 13 or newer, and a device with memory pools and concurrent managed access. Elsewhere
/// [`new`](CudaAsyncManagedResource::new) returns [`Error::Unsupported`]. The host backend
/// emulates it, since its memory is host- and device-accessible already: blocks count as
/// managed memory, so [`PrefetchAdaptor`](crate::PrefetchAdaptor) and
/// [`DeviceBuffer::prefetch`](crate::DeviceBuffer::prefetch) see them as such.
///
/// As with [`ManagedResource`], one request may not exceed the device's total memory: asking
/// the driver for far more managed memory than the GPU has can hang it on some systems.
///
/// [`ManagedResource`]: crate::ManagedResource
///
/// # Stream ordering
/// Memory is usable on the allocating stream at once; a free is reusable by work ordered after
/// it, as the driver's pool guarantees.
///
/// # Errors
/// See [`new`](CudaAsyncManagedResource::new).
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaAsyncManagedResource, Device, MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = CudaAsyncManagedResource::new(&device)?;
/// let props = mr.properties();
/// assert!(props.host_accessible && props.device_accessible);
/// let p = mr.try_allocate(1 << 16, &stream)?;
/// unsafe { mr.deallocate(p, 1 << 16, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Clone)]
pub struct CudaAsyncManagedResource {
    /// Allocation and free go through a view of the managed pool, as for device memory.
    view: CudaAsyncViewResource,
}

impl CudaAsyncManagedResource {
    /// A resource over `device`'s default managed memory pool.
    ///
    /// # Errors
    /// [`Error::Unsupported`] in builds for CUDA 12 headers, with a driver older than CUDA 13,
    /// and on devices without memory pools or without concurrent managed access; driver errors.
    pub fn new(device: &Device) -> Result<Self> {
        Ok(CudaAsyncManagedResource {
            view: CudaAsyncViewResource::over(device, device.raw().managed_mempool()?),
        })
    }

    /// The driver's pool handle (`CUmemoryPool` as an integer on CUDA).
    ///
    /// ```
    /// # use streamalloc::{CudaAsyncManagedResource, Device};
    /// let device = Device::host();
    /// let a = CudaAsyncManagedResource::new(&device)?;
    /// let b = CudaAsyncManagedResource::new(&device)?;
    /// assert_eq!(a.pool_handle(), b.pool_handle()); // the device's one managed pool
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn pool_handle(&self) -> u64 {
        self.view.pool_handle()
    }

    /// Bytes the pool now holds from the device, in use or cached
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    ///
    /// # Errors
    /// Driver errors.
    pub fn reserved_bytes(&self) -> Result<usize> {
        self.view.pool().reserved()
    }

    fn total(&self) -> Result<usize> {
        self.view.device().total_memory()
    }
}

// SAFETY: a pointer it hands out is its view's, a block of the device's managed-memory pool
// (CUDA 13's managed `cuMemPool`; host memory on the host backend) of `bytes` bytes,
// 256-byte aligned: managed memory, which host and device code may both use, as it says.
unsafe impl MemoryResource for CudaAsyncManagedResource {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if bytes > self.total()? {
            return Err(Error::OutOfMemory {
                details: None,
                requested: bytes,
                available: None,
                device: self.view.device().id(),
            });
        }
        self.view.try_allocate(bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.view.deallocate(ptr, bytes, stream) }
    }

    /// The device's total memory: no single request may be larger.
    fn capacity_limit(&self) -> Option<usize> {
        self.total().ok()
    }

    fn identity(&self) -> ResourceIdentity {
        self.view.identity()
    }

    fn properties(&self) -> Properties {
        Properties::host_and_device(self.view.device().id())
    }
}

impl fmt::Debug for CudaAsyncManagedResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.view.debug_as("CudaAsyncManagedResource", f)
    }
}

impl PartialEq for CudaAsyncManagedResource {
    /// Equal when they allocate from the same driver pool on the same device: every resource
    /// of one device is.
    fn eq(&self, other: &Self) -> bool {
        self.pool_handle() == other.pool_handle() && self.view.device() == other.view.device()
    }
}
