use std::fmt;
use std::sync::Arc;

use crate::backend::BackendPool;
use crate::device::Device;
use crate::error::Result;
use crate::resource::cuda_async::{pool_allocate, pool_deallocate, pool_properties};
use crate::resource::ResourceIdentity;
use crate::resource::{CudaAsyncResource, DevicePtr, MemoryResource, Properties};
use crate::stream::Stream;

/// Stream-ordered allocation from a driver pool that something else owns (RMM's
/// `cuda_async_view_memory_resource`): another [`CudaAsyncResource`]'s pool, or the device's
/// default pool. It never changes or destroys the pool.
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
    pool: Arc<dyn BackendPool>,
}

impl CudaAsyncViewResource {
    /// A view of `owner`'s pool. The view keeps the pool alive.
    pub fn of(owner: &CudaAsyncResource) -> Self {
        let (device, pool) = owner.parts();
        CudaAsyncViewResource {
            device: device.clone(),
            pool: pool.clone(),
        }
    }

    /// A view of the device's default pool (`cuDeviceGetDefaultMemPool`).
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) when the device has no memory pools;
    /// driver errors.
    pub fn device_default(device: &Device) -> Result<Self> {
        Ok(CudaAsyncViewResource {
            device: device.clone(),
            pool: device.raw().default_pool()?,
        })
    }

    /// The driver's pool handle (`CUmemoryPool` as an integer on CUDA).
    pub fn pool_handle(&self) -> u64 {
        self.pool.handle()
    }
}

impl MemoryResource for CudaAsyncViewResource {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        pool_allocate(&self.device, &*self.pool, bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { pool_deallocate(&self.device, &*self.pool, ptr, bytes, stream) }
    }

    /// The device's total memory: no single request can be larger.
    fn capacity_limit(&self) -> Option<usize> {
        self.device.total_memory().ok()
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::of_shared(&self.pool)
    }

    fn properties(&self) -> Properties {
        pool_properties(&self.device)
    }
}

impl fmt::Debug for CudaAsyncViewResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaAsyncViewResource")
            .field("device", &self.device.id())
            .field("pool", &format_args!("{:#x}", self.pool.handle()))
            .finish()
    }
}
