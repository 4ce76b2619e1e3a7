//! cuBLAS SGEMM on `DeviceVec<f32>` inputs that a kernel produced on another stream, checked
//! against the same product computed on the host.
//!
//! ```text
//! stream P (producer)   init kernel writes A (m x k) and B (k x n)
//! stream G (gemm)       cuBLAS: C = A * B      <- waits for P's writes: A and B are read on G
//!                                                 through cudarc's DevicePtr, which the
//!                                                 vectors track (no manual event)
//! host                  C copied back, compared with a CPU loop
//! ```
//!
//! ```sh
//! cargo run --example gemm   # CUDA device 0 (NVRTC + cuBLAS, default features), else the host backend
//! ```
//!
//! On the host backend (no GPU, or a build without `nvrtc`/`cublas`) the same pipeline runs with
//! host kernels (`Stream::launch_host_kernel`): an init kernel on P, a CPU SGEMM loop on G; the
//! program says which path ran. Where libnvrtc or
//! libcublas is missing it says so and skips the GPU path.

use std::time::Instant;

use streamalloc::{CudaAsyncResource, Device, DeviceVec, Stream};

type BoxError = Box<dyn std::error::Error>;

const M: usize = 512;
const N: usize = 384;
const K: usize = 256;

/// Element `i` of A (column-major, M x K): what the init kernel writes.
fn a_at(i: usize) -> f32 {
    ((i * 7) % 13) as f32 * 0.25 - 1.5
}

/// Element `i` of B (column-major, K x N).
fn b_at(i: usize) -> f32 {
    ((i * 5) % 11) as f32 * 0.5 - 2.0
}

/// C = A * B on the host, column-major.
fn host_gemm(a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0.0f32; M * N];
    host_gemm_into(a, b, &mut c);
    c
}

/// `c = A * B`, column-major (`c` is overwritten).
fn host_gemm_into(a: &[f32], b: &[f32], c: &mut [f32]) {
    c.fill(0.0);
    for j in 0..N {
        for p in 0..K {
            let bpj = b[p + j * K];
            for i in 0..M {
                c[i + j * M] += a[i + p * M] * bpj;
            }
        }
    }
}

/// The largest difference between `got` and `want`, relative to `want`'s largest magnitude.
fn max_relative_error(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / scale)
        .fold(0.0, f32::max)
}

fn main() -> Result<(), BoxError> {
    let device = Device::default();
    println!(
        "device {} ({}, {} backend); C[{M}x{N}] = A[{M}x{K}] * B[{K}x{N}]",
        device.id(),
        device.name(),
        device.backend()
    );
    futures::executor::block_on(async {
        #[cfg(all(feature = "nvrtc", feature = "cublas"))]
        if device.backend() == streamalloc::BackendKind::Cuda {
            return cuda::run(&device).await;
        }
        #[cfg(not(all(feature = "nvrtc", feature = "cublas")))]
        if device.backend() == streamalloc::BackendKind::Cuda {
            println!("built without the `nvrtc` and `cublas` features: skipping the GPU path");
            println!("(both are default features); computing on the host backend");
            return host_path(&Device::host()).await;
        }
        host_path(&device).await
    })
}

/// The host backend, the same shape with host kernels (closures enqueued on a stream, tracked
/// like device kernels): one on the producer stream writes A and B, one on the gemm stream
/// reads them (waiting for the producer) and writes C.
async fn host_path(device: &Device) -> Result<(), BoxError> {
    println!("path: host backend (host kernels: init on stream P, a CPU SGEMM loop on stream G)");
    let mr = CudaAsyncResource::new(device)?;
    let (producer, gemm) = (Stream::new(device)?, Stream::new(device)?);
    let start = Instant::now();
    let mut a = DeviceVec::<f32>::new(M * K, &producer, mr.clone()).await?;
    let mut b = DeviceVec::<f32>::new(K * N, &producer, mr.clone()).await?;
    producer.launch_host_kernel((a.host_write(), b.host_write()), |(a, b)| {
        fill(a, a_at);
        fill(b, b_at);
    })?;

    // C = A * B on G: the kernel reads A and B, so G first waits for P's kernel.
    let mut c = DeviceVec::<f32>::new(M * N, &gemm, mr).await?;
    gemm.launch_host_kernel(
        (a.host_read(), b.host_read(), c.host_write()),
        |(a, b, c)| host_gemm_into(a, b, c),
    )?;
    let got = c.to_vec().await?;
    let elapsed = start.elapsed();
    drop((a, b)); // freed on P once G's kernel has read them
    check(&got, elapsed)
}

/// `x[i] = at(i)`.
fn fill(x: &mut [f32], at: fn(usize) -> f32) {
    for (i, x) in x.iter_mut().enumerate() {
        *x = at(i);
    }
}

fn check(got: &[f32], elapsed: std::time::Duration) -> Result<(), BoxError> {
    let want = host_gemm(
        &(0..M * K).map(a_at).collect::<Vec<_>>(),
        &(0..K * N).map(b_at).collect::<Vec<_>>(),
    );
    let err = max_relative_error(got, &want);
    println!(
        "C computed in {:.1} ms; max relative error against the host: {err:.2e}",
        elapsed.as_secs_f64() * 1e3
    );
    if err > 1e-4 {
        return Err(
            format!("C differs from the host computation (max relative error {err:.2e})").into(),
        );
    }
    println!("C matches the host computation");
    Ok(())
}

#[cfg(all(feature = "nvrtc", feature = "cublas"))]
mod cuda {
    use std::time::Instant;

    use streamalloc::cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
    use streamalloc::cudarc::driver::{LaunchConfig, PushKernelArg};
    use streamalloc::{CudaAsyncResource, Device, DeviceVec, Error, Stream};

    use super::{check, BoxError, K, M, N};

    /// The init kernel: the same formulas as `a_at` / `b_at`.
    const INIT: &str = r#"
extern "C" __global__ void init(float *x, unsigned n, unsigned mul, unsigned modulo,
                                float scale, float offset) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = (float)((i * mul) % modulo) * scale - offset;
}
"#;

    pub(super) async fn run(device: &Device) -> Result<(), BoxError> {
        let (producer, gemm) = (Stream::new(device)?, Stream::new(device)?);
        let module = match device.compile_kernels(INIT) {
            Ok(module) => module,
            Err(Error::Unsupported { what, .. }) => {
                println!("skipped: {what}");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        let blas = match gemm.cublas() {
            Ok(blas) => blas,
            Err(Error::Unsupported { what, .. }) => {
                println!("skipped: {what}");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        println!("path: CUDA (NVRTC init kernel on stream P, cuBLAS SGEMM on stream G)");
        let init = module.load_function("init")?;
        let mr = CudaAsyncResource::new(device)?;
        let start = Instant::now();

        // Produce A and B on P: the kernel writes the vectors on their owner.
        let mut a = DeviceVec::<f32>::new(M * K, &producer, mr.clone()).await?;
        let mut b = DeviceVec::<f32>::new(K * N, &producer, mr.clone()).await?;
        let p = producer.cudarc_stream()?;
        for (x, mul, modulo, scale, offset) in [
            (&mut a, 7u32, 13u32, 0.25f32, 1.5f32),
            (&mut b, 5, 11, 0.5, 2.0),
        ] {
            let n = x.len() as u32;
            // SAFETY: `init(float*, unsigned, unsigned, unsigned, float, float)` over the
            // vector's `n` elements, launched on its owner stream.
            unsafe {
                p.launch_builder(&init)
                    .arg(x)
                    .arg(&n)
                    .arg(&mul)
                    .arg(&modulo)
                    .arg(&scale)
                    .arg(&offset)
                    .launch(LaunchConfig::for_num_elems(n))
            }?;
        }

        // C = A * B on G. A and B are read on G: G waits for P's kernels, and the vectors'
        // frees on P will wait for G's reads.
        let mut c = DeviceVec::<f32>::new(M * N, &gemm, mr).await?;
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: M as i32,
            n: N as i32,
            k: K as i32,
            alpha: 1.0f32,
            lda: M as i32,
            ldb: K as i32,
            beta: 0.0f32,
            ldc: M as i32,
        };
        // SAFETY: A, B and C hold M*K, K*N and M*N elements, as the configuration says.
        unsafe { blas.gemm(cfg, &a, &b, &mut c) }?;
        let got = c.to_vec().await?;
        let elapsed = start.elapsed();
        drop((a, b));
        check(&got, elapsed)
    }
}
