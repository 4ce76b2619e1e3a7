//! Ageing in the wait queue: a waiter passed over by `age_step` serves of higher level rises
//! one level, which bounds how long any priority waits (see "Fairness" on `Availability`).
//!
//! Each test holds the whole budget in one block and hands it on one free at a time: every
//! free serves exactly the head, so the order of serves is the queue's order, deterministic.

use std::num::NonZeroU32;
use std::pin::Pin;
use std::time::Duration;

use futures::FutureExt;

use crate::test_support::free;
use crate::{
    Allocate, Availability, CudaResource, Device, DevicePtr, HostConfig, LimitingAdaptor,
    MemoryResource, Stream,
};

const KIB: usize = 1024;

type Mr = LimitingAdaptor<CudaResource>;
type Waiting<'a> = Pin<Box<Allocate<'a, Mr>>>;

fn limited() -> (Mr, Stream) {
    let device = Device::host_with(HostConfig::default());
    let stream = Stream::new(&device).unwrap();
    (
        LimitingAdaptor::new(CudaResource::new(&device).unwrap(), KIB),
        stream,
    )
}

fn queue(mr: &Mr) -> &Availability {
    mr.availability().unwrap()
}

fn step(k: u32) -> Option<NonZeroU32> {
    NonZeroU32::new(k)
}

/// A request of `priority` for the whole budget, polled once so it queues.
fn wait<'a>(mr: &'a Mr, s: &'a Stream, priority: i32) -> Waiting<'a> {
    let mut f = Box::pin(mr.allocate(KIB, s).priority(priority));
    assert!(f.as_mut().now_or_never().is_none(), "the budget is held");
    f
}

/// Frees `held` and polls every pending request once: exactly one (the head) is served.
/// Returns its label and its memory, the next block to hand on.
fn serve_one<'a>(
    mr: &'a Mr,
    s: &'a Stream,
    held: DevicePtr,
    pending: &mut Vec<(String, Waiting<'a>)>,
) -> (String, DevicePtr) {
    free(mr, held, KIB, s);
    let mut served = None;
    for (i, (label, f)) in pending.iter_mut().enumerate() {
        if let Some(r) = f.as_mut().now_or_never() {
            assert!(served.is_none(), "two served by one free");
            served = Some((i, label.clone(), r.unwrap()));
        }
    }
    let (i, label, p) = served.expect("a free serves the head");
    drop(pending.remove(i));
    (label, p)
}

/// Keeps `highs` requests of priority `high` waiting (a fresh one replaces each one served)
/// over a `low` one of priority `low` that queued first, until `low` is served or `rounds`
/// serves have passed. Returns how many high ones were served before it (`None`: never).
fn highs_served_before_low<'a>(
    mr: &'a Mr,
    s: &'a Stream,
    low: i32,
    high: i32,
    highs: usize,
    rounds: usize,
) -> Option<usize> {
    let mut held = mr.allocate_blocking(KIB, s).unwrap();
    let mut pending = vec![("low".to_string(), wait(mr, s, low))];
    let mut fresh = 0;
    let mut top_up = |pending: &mut Vec<(String, Waiting<'a>)>| {
        while pending.len() <= highs {
            pending.push((format!("high {fresh}"), wait(mr, s, high)));
            fresh += 1;
        }
    };
    top_up(&mut pending);
    let mut before = None;
    for round in 0..rounds {
        let (label, p) = serve_one(mr, s, held, &mut pending);
        held = p;
        if label == "low" {
            before = Some(round);
            break;
        }
        top_up(&mut pending);
    }
    drop(pending);
    free(mr, held, KIB, s);
    assert_eq!(mr.allocated_bytes(), 0);
    assert!(!queue(mr).has_waiters());
    before
}

#[test]
fn a_starved_low_waiter_is_served_within_the_bound() {
    // Without ageing the low request would wait for as long as high ones keep coming: the
    // stream below never stops, so it would never be served.
    for (k, low, high) in [(4, 0, 1), (4, -1, 2), (1, 0, 3), (7, -3, 0)] {
        let (mr, s) = limited();
        queue(&mr).set_age_step(step(k));
        let before = highs_served_before_low(&mr, &s, low, high, 3, 200)
            .unwrap_or_else(|| panic!("K {k}, {low} under {high}: starved"));
        // The bound, K · (P − p) + N with N = 0 (it queued first), is exact here: it rises one
        // level per K serves, and at the top it is the oldest.
        let bound = k as usize * (high - low) as usize;
        assert_eq!(before, bound, "K {k}, priority {low} under {high}");
        let rose = (high - low) as u64;
        assert_eq!(queue(&mr).stats().promotions, rose);
    }
}

#[test]
fn the_default_step_serves_a_low_waiter_after_128_serves_per_level() {
    let (mr, s) = limited();
    assert_eq!(queue(&mr).age_step(), Some(Availability::DEFAULT_AGE_STEP));
    let before = highs_served_before_low(&mr, &s, 0, 2, 2, 400);
    assert_eq!(before, Some(2 * 128));
}

#[test]
fn with_ageing_off_priorities_stay_strict() {
    let (mr, s) = limited();
    queue(&mr).set_age_step(None);
    assert_eq!(highs_served_before_low(&mr, &s, 0, 1, 2, 100), None);
    assert_eq!(queue(&mr).stats().promotions, 0);
}

#[test]
fn the_bound_counts_the_waiters_queued_before() {
    // `late` (priority 0) joins behind two older waiters of priority 0 and one of priority 1:
    // N = 3. Under a stream of priority 1 it is served after at most K · 1 + 3 serves.
    let (mr, s) = limited();
    let k = 3;
    queue(&mr).set_age_step(step(k));
    let mut held = mr.allocate_blocking(KIB, &s).unwrap();
    let mut pending = vec![
        ("old 0".to_string(), wait(&mr, &s, 0)),
        ("old 1".to_string(), wait(&mr, &s, 0)),
        ("old high".to_string(), wait(&mr, &s, 1)),
        ("late".to_string(), wait(&mr, &s, 0)),
    ];
    let mut order = Vec::new();
    for fresh in 0.. {
        pending.push((format!("high {fresh}"), wait(&mr, &s, 1)));
        let (label, p) = serve_one(&mr, &s, held, &mut pending);
        held = p;
        order.push(label.clone());
        if label == "late" {
            break;
        }
        assert!(order.len() <= k as usize + 3, "past the bound: {order:?}");
    }
    // The two older waiters of its level rose with it and keep their places ahead of it.
    assert_eq!(
        order,
        ["old high", "high 0", "high 1", "old 0", "old 1", "late"]
    );
    drop(pending);
    free(&mr, held, KIB, &s);
}

#[test]
fn waiters_that_rise_keep_arrival_order_within_their_new_level() {
    let (mr, s) = limited();
    queue(&mr).set_age_step(step(2));
    let mut held = mr.allocate_blocking(KIB, &s).unwrap();
    let mut pending: Vec<(String, Waiting<'_>)> =
        [("a", 0), ("b", 0), ("c", 1), ("d", 1), ("e", 0)]
            .into_iter()
            .map(|(l, p)| (l.to_string(), wait(&mr, &s, p)))
            .collect();
    let mut order = Vec::new();
    for _ in 0..2 {
        let (label, p) = serve_one(&mr, &s, held, &mut pending);
        held = p;
        order.push(label);
    }
    // c and d passed a, b and e over twice: all three rose to level 1, where they queue by
    // arrival, so before `f`, a request of priority 1 that arrives after them. Strict
    // priorities would serve `f` first.
    assert_eq!(queue(&mr).stats().promotions, 3);
    pending.push(("f".to_string(), wait(&mr, &s, 1)));
    while !pending.is_empty() {
        let (label, p) = serve_one(&mr, &s, held, &mut pending);
        held = p;
        order.push(label);
    }
    assert_eq!(order, ["c", "d", "a", "b", "e", "f"]);
    free(&mr, held, KIB, &s);
}

#[test]
fn an_aged_waiter_goes_before_newer_arrivals_of_its_new_level_and_after_older_ones() {
    let (mr, s) = limited();
    queue(&mr).set_age_step(step(1));
    let mut held = mr.allocate_blocking(KIB, &s).unwrap();
    let mut pending = vec![
        ("old high".to_string(), wait(&mr, &s, 1)),
        ("low".to_string(), wait(&mr, &s, 0)),
        ("top".to_string(), wait(&mr, &s, 2)),
    ];
    // `top` (2) is served and passes the other two over: `old high` rises to 2, `low` to 1.
    // Then `old high` is served (older than any other waiter at 2), passing `low` over: it
    // rises to 2.
    let (first, p) = serve_one(&mr, &s, held, &mut pending);
    held = p;
    assert_eq!(first, "top");
    let (second, p) = serve_one(&mr, &s, held, &mut pending);
    held = p;
    assert_eq!(second, "old high");
    assert_eq!(queue(&mr).stats().promotions, 3);
    // A new request of priority 2 queues behind `low`, which arrived before it (strict
    // priorities would serve it first).
    pending.push(("new high".to_string(), wait(&mr, &s, 2)));
    let (third, p) = serve_one(&mr, &s, held, &mut pending);
    assert_eq!(third, "low");
    let (fourth, p) = serve_one(&mr, &s, p, &mut pending);
    assert_eq!(fourth, "new high");
    free(&mr, p, KIB, &s);
}

#[test]
fn only_serves_age_waiters_and_timeouts_and_cancellations_are_still_counted() {
    let (mr, s) = limited();
    queue(&mr).set_age_step(step(1));
    let held = mr.allocate_blocking(KIB, &s).unwrap();
    let mut low = wait(&mr, &s, 0);
    // High requests that leave without memory pass nobody over: cancelled ones...
    for _ in 0..3 {
        drop(wait(&mr, &s, 1));
    }
    // ...and timed-out ones.
    for _ in 0..2 {
        let mut late = Box::pin(
            mr.allocate(KIB, &s)
                .priority(1)
                .timeout(Duration::from_millis(1)),
        );
        assert!(late.as_mut().now_or_never().is_none());
        std::thread::sleep(Duration::from_millis(10));
        assert!(matches!(
            late.as_mut().now_or_never(),
            Some(Err(crate::Error::Timeout { .. }))
        ));
    }
    let stats = queue(&mr).stats();
    assert_eq!(
        (stats.cancellations, stats.timeouts, stats.promotions),
        (3, 2, 0)
    );
    // So a high request still goes before `low`, which was never passed over...
    let mut high = wait(&mr, &s, 1);
    free(&mr, held, KIB, &s);
    assert!(low.as_mut().now_or_never().is_none());
    let p = high.as_mut().now_or_never().expect("the head").unwrap();
    // ...and that serve raises it (K = 1): it goes before a newer high one.
    assert_eq!(queue(&mr).stats().promotions, 1);
    let mut newer = wait(&mr, &s, 1);
    free(&mr, p, KIB, &s);
    assert!(newer.as_mut().now_or_never().is_none());
    let p = low.as_mut().now_or_never().expect("risen").unwrap();
    // A waiter that rose and then times out is counted as a timeout...
    let mut aged = Box::pin(mr.allocate(KIB, &s).timeout(Duration::from_millis(50)));
    assert!(aged.as_mut().now_or_never().is_none());
    free(&mr, p, KIB, &s);
    let p = newer.as_mut().now_or_never().expect("the head").unwrap();
    assert_eq!(queue(&mr).stats().promotions, 2);
    std::thread::sleep(Duration::from_millis(60));
    assert!(matches!(
        aged.as_mut().now_or_never(),
        Some(Err(crate::Error::Timeout { .. }))
    ));
    // ...and one that rose and is dropped as a cancellation.
    let aged = wait(&mr, &s, 0);
    let mut top = wait(&mr, &s, 1);
    free(&mr, p, KIB, &s);
    let p = top.as_mut().now_or_never().expect("the head").unwrap();
    assert_eq!(queue(&mr).stats().promotions, 3);
    drop(aged);
    let stats = queue(&mr).stats();
    assert_eq!(
        (
            stats.cancellations,
            stats.timeouts,
            stats.waiting,
            stats.promotions
        ),
        (4, 3, 0, 3)
    );
    free(&mr, p, KIB, &s);
    assert_eq!(mr.allocated_bytes(), 0);
}
