//! Device-wide synchronization and stream-waits-for-stream, ordered by work the device runs
//! (a delay, then a host function), so that the tests are deterministic on both backends.
//!
//! `sync_suite!` instantiates it for one device kind.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use streamalloc::{Device, Stream};

/// Enqueues a long operation, then a host function that raises the returned flag.
fn busy_then_flag(s: &Stream) -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    s.enqueue_delay(Duration::from_millis(100)).unwrap();
    let raised = flag.clone();
    s.launch_host_fn(move || raised.store(true, Ordering::SeqCst))
        .unwrap();
    flag
}

/// Work enqueued on `a` after `a.wait_stream(&b)` runs after everything `b` had enqueued.
pub fn wait_stream_orders_after_the_other_streams_work(device: Device) {
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let done_on_b = busy_then_flag(&b);
    a.wait_stream(&b).unwrap();
    let seen = Arc::new(AtomicBool::new(false));
    let (seen_on_a, done) = (seen.clone(), done_on_b.clone());
    a.launch_host_fn(move || seen_on_a.store(done.load(Ordering::SeqCst), Ordering::SeqCst))
        .unwrap();
    a.synchronize_blocking().unwrap();
    assert!(
        seen.load(Ordering::SeqCst),
        "a ran before b's work was done"
    );
    // Waiting for itself is allowed and changes nothing.
    a.wait_stream(&a).unwrap();
    a.synchronize_blocking().unwrap();
}

/// `Device::synchronize().await` resumes after the work of every stream of the device, the
/// legacy default stream included.
pub fn device_synchronize_waits_for_every_stream(device: Device) {
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let legacy = Stream::legacy_default(&device).unwrap();
    let flags = [
        busy_then_flag(&a),
        busy_then_flag(&b),
        busy_then_flag(&legacy),
    ];
    let synchronized = device.synchronize();
    // Send, so that a task awaiting it can be spawned on a multi-thread runtime.
    fn send<T: Send>(_: &T) {}
    send(&synchronized);
    futures::executor::block_on(synchronized).unwrap();
    for (i, f) in flags.iter().enumerate() {
        assert!(f.load(Ordering::SeqCst), "stream {i} was still busy");
    }
}

/// The blocking form does the same for non-async callers.
pub fn device_synchronize_blocking_waits_for_every_stream(device: Device) {
    let streams: Vec<_> = (0..3).map(|_| Stream::new(&device).unwrap()).collect();
    let flags: Vec<_> = streams.iter().map(busy_then_flag).collect();
    device.synchronize_blocking().unwrap();
    for (i, f) in flags.iter().enumerate() {
        assert!(f.load(Ordering::SeqCst), "stream {i} was still busy");
    }
    // With nothing enqueued, and with every stream dropped, it returns at once.
    drop(streams);
    device.synchronize_blocking().unwrap();
    futures::executor::block_on(device.synchronize()).unwrap();
}

/// Instantiates the synchronization suite for one device kind.
///
/// `sync_suite!(name, device_expr, #[attrs]...)`.
#[macro_export]
macro_rules! sync_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::sync_suite as suite;

            $(#[$attr])* #[test] fn wait_stream_orders_after_the_other_streams_work() { suite::wait_stream_orders_after_the_other_streams_work($device) }
            $(#[$attr])* #[test] fn device_synchronize_waits_for_every_stream() { suite::device_synchronize_waits_for_every_stream($device) }
            $(#[$attr])* #[test] fn device_synchronize_blocking_waits_for_every_stream() { suite::device_synchronize_blocking_waits_for_every_stream($device) }
        }
    };
}
