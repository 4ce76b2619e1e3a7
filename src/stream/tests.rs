use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{CompletionStrategy, Device, Error, HostConfig, Stream, StreamPool};

fn device(strategy: CompletionStrategy) -> Device {
    Device::host_with(HostConfig::default().completion_strategy(strategy))
}

const STRATEGIES: [CompletionStrategy; 3] = [
    CompletionStrategy::HostFunction,
    CompletionStrategy::Poller,
    CompletionStrategy::FlagWrite,
];

#[test]
fn event_completes_only_after_earlier_work() {
    let s = Stream::new(&Device::host()).unwrap();
    s.enqueue_delay(Duration::from_millis(50)).unwrap();
    let e = s.record().unwrap();
    assert!(!e.is_complete().unwrap());
    e.synchronize_blocking().unwrap();
    assert!(e.is_complete().unwrap());
}

#[test]
fn event_on_idle_stream_is_complete() {
    let s = Stream::new(&Device::host()).unwrap();
    let e = s.record().unwrap();
    e.synchronize_blocking().unwrap();
    assert!(e.is_complete().unwrap());
}

#[test]
fn wait_orders_one_stream_after_another() {
    let d = Device::host();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let written = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicBool::new(false));
    a.enqueue_delay(Duration::from_millis(50)).unwrap();
    let w = written.clone();
    a.launch_host_fn(move || w.store(true, Ordering::SeqCst))
        .unwrap();
    b.wait(&a.record().unwrap()).unwrap();
    let (w, s) = (written.clone(), seen.clone());
    b.launch_host_fn(move || s.store(w.load(Ordering::SeqCst), Ordering::SeqCst))
        .unwrap();
    b.synchronize_blocking().unwrap();
    assert!(seen.load(Ordering::SeqCst), "b ran before a's earlier work");
}

#[test]
fn without_wait_streams_are_unordered() {
    // The negative control of the test above: the same program without `wait` lets b run first.
    let d = Device::host();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let written = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicBool::new(true));
    a.enqueue_delay(Duration::from_millis(200)).unwrap();
    let w = written.clone();
    a.launch_host_fn(move || w.store(true, Ordering::SeqCst))
        .unwrap();
    let (w, s) = (written.clone(), seen.clone());
    b.launch_host_fn(move || s.store(w.load(Ordering::SeqCst), Ordering::SeqCst))
        .unwrap();
    b.synchronize_blocking().unwrap();
    assert!(!seen.load(Ordering::SeqCst));
    a.synchronize_blocking().unwrap();
}

#[test]
fn awaiting_an_event_resumes_after_completion_with_block_on() {
    for strategy in STRATEGIES {
        let s = Stream::new(&device(strategy)).unwrap();
        s.enqueue_delay(Duration::from_millis(30)).unwrap();
        let e = s.record().unwrap();
        let start = Instant::now();
        futures::executor::block_on(e.clone()).unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(25),
            "{strategy:?} resolved early"
        );
        assert!(e.is_complete().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_await_clones_of_one_event() {
    for strategy in STRATEGIES {
        let s = Stream::new(&device(strategy)).unwrap();
        s.enqueue_delay(Duration::from_millis(30)).unwrap();
        let e = s.record().unwrap();
        let woken = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (e, woken) = (e.clone(), woken.clone());
                tokio::spawn(async move {
                    e.await.unwrap();
                    woken.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(woken.load(Ordering::SeqCst), 16, "{strategy:?}");
        assert!(e.is_complete().unwrap());
    }
}

#[tokio::test(flavor = "current_thread")]
async fn synchronize_waits_for_all_enqueued_work() {
    for strategy in STRATEGIES {
        let s = Stream::new(&device(strategy)).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        s.enqueue_delay(Duration::from_millis(20)).unwrap();
        let d = done.clone();
        s.launch_host_fn(move || d.store(true, Ordering::SeqCst))
            .unwrap();
        s.synchronize().await.unwrap();
        assert!(done.load(Ordering::SeqCst), "{strategy:?}");
    }
}

#[test]
fn strategy_can_change_between_events() {
    let d = device(CompletionStrategy::HostFunction);
    let s = Stream::new(&d).unwrap();
    for strategy in [CompletionStrategy::Poller, CompletionStrategy::HostFunction] {
        d.set_completion_strategy(strategy);
        s.enqueue_delay(Duration::from_millis(5)).unwrap();
        futures::executor::block_on(s.record().unwrap()).unwrap();
    }
}

#[test]
fn a_panicking_host_function_does_not_stop_the_stream() {
    let s = Stream::new(&Device::host()).unwrap();
    s.launch_host_fn(|| panic!("deliberate panic in a host function"))
        .unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    s.launch_host_fn(move || r.store(true, Ordering::SeqCst))
        .unwrap();
    s.synchronize_blocking().unwrap();
    assert!(ran.load(Ordering::SeqCst));
}

#[test]
fn dropping_a_stream_still_runs_its_queued_work() {
    let s = Stream::new(&Device::host()).unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    s.enqueue_delay(Duration::from_millis(20)).unwrap();
    s.launch_host_fn(move || r.store(true, Ordering::SeqCst))
        .unwrap();
    let e = s.record().unwrap();
    drop(s);
    futures::executor::block_on(e).unwrap();
    assert!(ran.load(Ordering::SeqCst));
}

#[test]
fn stream_pool_round_robin_and_size_checked() {
    let d = Device::host();
    assert!(matches!(
        StreamPool::new(&d, 0),
        Err(Error::InvalidArgument(_))
    ));
    let pool = StreamPool::new(&d, 3).unwrap();
    assert_eq!(pool.len(), 3);
    let ids: Vec<_> = (0..6).map(|_| pool.get().id()).collect();
    assert_eq!(ids[0..3], ids[3..6]);
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
    assert_eq!(pool.get_at(4), pool.get_at(1));
}

#[test]
fn streams_are_equal_only_to_their_clones() {
    let d = Device::host();
    let a = Stream::new(&d).unwrap();
    assert_eq!(a, a.clone());
    assert_ne!(a, Stream::new(&d).unwrap());
    assert_eq!(a.device(), &d);
}

/// A per-thread default stream is a different stream on each thread under one id (on CUDA its
/// handle names the calling thread's stream): every operation from another thread than the one
/// that got it is refused with both threads named, and a buffer it owns is not freed from there
/// (a deferred error, the memory leaked) rather than on another thread's stream. Failed before
/// the check: every call went through (the host emulation ran it on the first thread's queue).
#[test]
fn a_per_thread_default_stream_refuses_other_threads() {
    use crate::{CudaResource, DeviceBuffer};

    let device = Device::host_with(HostConfig::default());
    let mine = Stream::per_thread_default(&device).unwrap();
    let mr = CudaResource::new(&device).unwrap();
    let mut buf = DeviceBuffer::try_new(64, &mine, mr).unwrap();
    buf.fill(1).unwrap();
    let done = mine.record().unwrap();
    let home = std::thread::current().id();
    let other = Stream::new(&device).unwrap();
    let (d, theirs) = (device.clone(), mine.clone());
    std::thread::Builder::new()
        .name("elsewhere".into())
        .spawn(move || {
            let check = |what: &str, result: Result<(), Error>| match result {
                Err(Error::WrongThread {
                    home: h,
                    current,
                    current_name,
                    device: dev,
                    ..
                }) => {
                    assert_eq!((h, current), (home, std::thread::current().id()), "{what}");
                    assert_eq!(
                        (current_name.as_str(), dev),
                        ("elsewhere", d.id()),
                        "{what}"
                    );
                }
                other => panic!("{what}: expected WrongThread, got {other:?}"),
            };
            check("record", theirs.record().map(drop));
            check("wait", theirs.wait(&done));
            check("wait_stream", other.wait_stream(&theirs));
            check("delay", theirs.enqueue_delay(Duration::from_millis(1)));
            check("host fn", theirs.launch_host_fn(|| {}));
            check("synchronize", theirs.synchronize_blocking());
            check("fill", buf.fill(2));
            let err = Stream::per_thread_default(&d).unwrap().record().map(drop);
            assert!(
                err.is_ok(),
                "this thread's own per-thread stream works: {err:?}"
            );
            drop(buf);
            check("free", d.take_deferred_error().map_or(Ok(()), Err));
            // Reading the error needs no driver call, and events travel.
            assert!(done.clone().is_complete().is_ok());
        })
        .unwrap()
        .join()
        .unwrap();
    mine.synchronize_blocking().unwrap();
    assert_eq!(
        device.host_controls().unwrap().live_allocations(),
        1,
        "leaked, not freed"
    );
}
