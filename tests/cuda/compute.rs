//! Computing on the crate's containers through cudarc: PTX and NVRTC kernels, cuBLAS, the
//! stream interop both ways, and the tracking of every use (a kernel on B reading a vector last
//! written on A waits for A; a later write on A waits for B's read; the free waits for both).
//!
//! Kernels from PTX need the `nvrtc` feature (for cudarc's `Ptx` type; not libnvrtc), cuBLAS the
//! `cublas` feature; both are default features and `cuda` implies them. Missing libraries skip
//! with a message.
#![cfg(feature = "cuda-driver")]
// Without `nvrtc` and `cublas` only the interop tests remain.
#![cfg_attr(not(feature = "nvrtc"), allow(unused_imports, dead_code))]

use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use streamalloc::cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};
use streamalloc::*;

use crate::kernels::launch_spin_then_fill;

/// Device 0, with the deferred errors earlier tests left taken (the GPU suites share it and
/// run one test at a time).
fn gpu() -> Device {
    let device = Device::cuda(0).expect("these tests need CUDA device 0");
    while device.take_deferred_error().is_some() {}
    device
}

/// 200 ms: long enough that work not ordered after the spin certainly runs before it ends.
const SPIN_NS: u64 = 200_000_000;
/// The spinning writer fills only this many leading bytes: 128 blocks of 256 threads, so most
/// of the GPU stays free. A writer that filled every SM would serialize a reader kernel on
/// another stream by itself (no room to run), and the ordering tests would pass without the
/// tracking (the negative control showed it).
const SPIN_BYTES: usize = 32 << 10;

/// What a zeroed `u32` vector holds after the spinning writer filled it with `0xab` bytes.
fn after_spin(i: usize) -> u32 {
    if i < SPIN_BYTES / 4 {
        0xabab_abab
    } else {
        0
    }
}

/// The number of elements of `seen` that differ from [`after_spin`].
fn not_after_spin(seen: &[u32]) -> usize {
    seen.iter()
        .enumerate()
        .filter(|&(i, &x)| x != after_spin(i))
        .count()
}

/// Hand-written PTX (JIT-compiled by the driver for the GPU at hand):
/// `add_one_f32(float* x, u32 n)`, `copy_u32(const u32* src, u32* dst, u32 n)`,
/// `fill_u32(u32* dst, u32 value, u32 n)`, `scale_f32(float* x, const float* alpha, u32 n)`,
/// each one thread per element.
#[cfg(feature = "nvrtc")]
const PTX: &str = r#".version 7.0
.target sm_52
.address_size 64

.visible .entry add_one_f32(.param .u64 add_x, .param .u32 add_n)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .f32 %f<3>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [add_x];
	ld.param.u32 %r1, [add_n];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.s32 %r5, %r2, %r3, %r4;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra ADD_DONE;
	cvta.to.global.u64 %rd2, %rd1;
	mul.wide.u32 %rd3, %r5, 4;
	add.s64 %rd4, %rd2, %rd3;
	ld.global.f32 %f1, [%rd4];
	add.f32 %f2, %f1, 0f3F800000;
	st.global.f32 [%rd4], %f2;
ADD_DONE:
	ret;
}

.visible .entry copy_u32(.param .u64 copy_src, .param .u64 copy_dst, .param .u32 copy_n)
{
	.reg .pred %p<2>;
	.reg .b32 %r<7>;
	.reg .b64 %rd<8>;
	ld.param.u64 %rd1, [copy_src];
	ld.param.u64 %rd2, [copy_dst];
	ld.param.u32 %r1, [copy_n];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.s32 %r5, %r2, %r3, %r4;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra COPY_DONE;
	cvta.to.global.u64 %rd3, %rd1;
	cvta.to.global.u64 %rd4, %rd2;
	mul.wide.u32 %rd5, %r5, 4;
	add.s64 %rd6, %rd3, %rd5;
	add.s64 %rd7, %rd4, %rd5;
	ld.global.u32 %r6, [%rd6];
	st.global.u32 [%rd7], %r6;
COPY_DONE:
	ret;
}

.visible .entry fill_u32(.param .u64 fill_dst, .param .u32 fill_value, .param .u32 fill_n)
{
	.reg .pred %p<2>;
	.reg .b32 %r<7>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [fill_dst];
	ld.param.u32 %r6, [fill_value];
	ld.param.u32 %r1, [fill_n];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.s32 %r5, %r2, %r3, %r4;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra FILL_DONE;
	cvta.to.global.u64 %rd2, %rd1;
	mul.wide.u32 %rd3, %r5, 4;
	add.s64 %rd4, %rd2, %rd3;
	st.global.u32 [%rd4], %r6;
FILL_DONE:
	ret;
}

.visible .entry scale_f32(.param .u64 scale_x, .param .u64 scale_alpha, .param .u32 scale_n)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .f32 %f<4>;
	.reg .b64 %rd<7>;
	ld.param.u64 %rd1, [scale_x];
	ld.param.u64 %rd5, [scale_alpha];
	ld.param.u32 %r1, [scale_n];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.s32 %r5, %r2, %r3, %r4;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra SCALE_DONE;
	cvta.to.global.u64 %rd2, %rd1;
	cvta.to.global.u64 %rd6, %rd5;
	ld.global.f32 %f3, [%rd6];
	mul.wide.u32 %rd3, %r5, 4;
	add.s64 %rd4, %rd2, %rd3;
	ld.global.f32 %f1, [%rd4];
	mul.f32 %f2, %f1, %f3;
	st.global.f32 [%rd4], %f2;
SCALE_DONE:
	ret;
}
"#;

#[cfg(feature = "nvrtc")]
struct Kernels {
    add_one: streamalloc::cudarc::driver::CudaFunction,
    copy: streamalloc::cudarc::driver::CudaFunction,
    fill: streamalloc::cudarc::driver::CudaFunction,
    scale: streamalloc::cudarc::driver::CudaFunction,
}

#[cfg(feature = "nvrtc")]
fn kernels(device: &Device) -> Kernels {
    // sm_52 first (any GPU's driver JIT-compiles it where it still knows Maxwell targets),
    // then sm_75, as `kernels.rs` does.
    let module = device
        .load_ptx(PTX)
        .or_else(|_| device.load_ptx(&PTX.replace("sm_52", "sm_75")))
        .expect("the test PTX loads");
    Kernels {
        add_one: module.load_function("add_one_f32").unwrap(),
        copy: module.load_function("copy_u32").unwrap(),
        fill: module.load_function("fill_u32").unwrap(),
        scale: module.load_function("scale_f32").unwrap(),
    }
}

/// Launches `copy_u32(src, dst, n)` on `cs` with raw addresses (for the tests that pass
/// pointers obtained through `DevicePtr` themselves).
#[cfg(feature = "nvrtc")]
fn launch_copy_raw(k: &Kernels, cs: &CudaStream, src: u64, dst: u64, n: u32) {
    use streamalloc::cudarc::driver::PushKernelArg;
    // SAFETY: `copy_u32` takes (u64, u64, u32); both ranges hold `n` u32s that the caller keeps
    // alive and ordered until the kernel completes.
    unsafe {
        cs.launch_builder(&k.copy)
            .arg(&src)
            .arg(&dst)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n))
    }
    .unwrap();
}

#[cfg(feature = "nvrtc")]
#[test]
#[ignore = "needs a CUDA device"]
fn ptx_kernel_runs_on_a_device_vec() {
    use streamalloc::cudarc::driver::PushKernelArg;
    let device = gpu();
    let k = kernels(&device);
    let stream = Stream::new(&device).unwrap();
    let n = 100_000u32;
    let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut v = block_on(DeviceVec::from_host(
        host.clone(),
        &stream,
        CudaAsyncResource::new(&device).unwrap(),
    ))
    .unwrap();
    let cs = stream.cudarc_stream().unwrap();
    // SAFETY: `add_one_f32(float*, u32)` over the vector's `n` elements, on its owner.
    unsafe {
        cs.launch_builder(&k.add_one)
            .arg(&mut v)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n))
    }
    .unwrap();
    let out = block_on(v.to_vec()).unwrap();
    for (i, (&x, &y)) in host.iter().zip(&out).enumerate() {
        assert_eq!(y, x + 1.0, "element {i}");
    }
    // A view as a kernel argument: only its range changes.
    let mut tail = v.slice_mut(n as usize - 10..).unwrap();
    let ten = 10u32;
    // SAFETY: as above, over the view's 10 elements.
    unsafe {
        cs.launch_builder(&k.add_one)
            .arg(&mut tail)
            .arg(&ten)
            .launch(LaunchConfig::for_num_elems(ten))
    }
    .unwrap();
    let out = block_on(v.to_vec()).unwrap();
    assert_eq!(out[n as usize - 11], host[n as usize - 11] + 1.0);
    assert_eq!(out[n as usize - 1], host[n as usize - 1] + 2.0);
    assert!(device.take_deferred_error().is_none());
}

/// A `DeviceScalar` as a kernel argument (a `const float*`): on its owner directly, and from
/// another stream through a `ReadGuard`, where the kernel waits for the scalar's `set_value`.
#[cfg(feature = "nvrtc")]
#[test]
#[ignore = "needs a CUDA device"]
fn a_scalar_is_a_kernel_argument() {
    use streamalloc::cudarc::driver::PushKernelArg;
    let device = gpu();
    let k = kernels(&device);
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let acs = a.cudarc_stream().unwrap();
    let n = 1000u32;
    let mut x = block_on(DeviceVec::from_host(
        vec![1.5f32; n as usize],
        &a,
        mr.clone(),
    ))
    .unwrap();
    let alpha = block_on(DeviceScalar::new(2.0f32, &a, mr.clone())).unwrap();
    // SAFETY: scale_f32(float*, const float*, u32) over `n` elements, on the owner of both.
    unsafe {
        acs.launch_builder(&k.scale)
            .arg(&mut x)
            .arg(&alpha)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n))
    }
    .unwrap();
    assert!(block_on(x.to_vec()).unwrap().iter().all(|&v| v == 3.0));

    // A scalar owned by B, set on B behind a 200 ms delay, read by a kernel on A.
    let mut beta = block_on(DeviceScalar::new(0.0f32, &b, mr)).unwrap();
    b.enqueue_delay(Duration::from_millis(200)).unwrap();
    beta.set_value(10.0).unwrap();
    {
        let read = beta.read_on(&a).unwrap();
        // SAFETY: as above; `beta` is read on A through its guard.
        unsafe {
            acs.launch_builder(&k.scale)
                .arg(&mut x)
                .arg(&read)
                .arg(&n)
                .launch(LaunchConfig::for_num_elems(n))
        }
        .unwrap();
    }
    let out = block_on(x.to_vec()).unwrap();
    assert!(
        out.iter().all(|&v| v == 30.0),
        "the kernel read the scalar before set_value: {}",
        out[0]
    );
    assert_eq!(block_on(beta.value()).unwrap(), 10.0);
    assert!(device.take_deferred_error().is_none());
}

#[cfg(feature = "nvrtc")]
#[test]
#[ignore = "needs a CUDA device"]
fn nvrtc_kernel_compiles_and_runs() {
    use streamalloc::cudarc::driver::PushKernelArg;
    let device = gpu();
    let src = r#"extern "C" __global__ void axpy(float a, const float *x, float *y, unsigned n) {
        unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i] + y[i];
    }"#;
    let module = match device.compile_kernels(src) {
        Ok(m) => m,
        Err(Error::Unsupported { what, .. }) => {
            println!("skipped: {what}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let axpy = module.load_function("axpy").unwrap();
    let stream = Stream::new(&device).unwrap();
    let mr = CudaAsyncResource::new(&device).unwrap();
    let n = 4096u32;
    let x = block_on(DeviceVec::from_host(
        (0..n).map(|i| i as f32).collect::<Vec<_>>(),
        &stream,
        mr.clone(),
    ))
    .unwrap();
    let mut y = block_on(DeviceVec::from_host(vec![1.0f32; n as usize], &stream, mr)).unwrap();
    let a = 3.0f32;
    let cs = stream.cudarc_stream().unwrap();
    // SAFETY: `axpy(float, const float*, float*, unsigned)` over `n` elements, on the owner.
    unsafe {
        cs.launch_builder(&axpy)
            .arg(&a)
            .arg(&x)
            .arg(&mut y)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n))
    }
    .unwrap();
    let out = block_on(y.to_vec()).unwrap();
    for (i, &v) in out.iter().enumerate() {
        assert_eq!(v, 3.0 * i as f32 + 1.0, "element {i}");
    }
    // A compile error is a typed error carrying NVRTC's log.
    match device.compile_kernels("extern \"C\" __global__ void broken( {") {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("NVRTC"), "{msg}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[cfg(feature = "cublas")]
#[test]
#[ignore = "needs a CUDA device"]
fn cublas_sgemm_matches_the_host() {
    use streamalloc::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
    let device = gpu();
    let stream = Stream::new(&device).unwrap();
    let blas = match stream.cublas() {
        Ok(b) => b,
        Err(Error::Unsupported { what, .. }) => {
            println!("skipped: {what}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let (m, n, k) = (67usize, 45usize, 33usize);
    // Column-major: A(i, p) = a[i + p * m], B(p, j) = b[p + j * k].
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 * 0.5).collect();
    let mr = CudaAsyncResource::new(&device).unwrap();
    let da = block_on(DeviceVec::from_host(a.clone(), &stream, mr.clone())).unwrap();
    let db = block_on(DeviceVec::from_host(b.clone(), &stream, mr.clone())).unwrap();
    let mut dc = block_on(DeviceVec::<f32>::zeroed(m * n, &stream, mr)).unwrap();
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha: 1.0f32,
        lda: m as i32,
        ldb: k as i32,
        beta: 0.0f32,
        ldc: m as i32,
    };
    // SAFETY: the three vectors hold m*k, k*n and m*n elements, as the configuration says.
    unsafe { blas.gemm(cfg, &da, &db, &mut dc) }.unwrap();
    let c = block_on(dc.to_vec()).unwrap();
    for j in 0..n {
        for i in 0..m {
            let want: f32 = (0..k).map(|p| a[i + p * m] * b[p + j * k]).sum();
            let got = c[i + j * m];
            assert!(
                (got - want).abs() <= 1e-3 * want.abs().max(1.0),
                "C({i}, {j}) = {got}, want {want}"
            );
        }
    }
    assert!(device.take_deferred_error().is_none());
}

/// The goal of the issue, through kernels: a read kernel on B of a vector last written on A
/// waits for A; a later write on A waits for B's read; dropping waits for both.
#[cfg(feature = "nvrtc")]
#[test]
#[ignore = "needs a CUDA device"]
fn handoff_through_kernels() {
    use streamalloc::cudarc::driver::PushKernelArg;
    let device = gpu();
    let k = kernels(&device);
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let (acs, bcs) = (a.cudarc_stream().unwrap(), b.cudarc_stream().unwrap());
    let n = 1u32 << 22;
    let mut v = block_on(DeviceVec::<u32>::zeroed(n as usize, &a, mr.clone())).unwrap();
    // A writes 0xabababab after spinning 200 ms.
    launch_spin_then_fill(&a, v.ptr().addr(), SPIN_BYTES, 0xab, SPIN_NS).unwrap();

    // 1. B reads through a ReadGuard: it waits for A.
    let mut out = block_on(DeviceVec::<u32>::zeroed(n as usize, &b, mr.clone())).unwrap();
    {
        let read = v.read_on(&b).unwrap();
        // SAFETY: copy_u32(src, dst, n): `read` on B (the launch stream), `out` owned by B.
        unsafe {
            bcs.launch_builder(&k.copy)
                .arg(&read)
                .arg(&mut out)
                .arg(&n)
                .launch(LaunchConfig::for_num_elems(n))
        }
        .unwrap();
    }
    let seen = block_on(out.to_vec()).unwrap();
    let stale = not_after_spin(&seen);
    assert_eq!(
        stale, 0,
        "{stale} of {n} elements were read before A wrote them"
    );

    // 2. A later write on A waits for B's read, even with B held up 200 ms and the guard
    //    forgotten.
    let mut out2 = block_on(DeviceVec::<u32>::zeroed(n as usize, &b, mr.clone())).unwrap();
    b.enqueue_delay(Duration::from_millis(200)).unwrap();
    let read = v.read_on(&b).unwrap();
    // SAFETY: as above.
    unsafe {
        bcs.launch_builder(&k.copy)
            .arg(&read)
            .arg(&mut out2)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n))
    }
    .unwrap();
    std::mem::forget(read);
    let seven = 7u32;
    // SAFETY: fill_u32(dst, value, n) on the owner A.
    unsafe {
        acs.launch_builder(&k.fill)
            .arg(&mut v)
            .arg(&seven)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n))
    }
    .unwrap();
    let seen = block_on(out2.to_vec()).unwrap();
    let overwritten = not_after_spin(&seen);
    assert_eq!(
        overwritten, 0,
        "A's write overtook B's read in {overwritten} of {n} elements"
    );
    assert!(block_on(v.to_vec()).unwrap().iter().all(|&x| x == 7));

    // 3. The free waits for both: B reads again after a delay, then the vector is dropped on A
    //    and A immediately reuses the memory (a stream-ordered pool hands it back at once).
    let mut out3 = block_on(DeviceVec::<u32>::zeroed(n as usize, &b, mr.clone())).unwrap();
    b.enqueue_delay(Duration::from_millis(200)).unwrap();
    {
        let read = v.read_on(&b).unwrap();
        // SAFETY: as above.
        unsafe {
            bcs.launch_builder(&k.copy)
                .arg(&read)
                .arg(&mut out3)
                .arg(&n)
                .launch(LaunchConfig::for_num_elems(n))
        }
        .unwrap();
    }
    drop(v);
    let reuse = DeviceVec::<u32>::try_new(n as usize, &a, mr).unwrap();
    launch_spin_then_fill(&a, reuse.ptr().addr(), 4 * n as usize, 0xcd, 0).unwrap();
    let seen = block_on(out3.to_vec()).unwrap();
    let wrong = seen.iter().filter(|&&x| x != 7).count();
    assert_eq!(
        wrong, 0,
        "the free overtook B's read in {wrong} of {n} elements"
    );
    assert!(device.take_deferred_error().is_none());
}

/// A view read by a kernel on another stream through `on(&stream)` (a `KernelRead`) waits for
/// the owner's write, like a whole vector's `ReadGuard`.
#[cfg(feature = "nvrtc")]
#[test]
#[ignore = "needs a CUDA device"]
fn a_view_is_read_on_another_stream_through_on() {
    use streamalloc::cudarc::driver::PushKernelArg;
    let device = gpu();
    let k = kernels(&device);
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let bcs = b.cudarc_stream().unwrap();
    let n = 1u32 << 20;
    let v = block_on(DeviceVec::<u32>::zeroed(n as usize, &a, mr.clone())).unwrap();
    let half = n / 2;
    // The writer fills the first SPIN_BYTES of the view (leaving SMs free, see SPIN_BYTES).
    launch_spin_then_fill(
        &a,
        v.ptr().addr() + 4 * u64::from(half),
        SPIN_BYTES,
        0xab,
        SPIN_NS,
    )
    .unwrap();
    let mut out = block_on(DeviceVec::<u32>::zeroed(half as usize, &b, mr)).unwrap();
    {
        let tail = v.slice(half as usize..).unwrap();
        let read = tail.on(&b).unwrap();
        // SAFETY: copy_u32(src, dst, n) of the view's `half` elements, on B (the read's stream).
        unsafe {
            bcs.launch_builder(&k.copy)
                .arg(&read)
                .arg(&mut out)
                .arg(&half)
                .launch(LaunchConfig::for_num_elems(half))
        }
        .unwrap();
    }
    drop(v); // freed on A after B's read
    let seen = block_on(out.to_vec()).unwrap();
    let stale = not_after_spin(&seen);
    assert_eq!(
        stale, 0,
        "{stale} of {half} elements were read before A wrote them"
    );
    assert!(device.take_deferred_error().is_none());
}

/// Negative control for `handoff_through_kernels`: the same read launched on B with the plain
/// `&v` argument, which is only valid on the owner, is not ordered after A and reads stale data.
/// It shows that the test above would fail without the tracking.
#[cfg(feature = "nvrtc")]
#[test]
#[ignore = "needs a CUDA device"]
fn negative_control_an_untracked_read_on_another_stream_races() {
    use streamalloc::cudarc::driver::PushKernelArg;
    let device = gpu();
    let k = kernels(&device);
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let bcs = b.cudarc_stream().unwrap();
    let n = 1u32 << 22;
    let v = block_on(DeviceVec::<u32>::zeroed(n as usize, &a, mr.clone())).unwrap();
    a.synchronize_blocking().unwrap();
    launch_spin_then_fill(&a, v.ptr().addr(), SPIN_BYTES, 0xab, SPIN_NS).unwrap();
    let mut out = block_on(DeviceVec::<u32>::zeroed(n as usize, &b, mr)).unwrap();
    // SAFETY: deliberately wrong ordering (the point of the control); the memory stays
    // allocated until both streams are synchronized below.
    unsafe {
        bcs.launch_builder(&k.copy)
            .arg(&v)
            .arg(&mut out)
            .arg(&n)
            .launch(LaunchConfig::for_num_elems(n))
    }
    .unwrap();
    let seen = block_on(out.to_vec()).unwrap();
    a.synchronize_blocking().unwrap();
    let stale = not_after_spin(&seen);
    assert!(
        stale > 0,
        "the untracked read happened to run after A's 200 ms write"
    );
}

/// cuBLAS through `DevicePtr` on a stream that is not the owner: the inputs, written by a
/// spinning kernel on A, are read on B (B waits); the output is handed to B.
#[cfg(feature = "cublas")]
#[test]
#[ignore = "needs a CUDA device"]
fn cublas_on_another_stream_waits_for_the_writer() {
    use streamalloc::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
    let device = gpu();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let blas = match b.cublas() {
        Ok(blas) => blas,
        Err(Error::Unsupported { what, .. }) => {
            println!("skipped: {what}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let m = 256usize;
    let mr = CudaAsyncResource::new(&device).unwrap();
    let x = block_on(DeviceVec::<f32>::zeroed(m * m, &a, mr.clone())).unwrap();
    // 0x3f80_0000 is 1.0f32: every byte 0x3f would be 0.747; fill bytes with 0x3c: 0.0117...
    // Only the first `cols` columns (column-major), so the spinning writer leaves SMs free.
    launch_spin_then_fill(&a, x.ptr().addr(), SPIN_BYTES, 0x3c, SPIN_NS).unwrap();
    let cols = SPIN_BYTES / 4 / m;
    let one_ish = f32::from_bits(0x3c3c_3c3c);
    let mut c = block_on(DeviceVec::<f32>::zeroed(m * m, &a, mr)).unwrap();
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: m as i32,
        n: m as i32,
        k: m as i32,
        alpha: 1.0f32,
        lda: m as i32,
        ldb: m as i32,
        beta: 0.0f32,
        ldc: m as i32,
    };
    // SAFETY: all three hold m*m elements.
    unsafe { blas.gemm(cfg, &x, &x, &mut c) }.unwrap();
    assert_eq!(c.stream(), b, "the output was handed to cuBLAS's stream");
    let out = block_on(c.to_vec()).unwrap();
    // C = X X with X nonzero in its first `cols` columns: C[i][j] = cols * v * v for j < cols.
    let want = |e: usize| {
        if e / m < cols {
            one_ish * one_ish * cols as f32
        } else {
            0.0
        }
    };
    let wrong = out
        .iter()
        .enumerate()
        .filter(|&(e, &v)| (v - want(e)).abs() > 1e-3 * want(0))
        .count();
    assert_eq!(wrong, 0, "{wrong} results computed from unwritten inputs");
    drop(x); // freed on A after B's read (pending reader settled here)
    assert!(device.take_deferred_error().is_none());
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_cudarc_stream_is_adopted_and_maps_back() {
    let device = gpu();
    let ctx = device.cudarc_context().unwrap();
    assert!(
        Arc::ptr_eq(&ctx, &device.cudarc_context().unwrap()),
        "one context per device"
    );
    let theirs = ctx.new_stream().unwrap();
    let ours = Stream::from_cudarc(theirs.clone()).unwrap();
    assert_eq!(ours.raw_handle(), theirs.cu_stream() as u64);
    assert_eq!(ours.device(), &device);
    assert_eq!(
        Stream::from_cudarc(theirs.clone()).unwrap(),
        ours,
        "adopting twice is one stream"
    );
    assert!(Arc::ptr_eq(&ours.cudarc_stream().unwrap(), &theirs));

    // The adopted stream has the crate's whole machinery: allocation, copies, events.
    let mr = CudaAsyncResource::new(&device).unwrap();
    let v = block_on(DeviceVec::from_host(vec![5u32; 1000], &ours, mr)).unwrap();
    assert_eq!(block_on(v.to_vec()).unwrap(), vec![5; 1000]);
    ours.enqueue_delay(Duration::from_millis(20)).unwrap();
    let event = ours.record().unwrap();
    block_on(event).unwrap();
    drop(v);
    drop(ours);
    theirs.synchronize().unwrap(); // the adopter kept nothing that outlives it

    // The other way: a Stream's cudarc handle maps back to it, and may outlive it.
    let mine = Stream::new(&device).unwrap();
    let cs = mine.cudarc_stream().unwrap();
    assert!(Arc::ptr_eq(&cs, &mine.cudarc_stream().unwrap()));
    assert_eq!(Stream::from_cudarc(cs.clone()).unwrap(), mine);
    drop(mine);
    // The CUstream is still alive: cudarc can use it.
    let event = cs.record_event(None).unwrap();
    event.synchronize().unwrap();
    drop(cs);
    let _next = Stream::new(&device).unwrap(); // retires the dead stream
    assert!(device.take_deferred_error().is_none());
}

/// A use on a cudarc stream the crate does not know: the stream waits for the owner, and the
/// `SyncOnDrop` makes the use complete before the borrow ends.
#[cfg(feature = "nvrtc")]
#[test]
#[ignore = "needs a CUDA device"]
fn an_unknown_cudarc_stream_waits_for_the_owner() {
    let device = gpu();
    let k = kernels(&device);
    let mr = CudaAsyncResource::new(&device).unwrap();
    let a = Stream::new(&device).unwrap();
    let unknown = device.cudarc_context().unwrap().new_stream().unwrap();
    let n = 1u32 << 20;
    let v = block_on(DeviceVec::<u32>::zeroed(n as usize, &a, mr.clone())).unwrap();
    launch_spin_then_fill(&a, v.ptr().addr(), SPIN_BYTES, 0xab, SPIN_NS).unwrap();
    let mut out = block_on(DeviceVec::<u32>::zeroed(n as usize, &a, mr)).unwrap();
    {
        let (src, _sync_src) = v.device_ptr(&unknown);
        let (dst, _sync_dst) = out.device_ptr_mut(&unknown);
        assert_ne!(src, 0);
        launch_copy_raw(&k, &unknown, src, dst, n);
    } // both SyncOnDrops synchronize `unknown` here
    let seen = block_on(out.to_vec()).unwrap();
    let stale = not_after_spin(&seen);
    assert_eq!(
        stale, 0,
        "{stale} of {n} elements were read before A wrote them"
    );
    assert!(device.take_deferred_error().is_none());
}

/// Bad input: a cudarc stream of another context (a non-primary one; of device 1 where there
/// are two GPUs) is refused with a typed error; a buffer used on it panics (never a null
/// address that would fault the operation) and the typed error goes to the buffer's device.
#[test]
#[ignore = "needs a CUDA device"]
fn streams_of_another_context_or_device_are_refused() {
    let device = gpu();
    let other_ctx = streamalloc::cudarc::driver::CudaContext::new_non_primary(0, 0).unwrap();
    let foreign = other_ctx.new_stream().unwrap();
    match Stream::from_cudarc(foreign.clone()) {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("primary"), "{msg}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let stream = Stream::new(&device).unwrap();
    let v =
        DeviceVec::<u32>::try_new(16, &stream, CudaAsyncResource::new(&device).unwrap()).unwrap();
    let used = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (p, _sync) = v.device_ptr(&foreign);
        p
    }));
    assert!(
        used.is_err(),
        "an address was handed out on a foreign context"
    );
    assert!(matches!(
        device.take_deferred_error(),
        Some(Error::InvalidArgument(_))
    ));

    if Device::cuda_device_count() < 2 {
        println!("skipped the two-device half: one GPU");
        return;
    }
    let gpu1 = Device::cuda(1).unwrap();
    let s1 = Stream::new(&gpu1).unwrap().cudarc_stream().unwrap();
    let used = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (p, _sync) = v.device_ptr(&s1);
        p
    }));
    assert!(
        used.is_err(),
        "an address was handed out on another device's stream"
    );
    match device.take_deferred_error() {
        Some(Error::DeviceMismatch {
            expected, actual, ..
        }) => {
            assert_eq!((expected.ordinal, actual.ordinal), (0, 1));
        }
        other => panic!("expected DeviceMismatch, got {other:?}"),
    }
    // A vector of device 0 read on a stream of device 1 through the crate: typed error too.
    let s1_ours = Stream::from_cudarc(s1).unwrap();
    assert!(matches!(
        v.read_on(&s1_ours),
        Err(Error::DeviceMismatch { .. })
    ));
}
