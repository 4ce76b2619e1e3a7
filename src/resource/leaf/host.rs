use crate::backend::pageable::{system_allocate, system_free};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ids::BackendKind;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::properties::{Properties, ResourceIdentity};
use crate::resource::device_ptr::DevicePtr;
use crate::stream::Stream;

/// Pageable system memory from the global allocator, 256-byte aligned.
///
/// Host code reads and writes it; device code can only on the host backend (or on systems with
/// HMM/ATS). Useful as an upstream for host-side pools and in tests.
///
/// # Stream ordering
/// A free is deferred until `stream` reaches it (a host function), so queued work that still
/// reads the memory finishes first; it never blocks the caller.
///
/// # Examples
///
/// ```
/// use streamalloc::{Device, HostResource, MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = HostResource::new(&device)?;
/// let p = mr.try_allocate(100, &stream)?;
/// assert!(p.is_aligned(256));
/// unsafe { mr.deallocate(p, 100, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct HostResource {
    device: Device,
}

impl HostResource {
    /// A resource of system memory, for use with streams of `device`.
    ///
    /// # Errors
    /// None today: system memory needs nothing of the device. It returns a `Result` like the
    /// other leaf resources' constructors, so that callers treat them alike.
    pub fn new(device: &Device) -> Result<Self> {
        Ok(HostResource {
            device: device.clone(),
        })
    }
}

// SAFETY: a pointer it hands out is a fresh block of the system allocator
// (`system_allocate`) of `bytes` bytes, 256-byte aligned, freed only by `deallocate`: host
// memory, which it says; device-accessible only on the host backend, whose device is the host.
unsafe impl MemoryResource for HostResource {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        stream.check_on(&self.device, "HostResource::try_allocate(stream)")?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        system_allocate(bytes)
            .map(DevicePtr::from_raw)
            .ok_or(Error::OutOfMemory {
                details: None,
                requested: bytes,
                available: None,
                device: self.device.id(),
            })
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if ptr.is_null() {
            return;
        }
        let addr = ptr.addr();
        let free = move || {
            // SAFETY: the caller guarantees `ptr` came from `try_allocate(bytes)` and that all
            // its users are ordered before this point of `stream`, which the host function
            // waits for.
            unsafe { system_free(addr, bytes) }
        };
        if let Err(e) = stream.launch_host_fn(free) {
            // The memory is leaked rather than freed under a possible reader.
            self.device.defer_error(e);
        }
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::stateless::<Self>(self.device.id())
    }

    fn properties(&self) -> Properties {
        Properties {
            device_accessible: self.device.backend() == BackendKind::Host,
            host_accessible: true,
            device: self.device.id(),
        }
    }
}
