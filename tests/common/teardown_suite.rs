//! Teardown in every order: resources dropped before their buffers, the device handle before
//! its streams, streams with work and stream-ordered frees still queued, a tokio runtime shut
//! down while its tasks wait for memory, a panic inside a waiting task, adaptor chains dropped
//! in any order, and process exit with live buffers and pending frees.
//!
//! Every scenario runs in a child process: the test binary runs itself again with
//! `--exact <this test>` and [`CHILD_ENV`] naming the test, and the parent waits with a
//! timeout, so a hang is killed and fails the test instead of stalling the suite, and a crash
//! (an abort, a double panic) shows as the child's exit status. What the scenarios expect:
//! - nothing hangs (the parent's timeout) and nothing crashes (the exit status);
//! - no driver call after the device is gone (on the host backend:
//!   [`HostControls::calls_after_teardown`] is 0 once its last handle dropped), and its stream
//!   workers and poller threads end (the process's `streamalloc-*` threads, Linux);
//! - memory comes back (the host device's allocations reach 0), and a leak is reported as the
//!   typed deferred error [`Error::Leaked`] where the crate promises it, and nothing else is.
//!
//! `teardown_suite!` instantiates it for one device kind.

use std::future::Future;
use std::io::Read;
use std::pin::pin;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use streamalloc::{
    ArenaResource, CudaAsyncResource, CudaResource, Device, DeviceBuffer, Error, FixedSizeResource,
    HostControls, LoggingAdaptor, MemoryResource, PoolResource, SharedResource, StatisticsAdaptor,
    Stream, TrackingAdaptor,
};

/// The environment variable that tells a test it runs as the child of itself: its value is the
/// test's full name.
pub const CHILD_ENV: &str = "STREAMALLOC_TEARDOWN_CHILD";

/// What the child prints when its scenario has run to its end (or to its deliberate exit), so
/// that a filter that matched no test cannot pass for a clean run.
const DONE: &str = "teardown scenario done:";

/// How long a child may run before it counts as hung.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a scenario waits for the device to go away, its memory to come back or its
/// threads to end.
const SETTLE: Duration = Duration::from_secs(10);

/// What a child process did.
#[derive(Debug)]
pub struct ChildRun {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// The wall clock when the parent saw the child end (within its 10 ms polling).
    pub exited: std::time::SystemTime,
}

impl ChildRun {
    /// Panics, showing the child's output, unless the child exited with 0 after printing
    /// `DONE`.
    fn assert_clean(&self, test: &str) {
        assert!(
            self.status.success() && self.stdout.contains(&format!("{DONE} {test}")),
            "the child running {test} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        assert_no_crash(self);
    }
}

/// No abort on a panic during a panic, no panic in a drop that cannot unwind.
fn assert_no_crash(run: &ChildRun) {
    for sign in [
        "panicked while processing panic",
        "panic in a function that cannot unwind",
        "non-unwinding panic",
        "Aborted",
        "SIGSEGV",
    ] {
        assert!(
            !run.stderr.contains(sign),
            "the child crashed (`{sign}`):\n{}",
            run.stderr
        );
    }
}

/// The name the test harness knows a test by: `module_path` (of the test's module, e.g.
/// `host::teardown`) without the crate, then the function.
pub fn test_name(module_path: &str, function: &str) -> String {
    let module = module_path.split_once("::").map_or("", |(_, m)| m);
    if module.is_empty() {
        function.to_owned()
    } else {
        format!("{module}::{function}")
    }
}

/// True in the child that runs `test`.
pub fn is_child(test: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|v| v == test)
}

/// Runs `test` again in a child process of this test binary, waits up to `timeout`, and
/// returns what it did; a child still running at `timeout` is killed and fails the test.
pub fn run_child(test: &str, timeout: Duration) -> ChildRun {
    let exe = std::env::current_exe().expect("the test binary's path");
    let started = Instant::now();
    let mut child = Command::new(exe)
        .args([
            test,
            "--exact",
            "--nocapture",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, test)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the test binary");
    // Read both pipes on their own threads: a child that fills one must not block.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            break status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the child running {test} hung: killed after {timeout:?}\n--- stdout\n{}\n--- \
                 stderr\n{}",
                stdout.join().unwrap(),
                stderr.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    ChildRun {
        status,
        exited: std::time::SystemTime::now(),
        elapsed: started.elapsed(),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// In the child: runs `scenario` and says it is done. In the parent: runs the child and
/// checks that it ran to its end, exited with 0 and did not crash.
pub fn isolated(test: &str, scenario: impl FnOnce()) {
    if is_child(test) {
        scenario();
        done(test);
    } else {
        run_child(test, CHILD_TIMEOUT).assert_clean(test);
    }
}

/// Says (on stdout, flushed) that the child reached the end of `test`'s scenario.
fn done(test: &str) {
    use std::io::Write;
    println!("{DONE} {test}");
    std::io::stdout().flush().unwrap();
}

/// Polls `condition` until it holds or `SETTLE` passes; returns whether it held.
fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + SETTLE;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    condition()
}

/// The process's threads named by this crate (`streamalloc-host-stream-N`,
/// `streamalloc-poller`), by the names the kernel keeps (15 bytes). Empty off Linux.
fn crate_threads() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name.starts_with("streamalloc-"))
        .collect()
}

/// Checks, once every handle of the device the scenario used is dropped, that it is gone
/// and stays quiet: on the host backend, the device is torn down, no driver call comes after
/// that, its memory comes back (unless `leaked`), and its threads end. (A CUDA device lives
/// in the process's device table until exit: there the scenario's own checks are all.)
fn assert_torn_down(controls: Option<HostControls>, leaked: bool) {
    let Some(controls) = controls else { return };
    assert!(
        eventually(|| controls.is_torn_down()),
        "the device outlived its last handle by {SETTLE:?}: something keeps it alive"
    );
    if !leaked {
        assert!(
            eventually(|| controls.live_allocations() == 0),
            "device memory never came back: {controls:?}"
        );
    }
    assert!(
        eventually(|| crate_threads().is_empty()),
        "threads of the device still run after its teardown: {:?}",
        crate_threads()
    );
    assert_eq!(
        controls.calls_after_teardown(),
        0,
        "driver calls were made after the device was torn down"
    );
}

/// Takes every deferred error of `device`.
fn deferred_errors(device: &Device) -> Vec<Error> {
    std::iter::from_fn(|| device.take_deferred_error()).collect()
}

/// A pool of `cap` bytes at most, over device memory.
fn bounded_pool(device: &Device, cap: usize) -> PoolResource<CudaResource> {
    PoolResource::new(CudaResource::new(device).unwrap(), 0, Some(cap)).unwrap()
}

/// Fills `buf` with `value` and reads it back: the buffer still works.
fn check_contents(buf: &mut DeviceBuffer, value: u8) {
    buf.fill(value).unwrap();
    let host = futures::executor::block_on(buf.copy_to_host(vec![0u8; buf.len()])).unwrap();
    assert!(
        host.iter().all(|&b| b == value),
        "the buffer lost its contents"
    );
}

/// The user drops the pool (and its adaptor) while buffers from it live on: the buffers keep
/// it, still work, and free into it; when the last goes, the pool returns everything, with no
/// leak reported.
pub fn resource_dropped_before_its_buffers(device: Device) {
    let controls = device.host_controls().cloned();
    let s = Stream::new(&device).unwrap();
    let pool = bounded_pool(&device, 8 << 20);
    let stats = StatisticsAdaptor::new(pool.clone());
    let mut bufs: Vec<DeviceBuffer> = (0..4)
        .map(|_| DeviceBuffer::try_new(1 << 20, &s, stats.clone()).unwrap())
        .collect();
    drop((pool, stats));
    for (i, buf) in bufs.iter_mut().enumerate() {
        check_contents(buf, i as u8 + 1);
    }
    s.enqueue_delay(Duration::from_millis(20)).unwrap();
    drop(bufs); // frees pending behind the delay; the last one drops the pool
    s.synchronize_blocking().unwrap();
    assert_eq!(deferred_errors(&device), []);
    drop((s, device));
    assert_torn_down(controls, false);
}

/// A pool dropped with raw allocations still out leaks them rather than free memory someone
/// may use, and says so with [`Error::Leaked`] (their number and bytes); nothing else is
/// reported, and the device still goes away cleanly.
pub fn pool_dropped_with_allocations_out_reports_them(device: Device) {
    let controls = device.host_controls().cloned();
    let s = Stream::new(&device).unwrap();
    let pool = bounded_pool(&device, 8 << 20);
    let stats = StatisticsAdaptor::new(pool.clone());
    let _a = stats.try_allocate(1000, &s).unwrap();
    let _b = stats.try_allocate(1 << 20, &s).unwrap();
    let c = stats.try_allocate(4096, &s).unwrap();
    // SAFETY: `c` came from `stats` with this size and is freed once.
    unsafe { stats.deallocate(c, 4096, &s) };
    drop(stats);
    drop(pool);
    let errors = deferred_errors(&device);
    assert!(
        matches!(
            errors.as_slice(),
            [Error::Leaked { what: "PoolResource", allocations: 2, bytes, .. }]
                if *bytes == 1024 + (1 << 20)
        ),
        "expected one Leaked error for 2 allocations of 1024 + 1 MiB bytes, got {errors:?}"
    );
    drop((s, device));
    assert_torn_down(controls, true);
}

/// The other sub-allocators that promise it report raw allocations still out when dropped the
/// same way: one [`Error::Leaked`] each, naming the resource and the number of allocations.
pub fn sub_allocators_dropped_with_allocations_out_report_them(device: Device) {
    let controls = device.host_controls().cloned();
    let s = Stream::new(&device).unwrap();
    let fixed = FixedSizeResource::new(CudaResource::new(&device).unwrap(), 1 << 16, 4).unwrap();
    let arena = ArenaResource::new(CudaResource::new(&device).unwrap(), Some(16 << 20)).unwrap();
    let resources: [(&str, SharedResource); 2] = [
        ("FixedSizeResource", Arc::new(fixed)),
        ("ArenaResource", Arc::new(arena)),
    ];
    for (name, mr) in resources {
        let _a = mr.try_allocate(4096, &s).unwrap();
        let _b = mr.try_allocate(8192, &s).unwrap();
        let c = mr.try_allocate(4096, &s).unwrap();
        // SAFETY: `c` came from `mr` with this size and is freed once.
        unsafe { mr.deallocate(c, 4096, &s) };
        drop(mr);
        let errors = deferred_errors(&device);
        assert!(
            matches!(
                errors.as_slice(),
                [Error::Leaked { what, allocations: 2, .. }] if *what == name
            ),
            "expected one Leaked error of {name} for 2 allocations, got {errors:?}"
        );
    }
    drop((s, device));
    assert_torn_down(controls, true);
}

/// The user's device handle goes first: streams, resources and buffers keep the device, keep
/// working, and the device goes when the last of them does.
pub fn device_dropped_before_streams(device: Device) {
    let controls = device.host_controls().cloned();
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let mr = CudaResource::new(&device).unwrap();
    let pool = bounded_pool(&device, 4 << 20);
    drop(device);
    let mut a = DeviceBuffer::try_new(1 << 20, &s, mr).unwrap();
    let mut b = DeviceBuffer::try_new(1 << 20, &t, pool.clone()).unwrap();
    check_contents(&mut a, 7);
    b.copy_from_device(&a).unwrap();
    s.enqueue_delay(Duration::from_millis(30)).unwrap();
    let host = futures::executor::block_on(b.copy_to_host(vec![0u8; 1 << 20])).unwrap();
    assert!(host.iter().all(|&x| x == 7));
    let device = s.device().clone();
    drop((a, b));
    drop(s); // streams before the pool that holds one of them
    drop(t);
    drop(pool);
    assert_eq!(deferred_errors(&device), []);
    drop(device);
    assert_torn_down(controls, false);
}

/// Streams dropped while work and stream-ordered frees are still queued on them: the queued
/// work runs, the frees take effect, a pool keeps a stream whose free memory it holds, and
/// another stream takes that memory safely (after the dropped stream's work).
pub fn streams_dropped_with_work_and_pending_frees(device: Device) {
    let controls = device.host_controls().cloned();
    let pool = bounded_pool(&device, 2 << 20);
    let s = Stream::new(&device).unwrap();
    // Direct device memory, freed behind a delay on a stream nobody holds any more.
    let mut raw = DeviceBuffer::try_new(1 << 20, &s, CudaResource::new(&device).unwrap()).unwrap();
    raw.fill(1).unwrap();
    // And driver-pool memory (`cuMemFreeAsync` on a stream that is then destroyed).
    let mut driver_pooled =
        DeviceBuffer::try_new(1 << 20, &s, CudaAsyncResource::new(&device).unwrap()).unwrap();
    driver_pooled.fill(2).unwrap();
    // Pool memory, written late on `s` and freed there.
    let mut pooled = DeviceBuffer::try_new(2 << 20, &s, pool.clone()).unwrap();
    s.enqueue_delay(Duration::from_millis(50)).unwrap();
    pooled.fill(0xaa).unwrap();
    drop((raw, driver_pooled, pooled));
    drop(s);
    // The whole pool is pending on the dropped stream: another stream gets it, ordered after
    // the fill, and sees the fill's bytes before its own.
    let t = Stream::new(&device).unwrap();
    let reused = DeviceBuffer::try_new(2 << 20, &t, pool.clone())
        .expect("memory freed on a dropped stream is reusable by another stream");
    let host = futures::executor::block_on(reused.copy_to_host(vec![0u8; 2 << 20])).unwrap();
    assert!(
        host.iter().all(|&x| x == 0xaa),
        "the other stream took the memory before the dropped stream's queued work ran"
    );
    drop(reused);
    drop(t);
    drop(pool);
    assert_eq!(deferred_errors(&device), []);
    drop(device);
    assert_torn_down(controls, false);
}

/// A multi-thread tokio runtime shut down while its tasks wait for memory of a bounded pool,
/// for an event, and for a copy: shutdown does not hang, every waiter leaves the queue
/// (counted as cancelled), nothing stays reserved (the pool serves its whole capacity at
/// once afterwards), and nothing leaks.
pub fn runtime_shut_down_while_tasks_wait(device: Device) {
    const WAITERS: usize = 8;
    let controls = device.host_controls().cloned();
    let pool = bounded_pool(&device, 1 << 20);
    let s = Stream::new(&device).unwrap();
    let held = DeviceBuffer::try_new(1 << 20, &s, pool.clone()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    for i in 0..WAITERS {
        let (s, pool) = (s.clone(), pool.clone());
        rt.spawn(async move {
            let b = DeviceBuffer::new((i + 1) << 16, &s, pool).await;
            unreachable!("served from a full pool: {b:?}");
        });
    }
    // Tasks awaiting device work: an event and a copy behind a long delay.
    let busy = Stream::new(&device).unwrap();
    let mr = CudaResource::new(&device).unwrap();
    let copied = DeviceBuffer::try_new(1 << 16, &busy, mr).unwrap();
    busy.enqueue_delay(Duration::from_millis(300)).unwrap();
    let on_busy = busy.clone();
    rt.spawn(async move { on_busy.synchronize().await });
    rt.spawn(async move { copied.copy_to_host(vec![0u8; 1 << 16]).await });
    assert!(
        eventually(|| pool.memory_stats().wait_queue.waiting == WAITERS),
        "the waiters never queued: {:?}",
        pool.memory_stats().wait_queue
    );
    rt.shutdown_timeout(SETTLE);
    let queue = pool.memory_stats().wait_queue;
    assert_eq!(queue.waiting, 0, "waiters of dropped tasks still queue");
    assert_eq!(queue.cancellations, WAITERS as u64);
    drop(held);
    let whole = DeviceBuffer::try_new(1 << 20, &s, pool.clone())
        .expect("the pool's whole capacity is free once the holder and the waiters are gone");
    drop(whole);
    busy.synchronize_blocking().unwrap();
    drop((s, busy, pool));
    assert_eq!(deferred_errors(&device), []);
    drop(device);
    assert_torn_down(controls, false);
}

/// A task panics while its allocation waits in the queue: the unwinding drops the waiting
/// future and the buffers the task held, so the next waiter in line is served, and the
/// runtime and the pool go on. (Were the panicking waiter left in the queue, or handed the
/// memory and dropped it, the next one would wait for ever: the parent's timeout.)
pub fn panic_inside_a_waiting_task(device: Device) {
    let controls = device.host_controls().cloned();
    let pool = bounded_pool(&device, 1 << 20);
    let s = Stream::new(&device).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let held = DeviceBuffer::try_new(1 << 20, &s, pool.clone()).unwrap();
    let queued = Arc::new(AtomicBool::new(false));
    let panicking = rt.spawn({
        let (s, pool, queued) = (s.clone(), pool.clone(), queued.clone());
        async move {
            // Holds a buffer of another resource too: the unwinding frees it.
            let _mine = DeviceBuffer::new(4096, &s, CudaResource::new(s.device()).unwrap())
                .await
                .unwrap();
            let mut waiting = pin!(DeviceBuffer::new(1 << 20, &s, pool));
            let mut polls = 0;
            std::future::poll_fn(|cx| -> Poll<()> {
                polls += 1;
                if let Poll::Ready(b) = waiting.as_mut().poll(cx) {
                    panic!("served from a full pool: {b:?}");
                }
                if polls == 1 {
                    queued.store(true, Ordering::Release);
                    cx.waker().wake_by_ref(); // poll again: then it panics, still waiting
                    return Poll::Pending;
                }
                panic!("deliberate panic in a waiting task");
            })
            .await
        }
    });
    assert!(eventually(|| queued.load(Ordering::Acquire)));
    let outcome = rt.block_on(panicking);
    assert!(outcome.as_ref().is_err_and(|e| e.is_panic()), "{outcome:?}");
    assert_eq!(pool.memory_stats().wait_queue.waiting, 0);
    // The next in line is served when the holder frees.
    let next = rt.spawn({
        let (s, pool) = (s.clone(), pool.clone());
        async move { DeviceBuffer::new(1 << 20, &s, pool).await.map(drop) }
    });
    assert!(eventually(|| pool.memory_stats().wait_queue.waiting == 1));
    drop(held);
    rt.block_on(next).unwrap().unwrap();
    drop(rt);
    s.synchronize_blocking().unwrap();
    drop((s, pool));
    assert_eq!(deferred_errors(&device), []);
    drop(device);
    assert_torn_down(controls, false);
}

/// Handles to every layer of a chain (logging over tracking over statistics over a pool),
/// dropped in each of the 24 orders while buffers from the top live, and the buffers last: no
/// leak reported, every allocation freed, the tracking and statistics layers back to zero
/// while they still have a holder.
pub fn adaptor_chains_dropped_in_any_order(device: Device) {
    let controls = device.host_controls().cloned();
    let s = Stream::new(&device).unwrap();
    for order in permutations(4) {
        let pool = bounded_pool(&device, 4 << 20);
        let stats = StatisticsAdaptor::new(pool.clone());
        let tracking = TrackingAdaptor::new(stats.clone());
        let logging = LoggingAdaptor::to_writer(tracking.clone(), std::io::sink()).unwrap();
        let mut bufs: Vec<DeviceBuffer> = (1..=3)
            .map(|i| DeviceBuffer::try_new(i << 16, &s, logging.clone()).unwrap())
            .collect();
        let (probe_stats, probe_tracking) = (stats.clone(), tracking.clone());
        let mut handles: Vec<Option<Box<dyn std::any::Any>>> = vec![
            Some(Box::new(pool)),
            Some(Box::new(stats)),
            Some(Box::new(tracking)),
            Some(Box::new(logging)),
        ];
        for &i in &order {
            handles[i] = None;
            // Dropping a handle changes nothing for the buffers.
            check_contents(&mut bufs[i % 3], i as u8);
        }
        drop(bufs);
        assert_eq!(probe_tracking.outstanding_count(), 0, "order {order:?}");
        assert_eq!(probe_stats.memory_stats().allocated_bytes, Some(0));
        drop((probe_stats, probe_tracking));
        assert_eq!(deferred_errors(&device), [], "order {order:?}");
    }
    s.synchronize_blocking().unwrap();
    drop((s, device));
    assert_torn_down(controls, false);
}

/// The device goes while its completion poller still watches events that no one awaits any
/// more (their futures were dropped before the device passed them): the poller stops with the
/// device and queries none of them after it. Repeated, since the poller spins between
/// queries and a window between the two is hit only sometimes. On CUDA the device outlives
/// the scenario (the process keeps it), so there it checks only that nothing hangs.
pub fn device_dropped_while_the_poller_watches(make: fn() -> Device) {
    for round in 0..200 {
        let device = make();
        device.set_completion_strategy(streamalloc::CompletionStrategy::Poller);
        let controls = device.host_controls().cloned();
        let s = Stream::new(&device).unwrap();
        s.enqueue_delay(Duration::from_millis(10)).unwrap();
        let mut event = s.record().unwrap();
        let waker = futures::task::noop_waker();
        // Pending arms the poller (on a loaded machine the delay may be over already).
        let _ = std::pin::Pin::new(&mut event).poll(&mut std::task::Context::from_waker(&waker));
        drop((event, s, device));
        if let Some(controls) = controls {
            assert!(eventually(|| controls.is_torn_down()));
            assert!(
                eventually(|| crate_threads().is_empty()),
                "round {round}: {:?}",
                crate_threads()
            );
            assert_eq!(controls.calls_after_teardown(), 0, "round {round}");
        }
    }
}

/// Every order of `0..n`.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for rest in permutations(n - 1) {
        for at in 0..=rest.len() {
            let mut p = rest.clone();
            p.insert(at, n - 1);
            all.push(p);
        }
    }
    all
}

/// How long the work queued at exit would keep a stream busy on the host backend: far past
/// the parent's timeout for the exit scenarios, so an exit that waited for it would be killed
/// as hung.
const WORK_AT_EXIT: Duration = Duration::from_secs(120);
/// The same on CUDA: short enough that an exit which waits for the running kernel still ends
/// well within the parent's timeout. Whether the CUDA driver lets a process exit while one of
/// its kernels runs is the driver's behaviour, not the crate's (the crate makes no driver call
/// at exit); the exit scenarios print how long the exit took after the scenario's end, next
/// to the device work still queued then, so a run shows which it is.
const WORK_AT_EXIT_CUDA: Duration = Duration::from_secs(5);
/// The parent's timeout for the exit scenarios.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// What a child of an exit scenario prints at the end of its scenario: the wall clock (ns
/// since the Unix epoch), the device work still queued (ns) and the backend (`host`, `cuda`).
const EXIT_CLOCK: &str = "teardown exit clock:";

/// Leaves everything live and busy: buffers (some leaked for good), stream-ordered frees
/// queued behind long work, tasks and a thread waiting on a full pool, a pending copy.
/// Returns the instant the queued work ends.
///
/// Every call here returns at once on both backends: the frees left pending are stream-ordered
/// (a `CudaAsyncResource` buffer's `cuMemFreeAsync`, the pool's free list), never a
/// `CudaResource` free, which on CUDA waits for its stream (`cuStreamSynchronize` before
/// `cuMemFree`) and would block here behind the work.
fn busy_at_exit(device: &Device) -> Instant {
    let work = if device.host_controls().is_some() {
        WORK_AT_EXIT
    } else {
        WORK_AT_EXIT_CUDA
    };
    let pool = bounded_pool(device, 1 << 20);
    let s = Stream::new(device).unwrap();
    let held = DeviceBuffer::try_new(1 << 20, &s, pool.clone()).unwrap();
    // Resources whose frees stay queued: kept for good, so that no resource's own drop (a
    // pool giving its chunks back to a `CudaResource`) runs here either.
    let (small_pool, driver_pool) = (
        bounded_pool(device, 1 << 16),
        CudaAsyncResource::new(device).unwrap(),
    );
    let mut pooled = DeviceBuffer::try_new(1 << 16, &s, small_pool.clone()).unwrap();
    let driver_pooled = DeviceBuffer::try_new(1 << 16, &s, driver_pool.clone()).unwrap();
    std::mem::forget((small_pool, driver_pool));
    let mut live = DeviceBuffer::try_new(1 << 16, &s, CudaResource::new(device).unwrap()).unwrap();
    s.enqueue_delay(work).unwrap();
    let work_ends = Instant::now() + work;
    live.fill(1).unwrap();
    pooled.fill(2).unwrap();
    // Frees queued behind the long work.
    drop((pooled, driver_pooled));
    std::mem::forget(held);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    for _ in 0..4 {
        let (s, pool) = (s.clone(), pool.clone());
        rt.spawn(async move { DeviceBuffer::new(1 << 16, &s, pool).await });
    }
    rt.spawn(async move { live.copy_to_host(vec![0u8; 1 << 16]).await });
    std::thread::spawn({
        let (s, pool) = (s.clone(), pool.clone());
        move || pool.allocate_blocking(1 << 16, &s)
    });
    assert!(eventually(|| pool.memory_stats().wait_queue.waiting == 5));
    std::mem::forget(rt);
    work_ends
}

/// Says (on stdout, flushed) when the exit scenario ended and how much device work was left.
fn exit_clock(device: &Device, work_ends: Instant) {
    use std::io::Write;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let left = work_ends.saturating_duration_since(Instant::now());
    let backend = if device.host_controls().is_some() {
        "host"
    } else {
        "cuda"
    };
    println!(
        "{EXIT_CLOCK} {} {} {backend}",
        now.as_nanos(),
        left.as_nanos()
    );
    std::io::stdout().flush().unwrap();
}

/// Whether a process exit on CUDA waits for a kernel still running: the driver's behaviour,
/// not the crate's. On an H100 with driver 580.159.04 it did not (the process ended about 40 ms
/// after its scenario with 5 s of device work queued), so the exit scenarios assert that.
const CUDA_EXIT_WAITS_FOR_KERNELS: Option<bool> = Some(false);

/// Reads the child's [`exit_clock`] line, prints how long after it the process ended, next to
/// the device work left then, and checks it: on the host backend the exit must not wait for
/// the work (the stream workers are not joined); on CUDA as [`CUDA_EXIT_WAITS_FOR_KERNELS`]
/// says, once known.
fn check_exit_time(test: &str, run: &ChildRun) {
    let line = run
        .stdout
        .lines()
        .find_map(|l| Some(l.split_once(EXIT_CLOCK)?.1))
        .unwrap_or_else(|| panic!("the child printed no exit clock: {run:?}"));
    // The harness may print the test's name on the same line first.
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [at, left, backend] = fields[..] else {
        panic!("a malformed exit clock: {line}");
    };
    let at = std::time::UNIX_EPOCH + Duration::from_nanos(at.parse().unwrap());
    let left = Duration::from_nanos(left.parse().unwrap());
    let took = run.exited.duration_since(at).unwrap_or_default();
    let waited = took >= left;
    println!(
        "{test} ({backend}): the process ended {took:?} after its scenario, with {left:?} of \
         device work still queued then: the exit {} for it",
        if waited { "waited" } else { "did not wait" }
    );
    let expected = match backend {
        "host" => Some(false),
        _ => CUDA_EXIT_WAITS_FOR_KERNELS,
    };
    if let Some(expected) = expected {
        assert_eq!(
            waited, expected,
            "{test} ({backend}): the exit took {took:?} with {left:?} of device work queued"
        );
    }
}

/// `std::process::exit` while buffers live, stream-ordered frees are queued behind long
/// device work (two minutes on the host backend, 5 s on CUDA), and tasks and a thread wait for
/// memory: the process exits with the status it asked for and without a crash; on the host
/// backend at once, on CUDA as the driver does (see [`CUDA_EXIT_WAITS_FOR_KERNELS`]).
pub fn process_exit_with_live_buffers_and_pending_frees(test: &str, device: Device) {
    if is_child(test) {
        let work_ends = busy_at_exit(&device);
        exit_clock(&device, work_ends);
        done(test);
        std::process::exit(17);
    }
    let run = run_child(test, EXIT_TIMEOUT);
    assert_eq!(
        run.status.code(),
        Some(17),
        "exit status {} (not the 17 asked for):\n{}",
        run.status,
        run.stderr
    );
    assert!(run.stdout.contains(&format!("{DONE} {test}")), "{run:?}");
    assert_no_crash(&run);
    check_exit_time(test, &run);
}

/// The test returns (the harness then exits the process) with the same live state: the
/// harness's normal exit is not held up either, and the run passes.
pub fn process_exit_from_a_passing_test_with_live_state(test: &str, device: Device) {
    if is_child(test) {
        let work_ends = busy_at_exit(&device);
        exit_clock(&device, work_ends);
        done(test);
        return;
    }
    let run = run_child(test, EXIT_TIMEOUT);
    run.assert_clean(test);
    check_exit_time(test, &run);
}

/// A panic unwinds through live buffers, a dropped waiting allocation and queued frees on the
/// test's own thread: every drop on the way runs without a second panic (which would abort),
/// and the process fails with the panic's message, as a failing test does.
pub fn panic_unwinding_through_live_state(test: &str, device: Device) {
    if is_child(test) {
        let pool = bounded_pool(&device, 1 << 20);
        let s = Stream::new(&device).unwrap();
        let _held = DeviceBuffer::try_new(1 << 20, &s, pool.clone()).unwrap();
        s.enqueue_delay(Duration::from_millis(200)).unwrap();
        // A stream-ordered free (a `CudaResource` free would wait for the delay on CUDA).
        let _pending_free_on_unwind =
            DeviceBuffer::try_new(4096, &s, CudaAsyncResource::new(&device).unwrap()).unwrap();
        let mut waiting = Box::pin(DeviceBuffer::new(4096, &s, pool.clone()));
        let waker = futures::task::noop_waker();
        let polled = waiting
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker));
        assert!(polled.is_pending());
        done(test);
        panic!("deliberate panic with live state");
    }
    let run = run_child(test, CHILD_TIMEOUT);
    assert_eq!(
        run.status.code(),
        Some(101),
        "a panicking test exits with 101; got {}:\n{}",
        run.status,
        run.stderr
    );
    assert!(
        run.stderr.contains("deliberate panic with live state"),
        "{run:?}"
    );
    assert!(run.stdout.contains(&format!("{DONE} {test}")), "{run:?}");
    assert_no_crash(&run);
}

/// Instantiates the teardown suite for one device kind.
///
/// `teardown_suite!(name, device_expr, #[attrs]...)`: `device_expr` makes a fresh device for
/// each scenario (on the host backend, one whose teardown can be observed).
#[macro_export]
macro_rules! teardown_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::teardown_suite as suite;

            fn device() -> ::streamalloc::Device {
                $device
            }

            macro_rules! isolated {
                ($test:ident) => {
                    $(#[$attr])* #[test] fn $test() {
                        let name = suite::test_name(module_path!(), stringify!($test));
                        suite::isolated(&name, || suite::$test(device()))
                    }
                };
            }
            macro_rules! owns_its_child {
                ($test:ident) => {
                    $(#[$attr])* #[test] fn $test() {
                        let name = suite::test_name(module_path!(), stringify!($test));
                        // The child needs the device, the parent only the name.
                        let device = suite::is_child(&name).then(device);
                        suite::$test(&name, device.unwrap_or_else(::streamalloc::Device::host))
                    }
                };
            }

            isolated!(resource_dropped_before_its_buffers);
            isolated!(pool_dropped_with_allocations_out_reports_them);
            isolated!(sub_allocators_dropped_with_allocations_out_report_them);
            isolated!(device_dropped_before_streams);
            isolated!(streams_dropped_with_work_and_pending_frees);
            isolated!(runtime_shut_down_while_tasks_wait);
            isolated!(panic_inside_a_waiting_task);
            isolated!(adaptor_chains_dropped_in_any_order);
            $(#[$attr])* #[test] fn device_dropped_while_the_poller_watches() {
                let name = suite::test_name(module_path!(), "device_dropped_while_the_poller_watches");
                suite::isolated(&name, || suite::device_dropped_while_the_poller_watches(device))
            }
            owns_its_child!(process_exit_with_live_buffers_and_pending_frees);
            owns_its_child!(process_exit_from_a_passing_test_with_live_state);
            owns_its_child!(panic_unwinding_through_live_state);
        }
    };
}
