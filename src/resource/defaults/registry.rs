//! The per-device current resource (RMM's `get_current_device_resource` and friends).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::device::{Device, DeviceId};
use crate::error::{Error, Result};
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::shared::{into_shared, SharedResource};
use crate::resource::contract::size::ALLOCATION_ALIGNMENT;
use crate::resource::contract::stats::MemoryStats;
use crate::resource::defaults::scoped::scoped_resource_for;
use crate::resource::leaf::cuda::CudaResource;

fn registry() -> &'static Mutex<HashMap<DeviceId, SharedResource>> {
    static REGISTRY: OnceLock<Mutex<HashMap<DeviceId, SharedResource>>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

fn initial(device: &Device) -> SharedResource {
    // `CudaResource::new` checks nothing of the device: every device has device memory.
    Arc::new(CudaResource::new(device).expect("CudaResource::new cannot fail"))
}

/// The current resource of [`Device::default()`]. See [`current_device_resource_for`].
///
/// ```
/// use streamalloc::{current_device_resource, MemoryResource};
/// let mr = current_device_resource();
/// assert!(mr.properties().device_accessible);
/// ```
pub fn current_device_resource() -> SharedResource {
    current_device_resource_for(&Device::default())
}

/// The resource that containers and helpers use on `device` when none is given: inside a
/// [`with_resource`](crate::with_resource) scope of a resource of `device`, that resource
/// (the innermost one); else the device's own, a [`CudaResource`] until
/// [`set_current_device_resource_for`] installs another.
///
/// ```
/// use streamalloc::*;
///
/// let device = Device::host_with(HostConfig::default());
/// assert_eq!(current_device_resource_for(&device).properties().device, device.id());
/// let managed = ManagedResource::new(&device).unwrap();
/// with_resource_sync(managed.clone(), || {
///     assert!(current_device_resource_for(&device).is_equal(&managed));
/// });
/// ```
pub fn current_device_resource_for(device: &Device) -> SharedResource {
    if let Some(scoped) = scoped_resource_for(device.id()) {
        return scoped;
    }
    registry()
        .lock()
        .entry(device.id())
        .or_insert_with(|| initial(device))
        .clone()
}

/// Installs `mr` as the current resource of [`Device::default()`]; returns the previous one.
/// Any resource will do, as for [`DeviceBuffer::new`](crate::DeviceBuffer::new): a resource by
/// value, a clone of a shared one, an `Arc` of either, or a [`SharedResource`].
///
/// It is the device's own resource, for every thread and task; a
/// [`with_resource`](crate::with_resource) scope still takes precedence inside it.
///
/// # Errors
/// [`Error::DeviceMismatch`] when `mr` allocates on another device.
///
/// ```
/// use std::sync::Arc;
/// use streamalloc::*;
///
/// let device = Device::default();
/// let pool = Arc::new(CudaAsyncResource::new(&device)?);
/// let previous = set_current_device_resource(pool)?;
/// assert!(format!("{previous:?}").contains("CudaResource"));
/// assert!(format!("{:?}", current_device_resource()).contains("CudaAsyncResource"));
/// set_current_device_resource(previous)?;
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub fn set_current_device_resource(mr: impl MemoryResource + 'static) -> Result<SharedResource> {
    set_current_device_resource_for(&Device::default(), mr)
}

/// Installs `mr` as the current resource of `device`; returns the previous one. Any resource
/// will do, as for [`DeviceBuffer::new`](crate::DeviceBuffer::new); `mr` is type-erased once
/// (a [`SharedResource`] is kept as it is).
///
/// # Errors
/// [`Error::DeviceMismatch`] when `mr` allocates on another device (`expected` is `device`,
/// `actual` the resource's); the current resource is then unchanged.
///
/// ```
/// use streamalloc::*;
///
/// let (d0, d1) = (Device::host_with(HostConfig::default()), Device::host_with(HostConfig::default()));
/// let pool = PoolResource::new(CudaResource::new(&d0)?, 1 << 20, None)?;
/// set_current_device_resource_for(&d0, pool.clone())?;
/// assert!(current_device_resource_for(&d0).is_equal(&pool));
///
/// let wrong = set_current_device_resource_for(&d1, pool);
/// assert!(matches!(wrong, Err(Error::DeviceMismatch { expected, actual, .. })
///     if expected == d1.id() && actual == d0.id()));
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub fn set_current_device_resource_for(
    device: &Device,
    mr: impl MemoryResource + 'static,
) -> Result<SharedResource> {
    let id = mr.properties().device;
    if id != device.id() {
        return Err(Error::DeviceMismatch {
            expected: device.id(),
            actual: id,
            call: "set_current_device_resource_for(device, mr)",
        });
    }
    let mr = into_shared(mr);
    let mut map = registry().lock();
    Ok(map.insert(id, mr).unwrap_or_else(|| initial(device)))
}

/// Puts `device` back on its initial resource (a [`CudaResource`]); returns the one that was
/// current.
///
/// ```
/// use std::sync::Arc;
/// use streamalloc::*;
///
/// let device = Device::host_with(HostConfig::default());
/// set_current_device_resource_for(&device, Arc::new(ManagedResource::new(&device)?))?;
/// let was = reset_current_device_resource_for(&device);
/// assert!(format!("{was:?}").contains("ManagedResource"));
/// assert!(format!("{:?}", current_device_resource_for(&device)).contains("CudaResource"));
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub fn reset_current_device_resource_for(device: &Device) -> SharedResource {
    registry()
        .lock()
        .remove(&device.id())
        .unwrap_or_else(|| initial(device))
}

/// Free and total memory of `device` in bytes (RMM's `available_device_memory`).
///
/// # Errors
/// Driver errors.
///
/// ```
/// use streamalloc::{available_device_memory, Device};
/// let (free, total) = available_device_memory(&Device::host())?;
/// assert!(free <= total);
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub fn available_device_memory(device: &Device) -> Result<(usize, usize)> {
    let info = device.memory_info()?;
    Ok((info.free, info.total))
}

/// `percent` % of `device`'s free memory, rounded down to a multiple of 256 bytes (RMM's
/// `percent_of_free_device_memory`), e.g. for a pool's initial size.
///
/// # Errors
/// [`Error::InvalidArgument`] when `percent` exceeds 100; driver errors.
///
/// ```
/// use streamalloc::{percent_of_free_device_memory, Device, HostConfig};
/// let device = Device::host_with(HostConfig::default().capacity(1000 * 256));
/// assert_eq!(percent_of_free_device_memory(&device, 50)?, 500 * 256);
/// assert!(percent_of_free_device_memory(&device, 101).is_err());
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub fn percent_of_free_device_memory(device: &Device, percent: u32) -> Result<usize> {
    if percent > 100 {
        return Err(Error::invalid(format!(
            "percent must be at most 100, got {percent}"
        )));
    }
    let free = device.memory_info()?.free as u128;
    let bytes = (free * u128::from(percent) / 100) as usize;
    Ok(bytes / ALLOCATION_ALIGNMENT * ALLOCATION_ALIGNMENT)
}

/// The [`memory_stats`](MemoryResource::memory_stats) of `device`'s current resource
/// ([`current_device_resource_for`](crate::current_device_resource_for)): PyTorch's
/// `torch.cuda.memory_stats(device)`.
///
/// ```
/// use streamalloc::{CudaResource, Device, HostConfig, PoolResource, StatisticsAdaptor};
///
/// let device = Device::host_with(HostConfig::default());
/// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, None)?;
/// streamalloc::set_current_device_resource_for(&device, std::sync::Arc::new(StatisticsAdaptor::new(pool)))?;
/// let stats = streamalloc::memory_stats(&device);
/// assert_eq!((stats.allocated_bytes, stats.reserved_bytes), (Some(0), Some(1 << 20)));
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub fn memory_stats(device: &Device) -> MemoryStats {
    current_device_resource_for(device).memory_stats()
}

#[cfg(test)]
mod tests;
