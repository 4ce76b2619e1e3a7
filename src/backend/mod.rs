//! The seam to a driver: raw memory, streams, events and host notifications.
//!
//! In wgpu-hal's shape: [`Backend`] is a trait of associated types (its stream, event and driver
//! pool), so inside a backend every call is static and a stream of another backend cannot even
//! be named. Two implementations: [`host`] (always built; device memory is 256-byte-aligned
//! host memory and each stream is an ordered queue run by a worker thread) and `cuda` (feature
//! `cuda`; cudarc's driver API, loaded at run time). The layers above hold the erased enums
//! [`AnyBackend`], [`AnyStream`], [`AnyEvent`] and [`AnyMemPool`] (`any.rs`), the only place
//! that dispatches, and the one place that refuses a stream, event or pool of another backend.
//! Everything above this module is safe Rust; the `unsafe` that touches raw addresses lives
//! here.
//!
//! The two folders split file for file: `mod.rs` (the backend), `memory.rs` (raw allocations of
//! each [`MemoryKind`]), `stream.rs`, `event.rs`, `mempool.rs` (driver pools, `CUmemoryPool`);
//! host adds `queue.rs` (the queue a worker runs), CUDA `context.rs` (driver loading, the
//! primary context), `handles.rs` (raw handle newtypes) and `spin.rs` (the delay kernel). [`pageable`] is the pageable host memory both use. The backend imports only
//! [`crate::ids`] and [`crate::error`]: it knows nothing of devices, streams or resources.
//! The traits and the plain types they share are in `seam.rs`; this file only declares and
//! re-exports.

mod any;
pub(crate) mod cpu_clock;
#[cfg(feature = "cuda-driver")]
pub(crate) mod cuda;
mod flags;
pub(crate) mod host;
pub(crate) mod pageable;
pub(crate) mod seam;

pub(crate) use any::{AnyBackend, AnyEvent, AnyMemPool, AnyStream};
pub(crate) use flags::DeviceFlag;
pub(crate) use seam::{
    panic_message, Completion, DefaultStream, MemPoolConfig, MemoryKind, SINK_KEPT,
};
pub use seam::{MemoryInfo, PrefetchTarget};
