//! The leaf resources' calls into the backend's raw allocators.

use crate::device::Device;
use crate::error::Result;
use crate::resource::device_ptr::DevicePtr;
use crate::stream::Stream;

/// `try_allocate` of a leaf resource over the backend's raw allocator of `kind`.
pub(crate) fn leaf_allocate(
    device: &Device,
    kind: crate::backend::MemoryKind,
    bytes: usize,
    stream: &Stream,
) -> Result<DevicePtr> {
    let call = match kind {
        crate::backend::MemoryKind::Device => "CudaResource::try_allocate(stream)",
        crate::backend::MemoryKind::Managed => "ManagedResource::try_allocate(stream)",
        crate::backend::MemoryKind::PinnedHost => "PinnedHostResource::try_allocate(stream)",
    };
    stream.check_on(device, call)?;
    if bytes == 0 {
        return Ok(DevicePtr::NULL);
    }
    device
        .raw()
        .allocate(kind, bytes)
        .map(DevicePtr::from_raw)
        .map_err(|e| {
            // No device allocation can be larger than the device (the leaves' capacity limit).
            match kind {
                crate::backend::MemoryKind::Device => e.never_fitting(device.total_memory().ok()),
                _ => e,
            }
        })
}

/// `deallocate` of a leaf resource over the backend's raw allocator of `kind`.
///
/// # Safety
/// As [`MemoryResource::deallocate`](crate::MemoryResource::deallocate), for memory from [`leaf_allocate`] of the same `kind`.
pub(crate) unsafe fn leaf_deallocate(
    device: &Device,
    kind: crate::backend::MemoryKind,
    ptr: DevicePtr,
    bytes: usize,
    stream: &Stream,
) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: forwarded from the caller's contract.
    if let Err(e) = unsafe { device.raw().free(kind, ptr.addr(), bytes, stream.raw()) } {
        device.defer_error(e);
    }
}
