//! Integration tests on the CUDA backend: the host suites instantiated for device 0. Ignored
//! where there is no GPU (CI shows them as ignored, never as passed); the GPU bundle runs them
//! with `--include-ignored`.

#[path = "../common/mod.rs"]
mod common;
mod kernels;

use std::sync::Arc;

use streamalloc::*;

fn gpu() -> Device {
    Device::cuda(0).expect("these tests need CUDA device 0")
}

resource_suite!(cuda_resource, gpu(), |d| Arc::new(CudaResource::new(d)), #[ignore = "needs a CUDA device"]);
resource_suite!(cuda_async_resource, gpu(), |d| Arc::new(CudaAsyncResource::new(d).unwrap()), #[ignore = "needs a CUDA device"]);
resource_suite!(
    cuda_async_view_resource,
    gpu(),
    |d| Arc::new(CudaAsyncViewResource::of(&CudaAsyncResource::new(d).unwrap())),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    cuda_async_view_of_default_pool,
    gpu(),
    |d| Arc::new(CudaAsyncViewResource::device_default(d).unwrap()),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(managed_resource, gpu(), |d| Arc::new(ManagedResource::new(d)), #[ignore = "needs a CUDA device"]);
resource_suite!(pinned_host_resource, gpu(), |d| Arc::new(PinnedHostResource::new(d)), #[ignore = "needs a CUDA device"]);
resource_suite!(host_resource, gpu(), |d| Arc::new(HostResource::new(d)), #[ignore = "needs a CUDA device"]);
resource_suite!(current_device_resource, gpu(), |d| current_device_resource_for(d), #[ignore = "needs a CUDA device"]);

buffer_suite!(buffers, gpu(), #[ignore = "needs a CUDA device"]);

/// The handoff proof: a long-running kernel writes a buffer on stream A, the buffer moves to
/// stream B, and B copies it to the host. The host must see what the kernel wrote.
#[test]
#[ignore = "needs a CUDA device"]
fn handoff_kernel_write_is_visible_after_the_move() {
    let host = kernel_then_move(0xab, true);
    let wrong = host.iter().filter(|&&x| x != 0xab).count();
    assert_eq!(
        wrong,
        0,
        "{wrong} of {} bytes were read before the kernel wrote them",
        host.len()
    );
}

/// The negative control of the test above: with the automatic wait switched off, B copies while
/// the kernel still spins, so the host sees bytes the kernel has not written. This shows the
/// test above can fail.
#[test]
#[ignore = "needs a CUDA device"]
fn handoff_without_the_automatic_wait_reads_stale_data() {
    let host = kernel_then_move(0x5c, false);
    let stale = host.iter().filter(|&&x| x != 0x5c).count();
    assert!(stale > 0, "every byte was written: the race did not show");
    println!(
        "without the wait, {stale} of {} bytes were stale",
        host.len()
    );
}

/// Runs the scenario: 16 MiB written by a kernel that first spins 200 ms.
fn kernel_then_move(value: u8, automatic_wait: bool) -> Vec<u8> {
    let device = gpu();
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let n = 16 << 20;
    let mut buf = DeviceBuffer::try_new(n, &a, mr).unwrap();
    kernels::launch_spin_then_fill(&a, buf.ptr().addr(), n, value, 200_000_000).unwrap();
    if !automatic_wait {
        // SAFETY: the race this allows is the point of the test; A is drained below before the
        // buffer is freed, and the host copy only reads.
        unsafe { buf.__disable_handoff_waits() };
    }
    buf.set_stream(&b).unwrap();
    let host = futures::executor::block_on(buf.copy_to_host(vec![0u8; n])).unwrap();
    a.synchronize_blocking().unwrap();
    host
}

resource_suite!(
    pool_over_cuda_resource,
    gpu(),
    |d| Arc::new(PoolResource::new(CudaResource::new(d), 1 << 20, None).unwrap()),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    bounded_pool_over_cuda_async_resource,
    gpu(),
    |d| Arc::new(PoolResource::new(CudaAsyncResource::new(d).unwrap(), 0, Some(8 << 30)).unwrap()),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    limiting_adaptor,
    gpu(),
    |d| Arc::new(LimitingAdaptor::new(CudaResource::new(d), 8 << 30)),
    #[ignore = "needs a CUDA device"]
);
pool_suite!(pools, gpu(), #[ignore = "needs a CUDA device"]);
resource_suite!(
    arena_over_cuda_resource,
    gpu(),
    |d| Arc::new(ArenaResource::new(CudaResource::new(d), None).unwrap()),
    #[ignore = "needs a CUDA device"]
);
arena_suite!(arenas, gpu(), #[ignore = "needs a CUDA device"]);
