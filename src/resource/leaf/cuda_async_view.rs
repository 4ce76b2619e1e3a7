use std::fmt;
use std::sync::Arc;

use crate::backend::AnyMemPool;
use crate::device::Device;
use crate::error::Result;
use crate::ids::BackendKind;
use crate::resource::contract::availability::pending_frees::PendingFrees;
use crate::resource::contract::availability::Availability;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::properties::{Properties, ResourceIdentity};
use crate::resource::device_ptr::DevicePtr;
use crate::stream::Stream;

/// Stream-ordered allocation from a driver pool that something else owns (RMM's
/// `cuda_async_view_memory_resource`): another [`CudaAsyncResource`](crate::CudaAsyncResource)'s pool, or the device's
/// default pool. It never changes or destroys the pool.
///
/// A [`CudaAsyncResource`](crate::CudaAsyncResource) is such a view of the pool it owns: the two allocate alike, and a
/// view of an owner's pool is the same resource as the owner
/// ([`is_equal`](MemoryResource::is_equal)).
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaAsyncResource, CudaAsyncViewResource, Device, MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let owner = CudaAsyncResource::new(&device)?;
/// let view = CudaAsyncViewResource::of(&owner);
/// assert_eq!(view.pool_handle(), owner.pool_handle());
/// let p = view.try_allocate(512, &stream)?;
/// unsafe { view.deallocate(p, 512, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Clone)]
pub struct CudaAsyncViewResource {
    device: Device,
    pool: AnyMemPool,
    /// Frees the device has not reached yet (their memory is not back in the pool), shared by
    /// the clones of this view: awaited allocations wait for them.
    pending: Arc<PendingFrees>,
}

impl CudaAsyncViewResource {
    /// A view of `pool`, a pool of `device`.
    pub(crate) fn over(device: &Device, pool: AnyMemPool) -> Self {
        CudaAsyncViewResource {
            device: device.clone(),
            pool,
            pending: Arc::default(),
        }
    }

    /// A view of the device's default pool (`cuDeviceGetDefaultMemPool`).
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) when the device has no memory pools;
    /// driver errors.
    pub fn device_default(device: &Device) -> Result<Self> {
        Ok(Self::over(device, device.raw().default_mempool()?))
    }

    /// The driver's pool handle (`CUmemoryPool` as an integer on CUDA).
    pub fn pool_handle(&self) -> u64 {
        self.pool.handle()
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn pool(&self) -> &AnyMemPool {
        &self.pool
    }

    /// `Debug` under the name of the view's type or of its owner's.
    pub(crate) fn debug_as(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("device", &self.device.id())
            .field("pool", &format_args!("{:#x}", self.pool.handle()))
            .finish()
    }
}

// SAFETY: a pointer it hands out is a fresh block of the driver pool
// (`cuMemAllocFromPoolAsync`, 256-byte aligned or more; the host emulation's raw allocator)
// of `bytes` bytes, of this resource's device, freed only by `deallocate`. It says
// host-accessible only on the host backend, whose device memory is host memory.
unsafe impl MemoryResource for CudaAsyncViewResource {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        stream.check_on(&self.device, "CudaAsyncResource::try_allocate(stream)")?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.pool
            .allocate_async(bytes, stream.raw())
            .map(DevicePtr::from_raw)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if ptr.is_null() {
            return;
        }
        // SAFETY: forwarded from the caller's contract: `ptr` came from this pool.
        match unsafe { self.pool.free_async(ptr.addr(), bytes, stream.raw()) } {
            Ok(()) => self.pending.freed(bytes, stream),
            Err(e) => self.device.defer_error(e),
        }
    }

    /// Fired when a free completes on the device (its memory is back in the pool), through
    /// the completion driver.
    fn availability(&self) -> Option<&Availability> {
        Some(self.pending.availability())
    }

    /// While a free of this view is pending on its stream: its memory comes back when the
    /// device reaches it. (Frees through other views of the pool, or by other processes, are
    /// not seen.)
    fn may_regain_memory(&self, bytes: usize) -> bool {
        let _ = bytes;
        self.pending.may_regain()
    }

    /// The device's total memory: no single request can be larger.
    fn capacity_limit(&self) -> Option<usize> {
        self.device.total_memory().ok()
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::Shared(self.pool.address())
    }

    /// Reserved: what the driver pool holds (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`); the
    /// driver's allocated figure is not asked for, so wrap it in a
    /// [`StatisticsAdaptor`](crate::StatisticsAdaptor) to count allocations.
    ///
    /// ```
    /// use streamalloc::{CudaAsyncResource, Device, HostConfig, MemoryResource, Stream};
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// let stream = Stream::new(&device)?;
    /// let mr = CudaAsyncResource::new(&device)?;
    /// let p = mr.try_allocate(1 << 20, &stream)?;
    /// assert!(mr.memory_stats().reserved_bytes.unwrap() >= 1 << 20);
    /// unsafe { mr.deallocate(p, 1 << 20, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    fn memory_stats(&self) -> crate::resource::contract::stats::MemoryStats {
        crate::resource::contract::stats::MemoryStats {
            reserved_bytes: self.pool.reserved().ok(),
            wait_queue: self.pending.availability().stats(),
            ..crate::resource::contract::stats::MemoryStats::default()
        }
    }

    fn properties(&self) -> Properties {
        Properties {
            device_accessible: true,
            host_accessible: self.device.backend() == BackendKind::Host,
            device: self.device.id(),
        }
    }
}

impl fmt::Debug for CudaAsyncViewResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.debug_as("CudaAsyncViewResource", f)
    }
}
