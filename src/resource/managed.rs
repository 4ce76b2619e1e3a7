use crate::backend::MemoryKind;
use crate::device::Device;
use crate::error::Result;
use crate::resource::{leaf_allocate, leaf_deallocate, DevicePtr, MemoryResource, Properties};
use crate::stream::Stream;

/// Unified memory that host and device both access: `cuMemAllocManaged` (RMM's
/// `managed_memory_resource`).
///
/// # Examples
///
/// ```
/// use streamalloc::{Device, ManagedResource, MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = ManagedResource::new(&device);
/// assert!(mr.properties().host_accessible && mr.properties().device_accessible);
/// let p = mr.try_allocate(256, &stream)?;
/// unsafe { mr.deallocate(p, 256, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ManagedResource {
    device: Device,
}

impl ManagedResource {
    /// A resource that allocates managed memory attached to `device`.
    pub fn new(device: &Device) -> Self {
        ManagedResource {
            device: device.clone(),
        }
    }
}

impl MemoryResource for ManagedResource {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        leaf_allocate(&self.device, MemoryKind::Managed, bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { leaf_deallocate(&self.device, MemoryKind::Managed, ptr, bytes, stream) }
    }

    fn properties(&self) -> Properties {
        Properties {
            device_accessible: true,
            host_accessible: true,
            device: self.device.id(),
        }
    }
}
