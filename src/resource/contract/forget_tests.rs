//! Forget-safety of the wait queue: a queued allocation future that is forgotten (or whose
//! task stops polling it) must not hold the queue for ever.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::FutureExt;

use crate::resource::contract::availability::{STALLED_TURN, TEST_STALLED_TURN};
use crate::test_support::free;
use crate::{CudaResource, Device, HostConfig, LimitingAdaptor, MemoryResource, Stream};

const KIB: usize = 1024;

/// The stalled-turn time of these tests' queues: shorter than the real [`STALLED_TURN`], which
/// each of them would otherwise wait out once or twice, and still far longer than a woken
/// task takes to poll, so that the bounds below keep a wide margin under load.
const TURN: Duration = Duration::from_millis(400);
const _: () = assert!(TURN.as_nanos() < STALLED_TURN.as_nanos());

fn limited(limit: usize) -> (LimitingAdaptor<CudaResource>, Stream) {
    let device = Device::host_with(HostConfig::default());
    let stream = Stream::new(&device).unwrap();
    // Only for the queues made here: the thread may run other tests after this one.
    TEST_STALLED_TURN.set(Some(TURN));
    let mr = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), limit);
    TEST_STALLED_TURN.set(None);
    (mr, stream)
}

/// Polls `f` once with a no-op waker: `Some` when it is ready.
fn poll_once<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
    f.now_or_never()
}

/// Queues `future` (one poll: the budget is spent) and forgets it; then a later awaited
/// allocation is served once memory is freed, within the time a stalled turn is given.
fn a_forgotten_queued_future_does_not_hold_the_queue<F: Future + Unpin>(
    mr: &LimitingAdaptor<CudaResource>,
    s: &Stream,
    mut future: F,
) {
    let held = mr.allocate_blocking(KIB, s).unwrap();
    assert!(poll_once(&mut future).is_none(), "it queues");
    std::mem::forget(future);
    let freer = {
        let (mr, s) = (mr.clone(), s.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            free(&mr, held, KIB, &s);
        })
    };
    let start = Instant::now();
    // The timeout turns the hang, which was the bug, into a failure.
    let p = futures::executor::block_on(mr.allocate(KIB, s).timeout(Duration::from_secs(10)))
        .expect("a later awaited allocation is served");
    assert!(start.elapsed() < 3 * TURN, "{:?}", start.elapsed());
    freer.join().unwrap();
    free(mr, p, KIB, s);
    assert!(!mr.availability().unwrap().has_waiters());
    assert_eq!(mr.allocated_bytes(), 0);
}

#[test]
fn a_forgotten_allocate_does_not_hold_the_queue() {
    let (mr, s) = limited(KIB);
    let future = Box::pin(mr.allocate(KIB, &s));
    a_forgotten_queued_future_does_not_hold_the_queue(&mr, &s, future);
}

#[test]
fn a_forgotten_new_buffer_does_not_hold_the_queue() {
    let (mr, s) = limited(KIB);
    let future = Box::pin(crate::DeviceBuffer::new(KIB, &s, mr.clone()));
    a_forgotten_queued_future_does_not_hold_the_queue(&mr, &s, future);
}

#[test]
fn a_forgotten_new_vec_does_not_hold_the_queue() {
    let (mr, s) = limited(KIB);
    let future = Box::pin(crate::DeviceVec::<u32>::new(KIB / 4, &s, mr.clone()));
    a_forgotten_queued_future_does_not_hold_the_queue(&mr, &s, future);
}

/// A forgotten waiter behind the head gets the turn when the head is served, and must pass it
/// on too.
#[test]
fn a_forgotten_waiter_behind_the_head_passes_its_turn_on() {
    let (mr, s) = limited(KIB);
    let held = mr.allocate_blocking(KIB, &s).unwrap();
    let mut head = Box::pin(mr.allocate(KIB, &s));
    assert!(poll_once(&mut head).is_none());
    let mut forgotten = Box::pin(mr.allocate(KIB, &s));
    assert!(poll_once(&mut forgotten).is_none());
    std::mem::forget(forgotten);
    let mut last = Box::pin(mr.allocate(KIB, &s).timeout(Duration::from_secs(10)));
    assert!(poll_once(&mut last).is_none());
    free(&mr, held, KIB, &s);
    let p = poll_once(&mut head).expect("the head is served").unwrap();
    drop(head);
    // The turn goes to the forgotten waiter, which never takes it.
    free(&mr, p, KIB, &s);
    let start = Instant::now();
    let p = futures::executor::block_on(last).expect("the last waiter is served");
    assert!(start.elapsed() >= TURN / 2, "{:?}", start.elapsed());
    free(&mr, p, KIB, &s);
    assert_eq!(mr.allocated_bytes(), 0);
}

/// A head that was told to retry and is polled only after its turn passed on gets its place
/// back: the front of its priority, before the waiters that came after it.
#[test]
fn a_head_slow_to_poll_gets_its_place_back() {
    let (mr, s) = limited(KIB);
    let held = mr.allocate_blocking(KIB, &s).unwrap();
    let mut slow = Box::pin(mr.allocate(KIB, &s));
    assert!(poll_once(&mut slow).is_none());
    let mut next = Box::pin(mr.allocate(KIB, &s));
    assert!(poll_once(&mut next).is_none());
    free(&mr, held, KIB, &s); // tells `slow` to retry; it is not polled
    let queue = mr.availability().unwrap();
    let deadline = Instant::now() + 10 * TURN;
    while queue.stats().waiting == 2 {
        assert!(Instant::now() < deadline, "the stalled head kept its turn");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The turn passed to `next`, which has not taken it either; `slow` polls first.
    let p = poll_once(&mut slow)
        .expect("back at the front, it retries and is served")
        .unwrap();
    assert!(poll_once(&mut next).is_none());
    free(&mr, p, KIB, &s);
    let p = poll_once(&mut next).expect("then the next one").unwrap();
    free(&mr, p, KIB, &s);
    assert!(!queue.has_waiters());
}
