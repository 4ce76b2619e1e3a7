//! Typed host copies of a range of elements: the host side is checked in elements (so a
//! length mismatch is reported in the unit the caller counts in), then the byte copies of
//! [`CopyToHost`] / [`CopyFromHost`] (and their borrowed-slice forms) do the work.

use std::mem::size_of;

use bytemuck::Pod;

use crate::buffer::{CopyFromHost, CopyFromSlice, CopyToHost, CopyToSlice, HostBuffer};
use crate::error::Error;
use crate::resource::DevicePtr;
use crate::stream::Stream;

fn mismatch(call: &'static str, device_len: usize, host_len: usize) -> Error {
    Error::LengthMismatch {
        call,
        device_len,
        host_len,
        unit: "elements",
    }
}

/// Enqueues a copy of the `len` elements at `src` into the start of `host` on `stream`.
///
/// # Safety
/// As [`CopyToHost::start`]: `src..src + len * size_of::<T>()` is device memory that is freed,
/// and written by other streams, only after work on `stream` enqueued now has completed.
pub(crate) unsafe fn to_host<T: Pod, B: HostBuffer<Elem = T>>(
    stream: &Stream,
    src: DevicePtr,
    len: usize,
    host: B,
) -> CopyToHost<B> {
    let host_len = host.elem_len();
    if host_len < len {
        return CopyToHost::failed(mismatch("copy_to_host", len, host_len));
    }
    // SAFETY: forwarded from the caller; `len * size_of::<T>()` fits in `host` (just above).
    unsafe { CopyToHost::start(stream, src, len * size_of::<T>(), host) }
}

/// Enqueues a copy of all of `host` into the start of the `len` elements at `dst` on `stream`.
///
/// # Safety
/// As [`CopyFromHost::start`]: `dst..dst + len * size_of::<T>()` is device memory that is
/// freed, read or written by other streams only after work on `stream` enqueued now has
/// completed.
pub(crate) unsafe fn from_host<T: Pod, B: HostBuffer<Elem = T>>(
    stream: &Stream,
    dst: DevicePtr,
    len: usize,
    host: B,
) -> CopyFromHost<B> {
    let host_len = host.elem_len();
    if host_len > len {
        return CopyFromHost::failed(mismatch("copy_from_host", len, host_len));
    }
    // SAFETY: forwarded from the caller.
    unsafe { CopyFromHost::start(stream, dst, len * size_of::<T>(), host) }
}

/// Enqueues a staged copy of the `len` elements at `src` into the start of `host`.
///
/// # Safety
/// As [`to_host`].
pub(crate) unsafe fn to_slice<'a, T: Pod>(
    stream: &Stream,
    src: DevicePtr,
    len: usize,
    host: &'a mut [T],
) -> CopyToSlice<'a> {
    if host.len() < len {
        return CopyToSlice::failed(mismatch("copy_to_host_slice", len, host.len()));
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        CopyToSlice::start(
            "copy_to_host_slice",
            stream,
            src,
            len * size_of::<T>(),
            host,
        )
    }
}

/// Enqueues a staged copy of all of `host` into the start of the `len` elements at `dst`.
///
/// # Safety
/// As [`from_host`].
pub(crate) unsafe fn from_slice<T: Pod>(
    stream: &Stream,
    dst: DevicePtr,
    len: usize,
    host: &[T],
) -> CopyFromSlice {
    if host.len() > len {
        return CopyFromSlice::failed(mismatch("copy_from_host_slice", len, host.len()));
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        CopyFromSlice::start(
            "copy_from_host_slice",
            stream,
            dst,
            len * size_of::<T>(),
            host,
        )
    }
}
