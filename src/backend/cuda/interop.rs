//! cudarc interop at the driver level: cudarc's handle to a device's primary context and to a
//! stream of this backend, and adopting a stream made by cudarc. (Keeping a `CUstream` alive
//! while cudarc handles to it outlive the stream that made it is [`retired`](super::retired)'s.)

use std::sync::Arc;

use crate::error::{Error, Result};

use super::retired::sweep_retired_streams;
use super::stream::CudaStream;
use super::CudaBackend;

impl CudaStream {
    /// Whether cudarc's handle to this stream exists yet.
    pub(crate) fn has_cudarc_stream(&self) -> bool {
        self.cudarc.get().is_some()
    }

    /// cudarc's handle to this stream, made on first use and then shared. While a clone of it
    /// lives, the `CUstream` is not destroyed, even after `self` is dropped.
    ///
    /// # Errors
    /// As [`DeviceContext::cudarc_context`].
    pub(crate) fn cudarc_stream(&self) -> Result<&Arc<cudarc::driver::CudaStream>> {
        if let Some(s) = self.cudarc.get() {
            return Ok(s);
        }
        sweep_retired_streams();
        let ctx = self.context().cudarc_context()?;
        // SAFETY: the stream belongs to this context (the primary context cudarc also wraps,
        // checked by `cudarc_context`); it stays alive while the handle does, because
        // `CudaStream::drop` retires instead of destroying it while a clone lives outside;
        // ordering cudarc's work with ours is what the crate's interop (DevicePtr) does.
        let wrapped = unsafe { ctx.wrap_borrowed_stream(self.raw()) };
        Ok(self.cudarc.get_or_init(|| wrapped))
    }
}

impl CudaBackend {
    /// cudarc's handle to this device's primary context.
    ///
    /// # Errors
    /// As [`DeviceContext::cudarc_context`].
    pub(crate) fn cudarc_context(&self) -> Result<Arc<cudarc::driver::CudaContext>> {
        self.ctx.cudarc_context()
    }

    /// Adopts `stream`, a stream of this device's primary context made by cudarc.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the stream belongs to another context of this device (a
    /// non-primary one).
    pub(crate) fn adopt_stream(
        &self,
        stream: Arc<cudarc::driver::CudaStream>,
    ) -> Result<Arc<CudaStream>> {
        let theirs = stream.context().cu_ctx();
        if theirs != self.ctx.raw_context() {
            return Err(Error::invalid(format!(
                "the cudarc stream belongs to a context ({theirs:p}) of {} other than its primary \
                 context ({:p}), which streamalloc uses",
                self.ctx.id(),
                self.ctx.raw_context()
            )));
        }
        // cudarc's handle to the context, which adopted streams' interop uses.
        self.ctx.cudarc_context()?;
        sweep_retired_streams();
        Ok(Arc::new(CudaStream::adopt(self.ctx.clone(), stream)))
    }
}

/// Defines `fn $fn() -> Result<(), String>`: whether an optional CUDA library can be loaded
/// and has every symbol listed, checked once, before cudarc's dynamic loading (which panics on
/// a missing library or symbol) is first used; `Err` says why not.
#[cfg(any(feature = "nvrtc", feature = "cublas"))]
macro_rules! library_check {
    ($(#[$attr:meta])* $fn:ident, $sys:path, $name:literal, $purpose:literal,
     [$($symbol:literal),* $(,)?]) => {
        $(#[$attr])*
        pub(crate) fn $fn() -> std::result::Result<(), String> {
            use $sys as sys;
            static CHECKED: std::sync::OnceLock<std::result::Result<(), String>> =
                std::sync::OnceLock::new();
            CHECKED.get_or_init(|| {
                // SAFETY: cudarc's `is_culib_present` only opens and closes the library.
                if !unsafe { sys::is_culib_present() } {
                    return Err(format!(
                        "{} need {}, which could not be loaded (install the CUDA toolkit's {}, \
                         or put it on the library path)",
                        $purpose, $name, $name
                    ));
                }
                // SAFETY: the library is present (checked above), so `culib` opens it instead
                // of panicking.
                let lib = unsafe { sys::culib() };
                for symbol in [$($symbol),*] {
                    // SAFETY: the symbol is only looked up, never called through this type.
                    if unsafe { lib.get::<*const std::ffi::c_void>(symbol.as_bytes()) }.is_err() {
                        return Err(format!(
                            "{} need {} with {symbol}: the library is too old",
                            $purpose, $name
                        ));
                    }
                }
                Ok(())
            })
            .clone()
        }
    };
}

library_check!(
    /// Whether NVRTC can be used, checked once: `Err` says why not.
    #[cfg(feature = "nvrtc")]
    nvrtc_available,
    cudarc::nvrtc::sys,
    "libnvrtc",
    "CUDA C kernels compiled at run time",
    [
        "nvrtcCreateProgram",
        "nvrtcCompileProgram",
        "nvrtcGetPTXSize",
        "nvrtcGetPTX",
        "nvrtcGetProgramLogSize",
        "nvrtcGetProgramLog",
        "nvrtcDestroyProgram",
    ]
);

library_check!(
    /// Whether cuBLAS can be used, checked once: `Err` says why not.
    #[cfg(feature = "cublas")]
    cublas_available,
    cudarc::cublas::sys,
    "libcublas",
    "cuBLAS calls",
    [
        "cublasCreate_v2",
        "cublasDestroy_v2",
        "cublasSetStream_v2",
        "cublasSgemm_v2",
        "cublasDgemm_v2",
        "cublasGemmEx",
    ]
);

#[cfg(test)]
mod tests {
    /// Checking for an optional library never panics (cudarc's loader would) and, where the
    /// library is missing (machines without the CUDA toolkit, CI), names it.
    #[test]
    fn a_missing_library_is_an_error_naming_it() {
        type Check = fn() -> Result<(), String>;
        let checks: &[(&str, Check)] = &[
            #[cfg(feature = "nvrtc")]
            ("libnvrtc", super::nvrtc_available),
            #[cfg(feature = "cublas")]
            ("libcublas", super::cublas_available),
        ];
        for (name, check) in checks {
            match check() {
                Ok(()) => println!("{name} is installed here"),
                Err(why) => assert!(why.contains(name), "{why}"),
            }
        }
    }
}
