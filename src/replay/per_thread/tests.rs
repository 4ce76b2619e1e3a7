//! The per-thread replay: the same outcome as in order where the outcome does not depend on
//! the interleaving, frees after their allocations, waits that end, no hang.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::FxHashSet;

use crate::error::Result;
use crate::replay::*;
use crate::resource::{Availability, DevicePtr, MemoryResource, MemoryStats, Properties};
use crate::stream::Stream;
use crate::test_support::{host, SplitMix64, KIB, MIB};
use crate::{CudaResource, Device, LimitingAdaptor, PoolResource, StatisticsAdaptor};

fn per_thread() -> ReplayOptions {
    ReplayOptions {
        mode: ReplayMode::PerThread,
        ..ReplayOptions::default()
    }
}

fn log(rows: &[String]) -> String {
    let mut s = format!("{LOG_HEADER}\n");
    for r in rows {
        s.push_str(r);
        s.push('\n');
    }
    s
}

fn row(thread: u64, action: &str, ptr: u64, bytes: usize, stream: u64) -> String {
    let ptr = if ptr == 0 {
        "(nil)".to_owned()
    } else {
        format!("{ptr:#x}")
    };
    format!("{thread},00:00:00.000001,{action},{ptr},{bytes},{stream:#x}")
}

/// A consistent log of `threads` threads on two streams each, in a random schedule: frees of
/// any thread's live allocations (so many cross threads), 0-byte `(nil)` allocations, logged
/// failures, and a few allocations never freed.
fn random_log(seed: u64, threads: u64, events: usize) -> String {
    let mut rng = SplitMix64(seed);
    let mut live: Vec<(u64, usize)> = Vec::new();
    let mut next = 0x7f00_0000_0000u64;
    let mut rows = Vec::new();
    for _ in 0..events {
        let t = 1 + rng.below(threads as usize) as u64;
        let stream = t * 0x10 + rng.below(2) as u64;
        if !live.is_empty() && rng.below(100) < 45 {
            let (p, bytes) = live.swap_remove(rng.below(live.len()));
            rows.push(row(t, "free", p, bytes, stream));
            continue;
        }
        match rng.below(30) {
            0 => rows.push(row(t, "allocate failure", 0, 1 << 50, stream)),
            1 => {
                rows.push(row(t, "allocate", 0, 0, stream));
                live.push((0, 0));
            }
            _ => {
                let bytes = 1 + rng.below(64 * KIB);
                next += 0x10_0000;
                rows.push(row(t, "allocate", next, bytes, stream));
                live.push((next, bytes));
            }
        }
    }
    for (p, bytes) in live.split_off(live.len() / 2) {
        rows.push(row(1, "free", p, bytes, 0x10));
    }
    log(&rows)
}

fn run(text: &str, mr: &dyn MemoryResource, device: &Device, o: &ReplayOptions) -> ReplayReport {
    replay(EventReader::new(text.as_bytes()).unwrap(), mr, device, o).unwrap()
}

/// Where memory is plentiful the outcome does not depend on the interleaving: per thread, as in
/// order, every allocation and free is made, the same allocations are left at the end, and
/// the resource ends with nothing live; run again, the same.
#[test]
fn both_modes_agree_where_memory_is_plentiful() {
    for seed in [1, 2, 3] {
        let text = random_log(seed, 4, 2000);
        let (device, _) = host();
        let in_order = run(
            &text,
            &CudaResource::new(&device).unwrap(),
            &device,
            &ReplayOptions::default(),
        );
        assert!(in_order.is_clean(), "{in_order}");
        assert_eq!((in_order.mode, in_order.threads), (ReplayMode::InOrder, 1));
        for _ in 0..2 {
            let (device, _) = host();
            let mr = StatisticsAdaptor::new(
                PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap(),
            );
            let r = run(&text, &mr, &device, &per_thread());
            assert!(r.is_clean(), "{r}");
            assert_eq!(
                (r.mode, r.threads, r.streams),
                (ReplayMode::PerThread, 4, 8)
            );
            let figures = |r: &ReplayReport| {
                (
                    r.events,
                    r.allocations,
                    r.frees,
                    r.logged_failures,
                    r.refused,
                    r.streams,
                )
            };
            assert_eq!(figures(&r), figures(&in_order));
            assert_eq!(r.unfreed, in_order.unfreed);
            assert!(!r.unfreed.is_empty());
            assert_eq!(r.skipped, in_order.skipped);
            assert_eq!(mr.counters().bytes.value, 0, "all freed at the end");
            assert_eq!(mr.allocations_counter().total, r.allocations as i64);
            assert!(r.peak_live > 0);
            // The end's frees are no calls of the replay loop.
            assert_eq!(
                r.operations,
                r.allocations + r.frees - r.unfreed.len() as u64
            );
            assert_eq!(r.waits, 0);
        }
    }
}

/// Checks every free against the allocations made so far, and makes allocations of `SLOW`
/// bytes take a while, after the thread that allocates `START` bytes has begun.
#[derive(Debug)]
struct Checked {
    inner: CudaResource,
    live: Mutex<FxHashSet<u64>>,
    started: AtomicBool,
    bad_frees: AtomicUsize,
}

const SLOW: usize = 3 * KIB;
const START: usize = 5 * KIB;

// SAFETY: every pointer is one `inner` returned for the same request; the properties are its.
unsafe impl MemoryResource for Checked {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if bytes == SLOW {
            while !self.started.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let p = self.inner.try_allocate(bytes, stream)?;
        self.live.lock().insert(p.addr());
        self.started.fetch_or(bytes == START, Ordering::Release);
        Ok(p)
    }
    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if !self.live.lock().remove(&ptr.addr()) {
            self.bad_frees.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // SAFETY: the caller's contract; `ptr` is live in `inner`.
        unsafe { self.inner.deallocate(ptr, bytes, stream) }
    }
    fn properties(&self) -> Properties {
        self.inner.properties()
    }
}

/// A free logged on thread 2 of an allocation logged on thread 1 waits for it: thread 2
/// reaches the free while thread 1's allocation is still being made, parks, and frees the
/// pointer made, after it was made.
#[test]
fn a_free_on_another_thread_runs_after_its_allocation() {
    let text = log(&[
        row(2, "allocate", 0x2000, START, 0),
        row(1, "allocate", 0x1000, SLOW, 0),
        row(2, "free", 0x1000, SLOW, 0),
        row(2, "free", 0x2000, START, 0),
    ]);
    let (device, _) = host();
    let mr = Checked {
        inner: CudaResource::new(&device).unwrap(),
        live: Mutex::default(),
        started: AtomicBool::new(false),
        bad_frees: AtomicUsize::new(0),
    };
    let r = run(&text, &mr, &device, &per_thread());
    assert_eq!(
        mr.bad_frees.load(Ordering::Relaxed),
        0,
        "a free ran before its allocation"
    );
    assert!(mr.live.lock().is_empty());
    assert_eq!((r.allocations, r.frees, r.threads), (2, 2, 2));
    // Thread 2 got to the free within the 200 ms thread 1's allocation took.
    assert_eq!(r.free_waits, 1, "{r:?}");
    assert!(r.elapsed >= Duration::from_millis(200));
}

/// A `LimitingAdaptor` whose first free waits until an allocation waits in its queue, so
/// that the replay's second allocation surely finds the budget spent.
#[derive(Debug)]
struct HoldFirstFree {
    inner: LimitingAdaptor<CudaResource>,
    freed: AtomicBool,
}

// SAFETY: every pointer is one `inner` returned for the same request; the properties are its.
unsafe impl MemoryResource for HoldFirstFree {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        self.inner.try_allocate(bytes, stream)
    }
    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if !self.freed.swap(true, Ordering::AcqRel) {
            let queue = self
                .inner
                .availability()
                .expect("a limit makes requests wait");
            let give_up = Instant::now() + Duration::from_secs(10);
            while queue.stats().waiting == 0 && Instant::now() < give_up {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { self.inner.deallocate(ptr, bytes, stream) }
    }
    fn availability(&self) -> Option<&Availability> {
        self.inner.availability()
    }
    fn capacity_limit(&self) -> Option<usize> {
        self.inner.capacity_limit()
    }
    fn may_regain_memory(&self, bytes: usize) -> bool {
        self.inner.may_regain_memory(bytes)
    }
    fn memory_stats(&self) -> MemoryStats {
        self.inner.memory_stats()
    }
    fn properties(&self) -> Properties {
        self.inner.properties()
    }
}

fn two_threads_of_one_mib() -> String {
    log(&[
        row(1, "allocate", 0x1000_0000, MIB, 0),
        row(2, "allocate", 0x2000_0000, MIB, 0),
        row(1, "free", 0x1000_0000, MIB, 0),
        row(2, "free", 0x2000_0000, MIB, 0),
    ])
}

/// Two threads that each hold 1 MiB, under a 1 MiB limit: in order the second allocation is
/// refused (the log has both live at once); per thread, whichever thread comes second waits
/// for the other's free and is served: a wait, with its time, and no failure.
#[test]
fn threads_wait_for_each_others_frees_under_a_limit() {
    let text = two_threads_of_one_mib();
    let (device, _) = host();
    let limited = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), MIB);
    let in_order = run(&text, &limited, &device, &ReplayOptions::default());
    assert_eq!(
        (in_order.allocations, in_order.refused, in_order.waits),
        (1, 1, 0)
    );

    let mr = HoldFirstFree {
        inner: LimitingAdaptor::new(CudaResource::new(&device).unwrap(), MIB),
        freed: AtomicBool::new(false),
    };
    let r = run(&text, &mr, &device, &per_thread());
    assert_eq!(
        (r.allocations, r.frees, r.refused, r.waits),
        (2, 2, 0, 1),
        "{r}"
    );
    assert!(r.waited > Duration::ZERO);
    assert!(r.is_clean());
    assert_eq!(r.peak_live, MIB, "never both at once");
    assert_eq!(mr.inner.allocated_bytes(), 0);
}

/// A wait that cannot end is a counted failure with its line once its deadline passes, not a
/// hang: thread 1 waits for memory that thread 2 frees only after a free of an allocation
/// thread 1 makes later.
#[test]
fn a_wait_past_its_deadline_is_a_failure() {
    let text = log(&[
        row(2, "allocate", 0x1000_0000, MIB, 0),
        row(2, "allocate", 0x3000, 256, 0),
        row(1, "free", 0x3000, 256, 0),
        row(1, "allocate", 0x2000_0000, MIB, 0),
        row(1, "allocate", 0x4000, 256, 0),
        row(2, "free", 0x4000, 256, 0),
        row(2, "free", 0x1000_0000, MIB, 0),
        row(1, "free", 0x2000_0000, MIB, 0),
    ]);
    let (device, _) = host();
    let limited = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), MIB + 256);
    let options = ReplayOptions {
        wait_timeout: Duration::from_millis(100),
        ..per_thread()
    };
    let r = run(&text, &limited, &device, &options);
    assert_eq!(
        (r.allocations, r.refused, r.frees, r.waits),
        (3, 1, 3, 0),
        "{r}"
    );
    // Thread 2 surely waited for 0x4000 (thread 1 may have found 0x3000 made already).
    assert!((1..=2).contains(&r.free_waits), "{r:?}");
    assert!(r.waited >= Duration::from_millis(100));
    assert_eq!(r.failures.len(), 1);
    assert_eq!(r.failures[0].line, 5);
    assert!(
        matches!(r.failures[0].kind, ReplayFailureKind::AllocationFailed(crate::Error::Timeout { requested, .. }) if requested == MIB),
        "{}",
        r.failures[0]
    );
    assert_eq!(limited.allocated_bytes(), 0);
}

/// A bounded resource far below the log's peak: the threads wait for each other's memory and
/// for each other's allocations, every wait ends (served or refused at its deadline), and
/// nothing is left allocated.
#[test]
fn a_bounded_replay_of_many_threads_finishes() {
    let text = random_log(7, 6, 3000);
    let (device, _) = host();
    let summary = scan_log(
        EventReader::new(text.as_bytes()).unwrap(),
        &ReplayOptions::default(),
    )
    .unwrap();
    let limited = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), summary.peak_live / 3);
    // Short: some 500 of the waits end refused, and their deadlines are most of the run's
    // time. The outcome checked below holds for any deadline (at 10 ms as many waits are
    // refused as at 50 ms, and more are served).
    let options = ReplayOptions {
        wait_timeout: Duration::from_millis(10),
        ..per_thread()
    };
    let started = Instant::now();
    let r = run(&text, &limited, &device, &options);
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(r.allocations + r.refused, summary.allocations, "{r}");
    assert_eq!(r.failure_count(), r.refused);
    assert!(r.peak_live <= summary.peak_live / 3 + 256 * 3000);
    assert_eq!(limited.allocated_bytes(), 0);
}

/// Logged threads past the cap run on one shared thread, counted; the outcome is the same.
#[test]
fn threads_past_the_cap_share_one_thread() {
    let text = random_log(4, 5, 500);
    let (device, _) = host();
    let all = run(
        &text,
        &CudaResource::new(&device).unwrap(),
        &device,
        &per_thread(),
    );
    let capped = ReplayOptions {
        max_threads: 2,
        ..per_thread()
    };
    let r = run(
        &text,
        &CudaResource::new(&device).unwrap(),
        &device,
        &capped,
    );
    assert_eq!((all.threads, r.threads), (5, 3));
    let mut first_two = Vec::new();
    let mut past = 0;
    for e in EventReader::new(text.as_bytes())
        .unwrap()
        .map(Result::unwrap)
    {
        if !first_two.contains(&e.thread) && first_two.len() < 2 {
            first_two.push(e.thread);
        }
        past += u64::from(!first_two.contains(&e.thread));
    }
    assert_eq!(r.skipped.threads_over_limit, past);
    assert!(past > 0);
    assert_eq!(
        (r.allocations, r.frees, &r.unfreed),
        (all.allocations, all.frees, &all.unfreed)
    );
    assert!(r.to_string().contains("ran on one shared thread"), "{r}");
}

/// The recording pass per thread: a timeline at the replay's own times, and the pool's
/// snapshot right after the log's peak line.
#[test]
fn a_recording_pass_per_thread_keeps_its_timeline_and_snapshot() {
    let text = random_log(5, 3, 600);
    let summary = scan_log(
        EventReader::new(text.as_bytes()).unwrap(),
        &ReplayOptions::default(),
    )
    .unwrap();
    let (device, _) = host();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
    let options = ReplayOptions {
        record: true,
        snapshot_line: Some(summary.peak_line),
        ..per_thread()
    };
    let r = run(&text, &pool, &device, &options);
    assert!(r.peak_snapshot.is_some() && r.peak_fragmentation.is_some());
    assert!(r.timeline_at_peak.is_some());
    let timeline = r.timeline.unwrap();
    assert!(timeline.peak_live_bytes() > 0);
    assert!(r.peak_reserved >= r.peak_live);
}

/// A resource that panics in one thread ends the replay with its panic, not a hang of the
/// thread that waits for that thread's allocation.
#[test]
fn a_panicking_resource_ends_the_replay() {
    #[derive(Debug)]
    struct Panicky(CudaResource);
    // SAFETY: forwards `CudaResource`, or panics.
    unsafe impl MemoryResource for Panicky {
        fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
            assert_ne!(bytes, 777, "the resource broke");
            self.0.try_allocate(bytes, stream)
        }
        unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
            // SAFETY: the caller's contract, forwarded.
            unsafe { self.0.deallocate(ptr, bytes, stream) }
        }
        fn properties(&self) -> Properties {
            self.0.properties()
        }
    }
    let text = log(&[
        row(1, "allocate", 0x1000, 777, 0),
        row(2, "free", 0x1000, 777, 0),
    ]);
    let (device, _) = host();
    let mr = Panicky(CudaResource::new(&device).unwrap());
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run(&text, &mr, &device, &per_thread())
    }));
    assert!(caught.is_err());
}

/// Strict mode refuses an inconsistent log per thread as in order, with the same line.
#[test]
fn strict_mode_refuses_as_in_order() {
    let text = log(&[
        row(1, "allocate", 0x1000, 256, 0),
        row(2, "free", 0x1000, 512, 0),
    ]);
    let (device, _) = host();
    let mr = CudaResource::new(&device).unwrap();
    let strict = |mode| ReplayOptions {
        strict: true,
        mode,
        ..ReplayOptions::default()
    };
    let reader = || EventReader::new(text.as_bytes()).unwrap();
    let a = replay(reader(), &mr, &device, &strict(ReplayMode::InOrder)).unwrap_err();
    let b = replay(reader(), &mr, &device, &strict(ReplayMode::PerThread)).unwrap_err();
    assert_eq!(a, b);
    assert!(matches!(b, ReplayError::Inconsistent { line: 3, .. }));
}
