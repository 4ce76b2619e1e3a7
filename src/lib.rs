//! Stream-ordered GPU memory management for async Rust.
//!
//! `streamalloc` does what NVIDIA's RAPIDS Memory Manager (RMM) does for C++ — one
//! memory-resource interface, a family of resources, RAII device buffers, per-device defaults —
//! and makes allocation a future: `mr.allocate(bytes, &stream).await` completes at once when
//! memory is there. Streams are async executors whose [`Event`]s are futures, and a
//! [`DeviceBuffer`] handed from one stream to another gets its event waits inserted for you.
//!
//! Everything runs on two backends: CUDA (feature `cuda`, the driver loaded at run time) and a
//! host emulation that needs no GPU, on which every example here runs.
//!
//! # A first example
//!
//! ```
//! use streamalloc::{CudaAsyncResource, Device, DeviceBuffer, Stream};
//!
//! # futures::executor::block_on(async {
//! let device = Device::default();            // CUDA device 0, or the host backend
//! let mr = CudaAsyncResource::new(&device)?;
//! let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
//!
//! let mut buf = DeviceBuffer::new(1024, &a, mr).await?;
//! buf.fill(7)?;                              // enqueued on `a`
//! buf.set_stream(&b)?;                       // `b` now waits for `a`'s work on `buf`
//! let host = buf.copy_to_host(vec![0u8; 1024]).await?;
//! assert!(host.iter().all(|&x| x == 7));
//! # Ok::<(), streamalloc::Error>(())
//! # }).unwrap();
//! ```
//!
//! # Concepts
//! - [`Device`]: a GPU or the host emulation; [`Device::default`] picks.
//! - [`Stream`], [`Event`], [`StreamPool`]: ordered device work; events resolve as futures
//!   through the device's completion driver ([`CompletionStrategy`]).
//! - [`MemoryResource`]: `try_allocate` (never waits), `allocate` (a future that waits for
//!   memory on resources with a wait queue, [`Availability`]), stream-ordered `deallocate`.
//!   Leaf resources: [`CudaResource`], [`CudaAsyncResource`], [`CudaAsyncViewResource`],
//!   [`ManagedResource`], [`PinnedHostResource`], [`HostResource`], [`CallbackResource`].
//! - Sub-allocators over any upstream: [`PoolResource`] (coalescing, stream shards for many
//!   threads, `trim`), [`ArenaResource`] (per-stream arenas over a global arena),
//!   [`FixedSizeResource`], [`BinningResource`].
//! - Adaptors, stacked over any resource: [`LimitingAdaptor`] (an awaitable byte budget),
//!   [`AlignedAdaptor`], [`FailureCallbackAdaptor`], [`PrefetchAdaptor`], [`TracingAdaptor`].
//! - [`DeviceBuffer`]: owning device memory that tracks which stream owns it and which streams
//!   read it, and orders its free after all of them.
//! - Per-device defaults: [`current_device_resource`], [`set_current_device_resource`]; a
//!   current resource for one task or call: [`with_resource`], [`with_resource_sync`].
//! - Observing a resource: [`StatisticsAdaptor`] (counters in scopes), [`TrackingAdaptor`]
//!   (outstanding allocations, leaks, bad frees), [`LoggingAdaptor`] (RMM's CSV log), and
//!   [`replay`] (RMM's logs and ours, parsed and replayed against any resource).
//!
//! # Feature flags
//! - Default: `cuda-13000`, `nvrtc`, `cublas` — the CUDA backend over cudarc bound to CUDA 13.0
//!   (driver 580+), kernels compiled from CUDA C (nvrtc) and cuBLAS, all loaded at run time.
//! - `cuda-12080`, `cuda-12060`, `cuda-12040`: the same backend bound to older headers, for
//!   older drivers (570+, 560+, 550+), with `default-features = false`. Exactly one CUDA
//!   version may be on in a build, cudarc's own `cuda-*` features included: use the cudarc
//!   re-exported here (`streamalloc::cudarc`) rather than a cudarc dependency of your own.
//! - `cuda`: the default plus this crate's GPU test suites (`gpu-tests`), which a plain
//!   `cargo test` does not build: `cargo test --features cuda -- --include-ignored`.
//!
//! Without a driver or device at run time, [`Device::cuda`] returns an error and
//! [`Device::default`] falls back to the host backend; nothing panics.

#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![warn(
    missing_debug_implementations,
    unreachable_pub,
    clippy::undocumented_unsafe_blocks
)]

// The floors, bottom to top; each module imports only those below it (no circle):
// `ids`, `sync` → `error` → `backend` (host/, cuda/) → `device` (config, completion driver) →
// `stream` → `resource` → `adaptor`, `buffer` → `replay`, `report`. The flat re-exports below are the
// public API; the module paths are not.
mod adaptor;
mod backend;
mod buffer;
mod device;
mod error;
mod ids;
pub mod replay;
pub mod report;
mod resource;
mod rmm_csv;
mod stream;
mod sync;
#[cfg(test)]
mod test_support;

pub use adaptor::TimelineAdaptor;
pub use adaptor::{
    AlignedAdaptor, Allocation, AllocationFailure, Counter, Counters, FailureCallbackAdaptor,
    LeakReport, LimitingAdaptor, LoggingAdaptor, LoggingAdaptorBuilder, PrefetchAdaptor,
    StatisticsAdaptor, TracingAdaptor, TrackingAdaptor, TrackingIssue, MAX_TRACKING_ISSUES,
};
pub use backend::host::{FaultPoint, HostControls};
pub use backend::{MemoryInfo, PrefetchTarget};
#[cfg(feature = "cuda-driver")]
pub use buffer::KernelRead;
pub use buffer::{
    BufferView, CopyFromHost, CopyFromSlice, CopyToHost, CopyToSlice, DeviceBuffer, DeviceScalar,
    DeviceVec, HostBuffer, NewBuffer, NewVec, PinnedHostVec, ReadGuard, VecView, VecViewMut,
};
pub use buffer::{HostKernelArgs, HostKernelViews, HostRead, HostWrite, ReadShape, WriteShape};
pub use device::{
    CompletionStrategy, Device, HostConfig, DEFAULT_HOST_CAPACITY, DEFERRED_ERRORS_KEPT,
};
pub use error::{Error, OutOfMemoryDetails, Result};
pub use ids::{BackendKind, DeviceId, StreamId};
pub use resource::defaults::registry::{
    available_device_memory, current_device_resource, current_device_resource_for,
    percent_of_free_device_memory, reset_current_device_resource_for, set_current_device_resource,
    set_current_device_resource_for,
};
pub use resource::defaults::scoped::{with_resource, with_resource_sync, WithResource};
/// The allocator cores for the fuzz targets in `fuzz/`: not part of the API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use resource::fuzzing;
pub use resource::CudaAsyncManagedResource;
pub use resource::ReleasePolicy;
pub use resource::{memory_stats, MemoryStats, WaitQueueStats};
pub use resource::{
    Allocate, ArenaConfig, ArenaDump, ArenaResource, ArenaStatistics, Availability,
    BinningResource, CallbackResource, CudaAsyncResource, CudaAsyncResourceBuilder,
    CudaAsyncViewResource, CudaResource, DevicePtr, ExportHandleType, FixedSizeResource,
    HostResource, ManagedResource, MemoryResource, PinnedHostResource, PoolResource,
    PoolStatistics, Properties, ResourceIdentity, SharedResource, ALLOCATION_ALIGNMENT,
};
pub use resource::{
    Block, BlockState, Fragmentation, FreeExtentBucket, MemorySnapshot, Segment, SeriesPoint,
    Timeline, TraceAction, TraceEvent, TIMELINE_STREAMS,
};
pub use resource::{MappedPoolConfig, MappedPoolResource, MappedPoolStatistics};
pub use stream::{Event, Stream, StreamPool};

/// The cudarc this crate is built with: its driver API, and nvrtc and cuBLAS under the features
/// of the same names. Use it rather than a cudarc dependency of your own, so that both are the
/// same crate (the `CudaContext` and `CudaStream` this crate's interop hands out are its types)
/// and a second CUDA version cannot slip in: cudarc fails to build, with hundreds of errors,
/// when its `cuda-12080` feature and this crate's default `cuda-13000` meet.
/// If you depend on cudarc directly as well, give it no `cuda-*` feature: the version comes
/// from this crate's features (for another one, `default-features = false` and `cuda-12080`,
/// say, on this crate).
///
/// ```
/// use streamalloc::cudarc::driver::sys::CUresult;
/// assert_ne!(CUresult::CUDA_SUCCESS, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
/// ```
#[cfg(feature = "cuda-driver")]
pub use cudarc;

/// The user guide's examples run as doctests, so the book cannot drift from the code.
#[cfg(doctest)]
mod book {
    macro_rules! pages {
        ($($name:ident => $file:literal),* $(,)?) => {$(
            #[doc = include_str!(concat!("../book/src/", $file))]
            struct $name;
        )*};
    }
    pages! {
        Introduction => "introduction.md",
        GettingStarted => "getting-started.md",
        ComingFrom => "coming-from.md",
        Resources => "resources.md",
        Awaiting => "awaiting.md",
        Buffers => "buffers.md",
        Computing => "computing.md",
        Pool => "pool.md",
        MappedPool => "mapped-pool.md",
        Arena => "arena.md",
        Binning => "binning.md",
        MoreAdaptors => "more-adaptors.md",
        Adaptors => "adaptors.md",
        SeeingMemory => "seeing-memory.md",
        Backends => "backends.md",
        Completion => "completion.md",
        Performance => "performance.md",
        Faults => "faults.md",
    }

    /// The README's examples, exactly as a user copies them.
    #[doc = include_str!("../README.md")]
    struct Readme;
}
