//! cudarc's handle to a device's primary context.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::Device;
use crate::backend::AnyBackend;
use crate::error::{Error, Result};

impl Device {
    /// cudarc's handle to this device's primary context: the context every call of this crate
    /// binds, so modules, functions and streams made through it work with this crate's streams
    /// and buffers. One per device, made on first use and then shared.
    ///
    /// From the first call on, this crate asks the driver which context is current before each
    /// call instead of trusting its per-thread cache, because cudarc binds contexts on the same
    /// threads.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a host-backend device; driver errors when cudarc cannot retain
    /// the primary context.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{Device, Error};
    ///
    /// assert!(matches!(Device::host().cudarc_context(), Err(Error::Unsupported { .. })));
    /// if let Ok(gpu) = Device::cuda(0) {
    ///     let ctx = gpu.cudarc_context()?;
    ///     assert_eq!(ctx.ordinal(), 0);
    /// }
    /// # Ok::<(), Error>(())
    /// ```
    pub fn cudarc_context(&self) -> Result<Arc<CudaContext>> {
        match self.raw() {
            AnyBackend::Cuda(backend) => backend.cudarc_context(),
            AnyBackend::Host(_) => Err(Error::unsupported(
                "cudarc interop (a host-backend device has no CUDA context)",
                self.id(),
            )),
        }
    }
}
