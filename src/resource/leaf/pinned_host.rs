use crate::backend::MemoryKind;
use crate::device::Device;
use crate::error::Result;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::properties::{Properties, ResourceIdentity};
use crate::resource::device_ptr::DevicePtr;
use crate::resource::leaf::raw::{leaf_allocate, leaf_deallocate};
use crate::stream::Stream;

/// Page-locked host memory that the device reads and writes directly and that async copies
/// need to overlap with compute: `cuMemHostAlloc` (RMM's `pinned_host_memory_resource`).
///
/// # Stream ordering
/// `deallocate` never blocks the calling thread: on CUDA an event is recorded on the stream
/// and one driver thread per device frees the memory (`cuMemFreeHost`) once the stream has
/// passed it. An allocation that finds no memory waits for those pending frees and tries once
/// more.
///
/// # Examples
///
/// ```
/// use streamalloc::{Device, MemoryResource, PinnedHostResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = PinnedHostResource::new(&device)?;
/// assert!(mr.properties().host_accessible);
/// let p = mr.try_allocate(1000, &stream)?;
/// assert!(p.is_aligned(256));
/// unsafe { mr.deallocate(p, 1000, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct PinnedHostResource {
    device: Device,
}

impl PinnedHostResource {
    /// A resource that allocates pinned host memory mapped for `device`.
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) on a CUDA device that cannot map host
    /// memory (`CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY` is 0); driver errors from asking. Never
    /// on the host backend.
    pub fn new(device: &Device) -> Result<Self> {
        device.raw().check_kind(MemoryKind::PinnedHost)?;
        Ok(PinnedHostResource {
            device: device.clone(),
        })
    }
}

// SAFETY: a pointer it hands out is a fresh allocation of the backend's raw allocator of
// pinned host memory (`cuMemHostAlloc` with device mapping, whose host and device addresses
// are one; host memory on the host backend) of `bytes` bytes, 256-byte aligned
// (`Backend::allocate`), freed only by `deallocate`: host and device may both use it.
unsafe impl MemoryResource for PinnedHostResource {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        leaf_allocate(&self.device, MemoryKind::PinnedHost, bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { leaf_deallocate(&self.device, MemoryKind::PinnedHost, ptr, bytes, stream) }
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::stateless::<Self>(self.device.id())
    }

    fn properties(&self) -> Properties {
        Properties::host_and_device(self.device.id())
    }
}
