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

/// A cudarc driver error of a call on `device` as the crate's error.
pub(crate) fn driver_error(
    device: &Device,
    call: &'static str,
    e: cudarc::driver::DriverError,
) -> Error {
    Error::Driver {
        call,
        code: e.0 as i32,
        name: format!("{:?}", e.0),
        device: device.id(),
    }
}

#[cfg(feature = "nvrtc")]
impl Device {
    /// Loads a PTX module (text, as `nvcc --ptx` writes it) into this device's primary
    /// context; the driver compiles it for the GPU. Its functions launch on this crate's
    /// streams through [`Stream::cudarc_stream`](crate::Stream::cudarc_stream):
    /// `stream.cudarc_stream()?.launch_builder(&module.load_function("name")?)`.
    ///
    /// Needs the `nvrtc` feature for cudarc's `Ptx` type only: loading PTX does not use
    /// libnvrtc.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a host-backend device; [`Error::InvalidArgument`] for text
    /// with a NUL byte; [`Error::Driver`] (`cuModuleLoadData`) when the driver rejects the PTX.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{Device, Error};
    ///
    /// let ptx = ".version 7.0\n.target sm_52\n.address_size 64\n";
    /// assert!(matches!(Device::host().load_ptx(ptx), Err(Error::Unsupported { .. })));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn load_ptx(&self, ptx: &str) -> Result<Arc<cudarc::driver::CudaModule>> {
        let ctx = self.cudarc_context()?;
        if ptx.contains('\0') {
            return Err(Error::invalid("PTX text contains a NUL byte"));
        }
        ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(|e| driver_error(self, "cuModuleLoadData", e))
    }

    /// Compiles CUDA C source with NVRTC (cudarc's `compile_ptx`, loaded at run time) and
    /// loads the result into this device's primary context, as [`load_ptx`](Device::load_ptx).
    /// Kernels meant to be looked up by name need `extern "C"`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a host-backend device, and when libnvrtc cannot be loaded (the
    /// message names it; nothing panics); [`Error::InvalidArgument`] with NVRTC's log when the
    /// source does not compile, or holds a NUL byte; [`Error::Driver`] when loading fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{Device, Error};
    ///
    /// let src = r#"extern "C" __global__ void twice(float *x, unsigned n) {
    ///     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    ///     if (i < n) x[i] *= 2.0f;
    /// }"#;
    /// let device = Device::default();
    /// match device.compile_kernels(src) {
    ///     Ok(module) => { module.load_function("twice").expect("the kernel"); }
    ///     Err(Error::Unsupported { what, .. }) => println!("skipped: {what}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), Error>(())
    /// ```
    pub fn compile_kernels(&self, src: &str) -> Result<Arc<cudarc::driver::CudaModule>> {
        let ctx = self.cudarc_context()?;
        if src.contains('\0') {
            return Err(Error::invalid("CUDA C source contains a NUL byte"));
        }
        crate::backend::cuda::interop::nvrtc_available()
            .map_err(|why| Error::unsupported(why, self.id()))?;
        let ptx = cudarc::nvrtc::compile_ptx(src).map_err(|e| match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => Error::invalid(format!(
                "NVRTC could not compile the CUDA C source:\n{}",
                log.to_string_lossy()
            )),
            other => Error::invalid(format!("NVRTC failed: {other:?}")),
        })?;
        ctx.load_module(ptx)
            .map_err(|e| driver_error(self, "cuModuleLoadData", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostConfig;

    /// Every cudarc entry point refuses a host-backend device with `Unsupported` naming it,
    /// instead of reaching the driver.
    #[test]
    fn host_devices_refuse_cudarc_interop_with_their_id() {
        let device = Device::host_with(HostConfig::default());
        let unsupported = |r: Result<()>| match r {
            Err(Error::Unsupported { device: d, what }) => {
                assert_eq!(d, device.id());
                assert!(what.contains("host-backend"), "{what}");
            }
            other => panic!("expected Unsupported, got {other:?}"),
        };
        unsupported(device.cudarc_context().map(drop));
        #[cfg(feature = "nvrtc")]
        {
            unsupported(device.load_ptx(".version 7.0").map(drop));
            unsupported(device.compile_kernels("__global__ void k() {}").map(drop));
            // A NUL byte is refused too, whatever the device: still no panic.
            assert!(device.compile_kernels("a\0b").is_err());
        }
        let stream = crate::Stream::new(&device).unwrap();
        unsupported(stream.cudarc_stream().map(drop));
        #[cfg(feature = "cublas")]
        unsupported(stream.cublas().map(drop));
    }
}
