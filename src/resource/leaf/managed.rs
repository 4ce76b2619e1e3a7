use crate::backend::MemoryKind;
use crate::device::Device;

use crate::error::{Error, Result};
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::properties::{Properties, ResourceIdentity};
use crate::resource::device_ptr::DevicePtr;
use crate::resource::leaf::raw::{leaf_allocate, leaf_deallocate};
use crate::stream::Stream;

/// Unified memory that host and device both access: `cuMemAllocManaged` (RMM's
/// `managed_memory_resource`).
///
/// By default a single request may not exceed the device's total memory: asking the driver for
/// far more managed memory than the GPU has can hang it on some systems. Call
/// [`allow_oversubscription`](ManagedResource::allow_oversubscription) to lift the cap.
///
/// # Examples
///
/// ```
/// use streamalloc::{Device, ManagedResource, MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = ManagedResource::new(&device)?;
/// assert!(mr.properties().host_accessible && mr.properties().device_accessible);
/// let p = mr.try_allocate(256, &stream)?;
/// unsafe { mr.deallocate(p, 256, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ManagedResource {
    device: Device,
    oversubscribe: bool,
}

impl ManagedResource {
    /// A resource that allocates managed memory attached to `device`, one request at most the
    /// device's total memory.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a CUDA device without managed memory
    /// (`CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY` is 0); driver errors from asking. Never on the
    /// host backend.
    pub fn new(device: &Device) -> Result<Self> {
        device.raw().check_kind(MemoryKind::Managed)?;
        Ok(ManagedResource {
            device: device.clone(),
            oversubscribe: false,
        })
    }

    /// Lets a single request exceed the device's total memory (pages then migrate on demand).
    ///
    /// ```
    /// # use streamalloc::{Device, ManagedResource, MemoryResource};
    /// let mr = ManagedResource::new(&Device::host()).unwrap().allow_oversubscription();
    /// assert_eq!(mr.capacity_limit(), None);
    /// ```
    pub fn allow_oversubscription(mut self) -> Self {
        self.oversubscribe = true;
        self
    }

    fn total(&self) -> Result<usize> {
        self.device.total_memory()
    }
}

// SAFETY: a pointer it hands out is a fresh allocation of the backend's raw allocator of
// managed memory (`cuMemAllocManaged`; host memory on the host backend) of `bytes` bytes,
// 256-byte aligned (`Backend::allocate`), freed only by `deallocate`: host and device code of
// its device may both use it, as it says.
unsafe impl MemoryResource for ManagedResource {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if !self.oversubscribe && bytes > self.total()? {
            return Err(Error::OutOfMemory {
                details: None,
                requested: bytes,
                available: None,
                device: self.device.id(),
            });
        }
        leaf_allocate(&self.device, MemoryKind::Managed, bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { leaf_deallocate(&self.device, MemoryKind::Managed, ptr, bytes, stream) }
    }

    fn capacity_limit(&self) -> Option<usize> {
        if self.oversubscribe {
            None
        } else {
            self.total().ok()
        }
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::stateless::<Self>(self.device.id())
    }

    fn properties(&self) -> Properties {
        Properties::host_and_device(self.device.id())
    }
}
