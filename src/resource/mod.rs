//! The memory-resource contract and the resources that implement it: leaves over the driver,
//! sub-allocators over an upstream, and the per-device default resource.

pub(crate) mod contract;
pub(crate) mod defaults;
pub(crate) mod device_ptr;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod inspect;
pub(crate) mod leaf;
pub(crate) mod suballoc;

pub use contract::availability::Availability;
pub(crate) use contract::memory_resource::{check_resource, held, try_without_waiting};
pub use contract::memory_resource::{Allocate, MemoryResource};
pub use contract::properties::{Properties, ResourceIdentity};
pub(crate) use contract::shared::into_shared;
pub use contract::shared::SharedResource;
pub(crate) use contract::size::align_up;
pub use contract::size::ALLOCATION_ALIGNMENT;
pub(crate) use contract::stats::Allocated;
pub use contract::stats::{MemoryStats, WaitQueueStats};
pub use defaults::registry::{
    available_device_memory, current_device_resource, current_device_resource_for, memory_stats,
    percent_of_free_device_memory, reset_current_device_resource_for, set_current_device_resource,
    set_current_device_resource_for,
};
pub use defaults::scoped::{with_resource, with_resource_sync, WithResource};
pub use device_ptr::DevicePtr;
pub(crate) use inspect::{
    Block, BlockState, Fragmentation, MemorySnapshot, Segment, SeriesPoint, Timeline, TraceAction,
    TraceEvent,
};
pub use leaf::callback::CallbackResource;
pub use leaf::cuda::CudaResource;
pub use leaf::cuda_async::{CudaAsyncResource, CudaAsyncResourceBuilder, ExportHandleType};
pub use leaf::cuda_async_managed::CudaAsyncManagedResource;
pub use leaf::cuda_async_view::CudaAsyncViewResource;
pub use leaf::host::HostResource;
pub use leaf::managed::ManagedResource;
pub use leaf::pinned_host::PinnedHostResource;
pub use suballoc::arena::{ArenaConfig, ArenaDump, ArenaResource, ArenaStatistics};
pub use suballoc::binning::BinningResource;
pub use suballoc::fixed_size::FixedSizeResource;
pub use suballoc::mapped_pool::{MappedPoolConfig, MappedPoolResource, MappedPoolStatistics};
pub use suballoc::pool::{PoolResource, PoolStatistics, ReleasePolicy};
