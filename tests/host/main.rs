//! Integration tests on the host backend: they run everywhere, CI included.

#[path = "../common/mod.rs"]
mod common;
mod spawn;
mod torch_snapshot;

use std::sync::Arc;

use streamalloc::*;

/// A fresh host device per test, so accounting and fault injection are the test's own.
fn host() -> Device {
    Device::host_with(HostConfig::default())
}

resource_suite!(cuda_resource, host(), |d| Arc::new(
    CudaResource::new(d).unwrap()
));
resource_suite!(cuda_async_resource, host(), |d| Arc::new(
    CudaAsyncResource::new(d).unwrap()
));
resource_suite!(cuda_async_view_resource, host(), |d| {
    Arc::new(CudaAsyncViewResource::of(
        &CudaAsyncResource::new(d).unwrap(),
    ))
});
resource_suite!(cuda_async_view_of_default_pool, host(), |d| {
    Arc::new(CudaAsyncViewResource::device_default(d).unwrap())
});
resource_suite!(managed_resource, host(), |d| Arc::new(
    ManagedResource::new(d).unwrap()
));
resource_suite!(cuda_async_managed_resource, host(), |d| Arc::new(
    CudaAsyncManagedResource::new(d).unwrap()
));
resource_suite!(pinned_host_resource, host(), |d| Arc::new(
    PinnedHostResource::new(d).unwrap()
));
resource_suite!(host_resource, host(), |d| Arc::new(
    HostResource::new(d).unwrap()
));
resource_suite!(current_device_resource, host(), |d| {
    current_device_resource_for(d)
});

buffer_suite!(buffers, host());
host_data_suite!(host_data, host());
container_suite!(containers, host());
multi_device_suite!(multi_device, Some((host(), host())));
sync_suite!(synchronization, host());
completion_suite!(completion_driver, host());
fault_suite!(faults, host());
fault_suite!(
    faults_with_host_function_completion,
    Device::host_with(HostConfig::default().completion_strategy(CompletionStrategy::HostFunction))
);
fault_suite!(
    faults_with_flag_completion,
    Device::host_with(HostConfig::default().completion_strategy(CompletionStrategy::FlagWrite))
);
huge_sizes_suite!(huge_sizes, host());

/// With no capacity to refuse them first, huge requests reach the host backend's own size
/// math (its headroom for alignment, the global allocator's layout limits).
#[test]
fn huge_requests_on_a_host_device_of_unbounded_capacity() {
    common::huge_sizes::huge_requests_fail_cleanly(
        Device::host_with(HostConfig::default().capacity(usize::MAX)),
        |d| Arc::new(CudaResource::new(d).unwrap()),
    );
}

resource_suite!(pool_over_cuda_resource, host(), |d| {
    Arc::new(PoolResource::new(CudaResource::new(d).unwrap(), 1 << 20, None).unwrap())
});
resource_suite!(bounded_pool_over_host_resource, host(), |d| {
    Arc::new(PoolResource::new(HostResource::new(d).unwrap(), 0, Some(8 << 30)).unwrap())
});
resource_suite!(limiting_adaptor, host(), |d| {
    Arc::new(LimitingAdaptor::new(CudaResource::new(d).unwrap(), 8 << 30))
});
resource_suite!(mapped_pool_resource, host(), |d| {
    Arc::new(MappedPoolResource::new(d).unwrap())
});
resource_suite!(mapped_pool_keeping_free_pages, host(), |d| {
    Arc::new(
        MappedPoolResource::with_config(d, MappedPoolConfig::default().release_threshold(64 << 20))
            .unwrap(),
    )
});
pool_suite!(pools, host());
snapshot_pool_suite!(pool_snapshots, host());
pressure_suites!(host());
resource_suite!(limiting_over_host_resource, host(), |d| {
    Arc::new(LimitingAdaptor::new(
        HostResource::new(d).unwrap(),
        usize::MAX,
    ))
});
resource_suite!(limiting_over_pinned_host_resource, host(), |d| {
    Arc::new(LimitingAdaptor::new(
        PinnedHostResource::new(d).unwrap(),
        usize::MAX,
    ))
});
resource_suite!(binning_over_host_resource, host(), |d| {
    Arc::new(BinningResource::with_range(HostResource::new(d).unwrap(), 12, 20).unwrap())
});
resource_suite!(binning_over_pool, host(), |d| {
    let pool = PoolResource::new(CudaResource::new(d).unwrap(), 0, None).unwrap();
    Arc::new(BinningResource::with_range(pool, 18, 22).unwrap())
});
resource_suite!(fixed_size_over_cuda_resource, host(), |d| {
    Arc::new(FixedSizeResource::with_defaults(CudaResource::new(d).unwrap()).unwrap())
});
resource_suite!(failure_callback_adaptor, host(), |d| {
    Arc::new(FailureCallbackAdaptor::new(
        CudaResource::new(d).unwrap(),
        |f| f.attempt < 2,
    ))
});
resource_suite!(aligned_adaptor, host(), |d| {
    Arc::new(AlignedAdaptor::new(CudaResource::new(d).unwrap(), 4096, 64 << 10).unwrap())
});
resource_suite!(prefetch_adaptor_over_managed, host(), |d| {
    Arc::new(PrefetchAdaptor::new(ManagedResource::new(d).unwrap()))
});
resource_suite!(prefetch_adaptor_over_device_memory, host(), |d| {
    Arc::new(PrefetchAdaptor::new(CudaResource::new(d).unwrap()))
});
resource_suite!(tracing_adaptor, host(), |d| {
    Arc::new(TracingAdaptor::new(CudaResource::new(d).unwrap()))
});
resource_suite!(statistics_adaptor, host(), |d| Arc::new(
    StatisticsAdaptor::new(CudaResource::new(d).unwrap())
));
resource_suite!(timeline_adaptor, host(), |d| Arc::new(
    TimelineAdaptor::new(CudaResource::new(d).unwrap())
));
resource_suite!(tracking_adaptor, host(), |d| Arc::new(
    TrackingAdaptor::new(CudaResource::new(d).unwrap())
));
resource_suite!(tracking_adaptor_with_backtraces, host(), |d| Arc::new(
    TrackingAdaptor::with_backtraces(CudaResource::new(d).unwrap())
));
resource_suite!(logging_adaptor, host(), |d| Arc::new(
    LoggingAdaptor::to_writer(CudaResource::new(d).unwrap(), std::io::sink()).unwrap()
));
resource_suite!(callback_resource, host(), |d| {
    let upstream = CudaResource::new(d).unwrap();
    let freeing = upstream.clone();
    // SAFETY: called only under `deallocate`'s contract; the pointer came from `upstream`, a
    // clone of `freeing`.
    let free = move |ptr, bytes, stream: &Stream| unsafe { freeing.deallocate(ptr, bytes, stream) };
    // SAFETY: every pointer is one `upstream` returned for the same request, with its properties:
    // `upstream` keeps the promise.
    Arc::new(unsafe {
        CallbackResource::new(
            upstream.properties(),
            move |bytes, stream| upstream.try_allocate(bytes, stream),
            free,
        )
    })
});

resource_suite!(arena_over_cuda_resource, host(), |d| {
    Arc::new(ArenaResource::new(CudaResource::new(d).unwrap(), None).unwrap())
});
arena_suite!(arenas, host());
snapshot_arena_suite!(snapshot_arena, host());

deferred_suite!(cuda_resource_errors, host(), |d| Arc::new(
    CudaResource::new(d).unwrap()
));
deferred_suite!(cuda_async_resource_errors, host(), |d| Arc::new(
    CudaAsyncResource::new(d).unwrap()
));
deferred_suite!(pinned_host_resource_errors, host(), |d| Arc::new(
    PinnedHostResource::new(d).unwrap()
));

teardown_suite!(teardown, host());
