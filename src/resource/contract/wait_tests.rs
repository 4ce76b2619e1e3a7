//! Awaiting memory: the `Allocate` future's waiting path over a resource with a wait queue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use std::future::Future;

use crate::test_support::{free, hold};
use crate::{CudaResource, Device, Error, HostConfig, LimitingAdaptor, MemoryResource, Stream};

const KIB: usize = 1024;

fn limited(limit: usize) -> (LimitingAdaptor<CudaResource>, Stream) {
    let device = Device::host_with(HostConfig::default());
    let stream = Stream::new(&device).unwrap();
    (
        LimitingAdaptor::new(CudaResource::new(&device).unwrap(), limit),
        stream,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_allocation_resumes_when_memory_is_freed() {
    let (mr, s) = limited(4 * KIB);
    let held = mr.allocate(4 * KIB, &s).await.unwrap();
    let task = {
        let (mr, s) = (mr.clone(), s.clone());
        tokio::spawn(async move { mr.allocate(2 * KIB, &s).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!task.is_finished());
    assert!(mr.availability().unwrap().has_waiters());
    free(&mr, held, 4 * KIB, &s);
    let p = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(mr.allocated_bytes(), 2 * KIB);
    assert!(!mr.availability().unwrap().has_waiters());
    free(&mr, p, 2 * KIB, &s);
}

#[test]
fn waiting_works_without_a_runtime() {
    let (mr, s) = limited(KIB);
    let held = mr.allocate_blocking(KIB, &s).unwrap();
    let freer = {
        let (mr, s) = (mr.clone(), s.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            free(&mr, held, KIB, &s);
        })
    };
    let start = Instant::now();
    let p = futures::executor::block_on(mr.allocate(KIB, &s)).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(20));
    freer.join().unwrap();
    free(&mr, p, KIB, &s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_request_is_not_starved_by_small_ones() {
    let (mr, s) = limited(8 * KIB);
    // Fill the budget with 1 KiB blocks.
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(mr.allocate(KIB, &s).await.unwrap());
    }
    let order = Arc::new(AtomicUsize::new(0));
    // A large request queues first...
    let large = {
        let (mr, s, order) = (mr.clone(), s.clone(), order.clone());
        tokio::spawn(async move {
            let p = mr.allocate(4 * KIB, &s).await.unwrap();
            (order.fetch_add(1, Ordering::SeqCst), p)
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // ...then small ones, each of which would fit in a single freed block.
    let small: Vec<_> = (0..4)
        .map(|_| {
            let (mr, s, order) = (mr.clone(), s.clone(), order.clone());
            tokio::spawn(async move {
                let p = mr.allocate(KIB, &s).await.unwrap();
                (order.fetch_add(1, Ordering::SeqCst), p)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Free one block at a time: under strict FIFO no small request may take one first.
    for p in held.drain(..4) {
        free(&mr, p, KIB, &s);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (rank, lp) = large.await.unwrap();
    assert_eq!(rank, 0, "the large request was overtaken");
    free(&mr, lp, 4 * KIB, &s);
    for t in small {
        let (rank, p) = t.await.unwrap();
        assert!(rank >= 1);
        free(&mr, p, KIB, &s);
    }
    for p in held {
        free(&mr, p, KIB, &s);
    }
    assert_eq!(mr.allocated_bytes(), 0);
}

#[test]
fn a_deadline_ends_the_wait_with_a_timeout_and_leaves_no_waiter() {
    let (mr, s) = limited(KIB);
    let held = mr.allocate_blocking(KIB, &s).unwrap();
    let start = Instant::now();
    let err = futures::executor::block_on(mr.allocate(512, &s).timeout(Duration::from_millis(30)))
        .unwrap_err();
    match err {
        Error::Timeout {
            requested, waited, ..
        } => {
            assert_eq!(requested, 512);
            // `waited` counts from when the request queued, which may be a while after the
            // deadline was set (a loaded machine): it is at most the time since then.
            assert!(!waited.is_zero() && waited <= start.elapsed(), "{waited:?}");
        }
        other => panic!("expected a timeout, got {other}"),
    }
    // The deadline is not cut short.
    assert!(start.elapsed() >= Duration::from_millis(30));
    assert!(!mr.availability().unwrap().has_waiters());
    assert_eq!(mr.allocated_bytes(), KIB);
    free(&mr, held, KIB, &s);
}

#[test]
fn dropping_a_waiting_future_removes_it_and_wakes_the_next() {
    let (mr, s) = limited(KIB);
    let held = mr.allocate_blocking(KIB, &s).unwrap();
    let mut first = Box::pin(mr.allocate(KIB, &s));
    let mut second = Box::pin(mr.allocate(KIB, &s));
    assert!(first.as_mut().now_or_never().is_none());
    assert!(second.as_mut().now_or_never().is_none());
    assert_eq!(
        format!("{:?}", mr.availability().unwrap()),
        "Availability { waiters: 2 }"
    );
    free(&mr, held, KIB, &s);
    // The head was notified but is cancelled: the second must get the memory.
    drop(first);
    let p = second
        .as_mut()
        .now_or_never()
        .expect("the next waiter is served")
        .unwrap();
    assert!(!mr.availability().unwrap().has_waiters());
    drop(second);
    assert_eq!(mr.allocated_bytes(), KIB);
    free(&mr, p, KIB, &s);
    assert_eq!(mr.allocated_bytes(), 0);
}

#[test]
fn requests_that_can_never_fit_fail_at_once() {
    let (mr, s) = limited(KIB);
    let start = Instant::now();
    let err = futures::executor::block_on(mr.allocate(2 * KIB, &s)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                requested: 2048,
                maximum: 1024,
                ..
            }
        ),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(!mr.availability().unwrap().has_waiters());
}

/// Requests are charged in 256-byte units, so with a limit of 1000 bytes nothing over 768 can
/// ever fit: the capacity limit says so, and an awaited 1000 bytes fails instead of waiting.
#[test]
fn a_limit_that_is_not_a_multiple_of_256_reports_what_can_fit() {
    let (mr, s) = limited(1000);
    assert_eq!(mr.capacity_limit(), Some(768));
    // The timeout only turns a hang, which would be the bug, into a failure.
    let r = futures::executor::block_on(mr.allocate(1000, &s).timeout(Duration::from_secs(5)));
    assert!(
        matches!(
            r,
            Err(Error::TooLarge {
                requested: 1000,
                maximum: 768,
                ..
            })
        ),
        "{r:?}"
    );
    let p = mr.try_allocate(768, &s).unwrap();
    free(&mr, p, 768, &s);
}

#[test]
fn resources_without_a_wait_queue_fail_at_once() {
    let device = Device::host_with(HostConfig::default().capacity(KIB));
    let s = Stream::new(&device).unwrap();
    let mr = CudaResource::new(&device).unwrap();
    let err = futures::executor::block_on(mr.allocate(2 * KIB, &s)).unwrap_err();
    assert!(err.is_out_of_memory());
}

#[test]
fn the_budget_is_charged_in_256_byte_units_and_errors_carry_it() {
    let (mr, s) = limited(KIB);
    let p = mr.try_allocate(1, &s).unwrap();
    assert_eq!(mr.allocated_bytes(), 256);
    match mr.try_allocate(800, &s) {
        Err(Error::OutOfMemory {
            requested,
            available,
            ..
        }) => {
            assert_eq!((requested, available), (800, Some(768)))
        }
        other => panic!("{other:?}"),
    }
    free(&mr, p, 1, &s);
    assert_eq!(mr.allocated_bytes(), 0);
}

#[test]
fn an_upstream_failure_returns_the_charge() {
    let device = Device::host_with(HostConfig::default());
    let s = Stream::new(&device).unwrap();
    let mr = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 4 * KIB);
    device.host_controls().unwrap().fail_next_allocations(1);
    assert!(mr.try_allocate(KIB, &s).unwrap_err().is_out_of_memory());
    assert_eq!(mr.allocated_bytes(), 0);
}

#[test]
fn a_limit_over_a_limit_wakes_on_upstream_frees() {
    // Inner budget 1 KiB, outer 4 KiB: the outer adaptor's waiter is blocked by the inner one
    // and must be woken when memory returns to the inner one.
    let device = Device::host_with(HostConfig::default());
    let s = Stream::new(&device).unwrap();
    let inner = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), KIB);
    let outer = LimitingAdaptor::new(inner.clone(), 4 * KIB);
    let held = inner.allocate_blocking(KIB, &s).unwrap();
    let mut waiting = Box::pin(outer.allocate(KIB, &s));
    assert!(waiting.as_mut().now_or_never().is_none());
    free(&inner, held, KIB, &s);
    let p = waiting
        .as_mut()
        .now_or_never()
        .expect("woken through the follower link")
        .unwrap();
    drop(waiting);
    free(&outer, p, KIB, &s);
    assert_eq!((inner.allocated_bytes(), outer.allocated_bytes()), (0, 0));
}

#[test]
fn a_head_waiter_that_fails_upstream_is_not_woken_by_its_own_failure() {
    // Outer budget has room, inner is full: the outer head's retry fails upstream. That failure
    // must not count as memory coming back, or the head would spin.
    let device = Device::host_with(HostConfig::default());
    let s = Stream::new(&device).unwrap();
    let inner = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), KIB);
    let outer = LimitingAdaptor::new(inner.clone(), 4 * KIB);
    let held = inner.allocate_blocking(KIB, &s).unwrap();
    let wakes = Arc::new(AtomicUsize::new(0));
    let waker = futures::task::waker(Arc::new(CountingWaker(wakes.clone())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut waiting = Box::pin(outer.allocate(KIB, &s));
    for _ in 0..3 {
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
    }
    assert_eq!(
        wakes.load(Ordering::SeqCst),
        0,
        "woken without any memory coming back"
    );
    free(&inner, held, KIB, &s);
    assert!(wakes.load(Ordering::SeqCst) >= 1);
    let p = match waiting.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(r) => r.unwrap(),
        std::task::Poll::Pending => panic!("not served after the free"),
    };
    drop(waiting);
    free(&outer, p, KIB, &s);
}

struct CountingWaker(Arc<AtomicUsize>);

impl futures::task::ArcWake for CountingWaker {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// On a current-thread runtime's thread, a blocking allocation that would wait returns an
/// error instead of blocking the one thread that could free memory; one served at once is
/// served; elsewhere it waits as before.
#[test]
fn allocate_blocking_on_a_current_thread_runtime_does_not_deadlock() {
    let (mr, s) = limited(KIB);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let held = rt
        .block_on(async { mr.allocate_blocking(KIB, &s) })
        .unwrap();
    let r = rt.block_on(async {
        let waiting = tokio::spawn({
            let (mr, s) = (mr.clone(), s.clone());
            async move { mr.allocate_blocking(256, &s) }
        });
        waiting.await.unwrap()
    });
    assert!(
        matches!(r, Err(Error::BlockingInAsyncContext { requested: 256, .. })),
        "{r:?}"
    );
    assert!(!mr.availability().unwrap().has_waiters());
    assert_eq!(mr.allocated_bytes(), KIB);
    free(&mr, held, KIB, &s);
}

/// Polls `f` once with a no-op waker: `Some` when it is ready.
fn poll_once<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
    f.now_or_never()
}

#[test]
fn a_higher_priority_waiter_is_served_before_an_older_lower_one() {
    let (mr, s) = limited(KIB);
    let held = mr.allocate_blocking(KIB, &s).unwrap();
    let mut low = Box::pin(mr.allocate(KIB, &s));
    assert!(poll_once(&mut low).is_none());
    let mut high = Box::pin(mr.allocate(KIB, &s).priority(1));
    assert!(poll_once(&mut high).is_none());
    free(&mr, held, KIB, &s);
    // Under FIFO the older `low` would be the head and take the memory.
    assert!(
        poll_once(&mut low).is_none(),
        "the lower priority went first"
    );
    let p = poll_once(&mut high)
        .expect("the higher priority is the head")
        .unwrap();
    free(&mr, p, KIB, &s);
    let p = poll_once(&mut low).expect("then the lower one").unwrap();
    free(&mr, p, KIB, &s);
    assert!(!mr.availability().unwrap().has_waiters());
}

#[test]
fn within_a_priority_waiters_are_served_in_arrival_order() {
    let (mr, s) = limited(KIB);
    let held = mr.allocate_blocking(KIB, &s).unwrap();
    let mut a = Box::pin(mr.allocate(KIB, &s).priority(1));
    let mut b = Box::pin(mr.allocate(KIB, &s));
    let mut c = Box::pin(mr.allocate(KIB, &s).priority(1));
    let mut d = Box::pin(mr.allocate(KIB, &s).priority(-1));
    let mut e = Box::pin(mr.allocate(KIB, &s));
    for f in [&mut a, &mut b, &mut c, &mut d, &mut e] {
        assert!(poll_once(f).is_none());
    }
    let mut p = held;
    // Expected order: a, c (priority 1, in arrival order), b, e (0), d (-1).
    let mut order = Vec::new();
    let mut pending: Vec<(&str, _)> = vec![("a", a), ("b", b), ("c", c), ("d", d), ("e", e)];
    while !pending.is_empty() {
        free(&mr, p, KIB, &s);
        let mut served = None;
        for (i, (name, f)) in pending.iter_mut().enumerate() {
            if let Some(r) = poll_once(f) {
                assert!(served.is_none(), "two served by one free");
                served = Some((i, *name, r.unwrap()));
            }
        }
        let (i, name, q) = served.expect("a free serves a waiter");
        order.push(name);
        drop(pending.remove(i));
        p = q;
    }
    free(&mr, p, KIB, &s);
    assert_eq!(order, ["a", "c", "b", "e", "d"]);
    assert_eq!(mr.allocated_bytes(), 0);
}

#[test]
fn a_new_request_queues_behind_equal_priority_but_passes_lower() {
    let (mr, s) = limited(2 * KIB);
    let half = mr.allocate_blocking(KIB, &s).unwrap();
    let other_half = mr.allocate_blocking(KIB, &s).unwrap();
    // A large low-priority request waits for both halves...
    let mut large = Box::pin(mr.allocate(2 * KIB, &s));
    assert!(poll_once(&mut large).is_none());
    free(&mr, half, KIB, &s);
    assert!(poll_once(&mut large).is_none());
    // ...a small one of its priority queues behind it although 1 KiB is free...
    let mut same = Box::pin(mr.allocate(KIB, &s));
    assert!(
        poll_once(&mut same).is_none(),
        "passed a waiter of its priority"
    );
    // ...and one of higher priority passes both.
    let mut urgent = Box::pin(mr.allocate(KIB, &s).priority(5));
    let p = poll_once(&mut urgent)
        .expect("a higher priority passes lower waiters")
        .unwrap();
    assert_eq!(mr.availability().unwrap().stats().waiting, 2);
    free(&mr, p, KIB, &s);
    free(&mr, other_half, KIB, &s);
    let p = poll_once(&mut large)
        .expect("the large one is next")
        .unwrap();
    assert!(poll_once(&mut same).is_none());
    free(&mr, p, 2 * KIB, &s);
    let p = poll_once(&mut same).unwrap().unwrap();
    free(&mr, p, KIB, &s);
    assert_eq!(mr.allocated_bytes(), 0);
}

#[test]
fn a_cancelled_high_priority_head_passes_the_turn_to_a_lower_waiter() {
    let (mr, s) = limited(KIB);
    let held = mr.allocate_blocking(KIB, &s).unwrap();
    let mut low = Box::pin(mr.allocate(KIB, &s));
    assert!(poll_once(&mut low).is_none());
    let mut high = Box::pin(mr.allocate(KIB, &s).priority(1));
    assert!(poll_once(&mut high).is_none());
    let wakes = Arc::new(AtomicUsize::new(0));
    let waker = futures::task::waker(Arc::new(CountingWaker(wakes.clone())));
    assert!(low
        .as_mut()
        .poll(&mut std::task::Context::from_waker(&waker))
        .is_pending());
    free(&mr, held, KIB, &s); // wakes the head, `high`
    assert_eq!(wakes.load(Ordering::SeqCst), 0);
    drop(high);
    assert_eq!(
        wakes.load(Ordering::SeqCst),
        1,
        "the turn was not passed on"
    );
    let p = poll_once(&mut low)
        .expect("served after the head left")
        .unwrap();
    free(&mr, p, KIB, &s);
    assert_eq!(mr.availability().unwrap().stats().cancellations, 1);
}

#[test]
fn buffer_builders_forward_their_priority() {
    let (mr, s) = limited(KIB);
    let held = crate::DeviceBuffer::try_new(KIB, &s, mr.clone()).unwrap();
    let mut low = Box::pin(crate::DeviceBuffer::new(KIB, &s, mr.clone()));
    assert!(poll_once(&mut low).is_none());
    let mut high = Box::pin(crate::DeviceVec::<u32>::new(KIB / 4, &s, mr.clone()).priority(2));
    assert!(poll_once(&mut high).is_none());
    drop(held);
    assert!(
        poll_once(&mut low).is_none(),
        "the vector's priority was lost"
    );
    let v = poll_once(&mut high).unwrap().unwrap();
    drop(v);
    let b = poll_once(&mut low).unwrap().unwrap();
    drop(b);
    assert_eq!(mr.allocated_bytes(), 0);
}

/// Two tasks each hold half of a bounded budget and each await more: without detection both
/// wait for ever. One of them (or both) must hear `WouldDeadlock` with the numbers; once it
/// gives its half back, the other may be served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_that_hold_everything_and_wait_for_more_get_would_deadlock() {
    let (mr, s) = limited(4 * KIB);
    mr.availability().unwrap().set_deadlock_detection(true);
    let both_hold = Arc::new(tokio::sync::Barrier::new(2));
    let task =
        |mr: LimitingAdaptor<CudaResource>, s: Stream, both_hold: Arc<tokio::sync::Barrier>| {
            tokio::spawn(async move {
                let half = mr.allocate(2 * KIB, &s).await.unwrap();
                both_hold.wait().await;
                let more = mr.allocate(KIB, &s).await;
                free(&mr, half, 2 * KIB, &s);
                if let Ok(p) = &more {
                    free(&mr, *p, KIB, &s);
                }
                more
            })
        };
    let a = task(mr.clone(), s.clone(), both_hold.clone());
    let b = task(mr.clone(), s.clone(), both_hold);
    let (a, b) = tokio::time::timeout(Duration::from_secs(10), async {
        (a.await.unwrap(), b.await.unwrap())
    })
    .await
    .expect("deadlocked tasks hung instead of failing");
    let deadlocks: Vec<_> = [&a, &b]
        .into_iter()
        .filter_map(|r| r.as_ref().err())
        .collect();
    assert!(!deadlocks.is_empty(), "{a:?} {b:?}");
    for e in deadlocks {
        match e {
            Error::WouldDeadlock {
                requested,
                allocated,
                limit,
                held_by_waiters,
                waiting_tasks,
                ..
            } => {
                assert_eq!((*requested, *allocated, *limit), (KIB, 4 * KIB, 4 * KIB));
                assert_eq!(*held_by_waiters, 4 * KIB);
                assert!((1..=2).contains(waiting_tasks), "{e}");
            }
            other => panic!("expected WouldDeadlock, got {other}"),
        }
    }
    assert_eq!(mr.allocated_bytes(), 0);
    assert!(!mr.availability().unwrap().has_waiters());
}

/// A task holds half and waits for more while another task, not waiting, holds the rest and
/// frees it later: that is a wait, not a deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_memory_a_running_task_holds_is_not_a_deadlock() {
    let (mr, s) = limited(4 * KIB);
    mr.availability().unwrap().set_deadlock_detection(true);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let holder = {
        let (mr, s) = (mr.clone(), s.clone());
        tokio::spawn(async move {
            let p = mr.allocate(2 * KIB, &s).await.unwrap();
            rx.await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
            free(&mr, p, 2 * KIB, &s);
        })
    };
    let waiter = {
        let (mr, s) = (mr.clone(), s.clone());
        tokio::spawn(async move {
            let half = mr.allocate(2 * KIB, &s).await.unwrap();
            tx.send(()).unwrap();
            let more = mr
                .allocate(4 * KIB - 2 * KIB + KIB, &s)
                .timeout(Duration::from_millis(1));
            // Too much while it holds half (3 KiB beside 2 KiB): gives up at its deadline,
            // never with WouldDeadlock; then asks for what the holder will free.
            assert!(matches!(more.await, Err(Error::Timeout { .. })));
            let more = mr.allocate(2 * KIB, &s).await;
            free(&mr, half, 2 * KIB, &s);
            more.map(|p| free(&mr, p, 2 * KIB, &s))
        })
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        holder.await.unwrap();
        waiter.await.unwrap()
    })
    .await
    .expect("hung")
    .expect("a running holder's memory was reported as a deadlock");
    assert_eq!(mr.allocated_bytes(), 0);
}

/// What a task got and freed is forgotten at the free: a waiting task whose old allocation
/// is gone must not count it, while memory it never held (taken outside any task) blocks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_waiter_freed_is_not_counted_as_held() {
    let (mr, s) = limited(4 * KIB);
    mr.availability().unwrap().set_deadlock_detection(true);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (freed_tx, freed_rx) = tokio::sync::oneshot::channel::<()>();
    let waiter = {
        let (mr, s) = (mr.clone(), s.clone());
        tokio::spawn(async move {
            let p = mr.allocate(4 * KIB, &s).await.unwrap();
            free(&mr, p, 4 * KIB, &s);
            freed_tx.send(()).unwrap();
            rx.await.unwrap();
            let p = mr.allocate(KIB, &s).await?;
            free(&mr, p, KIB, &s);
            Ok::<_, Error>(())
        })
    };
    freed_rx.await.unwrap();
    // The test body is no task: this allocation is nobody's, as far as detection knows.
    let outside = mr.try_allocate(4 * KIB, &s).unwrap();
    tx.send(()).unwrap();
    while !mr.availability().unwrap().has_waiters() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    free(&mr, outside, 4 * KIB, &s);
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("hung")
        .unwrap()
        .expect("a freed allocation was counted as held");
}

/// A driver pool's free gives its memory back only when the freeing stream reaches it. A
/// request on another stream waits for it and resumes when the device passes the free, with
/// no synchronize by anyone: bare, and through a limit stacked on the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_stream_ordered_free_wakes_a_waiter_on_another_stream() {
    const MIB: usize = 1 << 20;
    let device = Device::host_with(HostConfig::default().capacity(MIB));
    let pool = crate::CudaAsyncResource::new(&device).unwrap();
    waits_for_a_pending_free(&pool, &device).await;
    waits_for_a_pending_free(&LimitingAdaptor::new(pool, 2 * MIB), &device).await;

    async fn waits_for_a_pending_free(mr: &impl MemoryResource, device: &Device) {
        let (freeing, waiting) = (Stream::new(device).unwrap(), Stream::new(device).unwrap());
        let p = mr.try_allocate(MIB, &freeing).unwrap();
        // The free stays pending until the waiter below has queued.
        let stage = hold(&freeing, Duration::from_secs(10));
        free(mr, p, MIB, &freeing);
        assert!(
            mr.try_allocate(MIB, &waiting)
                .unwrap_err()
                .is_out_of_memory(),
            "the free took effect before its stream reached it"
        );
        let waits = mr.availability().unwrap().stats().waits;
        // Polled by hand: a timeout around the future would poll it once more when it fires,
        // and that retry would find the memory back without any wake-up.
        let woken = Arc::new(tokio::sync::Notify::new());
        let waker = futures::task::waker(Arc::new(NotifyWaker(woken.clone())));
        let mut cx = std::task::Context::from_waker(&waker);
        let mut allocate = Box::pin(mr.allocate(MIB, &waiting));
        assert!(
            allocate.as_mut().poll(&mut cx).is_pending(),
            "served before the free"
        );
        drop(stage);
        // Other frees completing (the last case's) may wake it first: each wake-up is a retry.
        let q = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let std::task::Poll::Ready(r) = allocate.as_mut().poll(&mut cx) {
                    break r.expect("failed instead of waiting for the pending free");
                }
                woken.notified().await;
            }
        })
        .await
        .expect("the waiter was never woken by the free's completion");
        drop(allocate);
        assert_eq!(mr.availability().unwrap().stats().waits, waits + 1);
        free(mr, q, MIB, &waiting);
        // That free is stream-ordered too: the next case starts once the device has passed it.
        device.synchronize().await.unwrap();
    }
}

struct NotifyWaker(Arc<tokio::sync::Notify>);

impl futures::task::ArcWake for NotifyWaker {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.0.notify_one();
    }
}

/// A producer that hands what it allocated to a consumer task and then waits for more is no
/// deadlock: the consumer frees the memory later. The ledger counts the handed-over bytes as
/// the producer's, so detection (which would call this a deadlock) is off unless asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_waiting_while_its_consumer_holds_its_memory_is_not_a_deadlock() {
    let (mr, s) = limited(4 * KIB);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<crate::DevicePtr>(8);
    let consumer = {
        let (mr, s) = (mr.clone(), s.clone());
        tokio::spawn(async move {
            while let Some(p) = rx.recv().await {
                tokio::time::sleep(Duration::from_millis(50)).await;
                free(&mr, p, 2 * KIB, &s);
            }
        })
    };
    let producer = {
        let (mr, s) = (mr.clone(), s.clone());
        tokio::spawn(async move {
            for _ in 0..4 {
                let p = mr.allocate(2 * KIB, &s).await?;
                tx.send(p).await.unwrap();
            }
            Ok::<_, Error>(())
        })
    };
    tokio::time::timeout(Duration::from_secs(10), producer)
        .await
        .expect("hung")
        .unwrap()
        .expect("a producer whose consumer holds its memory was told it deadlocks");
    consumer.await.unwrap();
    assert_eq!(mr.allocated_bytes(), 0);
}
