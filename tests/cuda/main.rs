//! Integration tests on the CUDA backend: the host suites instantiated for device 0. This binary
//! is built only with feature `gpu-tests` (implied by `cuda`; Cargo.toml's `required-features`),
//! so a plain `cargo test` skips it without listing its tests. Built, every test is ignored where
//! there is no GPU (shown as ignored, never as passed):
//! `cargo test --features cuda -- --include-ignored` and the GPU bundle run them.

#[path = "../common/mod.rs"]
mod common;
mod compute;
mod kernels;
mod mapped_pool;

use std::sync::Arc;

use streamalloc::*;

fn gpu() -> Device {
    Device::cuda(0).expect("these tests need CUDA device 0")
}

resource_suite!(cuda_resource, gpu(), |d| Arc::new(CudaResource::new(d).unwrap()), #[ignore = "needs a CUDA device"]);
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
resource_suite!(managed_resource, gpu(), |d| Arc::new(ManagedResource::new(d).unwrap()), #[ignore = "needs a CUDA device"]);
resource_suite!(cuda_async_managed_resource, gpu(), |d| Arc::new(CudaAsyncManagedResource::new(d).unwrap()), #[ignore = "needs a CUDA device"]);
resource_suite!(pinned_host_resource, gpu(), |d| Arc::new(PinnedHostResource::new(d).unwrap()), #[ignore = "needs a CUDA device"]);
resource_suite!(host_resource, gpu(), |d| Arc::new(HostResource::new(d).unwrap()), #[ignore = "needs a CUDA device"]);
resource_suite!(current_device_resource, gpu(), |d| current_device_resource_for(d), #[ignore = "needs a CUDA device"]);

buffer_suite!(buffers, gpu(), #[ignore = "needs a CUDA device"]);
host_data_suite!(host_data, gpu(), #[ignore = "needs a CUDA device"]);
container_suite!(containers, gpu(), #[ignore = "needs a CUDA device"]);
// Devices 0 and 1; with one GPU these skip, or fail when asked for by name (`multi_gpu`).
multi_device_suite!(multi_gpu, common::multi_device_suite::two_cuda_devices(), #[ignore = "needs two CUDA devices"]);
sync_suite!(synchronization, gpu(), #[ignore = "needs a CUDA device"]);
completion_suite!(completion_driver, gpu(), #[ignore = "needs a CUDA device"]);
huge_sizes_suite!(huge_sizes, gpu(), #[ignore = "needs a CUDA device"]);

resource_suite!(mapped_pool_resource, gpu(), |d| Arc::new(MappedPoolResource::new(d).unwrap()), #[ignore = "needs a CUDA device"]);
resource_suite!(
    mapped_pool_keeping_free_pages,
    gpu(),
    |d| Arc::new(MappedPoolResource::with_config(d, MappedPoolConfig::default().release_threshold(64 << 20)).unwrap()),
    #[ignore = "needs a CUDA device"]
);

deferred_suite!(cuda_resource_errors, gpu(), |d| Arc::new(CudaResource::new(d).unwrap()), #[ignore = "needs a CUDA device"]);
deferred_suite!(cuda_async_resource_errors, gpu(), |d| Arc::new(CudaAsyncResource::new(d).unwrap()), #[ignore = "needs a CUDA device"]);
deferred_suite!(pinned_host_resource_errors, gpu(), |d| Arc::new(PinnedHostResource::new(d).unwrap()), #[ignore = "needs a CUDA device"]);
teardown_suite!(teardown, gpu(), #[ignore = "needs a CUDA device"]);

/// The handoff proof: a long-running kernel writes a buffer on stream A, the buffer moves to
/// stream B, and B copies it to the host. The host must see what the kernel wrote. (Its
/// negative control, which needs a crate-private switch, is in the crate's own tests:
/// `buffer::gpu_tests::handoff_without_the_automatic_wait_reads_stale_data`.)
#[test]
#[ignore = "needs a CUDA device"]
fn handoff_kernel_write_is_visible_after_the_move() {
    let host = kernel_then_move(0xab);
    let wrong = host.iter().filter(|&&x| x != 0xab).count();
    assert_eq!(
        wrong,
        0,
        "{wrong} of {} bytes were read before the kernel wrote them",
        host.len()
    );
}

/// Runs the scenario: 16 MiB written by a kernel that first spins 200 ms.
fn kernel_then_move(value: u8) -> Vec<u8> {
    let device = gpu();
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let n = 16 << 20;
    let mut buf = DeviceBuffer::try_new(n, &a, mr).unwrap();
    kernels::launch_spin_then_fill(&a, buf.ptr().addr(), n, value, 200_000_000).unwrap();
    buf.set_stream(&b).unwrap();
    let host = futures::executor::block_on(buf.copy_to_host(vec![0u8; n])).unwrap();
    a.synchronize_blocking().unwrap();
    host
}

resource_suite!(
    pool_over_cuda_resource,
    gpu(),
    |d| Arc::new(PoolResource::new(CudaResource::new(d).unwrap(), 1 << 20, None).unwrap()),
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
    |d| Arc::new(LimitingAdaptor::new(CudaResource::new(d).unwrap(), 8 << 30)),
    #[ignore = "needs a CUDA device"]
);
pool_suite!(pools, gpu(), #[ignore = "needs a CUDA device"]);
snapshot_pool_suite!(pool_snapshots, gpu(), #[ignore = "needs a CUDA device"]);
pressure_suites!(gpu(), #[ignore = "needs a CUDA device"]);
resource_suite!(limiting_over_host_resource, gpu(), |d| {
    Arc::new(LimitingAdaptor::new(HostResource::new(d).unwrap(), usize::MAX))
}, #[ignore = "needs a CUDA device"]);
resource_suite!(limiting_over_pinned_host_resource, gpu(), |d| {
    Arc::new(LimitingAdaptor::new(PinnedHostResource::new(d).unwrap(), usize::MAX))
}, #[ignore = "needs a CUDA device"]);
resource_suite!(binning_over_host_resource, gpu(), |d| {
    Arc::new(BinningResource::with_range(HostResource::new(d).unwrap(), 12, 20).unwrap())
}, #[ignore = "needs a CUDA device"]);
resource_suite!(
    binning_over_pool,
    gpu(),
    |d| {
        let pool = PoolResource::new(CudaResource::new(d).unwrap(), 0, None).unwrap();
        Arc::new(BinningResource::with_range(pool, 18, 22).unwrap())
    },
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    fixed_size_over_cuda_resource,
    gpu(),
    |d| Arc::new(FixedSizeResource::with_defaults(CudaResource::new(d).unwrap()).unwrap()),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    failure_callback_adaptor,
    gpu(),
    |d| Arc::new(FailureCallbackAdaptor::new(CudaResource::new(d).unwrap(), |f| f.attempt < 2)),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    aligned_adaptor,
    gpu(),
    |d| Arc::new(AlignedAdaptor::new(CudaAsyncResource::new(d).unwrap(), 4096, 64 << 10).unwrap()),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    prefetch_adaptor_over_managed,
    gpu(),
    |d| Arc::new(PrefetchAdaptor::new(ManagedResource::new(d).unwrap())),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    prefetch_adaptor_over_device_memory,
    gpu(),
    |d| Arc::new(PrefetchAdaptor::new(CudaResource::new(d).unwrap())),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    tracing_adaptor,
    gpu(),
    |d| Arc::new(TracingAdaptor::new(CudaResource::new(d).unwrap())),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    statistics_adaptor,
    gpu(),
    |d| Arc::new(StatisticsAdaptor::new(CudaResource::new(d).unwrap())),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    timeline_adaptor,
    gpu(),
    |d| Arc::new(TimelineAdaptor::new(CudaResource::new(d).unwrap())),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    tracking_adaptor,
    gpu(),
    |d| Arc::new(TrackingAdaptor::new(CudaResource::new(d).unwrap())),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    logging_adaptor,
    gpu(),
    |d| Arc::new(LoggingAdaptor::to_writer(CudaResource::new(d).unwrap(), std::io::sink()).unwrap()),
    #[ignore = "needs a CUDA device"]
);
resource_suite!(
    callback_resource,
    gpu(),
    |d| {
        let upstream = CudaAsyncResource::new(d).unwrap();
        let freeing = upstream.clone();
        // SAFETY: called only under `deallocate`'s contract; the pointer came from
        // `upstream`, a clone of `freeing`.
        let free =
            move |ptr, bytes, stream: &Stream| unsafe { freeing.deallocate(ptr, bytes, stream) };
        // SAFETY: every pointer is one `upstream` returned for the same request, with its
        // properties: `upstream` keeps the promise.
        Arc::new(unsafe {
            CallbackResource::new(
                upstream.properties(),
                move |bytes, stream| upstream.try_allocate(bytes, stream),
                free,
            )
        })
    },
    #[ignore = "needs a CUDA device"]
);

/// The prefetch adaptor on a GPU, through the public API: managed memory it hands out was
/// last prefetched to the device (RMM's `PointerAndSize`), and data written there survives.
#[cfg(feature = "cuda-driver")]
#[test]
#[ignore = "needs a CUDA device"]
fn prefetch_adaptor_moves_managed_memory_to_the_device() {
    use streamalloc::cudarc::driver::sys;

    let device = gpu();
    let stream = Stream::new(&device).unwrap();
    let mr = PrefetchAdaptor::new(ManagedResource::new(&device).unwrap());
    let n = 12345;
    let mut buf = DeviceBuffer::try_new(n, &stream, mr).unwrap();
    stream.synchronize_blocking().unwrap();
    let mut concurrent: std::ffi::c_int = 0;
    let mut location: std::ffi::c_int = 0;
    // SAFETY: the device's context is current on this thread (the stream's creation and
    // synchronization bound it); both out-pointers are valid `int`s; the range is live managed
    // memory of the buffer.
    unsafe {
        let mut dev: sys::CUdevice = 0;
        sys::cuDeviceGet(&mut dev, 0).result().unwrap();
        sys::cuDeviceGetAttribute(
            &mut concurrent,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
            dev,
        )
        .result()
        .unwrap();
        sys::cuMemRangeGetAttribute(
            (&mut location as *mut std::ffi::c_int).cast(),
            std::mem::size_of::<std::ffi::c_int>(),
            sys::CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION,
            buf.ptr().addr(),
            n,
        )
        .result()
        .unwrap();
    }
    if concurrent != 0 {
        assert_eq!(location, 0, "last prefetched to device 0");
    } else {
        println!("no concurrent managed access: prefetch is skipped");
    }
    assert!(device.take_deferred_error().is_none());
    buf.fill(0x42).unwrap();
    let host = futures::executor::block_on(buf.copy_to_host(vec![0u8; n])).unwrap();
    assert!(host.iter().all(|&x| x == 0x42));
}
resource_suite!(
    arena_over_cuda_resource,
    gpu(),
    |d| Arc::new(ArenaResource::new(CudaResource::new(d).unwrap(), None).unwrap()),
    #[ignore = "needs a CUDA device"]
);
arena_suite!(arenas, gpu(), #[ignore = "needs a CUDA device"]);
snapshot_arena_suite!(snapshot_arena, gpu(), #[ignore = "needs a CUDA device"]);
