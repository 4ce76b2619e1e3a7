//! Errors met where they cannot be returned reach the user through the device's deferred errors
//! ([`Device::take_deferred_error`]), are counted, and name what went wrong.
//!
//! `deferred_suite!` instantiates it for one leaf resource constructor on one device kind.

use std::time::Duration;

use streamalloc::{Device, Stream};

use super::suite::Make;

/// Takes every deferred error left by earlier tests on a shared device.
fn drain(device: &Device) {
    while device.take_deferred_error().is_some() {}
}

/// A double free whose two frees are both enqueued while the stream is still busy (the usual
/// case on a GPU) is one deferred error that names the pointer.
pub fn double_free_while_the_stream_is_busy(device: Device, make: Make) {
    let s = Stream::new(&device).unwrap();
    let mr = make(&device);
    let p = mr.try_allocate(4096, &s).unwrap();
    drain(&device);
    let before = device.deferred_error_count();
    s.enqueue_delay(Duration::from_millis(50)).unwrap();
    // SAFETY: allocated above with this size; the queued delay does not touch it.
    unsafe { mr.deallocate(p, 4096, &s) };
    // SAFETY: deliberately a double free: both backends check frees and refuse this one
    // without touching memory (the host backend against its live map, CUDA's driver by its
    // own bookkeeping).
    unsafe { mr.deallocate(p, 4096, &s) };
    s.synchronize_blocking().unwrap();
    let error = device
        .take_deferred_error()
        .expect("the double free was not reported");
    let named = format!("{:#x}", p.addr());
    assert!(
        error.to_string().contains(&named),
        "`{error}` does not name {named}"
    );
    assert_eq!(device.deferred_error_count() - before, 1, "counted once");
    assert!(device.take_deferred_error().is_none());
}

/// Instantiates the deferred-error suite for one leaf resource constructor.
///
/// `deferred_suite!(name, device_expr, |device| make_expr, #[attrs]...)` as `resource_suite!`.
#[macro_export]
macro_rules! deferred_suite {
    ($name:ident, $device:expr, |$d:ident| $make:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::deferred_suite as suite;

            fn make($d: &::streamalloc::Device) -> ::streamalloc::SharedResource {
                $make
            }

            $(#[$attr])* #[test] fn double_free_while_the_stream_is_busy() {
                suite::double_free_while_the_stream_is_busy($device, make)
            }
        }
    };
}
