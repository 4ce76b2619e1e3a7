//! The delay kernel behind `Stream::enqueue_delay` on CUDA: one thread that reads `%globaltimer`
//! until the requested nanoseconds have passed, a stand-in for a long-running kernel.
//!
//! Hand-written PTX, JIT-compiled by the driver once per context. The first image targets
//! `sm_52` with PTX ISA 7.0 (CUDA 11.0), which every driver from 450 on JIT-compiles for any
//! newer GPU (Hopper's `sm_90` included); the second targets `sm_75` for drivers that no longer
//! accept Maxwell-era targets.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

use crate::ids::DeviceId;

use super::handles::{RawFunction, RawModule};

/// The kernel's entry point, as named in the PTX.
const ENTRY: &std::ffi::CStr = c"streamalloc_spin";

/// The PTX after the `.version` and `.target` directives.
macro_rules! spin_body {
    () => {
        r#".address_size 64

.visible .entry streamalloc_spin(
	.param .u64 streamalloc_spin_param_ns
)
{
	.reg .pred 	%p<2>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [streamalloc_spin_param_ns];
	mov.u64 	%rd2, %globaltimer;
$L__spin:
	mov.u64 	%rd3, %globaltimer;
	sub.u64 	%rd4, %rd3, %rd2;
	setp.lt.u64 	%p1, %rd4, %rd1;
	@%p1 bra 	$L__spin;
	ret;
}
"#
    };
}

/// `streamalloc_spin(u64 ns)`: spins until `%globaltimer` has advanced by `ns` nanoseconds.
/// Each image is NUL-terminated, as `cuModuleLoadData` needs for PTX text.
const PTX_IMAGES: [&str; 2] = [
    concat!(".version 7.0\n.target sm_52\n", spin_body!(), "\0"),
    concat!(".version 7.0\n.target sm_75\n", spin_body!(), "\0"),
];

/// The loaded delay kernel of one context. The module is unloaded by `DeviceContext::drop`.
#[derive(Debug)]
pub(crate) struct SpinKernel {
    module: RawModule,
    function: RawFunction,
}

impl SpinKernel {
    /// Loads (JIT-compiles) the kernel into the context of `device`, which the caller has made
    /// current; on failure, the driver call that failed first and its error (`None` if there
    /// were no images to try).
    #[allow(clippy::type_complexity)]
    pub(crate) fn load(
        device: DeviceId,
    ) -> Result<SpinKernel, Option<(&'static str, DriverError)>> {
        let mut first_error = None;
        for image in PTX_IMAGES {
            debug_assert!(image.ends_with('\0'));
            match load_image(image) {
                Ok(kernel) => return Ok(kernel),
                Err((call, e)) => {
                    tracing::debug!(
                        device = %device,
                        error = ?e,
                        "the delay kernel's PTX did not load; trying the next image"
                    );
                    first_error.get_or_insert((call, e));
                }
            }
        }
        Err(first_error)
    }

    pub(crate) fn module(&self) -> RawModule {
        self.module
    }

    /// Enqueues the kernel on `stream`, one block of one thread, to spin for `ns` nanoseconds.
    ///
    /// # Safety
    /// 1. The context that loaded the kernel is current and its module is still loaded.
    /// 2. `stream` is a live stream of that context.
    pub(crate) unsafe fn launch(&self, stream: sys::CUstream, ns: u64) -> Result<(), DriverError> {
        let mut ns = ns;
        let mut params: [*mut c_void; 1] = [ptr::addr_of_mut!(ns).cast()];
        // SAFETY: the function is live and the context current (caller, 1); the stream is
        // live (caller, 2). `params` holds one pointer to a `u64`, matching the kernel's single
        // `.u64` parameter; the driver copies parameter values during the call, so stack
        // storage is enough.
        unsafe {
            sys::cuLaunchKernel(
                self.function.0,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        }
        .result()
    }
}

/// Loads one NUL-terminated PTX image and finds the entry point, unloading the module if the
/// entry point is missing. The caller has made the target context current.
fn load_image(image: &str) -> std::result::Result<SpinKernel, (&'static str, DriverError)> {
    let mut module: sys::CUmodule = ptr::null_mut();
    // SAFETY: `image` is NUL-terminated PTX text (checked by the caller in debug builds), valid
    // for the call; `module` is a valid out-pointer; a context is current (caller).
    unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) }
        .result()
        .map_err(|e| ("cuModuleLoadData", e))?;
    let mut function: sys::CUfunction = ptr::null_mut();
    // SAFETY: `module` was just loaded; `ENTRY` is NUL-terminated; `function` is a valid
    // out-pointer.
    let found = unsafe { sys::cuModuleGetFunction(&mut function, module, ENTRY.as_ptr()) }.result();
    if let Err(e) = found {
        // SAFETY: `module` was loaded above and nothing else refers to it.
        let _ = unsafe { sys::cuModuleUnload(module) };
        return Err(("cuModuleGetFunction", e));
    }
    Ok(SpinKernel {
        module: RawModule(module),
        function: RawFunction(function),
    })
}
