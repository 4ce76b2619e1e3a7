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
