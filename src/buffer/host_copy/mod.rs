//! Host↔device copies that own their host buffer until the device is done with it
//! ([`owned`]), and copies of borrowed host slices staged through owned memory ([`slice`]).
//! This file only declares and re-exports.

mod owned;
mod slice;

pub(in crate::buffer) use owned::sealed;
pub use owned::{CopyFromHost, CopyToHost, HostBuffer};
pub(crate) use owned::{EnqueuedCopy, Unit};
pub use slice::{CopyFromSlice, CopyToSlice};

#[cfg(test)]
mod tests;
