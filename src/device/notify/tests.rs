//! The poller's back-off and wake-ups, on the host backend.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Context;
use std::time::{Duration, Instant};

use futures::task::noop_waker_ref;

use super::{Backoff, PollerCounters};
use crate::backend::Completion;
use crate::test_support::gate;
use crate::{CompletionStrategy, Device, HostConfig, Stream};

/// Far longer than any test waits: a park of this length that ends early was cut short.
const HOUR: Duration = Duration::from_secs(3600);
/// How long a test waits for what should happen at once before failing instead of hanging (a
/// bound against hangs, not a timing assertion).
const HANG_GUARD: Duration = Duration::from_secs(20);

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < HANG_GUARD,
            "{what}: not within {HANG_GUARD:?}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A host device whose poller, once an event is pending, parks for an hour at a time.
fn poller_parking_for_an_hour() -> Device {
    let device =
        Device::host_with(HostConfig::default().completion_strategy(CompletionStrategy::Poller));
    device.inner.driver.set_backoff(Backoff {
        spin: Duration::ZERO,
        yield_until: Duration::ZERO,
        first_park: HOUR,
        max_park: HOUR,
    });
    device
}

fn counters(device: &Device) -> &PollerCounters {
    device.inner.driver.poller_counters().expect("armed")
}

/// Arms the completion driver for an event of a stream held behind a gate.
fn arm_behind_gate(stream: &Stream) -> (std::sync::mpsc::Sender<()>, crate::Event) {
    let open = gate(stream);
    let event = stream.record().unwrap();
    let mut cx = Context::from_waker(noop_waker_ref());
    assert!(Pin::new(&mut event.clone()).poll(&mut cx).is_pending());
    (open, event)
}

/// An event armed while the poller is in a long park (another stream's event pending) is
/// completed at once: the arm ends the park, as the counter shows, instead of waiting for its
/// timeout.
#[test]
fn an_arm_ends_a_long_park() {
    let device = poller_parking_for_an_hour();
    let [a, b] = crate::test_support::streams(&device);
    let (open_a, long) = arm_behind_gate(&a);
    wait_until("the poller's hour-long park", || {
        counters(&device).parked_for_nanos.load(Ordering::Acquire) == HOUR.as_nanos() as u64
    });
    assert_eq!(
        counters(&device).cut_short_by_arm.load(Ordering::Relaxed),
        0
    );

    // An event the device has passed already, armed directly (an `Event` would find it
    // complete at its first poll and never arm).
    let short = b.record().unwrap();
    short.synchronize_blocking().unwrap();
    let completion = Arc::new(Completion::default());
    device
        .completion_driver()
        .arm(
            device.raw(),
            b.id(),
            b.shadow(),
            short.raw(),
            0,
            &completion,
        )
        .unwrap();
    wait_until("the short event's completion", || completion.is_done());
    assert_eq!(
        counters(&device).cut_short_by_arm.load(Ordering::Relaxed),
        1
    );
    assert!(!long.is_complete().unwrap());
    drop(open_a);
    a.synchronize_blocking().unwrap();
}

/// Under the flag strategy the poller learns of a completion from the flag the shadow stream
/// writes: with a back-off that never reaches the event queries (an hour of spinning), the
/// task awaiting the event is still woken once its stream passes it.
#[test]
fn a_flag_completes_an_event_without_a_query() {
    struct Woken(std::sync::atomic::AtomicBool);
    impl std::task::Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::Release);
        }
    }
    let device =
        Device::host_with(HostConfig::default().completion_strategy(CompletionStrategy::FlagWrite));
    device.inner.driver.set_backoff(Backoff {
        spin: HOUR,
        yield_until: HOUR,
        first_park: HOUR,
        max_park: HOUR,
    });
    let [a] = crate::test_support::streams(&device);
    let open = gate(&a);
    let event = a.record().unwrap();
    let woken = Arc::new(Woken(std::sync::atomic::AtomicBool::new(false)));
    let waker = std::task::Waker::from(woken.clone());
    assert!(Pin::new(&mut event.clone())
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        !woken.0.load(Ordering::Acquire),
        "the gate holds the stream"
    );
    drop(open);
    wait_until("the wake-up from the flag", || {
        woken.0.load(Ordering::Acquire)
    });
    assert_eq!(counters(&device).flagged.load(Ordering::Relaxed), 1);
}
