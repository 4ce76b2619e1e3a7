//! `RUSTFLAGS="--cfg loom" cargo test --lib --release loom_tests`

use std::sync::atomic::Ordering::SeqCst;

use loom::sync::atomic::AtomicBool;

use super::{Availability, WaitQueue};
use crate::sync::Arc;

struct WakeFlag(AtomicBool);

impl futures::task::ArcWake for WakeFlag {
    fn wake_by_ref(arc_self: &std::sync::Arc<Self>) {
        arc_self.0.store(true, SeqCst);
    }
}

fn flag() -> (std::sync::Arc<WakeFlag>, std::task::Waker) {
    let flag = std::sync::Arc::new(WakeFlag(AtomicBool::new(false)));
    let waker = futures::task::waker(flag.clone());
    (flag, waker)
}

/// A free racing with a waiter that has just failed its fast path: either the waiter's
/// retry after queueing sees the memory, or the free wakes it. Never neither.
#[test]
fn no_lost_wake_up_between_a_failed_try_and_queueing() {
    loom::model(|| {
        let queue = Arc::new(WaitQueue::default());
        let memory = Arc::new(AtomicBool::new(false));
        let (q, m) = (queue.clone(), memory.clone());
        let freer = loom::thread::spawn(move || {
            m.store(true, SeqCst);
            q.notify();
        });
        let (woken, waker) = flag();
        let waiter = queue.push(&waker, || {});
        let served = queue.is_head(&waiter) && memory.load(SeqCst);
        freer.join().unwrap();
        assert!(served || woken.0.load(SeqCst), "lost wake-up");
    });
}

/// A free at a resource another one follows (a bin under a binning resource), racing with
/// a waiter at the follower: the follower counts its waiter before retrying, and the free
/// reads that count after its fence, so the waiter is served or woken. Never neither.
#[test]
fn no_lost_wake_up_through_a_follower() {
    loom::model(|| {
        let leader = std::sync::Arc::new(Availability::new());
        let follower = std::sync::Arc::new(Availability::new());
        leader.add_follower(&follower);
        let memory = Arc::new(AtomicBool::new(false));
        let (l, m) = (leader.clone(), memory.clone());
        let freer = loom::thread::spawn(move || {
            m.store(true, SeqCst);
            l.notify();
        });
        let (woken, waker) = flag();
        let waiter = follower.push(&waker);
        let served = follower.is_head(&waiter) && memory.load(SeqCst);
        freer.join().unwrap();
        assert!(
            served || woken.0.load(SeqCst),
            "lost wake-up through a follower"
        );
    });
}

/// The head is cancelled while memory comes back: the next waiter is woken either way.
#[test]
fn a_cancelled_head_hands_its_wake_up_on() {
    loom::model(|| {
        let queue = Arc::new(WaitQueue::default());
        let (_, waker1) = flag();
        let (woken2, waker2) = flag();
        let first = queue.push(&waker1, || {});
        let _second = queue.push(&waker2, || {});
        let q = queue.clone();
        let freer = loom::thread::spawn(move || q.notify());
        queue.remove(&first, || {});
        freer.join().unwrap();
        assert!(
            woken2.0.load(SeqCst),
            "the next waiter was never told to retry"
        );
        assert_eq!(queue.len(), 1);
    });
}
