//! A soak test of a bounded pool under pressure: 200 tokio tasks share one `PoolResource`
//! whose maximum is a third of what they hold at once (3× over-subscribed), for `SOAK_SECS`
//! seconds (default 60). Each task loops: it awaits a buffer (a fifth of the requests are
//! cancelled: half by a short deadline of the crate's own, half by the client dropping the
//! future), writes a pattern into it from the host, lets the stream work on it for a moment,
//! reads it back and checks every byte, and frees it (stream-ordered). Requests carry mixed
//! priorities (per task, from -1 to 2: higher is served first, and a waiter passed over by
//! enough serves of higher priority rises a level; see "Fairness" on `Availability`).
//!
//! It prints how many requests were served, timed out and cancelled, the wait for memory
//! (p50, p99, max, overall and per priority), the pool's peak and how many times a waiter rose
//! a level, and then checks that nothing leaked (no live allocation in the pool, 0 bytes
//! allocated in `memory_stats`, no deferred error; on the host backend, no device memory once
//! the pool is gone), that nothing deadlocked (every task finished before a watchdog
//! deadline), and that waits were fair: every priority was served, no request of any priority
//! waited past its 10 s deadline, and each priority's p99 wait is within `FAIRNESS` times the
//! top priority's p99 (or `FAIRNESS_FLOOR`, whichever is larger). It exits non-zero otherwise.
//!
//! ```sh
//! cargo run --release --example soak                # 60 s on CUDA device 0, else the host
//! SOAK_SECS=5 cargo run --release --example soak    # CI-sized
//! SOAK_AGE_STEP=0 cargo run --release --example soak # strict priorities: fails the fairness check
//! ```

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use streamalloc::{
    CudaAsyncResource, Device, DeviceBuffer, Error, MemoryResource, PoolResource,
    StatisticsAdaptor, StreamPool,
};

type Pool = PoolResource<CudaAsyncResource>;
type Mr = StatisticsAdaptor<Pool>;

const TASKS: usize = 200;
const STREAMS: usize = 8;
/// Each task's buffer size lies between these (256-byte multiples).
const MIN_BYTES: usize = 64 << 10;
const MAX_BYTES: usize = 1 << 20;
/// How much more the tasks hold at once than the pool's maximum.
const OVERSUBSCRIPTION: usize = 3;
/// The deadline of a request that is not meant to be cancelled. Waiters age, so no request of
/// any priority should reach it while memory keeps being freed: one that does fails the run.
const PATIENT: Duration = Duration::from_secs(10);
/// How many times the top priority's p99 wait any priority's p99 may be. The queue bounds
/// waits in serves: a waiter of priority `p` is served after at most `K · (P − p) + N` serves
/// (`K` the age step, 128 by default; `P` = 2 the top priority; `N` the waiters queued before
/// it, under 200 here), one of the top priority after at most `N`. On the host the top
/// priority's p99 is about 150 to 200 serves (50 to 80 ms at 2,600 serves a second) and the
/// lowest's about `3K` more, some 4 times as long; 8 leaves room for a queue whose length
/// varies. Strict priorities (`SOAK_AGE_STEP=0`) break it a hundredfold.
const FAIRNESS: f64 = 8.0;
/// The fairness bound's floor: when the top priority hardly waits (little pressure, a fast
/// device) a p99 of a few scheduler ticks is not unfair.
const FAIRNESS_FLOOR: Duration = Duration::from_millis(20);
/// Cancelled requests give up after a random time up to this.
const IMPATIENT: Duration = Duration::from_millis(2);
/// Device work per served request, at most (a random delay on its stream).
const WORK: Duration = Duration::from_millis(2);
/// How long after the soak's end every task must have finished.
const GRACE: Duration = Duration::from_secs(30);

/// What one task saw.
#[derive(Default)]
struct Tally {
    served: u64,
    timed_out: u64,
    starved: u64,
    cancelled: u64,
    /// Requests set to be cut short (a short deadline, or a client that drops them).
    impatient: u64,
    /// Waits for memory of served requests, in nanoseconds.
    waits: Vec<u64>,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> ExitCode {
    match soak().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn soak() -> Result<(), Box<dyn std::error::Error>> {
    let secs: u64 = match std::env::var("SOAK_SECS") {
        Ok(s) => s.parse().map_err(|e| format!("SOAK_SECS={s}: {e}"))?,
        Err(_) => 60,
    };
    let device = Device::default();
    println!(
        "device {} ({}, {} backend)",
        device.id(),
        device.name(),
        device.backend()
    );

    // Each task's demand, decided up front; the pool holds a third of their sum.
    let mut rng = SplitMix64(0x50a4);
    let demands: Vec<usize> = (0..TASKS)
        .map(|_| (MIN_BYTES + rng.below(MAX_BYTES - MIN_BYTES + 1)) / 256 * 256)
        .collect();
    let total: usize = demands.iter().sum();
    let cap = total / OVERSUBSCRIPTION / 256 * 256;
    let pool = PoolResource::new(CudaAsyncResource::new(&device)?, 0, Some(cap))?;
    if let Ok(k) = std::env::var("SOAK_AGE_STEP") {
        let k: u32 = k.parse().map_err(|e| format!("SOAK_AGE_STEP={k}: {e}"))?;
        // 0: strict priorities, to see what ageing changes.
        pool.availability()
            .expect("a bounded pool")
            .set_age_step(std::num::NonZeroU32::new(k));
    }
    let mr = StatisticsAdaptor::new(pool.clone());
    let streams = Arc::new(StreamPool::new(&device, STREAMS)?);
    println!(
        "{TASKS} tasks, {} KiB to {} KiB each, {} MiB at once over a pool of at most {} MiB \
         ({OVERSUBSCRIPTION}x over-subscribed), {STREAMS} streams, {secs} s",
        MIN_BYTES >> 10,
        MAX_BYTES >> 10,
        total >> 20,
        cap >> 20
    );

    // The last line of defence against a wedged runtime: a thread outside it ends the process.
    let deadline = Duration::from_secs(secs) + GRACE;
    let finished = Arc::new(AtomicU64::new(0));
    std::thread::spawn({
        let finished = finished.clone();
        move || {
            std::thread::sleep(deadline + GRACE);
            eprintln!(
                "soak FAILED: deadlock: the runtime did not finish within {:?} ({} of {TASKS} \
                 tasks done)",
                deadline + GRACE,
                finished.load(Ordering::Acquire)
            );
            std::process::exit(3);
        }
    });

    let started = Instant::now();
    let end = started + Duration::from_secs(secs);
    let tasks: Vec<_> = demands
        .iter()
        .enumerate()
        .map(|(i, &bytes)| {
            let (mr, streams, finished) = (mr.clone(), streams.clone(), finished.clone());
            let priority = (i % 4) as i32 - 1;
            tokio::spawn(async move {
                let tally = task(i, bytes, priority, mr, streams, end).await;
                finished.fetch_add(1, Ordering::AcqRel);
                tally.map(|t| (priority, t))
            })
        })
        .collect();

    // Zero deadlocks: every task finishes before the watchdog deadline.
    let mut by_priority: Vec<(i32, Tally)> = (-1..=2).map(|p| (p, Tally::default())).collect();
    let all = futures::future::join_all(tasks);
    let results = tokio::time::timeout(deadline, all).await.map_err(|_| {
        format!(
            "deadlock: {} of {TASKS} tasks still running {deadline:?} after the start",
            TASKS as u64 - finished.load(Ordering::Acquire)
        )
    })?;
    for result in results {
        let (priority, t) = result??;
        let into = &mut by_priority[(priority + 1) as usize].1;
        into.served += t.served;
        into.timed_out += t.timed_out;
        into.starved += t.starved;
        into.cancelled += t.cancelled;
        into.impatient += t.impatient;
        into.waits.extend(t.waits);
    }
    let elapsed = started.elapsed();
    for s in 0..STREAMS {
        streams.get_at(s).synchronize().await?;
    }

    let mut all = Tally::default();
    for (_, t) in &mut by_priority {
        t.waits.sort_unstable();
        all.served += t.served;
        all.timed_out += t.timed_out;
        all.starved += t.starved;
        all.cancelled += t.cancelled;
        all.impatient += t.impatient;
        all.waits.extend_from_slice(&t.waits);
    }
    all.waits.sort_unstable();
    let requests = all.served + all.timed_out + all.cancelled;
    println!(
        "{requests} requests in {:.1} s: served {}, timed out {} ({} of them not meant to), \
         cancelled {}; {} ({:.1} %) were set to be cut short, the rest of them were served \
         first",
        elapsed.as_secs_f64(),
        all.served,
        all.timed_out,
        all.starved,
        all.cancelled,
        all.impatient,
        all.impatient as f64 * 100.0 / requests.max(1) as f64
    );
    println!("wait for memory (served): {}", percentiles(&all.waits));
    for (p, t) in &by_priority {
        println!(
            "  priority {p:>2}: served {:>7}, timed out {:>5} ({:>4} past {PATIENT:?}), \
             cancelled {:>5}; wait {}",
            t.served,
            t.timed_out,
            t.starved,
            t.cancelled,
            percentiles(&t.waits)
        );
    }
    let stats = mr.memory_stats();
    let queue = stats.wait_queue;
    println!(
        "pool: peak {} MiB held of {} MiB allowed, peak {} MiB allocated; wait queue: {} waits, \
         {} timeouts, {} cancellations, {} rises a level by ageing (age step {})",
        stats.peak_reserved_bytes.unwrap_or(0) >> 20,
        cap >> 20,
        stats.peak_allocated_bytes.unwrap_or(0) >> 20,
        queue.waits,
        queue.timeouts,
        queue.cancellations,
        queue.promotions,
        pool.availability()
            .and_then(|a| a.age_step())
            .map_or("none".into(), |k| k.to_string()),
    );

    // Zero leaks.
    let mut failures = Vec::new();
    let pool_stats = pool.statistics();
    if pool_stats.live_allocations != 0 {
        failures.push(format!(
            "{} allocations live in the pool",
            pool_stats.live_allocations
        ));
    }
    if stats.allocated_bytes != Some(0) || stats.allocations != Some(0) {
        failures.push(format!(
            "memory_stats: {:?} bytes in {:?} allocations still allocated",
            stats.allocated_bytes, stats.allocations
        ));
    }
    if queue.waiting != 0 {
        failures.push(format!("{} waiters left in the queue", queue.waiting));
    }
    if stats.peak_reserved_bytes.unwrap_or(0) > cap {
        failures.push(format!("the pool held more than its maximum {cap}"));
    }
    failures.extend(unfair(&by_priority, all.served));
    while let Some(e) = device.take_deferred_error() {
        failures.push(format!("deferred error: {e}"));
    }
    drop((mr, pool));
    if let Some(controls) = device.host_controls() {
        device.synchronize().await?;
        if controls.allocated_bytes() != 0 {
            failures.push(format!(
                "{} bytes of device memory held after the pool is gone",
                controls.allocated_bytes()
            ));
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    println!("zero leaks, zero deadlocks, fair waits");
    Ok(())
}

/// What breaks the fairness bound, given each priority's tally (waits sorted, highest priority
/// last) and how many requests were served in all (memory was being freed when it is above 0):
/// a priority never served, a patient request that reached its deadline (of any priority:
/// waiters age, so none should), or a priority whose p99 wait is above `FAIRNESS` times the
/// top priority's p99 (or `FAIRNESS_FLOOR`).
fn unfair(by_priority: &[(i32, Tally)], served: u64) -> Vec<String> {
    let mut failures = Vec::new();
    if served == 0 {
        return failures;
    }
    let p99 = |t: &Tally| Duration::from_nanos(at(&t.waits, 99));
    let (top, highest) = by_priority.last().expect("priorities");
    let bound = p99(highest).mul_f64(FAIRNESS).max(FAIRNESS_FLOOR);
    println!(
        "fairness: every priority's p99 within {FAIRNESS}x the top priority's ({top}) p99 of \
         {:.3} ms, or {FAIRNESS_FLOOR:?}: at most {:.3} ms",
        p99(highest).as_secs_f64() * 1e3,
        bound.as_secs_f64() * 1e3
    );
    for (p, t) in by_priority {
        if t.served == 0 {
            failures.push(format!("priority {p} was never served"));
            continue;
        }
        if t.starved != 0 {
            failures.push(format!(
                "{} requests of priority {p} waited past {PATIENT:?}",
                t.starved
            ));
        }
        if p99(t) > bound {
            failures.push(format!(
                "priority {p} waited {:.3} ms at p99, over the fairness bound of {:.3} ms",
                p99(t).as_secs_f64() * 1e3,
                bound.as_secs_f64() * 1e3
            ));
        }
    }
    failures
}

/// One task: requests of `bytes` until `end`.
async fn task(
    index: usize,
    bytes: usize,
    priority: i32,
    mr: Mr,
    streams: Arc<StreamPool>,
    end: Instant,
) -> Result<Tally, Error> {
    let mut rng = SplitMix64(index as u64 + 1);
    let mut tally = Tally::default();
    let (mut outgoing, mut incoming) = (vec![0u8; bytes], vec![0u8; bytes]);
    let mut round = 0u64;
    while Instant::now() < end {
        round += 1;
        let stream = streams.get();
        let roll = rng.below(10);
        tally.impatient += u64::from(roll < 2);
        let asked = Instant::now();
        let request = DeviceBuffer::new(bytes, &stream, mr.clone()).priority(priority);
        let outcome = match roll {
            // A deadline of the crate's own that may cut the wait short.
            0 => request.timeout(rng.duration(IMPATIENT)).await,
            // The client drops the future (wherever it is) after a while.
            1 => {
                let give_up = tokio::time::sleep(rng.duration(IMPATIENT));
                tokio::select! {
                    got = request.timeout(PATIENT) => got,
                    _ = give_up => {
                        tally.cancelled += 1;
                        continue;
                    }
                }
            }
            _ => request.timeout(PATIENT).await,
        };
        let mut buf = match outcome {
            Ok(buf) => buf,
            Err(Error::Timeout { .. }) => {
                tally.timed_out += 1;
                // Only roll 0's short deadline is meant to pass; the others' is a starvation.
                tally.starved += u64::from(roll != 0);
                continue;
            }
            Err(e) => return Err(e),
        };
        tally.waits.push(asked.elapsed().as_nanos() as u64);
        tally.served += 1;

        // Write, work, read back, check: what the previous owner of the memory left must be
        // gone, and the stream's work must be ordered before the read.
        let pattern = (index as u64 * 31 + round) as u8;
        outgoing.fill(pattern);
        outgoing = buf.copy_from_host(outgoing).await?;
        stream.enqueue_delay(rng.duration(WORK))?;
        incoming = buf.copy_to_host(incoming).await?;
        if let Some(at) = incoming.iter().position(|&b| b != pattern) {
            return Err(Error::InvalidArgument(format!(
                "task {index}, round {round}: byte {at} reads {:#x}, not {pattern:#x}",
                incoming[at]
            )));
        }
        drop(buf); // stream-ordered free: the memory goes to the next in line
    }
    Ok(tally)
}

/// The `p`th percentile of sorted nanoseconds (0 when there are none).
fn at(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// `p50 .. p99 .. max` of sorted nanoseconds, in milliseconds.
fn percentiles(sorted: &[u64]) -> String {
    if sorted.is_empty() {
        return "none".into();
    }
    let ms = |n: u64| n as f64 / 1e6;
    format!(
        "p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        ms(at(sorted, 50)),
        ms(at(sorted, 99)),
        ms(*sorted.last().unwrap())
    )
}

/// SplitMix64: a deterministic plan without a dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn duration(&mut self, max: Duration) -> Duration {
        Duration::from_nanos(self.next() % max.as_nanos() as u64)
    }
}
