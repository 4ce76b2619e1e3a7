//! Test support for the GPU suites: a kernel that spins, then fills memory, so a test can show
//! that work ordered after it (copies, frees, waits on other streams) really waits for it.
//!
//! The kernel is hand-written PTX, JIT-compiled by the driver on first use, for device 0 only.
#![cfg(feature = "cuda-driver")]

use std::ffi::{c_uint, c_void};
use std::sync::OnceLock;

use streamalloc::cudarc::driver::result::{self, DriverError};
use streamalloc::cudarc::driver::sys;
use streamalloc::{BackendKind, Stream};

/// `spin_then_fill(u8* dst, u64 n, u8 value, u64 spin_ns)`: every thread spins on
/// `%globaltimer` for `spin_ns` nanoseconds, then the grid writes `value` to `dst[0..n]` in a
/// grid-stride loop.
macro_rules! spin_then_fill_body {
    () => {
        r#".address_size 64

.visible .entry spin_then_fill(
	.param .u64 spin_then_fill_param_dst,
	.param .u64 spin_then_fill_param_n,
	.param .u8 spin_then_fill_param_value,
	.param .u64 spin_then_fill_param_spin_ns
)
{
	.reg .pred 	%p<3>;
	.reg .b16 	%rs<2>;
	.reg .b32 	%r<5>;
	.reg .b64 	%rd<13>;

	ld.param.u64 	%rd1, [spin_then_fill_param_dst];
	ld.param.u64 	%rd2, [spin_then_fill_param_n];
	ld.param.u8 	%rs1, [spin_then_fill_param_value];
	ld.param.u64 	%rd3, [spin_then_fill_param_spin_ns];
	cvta.to.global.u64 	%rd4, %rd1;
	mov.u64 	%rd5, %globaltimer;
$L__spin:
	mov.u64 	%rd6, %globaltimer;
	sub.u64 	%rd7, %rd6, %rd5;
	setp.lt.u64 	%p1, %rd7, %rd3;
	@%p1 bra 	$L__spin;
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mov.u32 	%r3, %tid.x;
	mov.u32 	%r4, %nctaid.x;
	mul.wide.u32 	%rd8, %r1, %r2;
	cvt.u64.u32 	%rd9, %r3;
	add.u64 	%rd10, %rd8, %rd9;
	mul.wide.u32 	%rd11, %r4, %r2;
	setp.ge.u64 	%p2, %rd10, %rd2;
	@%p2 bra 	$L__done;
$L__fill:
	add.u64 	%rd12, %rd4, %rd10;
	st.global.u8 	[%rd12], %rs1;
	add.u64 	%rd10, %rd10, %rd11;
	setp.lt.u64 	%p2, %rd10, %rd2;
	@%p2 bra 	$L__fill;
$L__done:
	ret;
}
"#
    };
}

/// NUL-terminated PTX images, tried in order: `sm_52` (JIT-compiled for any newer GPU by
/// drivers that still know Maxwell targets, 580 included), then `sm_75`.
const PTX_IMAGES: [&str; 2] = [
    concat!(
        ".version 7.0\n.target sm_52\n",
        spin_then_fill_body!(),
        "\0"
    ),
    concat!(
        ".version 7.0\n.target sm_75\n",
        spin_then_fill_body!(),
        "\0"
    ),
];

/// Threads per block of the launch.
const BLOCK: u32 = 256;
/// Most blocks of the launch; the grid-stride loop covers the rest.
const MAX_BLOCKS: u64 = 1024;

/// The loaded kernel and the context it was loaded in (device 0's primary context, retained for
/// the rest of the process).
struct Kernel {
    ctx: sys::CUcontext,
    function: sys::CUfunction,
}

// SAFETY: the handles are opaque tokens for the thread-safe driver API; the context is never
// released and the module never unloaded, so they stay valid on every thread.
unsafe impl Send for Kernel {}
// SAFETY: as for `Send`.
unsafe impl Sync for Kernel {}

fn kernel() -> Result<&'static Kernel, DriverError> {
    static KERNEL: OnceLock<Result<Kernel, DriverError>> = OnceLock::new();
    KERNEL.get_or_init(load).as_ref().map_err(|e| *e)
}

fn load() -> Result<Kernel, DriverError> {
    // SAFETY: only opens and closes the library, so a missing driver is an error, not a panic.
    if !unsafe { sys::is_culib_present() } {
        return Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_INITIALIZED));
    }
    result::init()?;
    let device = result::device::get(0)?;
    // SAFETY: `device` came from `cuDeviceGet`. Retained for the rest of the process (never
    // released), so the context outlives the module and every launch.
    let ctx = unsafe { result::primary_ctx::retain(device) }?;
    // SAFETY: `ctx` is a live, retained primary context.
    unsafe { result::ctx::set_current(ctx) }?;
    let mut first_error = None;
    for image in PTX_IMAGES {
        // SAFETY: `image` is NUL-terminated PTX text; a context is current.
        match unsafe { result::module::load_data(image.as_ptr().cast()) } {
            Ok(module) => {
                let entry = c"spin_then_fill".to_owned();
                // SAFETY: `module` was just loaded in the current context (and is never
                // unloaded).
                let function = unsafe { result::module::get_function(module, entry) }?;
                return Ok(Kernel { ctx, function });
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or(DriverError(sys::CUresult::CUDA_ERROR_INVALID_PTX)))
}

/// Enqueues on `stream` a kernel that spins for `spin_ns` nanoseconds and then writes `value`
/// to the `n` bytes at `dst`. Makes device 0's primary context current on the calling thread
/// first.
///
/// `dst..dst + n` must be device-accessible memory (device, managed or mapped pinned host) that
/// stays allocated, and that nothing else uses, until the kernel has completed in `stream`
/// order. The function is safe to call only because it is test support; the kernel writes
/// wherever `dst` points.
///
/// # Errors
/// The driver's error; `CUDA_ERROR_INVALID_HANDLE` for a stream that is not on CUDA device 0,
/// `CUDA_ERROR_NOT_INITIALIZED` without a driver.
pub fn launch_spin_then_fill(
    stream: &Stream,
    dst: u64,
    n: usize,
    value: u8,
    spin_ns: u64,
) -> Result<(), DriverError> {
    let device = stream.device().id();
    if device.backend != BackendKind::Cuda || device.ordinal != 0 {
        return Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_HANDLE));
    }
    let kernel = kernel()?;
    // SAFETY: `kernel.ctx` is device 0's primary context, retained for the process.
    unsafe { result::ctx::set_current(kernel.ctx) }?;
    let mut dst = dst;
    let mut n = n as u64;
    let mut value = value;
    let mut spin_ns = spin_ns;
    let mut params: [*mut c_void; 4] = [
        std::ptr::addr_of_mut!(dst).cast(),
        std::ptr::addr_of_mut!(n).cast(),
        std::ptr::addr_of_mut!(value).cast(),
        std::ptr::addr_of_mut!(spin_ns).cast(),
    ];
    let blocks = n.div_ceil(u64::from(BLOCK)).clamp(1, MAX_BLOCKS) as c_uint;
    // SAFETY: the function was loaded in the current context, whose stream `stream` is (a live
    // CUDA stream of device 0, checked above); `params` points at four values whose types match
    // the kernel's `.u64, .u64, .u8, .u64` parameters, copied by the driver during the call.
    // That `dst..dst + n` is writable until the kernel completes is this function's documented
    // precondition.
    unsafe {
        result::launch_kernel(
            kernel.function,
            (blocks, 1, 1),
            (BLOCK, 1, 1),
            0,
            stream.raw_handle() as sys::CUstream,
            &mut params,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use streamalloc::{Device, MemoryResource, PinnedHostResource, Stream};

    use super::launch_spin_then_fill;

    #[test]
    #[ignore = "needs a CUDA device"]
    fn spin_then_fill_writes_after_spinning() {
        let device = Device::cuda(0).expect("CUDA device 0");
        let stream = Stream::new(&device).unwrap();
        // Pinned host memory: the device writes it, the host reads it back directly.
        let mr = PinnedHostResource::new(&device).unwrap();
        let n = 3 << 20;
        let p = mr.try_allocate(n, &stream).unwrap();
        // SAFETY: `p` is `n` bytes of host-accessible memory that nothing uses yet.
        unsafe { std::ptr::write_bytes(p.addr() as *mut u8, 0, n) };

        let start = Instant::now();
        launch_spin_then_fill(&stream, p.addr(), n, 0x7e, 20_000_000).unwrap();
        let filled = stream.record().unwrap();
        assert!(!filled.is_complete().unwrap(), "the kernel did not spin");
        // Await through the completion driver (host function on a shadow stream).
        futures::executor::block_on(filled).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(20));
        // SAFETY: the kernel has completed; nothing else writes the block.
        let bytes = unsafe { std::slice::from_raw_parts(p.addr() as *const u8, n) };
        assert!(bytes.iter().all(|&b| b == 0x7e));

        // A launch on a stream of another backend is refused, not sent to the driver.
        let host_stream = Stream::new(&Device::host()).unwrap();
        assert!(launch_spin_then_fill(&host_stream, p.addr(), n, 1, 0).is_err());
        // SAFETY: from this resource on `stream`; the kernel that used it has completed.
        unsafe { mr.deallocate(p, n, &stream) };
    }
}
