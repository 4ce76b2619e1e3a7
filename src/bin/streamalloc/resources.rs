//! The resources `streamalloc replay --resource` can build, each the way RMM's replay
//! benchmark (`benchmarks/replay/replay.cpp`) builds its namesake.

use std::sync::Arc;

use clap::ValueEnum;
use streamalloc::{
    ArenaResource, BinningResource, CudaAsyncResource, CudaResource, Device, FixedSizeResource,
    ManagedResource, MappedPoolResource, PoolResource, Result, SharedResource,
};

/// A resource to replay a log on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub(crate) enum ResourceKind {
    /// cuMemAlloc/cuMemFree for every request (RMM's `cuda`).
    Cuda,
    /// Managed memory, cuMemAllocManaged (RMM's `managed`).
    Managed,
    /// A coalescing pool over `cuda` that starts empty and grows without bound (RMM's `pool`:
    /// `pool_memory_resource{cuda, 0}`).
    Pool,
    /// An arena over `cuda` that starts empty and grows on demand (RMM's `arena` over the
    /// current device resource, which is `cuda`).
    Arena,
    /// Fixed-size bins of 256 KiB, 512 KiB, 1 MiB, 2 MiB and 4 MiB over `pool`, larger
    /// requests to the pool (RMM's `binning`: `add_bin(1 << i)` for i in 18..=22).
    Binning,
    /// The driver's stream-ordered pool, cuMemAllocAsync (RMM's `cuda_async`).
    CudaAsync,
    /// Blocks of 1 MiB over `cuda`, 128 at a time (RMM's `fixed_size` defaults); larger
    /// requests fail.
    FixedSize,
    /// A pool of virtual address space backed by mapped physical pages, grown and shrunk
    /// page by page (streamalloc's `MappedPoolResource`, default settings).
    MappedPool,
}

impl ResourceKind {
    /// The name `--resource` takes.
    pub(crate) fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }

    /// A fresh resource of this kind on `device`.
    pub(crate) fn build(self, device: &Device) -> Result<SharedResource> {
        Ok(match self {
            ResourceKind::Cuda => Arc::new(CudaResource::new(device)?),
            ResourceKind::Managed => Arc::new(ManagedResource::new(device)?),
            ResourceKind::Pool => Arc::new(pool(device)?),
            ResourceKind::Arena => Arc::new(ArenaResource::new(CudaResource::new(device)?, None)?),
            ResourceKind::Binning => Arc::new(BinningResource::with_range(pool(device)?, 18, 22)?),
            ResourceKind::CudaAsync => Arc::new(CudaAsyncResource::new(device)?),
            ResourceKind::FixedSize => Arc::new(FixedSizeResource::with_defaults(
                CudaResource::new(device)?,
            )?),
            ResourceKind::MappedPool => Arc::new(MappedPoolResource::new(device)?),
        })
    }
}

/// RMM's replay pool: over `cuda`, empty at first, unbounded; counting its peak of
/// allocated bytes for the table (one shared counter: nothing next to a replay's own work).
fn pool(device: &Device) -> Result<PoolResource<CudaResource>> {
    Ok(PoolResource::new(CudaResource::new(device)?, 0, None)?.with_peak_allocated())
}
