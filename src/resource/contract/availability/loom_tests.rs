//! `RUSTFLAGS="--cfg loom" cargo test --lib --release loom_tests`

use std::sync::atomic::Ordering::{Relaxed, SeqCst};

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
        let waiter = queue.push(&waker, 0, || {});
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
        let waiter = follower.push(&waker, 0);
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
        let first = queue.push(&waker1, 0, || {});
        let _second = queue.push(&waker2, 0, || {});
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

/// A higher-priority waiter queues while the low-priority head is notified: the high one
/// becomes the head whatever the interleaving, and is either served by its own retry after
/// queueing or woken by the free. Never neither; the low one never holds the turn after.
#[test]
fn a_higher_priority_arrival_takes_the_turn_without_a_lost_wake_up() {
    loom::model(|| {
        let queue = Arc::new(WaitQueue::default());
        let memory = Arc::new(AtomicBool::new(false));
        let (_, waker_low) = flag();
        let low = queue.push(&waker_low, 0, || {});
        let (q, m) = (queue.clone(), memory.clone());
        let freer = loom::thread::spawn(move || {
            m.store(true, SeqCst);
            q.notify();
        });
        let (woken_high, waker_high) = flag();
        let high = queue.push(&waker_high, 1, || {});
        let head = queue.is_head(&high);
        let served = head && memory.load(SeqCst);
        freer.join().unwrap();
        assert!(head, "a higher priority queued behind a lower one");
        assert!(!queue.is_head(&low));
        assert!(served || woken_high.0.load(SeqCst), "lost wake-up");
    });
}

/// Two waiters of one priority behind a higher-priority head that is cancelled while memory
/// comes back: the older of the two gets the turn (and a wake-up), the younger neither.
#[test]
fn a_cancelled_priority_head_hands_on_in_arrival_order() {
    loom::model(|| {
        let queue = Arc::new(WaitQueue::default());
        let (_, waker_a) = flag();
        let (woken_b, waker_b) = flag();
        let (woken_c, waker_c) = flag();
        let b = queue.push(&waker_b, 0, || {});
        let c = queue.push(&waker_c, 0, || {});
        let a = queue.push(&waker_a, 7, || {});
        assert!(queue.is_head(&a));
        let q = queue.clone();
        let freer = loom::thread::spawn(move || q.notify());
        queue.remove(&a, || {});
        freer.join().unwrap();
        assert!(queue.is_head(&b) && !queue.is_head(&c));
        assert!(woken_b.0.load(SeqCst), "the turn was not handed on");
        assert!(!woken_c.0.load(SeqCst), "the younger waiter was woken");
        assert_eq!(queue.len(), 2);
    });
}

/// A resource whose free checks `nobody_to_notify` under its own lock, with no fence, and
/// skips the notify when it says so (the pool's shard fast path); its join barrier takes that
/// lock. The retry reads the state without the lock (as a pool's retry may find its memory
/// elsewhere and never lock that shard), relaxed: only the barrier orders it after the free.
struct Resource {
    lock: crate::sync::Mutex<()>,
    memory: AtomicBool,
}

fn resource_with_barrier() -> (std::sync::Arc<Availability>, Arc<Resource>) {
    let availability = std::sync::Arc::new(Availability::new());
    let resource = Arc::new(Resource {
        lock: crate::sync::Mutex::default(),
        memory: AtomicBool::new(false),
    });
    let swept = resource.clone();
    availability.set_join_barrier(move || drop(swept.lock.lock()));
    (availability, resource)
}

/// The free side of [`resource_with_barrier`].
fn free_under_lock(availability: &Availability, resource: &Resource) {
    let held = resource.lock.lock();
    resource.memory.store(true, Relaxed);
    let quiet = availability.nobody_to_notify();
    drop(held);
    if !quiet {
        availability.notify();
    }
}

/// A free that reads the waiter count under its lock and skips the notify, racing with a
/// waiter joining: the join barrier makes the waiter's retry see the memory, or the free see
/// the waiter. Never neither.
#[test]
fn no_lost_wake_up_when_a_free_skips_the_notify_under_its_lock() {
    loom::model(|| {
        let (availability, resource) = resource_with_barrier();
        let (a, r) = (availability.clone(), resource.clone());
        let freer = loom::thread::spawn(move || free_under_lock(&a, &r));
        let (woken, waker) = flag();
        let waiter = availability.push(&waker, 0);
        let served = availability.is_head(&waiter) && resource.memory.load(Relaxed);
        freer.join().unwrap();
        assert!(served || woken.0.load(SeqCst), "lost wake-up");
    });
}

/// As above, with the waiter at a resource that follows the one that frees (an adaptor with
/// a limit over a pool): the follower's join runs its leader's barrier too.
#[test]
fn no_lost_wake_up_when_a_leader_skips_the_notify_under_its_lock() {
    loom::model(|| {
        let (leader, resource) = resource_with_barrier();
        let follower = std::sync::Arc::new(Availability::new());
        leader.add_follower(&follower);
        let (l, r) = (leader.clone(), resource.clone());
        let freer = loom::thread::spawn(move || free_under_lock(&l, &r));
        let (woken, waker) = flag();
        let waiter = follower.push(&waker, 0);
        let served = follower.is_head(&waiter) && resource.memory.load(Relaxed);
        freer.join().unwrap();
        assert!(
            served || woken.0.load(SeqCst),
            "lost wake-up through a follower"
        );
    });
}
