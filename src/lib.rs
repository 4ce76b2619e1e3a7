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
//! # Where things are
//! The crate root holds what a first program needs: [`Device`], [`Stream`] and [`Event`];
//! [`MemoryResource`] with [`CudaAsyncResource`], [`CudaResource`] and [`PoolResource`];
//! [`DeviceBuffer`] and [`DeviceVec`]; the per-device default resource; [`Error`] and
//! [`Result`]. The rest lives in a module named for its concept:
//!
//! | module | what it holds |
//! |---|---|
//! | [`device`] | [`Device`] and its settings ([`device::HostConfig`], [`device::CompletionStrategy`]), the host backend's controls and fault injection |
//! | [`stream`] | [`Stream`], [`Event`] (a future) and [`stream::StreamPool`] |
//! | [`resource`] | the [`MemoryResource`] contract and every resource: leaves over the driver ([`CudaAsyncResource`], [`resource::ManagedResource`], …), sub-allocators over an upstream ([`PoolResource`], [`resource::ArenaResource`], [`resource::BinningResource`], …), per-device defaults and scoped overrides |
//! | [`adaptor`] | resources stacked over another: limits, statistics, tracking, logging (RMM's CSV), tracing, failure callbacks, alignment, prefetch, timelines |
//! | [`buffer`] | [`DeviceBuffer`], [`DeviceVec`], [`buffer::DeviceScalar`], [`buffer::PinnedHostVec`], views, copy futures and host kernels |
//! | [`snapshot`] | seeing memory: [`snapshot::MemorySnapshot`], [`snapshot::Fragmentation`], [`snapshot::Timeline`] |
//! | [`replay`], [`report`] | RMM's allocation logs replayed on any resource; HTML and PyTorch exports |
//!
//! Every name that lived at the root before keeps working there (hidden from these docs), so
//! code written against earlier versions compiles unchanged.
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
// `stream` → `resource` → `rmm_csv` → `adaptor`, `buffer` → `replay`, `report`.
pub mod adaptor;
mod backend;
pub mod buffer;
mod builder;
pub mod device;
mod error;
mod ids;
pub mod replay;
pub mod report;
pub mod resource;
mod rmm_csv;
pub mod stream;
mod sync;
#[cfg(test)]
mod test_support;

/// Seeing memory: a resource's segments and blocks ([`MemorySnapshot`]), what is free for which
/// stream ([`Fragmentation`]), and the history of its allocations ([`Timeline`], which the
/// [`TimelineAdaptor`] records).
pub mod snapshot {
    #[doc(inline)]
    pub use crate::resource::inspect::{
        Block, BlockState, Fragmentation, FreeExtentBucket, MemorySnapshot, Segment, SeriesPoint,
        Timeline, TraceAction, TraceEvent, TIMELINE_STREAMS,
    };
}

// What a first program needs.
pub use buffer::{DeviceBuffer, DeviceVec};
pub use device::Device;
pub use error::{Error, OutOfMemoryDetails, Result};
pub use resource::{
    current_device_resource, set_current_device_resource, CudaAsyncResource, CudaResource,
    DevicePtr, MemoryResource, PoolResource, SharedResource,
};
pub use stream::{Event, Stream};

// Every other name the root held before, kept for code written against it; the docs show each
// in its module.
#[doc(hidden)]
pub use adaptor::{
    AlignedAdaptor, Allocation, AllocationFailure, Counter, Counters, FailureCallbackAdaptor,
    LeakReport, LimitingAdaptor, LoggingAdaptor, LoggingAdaptorBuilder, PrefetchAdaptor,
    StatisticsAdaptor, TimelineAdaptor, TracingAdaptor, TrackingAdaptor, TrackingIssue,
    MAX_TRACKING_ISSUES,
};
#[cfg(feature = "cuda-driver")]
#[doc(hidden)]
pub use buffer::KernelRead;
#[doc(hidden)]
pub use buffer::{
    BufferView, CopyFromHost, CopyFromSlice, CopyToHost, CopyToSlice, DeviceScalar, HostBuffer,
    HostKernelArgs, HostKernelViews, HostRead, HostWrite, NewBuffer, NewVec, PinnedHostVec,
    ReadGuard, ReadShape, VecView, VecViewMut, WriteShape,
};
#[doc(hidden)]
pub use device::{
    CompletionStrategy, FaultPoint, HostConfig, HostControls, MemoryInfo, PrefetchTarget,
    DEFAULT_HOST_CAPACITY, DEFERRED_ERRORS_KEPT,
};
#[doc(hidden)]
pub use ids::{BackendKind, DeviceId, StreamId};
/// The allocator cores for the fuzz targets in `fuzz/`: not part of the API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use resource::fuzzing;
#[doc(hidden)]
pub use resource::{
    available_device_memory, current_device_resource_for, memory_stats,
    percent_of_free_device_memory, reset_current_device_resource_for,
    set_current_device_resource_for, with_resource, with_resource_sync, Allocate, ArenaConfig,
    ArenaDump, ArenaResource, ArenaStatistics, Availability, BinningResource, CallbackResource,
    CudaAsyncManagedResource, CudaAsyncResourceBuilder, CudaAsyncViewResource, ExportHandleType,
    FixedSizeResource, HostResource, ManagedResource, MappedPoolConfig, MappedPoolResource,
    MappedPoolStatistics, MemoryStats, PinnedHostResource, PoolStatistics, Properties,
    ReleasePolicy, ResourceIdentity, WaitQueueStats, WithResource, ALLOCATION_ALIGNMENT,
};
#[doc(hidden)]
pub use snapshot::{
    Block, BlockState, Fragmentation, FreeExtentBucket, MemorySnapshot, Segment, SeriesPoint,
    Timeline, TraceAction, TraceEvent, TIMELINE_STREAMS,
};
#[doc(hidden)]
pub use stream::StreamPool;

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
        Layout => "layout.md",
    }

    /// The README's examples, exactly as a user copies them.
    #[doc = include_str!("../README.md")]
    struct Readme;
}
