//! What a resource is: its memory's [`Properties`] and its [`ResourceIdentity`].

use std::sync::Arc;

use crate::device::DeviceId;

/// What a resource's memory is and where it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Properties {
    /// Device code can read and write it.
    pub device_accessible: bool,
    /// Host code can read and write it through the pointer.
    pub host_accessible: bool,
    /// The device the resource allocates for.
    pub device: DeviceId,
}

impl Properties {
    /// Memory that device code and host code can both read and write through the pointer
    /// (managed and pinned host memory), of `device`.
    ///
    /// ```
    /// use streamalloc::{Device, Properties};
    ///
    /// let p = Properties::host_and_device(Device::host().id());
    /// assert!(p.device_accessible && p.host_accessible);
    /// ```
    pub fn host_and_device(device: DeviceId) -> Self {
        Properties {
            device_accessible: true,
            host_accessible: true,
            device,
        }
    }
}

/// What tells one resource from another ([`MemoryResource::identity`](crate::MemoryResource::identity)).
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, ResourceIdentity};
///
/// let device = Device::host();
/// assert!(matches!(CudaResource::new(&device).unwrap().identity(), ResourceIdentity::Stateless { .. }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResourceIdentity {
    /// A resource with shared state, named by that state's address: every clone shares it.
    Shared(usize),
    /// A resource with no state of its own: any two of the same kind and device are one.
    Stateless {
        /// The resource's type name.
        kind: &'static str,
        /// Its device.
        device: DeviceId,
    },
}

impl ResourceIdentity {
    /// The identity of the shared state behind `arc`.
    pub(crate) fn of_shared<T: ?Sized>(arc: &Arc<T>) -> Self {
        ResourceIdentity::Shared(Arc::as_ptr(arc) as *const () as usize)
    }

    /// The identity of a stateless resource of type `R` on `device`.
    pub(crate) fn stateless<R: ?Sized>(device: DeviceId) -> Self {
        ResourceIdentity::Stateless {
            kind: std::any::type_name::<R>(),
            device,
        }
    }
}
