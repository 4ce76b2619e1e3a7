use crate::backend::MemoryKind;
use crate::device::Device;
use crate::error::Result;
use crate::ids::BackendKind;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::properties::{Properties, ResourceIdentity};
use crate::resource::device_ptr::DevicePtr;
use crate::resource::leaf::raw::{leaf_allocate, leaf_deallocate};
use crate::stream::Stream;

/// Plain device memory: `cuMemAlloc` / `cuMemFree` (RMM's `cuda_memory_resource`).
///
/// Every call goes to the driver, which is slow (tens of microseconds) and synchronizes the
/// device on free; put a pool in front of it for anything hot. This is the initial per-device
/// resource.
///
/// # Stream ordering
/// The stream is only checked to belong to the device: the driver's allocation is usable on
/// every stream, and its free waits for all work on the device.
///
/// A free therefore blocks the calling thread on CUDA: it waits for the stream it is given
/// (`cuStreamSynchronize`, then `cuMemFree`), so dropping a [`DeviceBuffer`](crate::DeviceBuffer)
/// of this resource whose stream still works waits for that work, as RMM's
/// `cuda_memory_resource` does. For a free that returns at once and takes effect in stream
/// order, use [`CudaAsyncResource`](crate::CudaAsyncResource) or a
/// [`PoolResource`](crate::PoolResource). (The host backend queues the free on the stream
/// instead; its memory comes back when the stream reaches it.)
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = CudaResource::new(&device)?;
/// let p = mr.try_allocate(4096, &stream)?;
/// unsafe { mr.deallocate(p, 4096, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct CudaResource {
    device: Device,
}

impl CudaResource {
    /// A resource that allocates device memory of `device`.
    ///
    /// # Errors
    /// None today: every device has device memory. It returns a `Result` like the other leaf
    /// resources' constructors, so that callers treat them alike.
    pub fn new(device: &Device) -> Result<Self> {
        Ok(CudaResource {
            device: device.clone(),
        })
    }

    /// The device it allocates on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

// SAFETY: a pointer it hands out is a fresh allocation of the backend's raw allocator
// (`cuMemAlloc`; host memory on the host backend) of `bytes` bytes, 256-byte aligned
// (`Backend::allocate`), of this resource's device, freed only by `deallocate`. It says
// host-accessible only on the host backend, whose device memory is host memory.
unsafe impl MemoryResource for CudaResource {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        leaf_allocate(&self.device, MemoryKind::Device, bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { leaf_deallocate(&self.device, MemoryKind::Device, ptr, bytes, stream) }
    }

    /// The device's total memory: no single request can be larger.
    fn capacity_limit(&self) -> Option<usize> {
        self.device.total_memory().ok()
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::stateless::<Self>(self.device.id())
    }

    fn properties(&self) -> Properties {
        Properties {
            device_accessible: true,
            host_accessible: self.device.backend() == BackendKind::Host,
            device: self.device.id(),
        }
    }
}
