//! Containers of device memory with stream-ordered drop and cross-stream use tracking:
//! [`DeviceBuffer`] (bytes, RMM's `device_buffer`), [`DeviceVec`] (typed, RMM's
//! `device_uvector`), [`DeviceScalar`], [`PinnedHostVec`], their views, the futures of their
//! host copies, and host kernels.
//!
//! A container knows which stream owns it and which other streams read it, and inserts the
//! event waits that a hand-off, a write after a read and the free need.
//!
//! In the source, the buffer and its accessors are in `device_buffer.rs`; its other operations
//! are grouped beside it: making one (`new_buffer.rs`), handing it between streams
//! (`handoff.rs`), working on its bytes (`copy.rs`) and changing its size (`resize.rs`). Every
//! container and view is a thin face of one (buffer, byte range) core (`byte_range.rs`); the
//! use tracking is `uses.rs`. This file only declares and re-exports.

mod byte_range;
mod copy;
#[cfg(feature = "cuda-driver")]
mod cudarc;
mod device_buffer;
mod guard;
mod handoff;
mod host_copy;
mod host_kernel;
#[cfg(feature = "cuda-driver")]
mod kernel_read;
mod new_buffer;
mod peer;
mod pinned;
mod resize;
mod scalar;
mod uses;
mod vec;
mod view;

pub use device_buffer::DeviceBuffer;
pub use guard::ReadGuard;
pub use host_copy::{CopyFromHost, CopyFromSlice, CopyToHost, CopyToSlice, HostBuffer};
pub use host_kernel::{
    HostKernelArgs, HostKernelViews, HostRead, HostWrite, ReadShape, WriteShape,
};
#[cfg(feature = "cuda-driver")]
pub use kernel_read::KernelRead;
pub use new_buffer::NewBuffer;
pub use pinned::PinnedHostVec;
pub use scalar::DeviceScalar;
pub use vec::{DeviceVec, NewVec, VecView, VecViewMut};
pub use view::BufferView;

#[cfg(all(test, feature = "gpu-tests"))]
mod gpu_tests;
#[cfg(test)]
mod tests;
