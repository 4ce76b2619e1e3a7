//! The completion driver, under each strategy: wake-ups in record order per stream, and a short
//! event on one stream seen while a long one is pending on another. Ordered by gates (a host
//! function that blocks its stream until the test opens it), so the tests are deterministic on
//! both backends.
//!
//! At most one gate is closed at a time: the CUDA driver runs the host functions of a context
//! on one thread, so while one gate blocks, no other host function runs (another stream's
//! gate, or a host-function-strategy notification). A long event is device work instead
//! ([`Stream::enqueue_delay`]) on CUDA, and a hold on the host backend, whose streams each run
//! their own host functions.
//!
//! `completion_suite!` instantiates it for one device kind.

use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use streamalloc::{BackendKind, CompletionStrategy, Device, Event, Stream};

use super::hold::hold;

/// How long a test waits for wake-ups that should come at once before it fails instead of
/// hanging (a bound against hangs, not a timing assertion).
const HANG_GUARD: Duration = Duration::from_secs(20);

/// Blocks `stream` until the returned sender is dropped.
fn gate(stream: &Stream) -> Sender<()> {
    let (open, wait) = channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = wait.recv();
        })
        .unwrap();
    open
}

/// A waker that appends its id to a shared log when woken.
struct LogWaker {
    id: usize,
    log: Arc<Mutex<Vec<usize>>>,
}

impl Wake for LogWaker {
    fn wake(self: Arc<Self>) {
        self.log.lock().unwrap().push(self.id);
    }
}

/// Polls `event` once with `waker`; the event must still be pending (the driver is armed).
fn arm(event: &mut Event, waker: &Waker) {
    let mut cx = Context::from_waker(waker);
    assert!(
        Pin::new(event).poll(&mut cx).is_pending(),
        "the event completed behind a closed gate"
    );
}

/// Waits until `done()` holds, failing after `HANG_GUARD`.
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

/// Events recorded 1, 2, 3 on one stream and awaited in the opposite order wake their tasks
/// 1, 2, 3 once the stream passes them: the order the stream reached them, not the order the
/// driver was asked.
pub fn wake_ups_follow_record_order(device: Device, strategy: CompletionStrategy) {
    device.set_completion_strategy(strategy);
    let stream = Stream::new(&device).unwrap();
    let open = gate(&stream);
    let mut events: Vec<Event> = (0..3).map(|_| stream.record().unwrap()).collect();
    let log = Arc::new(Mutex::new(Vec::new()));
    for (i, event) in events.iter_mut().enumerate().rev() {
        let waker = Waker::from(Arc::new(LogWaker {
            id: i + 1,
            log: log.clone(),
        }));
        arm(event, &waker);
    }
    drop(open);
    wait_until("three wake-ups", || log.lock().unwrap().len() == 3);
    assert_eq!(*log.lock().unwrap(), [1, 2, 3], "{strategy:?}");
    stream.synchronize_blocking().unwrap();
}

/// How long the long event's stream is busy: far longer than the short event's path (a gate
/// opened at once), so the long event is still pending when the short one wakes its task.
const LONG_WORK: Duration = Duration::from_secs(5);

/// Keeps `a` busy before the long event: device work for `LONG_WORK` on CUDA (see below). The
/// host backend runs each stream's host functions on the stream's own thread, so there a hold
/// stands in, opened once the short event has woken its task: a passing run does not wait out
/// `LONG_WORK`, and one where the short event waits for the long one still fails, after it.
fn long_work(a: &Stream) -> Option<Sender<()>> {
    if a.device().backend() == BackendKind::Host {
        Some(hold(a, LONG_WORK))
    } else {
        a.enqueue_delay(LONG_WORK).unwrap();
        None
    }
}

/// With an event pending behind long device work on stream A, an event of stream B wakes its
/// task as soon as B passes it, before A's: a completion driver that took no new arm while an
/// older event was pending (or blocked the other stream's notification behind it) would wake
/// them in the order 1, 2, after `LONG_WORK`.
///
/// On CUDA the long event is device work, not a gate: there a gate is a host function that
/// blocks the one thread running the context's host functions, and B's gate (and, under the
/// host-function strategy, B's notification) could never run behind it.
pub fn short_event_beside_a_long_one_wakes(device: Device, strategy: CompletionStrategy) {
    device.set_completion_strategy(strategy);
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let long_stage = long_work(&a);
    let mut long = a.record().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let waker = |id| {
        Waker::from(Arc::new(LogWaker {
            id,
            log: log.clone(),
        }))
    };
    arm(&mut long, &waker(1));
    // Lets a poller take the long event in before the short one is armed (a thread just
    // started may not have run yet): only then does a poller that takes no new arm while an
    // event is pending show it. Not needed for a correct driver.
    std::thread::sleep(Duration::from_millis(100));
    let open_b = gate(&b);
    let mut short = b.record().unwrap();
    arm(&mut short, &waker(2));
    drop(open_b);
    wait_until("the short event's wake-up", || {
        !log.lock().unwrap().is_empty()
    });
    assert_eq!(
        *log.lock().unwrap(),
        [2],
        "{strategy:?}: the short event must wake first, while A still works ({LONG_WORK:?})"
    );
    assert!(
        !long.is_complete().unwrap(),
        "{strategy:?}: the long event completed before the short one woke its task"
    );
    drop(long_stage);
    wait_until("the long event's wake-up", || {
        log.lock().unwrap().len() == 2
    });
    assert_eq!(*log.lock().unwrap(), [2, 1], "{strategy:?}");
}

/// Instantiates the completion-driver suite for one device kind, under each strategy.
///
/// `completion_suite!(name, device_expr, #[attrs]...)`.
#[macro_export]
macro_rules! completion_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::completion_suite as suite;
            use streamalloc::CompletionStrategy::{FlagWrite, HostFunction, Poller};

            $(#[$attr])* #[test] fn poller_wake_ups_follow_record_order() { suite::wake_ups_follow_record_order($device, Poller) }
            $(#[$attr])* #[test] fn host_function_wake_ups_follow_record_order() { suite::wake_ups_follow_record_order($device, HostFunction) }
            $(#[$attr])* #[test] fn poller_short_event_beside_a_long_one_wakes() { suite::short_event_beside_a_long_one_wakes($device, Poller) }
            $(#[$attr])* #[test] fn host_function_short_event_beside_a_long_one_wakes() { suite::short_event_beside_a_long_one_wakes($device, HostFunction) }
            $(#[$attr])* #[test] fn flag_write_wake_ups_follow_record_order() { suite::wake_ups_follow_record_order($device, FlagWrite) }
            $(#[$attr])* #[test] fn flag_write_short_event_beside_a_long_one_wakes() { suite::short_event_beside_a_long_one_wakes($device, FlagWrite) }
        }
    };
}
