//! Typed host copies over the byte-based [`HostBuffer`](crate::HostBuffer): the one place to
//! change when host buffers carry their element type.
//!
//! Until then the host data is staged through an owned byte vector, which the byte-based copy
//! futures own while the device uses it (so forgetting a future frees nothing under the
//! device), and copied into or out of the caller's `Vec<T>` on the host.

use std::future::Future;

use bytemuck::Pod;

use crate::buffer::{CopyFromHost, CopyToHost};
use crate::error::Result;
use crate::resource::DevicePtr;
use crate::stream::Stream;

/// Enqueues a copy of `bytes` from `src` into the start of `host` on `stream`; the future
/// hands `host` back once the copy has completed.
///
/// # Safety
/// As [`CopyToHost::start`]: `src..src + bytes` is device memory that is freed, and written by
/// other streams, only after work on `stream` enqueued now has completed.
pub(crate) unsafe fn to_host<T: Pod>(
    stream: &Stream,
    src: DevicePtr,
    bytes: usize,
    mut host: Vec<T>,
) -> impl Future<Output = Result<Vec<T>>> + 'static {
    let staging = vec![0u8; std::mem::size_of_val(host.as_slice())];
    // SAFETY: the caller's contract is `start`'s.
    let copy = unsafe { CopyToHost::start(stream, src, bytes, staging) };
    async move {
        let staging = copy.await?;
        bytemuck::cast_slice_mut::<T, u8>(&mut host)[..bytes].copy_from_slice(&staging[..bytes]);
        Ok(host)
    }
}

/// Enqueues a copy of all of `host` to the start of `dst` (`capacity` bytes) on `stream`; the
/// future hands `host` back once the copy has completed.
///
/// # Safety
/// As [`CopyFromHost::start`]: `dst..dst + capacity` is device memory that is freed, read or
/// written by other streams only after work on `stream` enqueued now has completed.
pub(crate) unsafe fn from_host<T: Pod>(
    stream: &Stream,
    dst: DevicePtr,
    capacity: usize,
    host: Vec<T>,
) -> impl Future<Output = Result<Vec<T>>> + 'static {
    let staging: Vec<u8> = bytemuck::cast_slice(&host).to_vec();
    // SAFETY: the caller's contract is `start`'s.
    let copy = unsafe { CopyFromHost::start(stream, dst, capacity, staging) };
    async move {
        copy.await?;
        Ok(host)
    }
}
