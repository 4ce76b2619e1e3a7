//! [`DeviceVec<T>`]: a typed, uninitialised device array over a [`DeviceBuffer`] (RMM's
//! `device_uvector`).
//!
//! The vector is a thin typed layer: it converts element counts to bytes (checked), and
//! everything else — allocation, hand-off, read tracking, stream-ordered drop — is the
//! buffer's, so there is one copy of that code.
//!
//! [`DeviceBuffer`]: crate::DeviceBuffer

mod device_vec;
mod new_vec;
mod view;

pub use device_vec::DeviceVec;
pub use new_vec::NewVec;
pub use view::{VecView, VecViewMut};

#[cfg(test)]
mod tests;
