//! The checks a resource makes of the requests it is given.

use super::memory_resource::MemoryResource;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::Stream;

/// The device of a sub-allocator's upstream, which it allocates for.
///
/// # Errors
/// [`Error::InvalidArgument`] when that device is gone.
pub(crate) fn upstream_device(upstream: &impl MemoryResource) -> Result<Device> {
    let id = upstream.properties().device;
    Device::from_id(id).ok_or_else(|| Error::invalid(format!("the upstream's device {id} is gone")))
}

/// The start of each sub-allocator's `try_allocate`: `Ok(true)` for a 0-byte request, which is
/// served with the null pointer whatever the stream; else the stream's device is checked (an
/// error names `call`).
#[inline]
pub(crate) fn is_empty_request(
    device: &Device,
    bytes: usize,
    stream: &Stream,
    call: &'static str,
) -> Result<bool> {
    if bytes == 0 {
        return Ok(true);
    }
    stream.check_on(device, call).map(|()| false)
}
