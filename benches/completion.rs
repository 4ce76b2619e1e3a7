//! The completion driver's benchmark: the figures that choose between
//! `CompletionStrategy::HostFunction`, `CompletionStrategy::Poller` and
//! `CompletionStrategy::FlagWrite`.
//!
//! For each strategy, on `Device::default()` (CUDA device 0, else the host emulation):
//! 1. Wake latency: an idle stream runs a 20 µs delay (a stand-in for a short kernel), an event
//!    is recorded after it and awaited, under a tokio current-thread runtime and under
//!    `futures::executor::block_on`. Timed from just after `record()` to the code after `.await`.
//!    A busy-spin `is_complete()` loop, timed from the same point, gives the kernel's own share;
//!    the difference of the medians is the notification overhead.
//! 2. Stream stall: 1,000 delays on one stream, (a) alone and (b) with an event recorded after
//!    each and all 1,000 awaited at once by tokio tasks, in two set-ups. *Gated*: 2 µs delays,
//!    the stream held behind a gate (an event of another stream) until everything is enqueued
//!    and armed, timed from the gate opening to the stream finishing: device time, not host
//!    enqueue time. This holds only if enqueueing and arming finish before the gate opens, which
//!    the report says per run. *Ungated*: 20 µs delays, long enough that the device, not the
//!    host, sets the pace, timed from the first enqueue to the stream finishing, so whatever
//!    arming costs the host or the stream shows.
//! 3. CPU cost: process CPU time per wall second while the main thread sleeps for 1 s, with no
//!    event pending and with one armed event pending behind a longer delay.
//!
//! 4. Free → waiting task: a full pool of 1 MiB, a task awaits all of it, the main thread frees
//!    the held block. (a) The crate's own part: free → the waiting future's waker called, the
//!    future polled by hand (no executor). (b) End to end on a 1-worker multi-thread tokio
//!    runtime: free → waker called → task resumed (`wake_latency` of benches/workloads.rs,
//!    with the waker stamped). (c) The executor's floor, measured the same way in the same run,
//!    interleaved with (b): a task awaiting a `tokio::sync::Notify`, woken by `notify_one`.
//!    (b) and (c) also run with the free 200 µs after the task queued, so that the worker is
//!    surely parked.
//!
//! Wake latency also runs with a 10 ms event kept pending (armed) on another stream and a 2 ms
//! pause before each iteration, so that the poller has backed off over the long event when the
//! short one is armed: the short event must not wait for that back-off; and with 1,008 events
//! armed on 16 other streams (63 each behind a 10 ms delay), so that the cost of what is
//! pending shows.
//!
//! Run: `cargo bench --features bench --bench completion` (or the built binary with `--bench`; other arguments
//! are ignored). Set `STREAMALLOC_BENCH_OUT=path.md` to also get the report as Markdown, and
//! `STREAMALLOC_BENCH_ONLY=wake` or `=free` (or `wake,free`) to run only those sections (no
//! stall, CPU or summary tables).

#[path = "common/report.rs"]
mod report;

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures::task::noop_waker_ref;
use futures::FutureExt;
use streamalloc::{
    CompletionStrategy, CudaResource, Device, Event, MemoryResource, PoolResource, Stream,
};

use report::{Report, Table};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const STRATEGIES: [(CompletionStrategy, &str); 3] = [
    (CompletionStrategy::HostFunction, "host-function"),
    (CompletionStrategy::Poller, "poller"),
    (CompletionStrategy::FlagWrite, "flag-write"),
];

/// Wake latency: measured iterations per series, after untimed warm-up ones.
const WAKE_ITERS: usize = 2_000;
const WAKE_WARMUP: usize = 50;
/// The stand-in for a short kernel.
const WAKE_KERNEL: Duration = Duration::from_micros(20);
/// A series stops early past this (its `n` says so), so a slow backend stays within a minute.
const WAKE_SERIES_BUDGET: Duration = Duration::from_secs(3);
/// The long event kept pending on another stream in the "beside a long event" cases.
const LONG_EVENT: Duration = Duration::from_millis(10);
/// The pause before each iteration of those cases.
const BESIDE_LONG_GAP: Duration = Duration::from_millis(2);
/// The "many armed events" case: this many streams, each with `MANY_PER_STREAM` armed events
/// pending behind a `LONG_EVENT` delay (1,008 in all).
const MANY_STREAMS: usize = 16;
const MANY_PER_STREAM: usize = 63;
/// Their delay: long enough that arming 1,008 events (host functions behind a busy stream make
/// the arming thread wait) ends before it does.
const MANY_DELAY: Duration = Duration::from_millis(100);

/// Stream stall: operations per run.
const STALL_OPS: usize = 1_000;
/// The gated set-up: each operation a delay of `STALL_OP`, the stream held by a `STALL_GATE`
/// delay on another stream until everything is enqueued and armed. (On an H100 under the
/// host-function strategy, enqueueing with 1,000 armed events lasted until the gate opened,
/// whether the gate was 50 or 250 ms: the ungated set-up measures that case.)
const STALL_OP: Duration = Duration::from_micros(2);
const STALL_GATE: Duration = Duration::from_millis(250);
/// The ungated set-up: each operation a delay of `STALL_OP_UNGATED`, longer than enqueueing
/// one operation and one event takes the host.
const STALL_OP_UNGATED: Duration = Duration::from_micros(20);
/// Runs of each variant, alternated; the median is reported.
const STALL_REPS: usize = 5;

/// CPU cost: the measured window, and the delay the busy case's event waits behind (longer than
/// the window, so the event stays pending throughout).
const CPU_WINDOW: Duration = Duration::from_secs(1);
const CPU_BUSY_DELAY: Duration = Duration::from_millis(1_200);

fn main() {
    // `--bench` (and anything else the bundle runner or cargo passes) is ignored.
    if let Err(e) = run() {
        eprintln!("completion bench failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), BoxError> {
    let started = Instant::now();
    let device = Device::default();
    let mut report = Report::new("streamalloc completion-driver benchmark");
    report.line(format!(
        "device: {} ({}); {} host CPUs; {} build",
        device.id(),
        device.name(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    ));
    eprintln!("completion bench on {} ({})", device.id(), device.name());

    let stream = Stream::new(&device)?;
    let gate_stream = Stream::new(&device)?;
    let only = std::env::var("STREAMALLOC_BENCH_ONLY").unwrap_or_default();
    let runs = |section: &str| only.is_empty() || only.split(',').any(|s| s.trim() == section);
    let mut summaries = Vec::new();
    if runs("wake") {
        report.line(format!(
            "wake latency: {WAKE_ITERS} iterations per series (fewer past {}s) of a {}µs delay; \
             timed from just after record() to the code after .await (spin: to is_complete() first \
             true); overhead = await p50 - spin p50",
            WAKE_SERIES_BUDGET.as_secs(),
            WAKE_KERNEL.as_micros(),
        ));
        report.line(format!(
            "stream stall: {STALL_OPS} ops, median of {STALL_REPS} runs; (b) records an event after \
             each op and awaits all of them in tokio tasks. gated: delays of {}µs, device time from \
             a {}ms gate opening to the stream's end (valid only where the gate held). ungated: \
             delays of {}µs, time from the first enqueue to the stream's end",
            STALL_OP.as_micros(),
            STALL_GATE.as_millis(),
            STALL_OP_UNGATED.as_micros(),
        ));
        report.line(format!(
            "CPU: process CPU time over a {}s window while the main thread sleeps; busy = one armed \
             event pending behind a {}ms delay",
            CPU_WINDOW.as_secs(),
            CPU_BUSY_DELAY.as_millis(),
        ));
        for (strategy, name) in STRATEGIES {
            device.set_completion_strategy(strategy);
            eprintln!("[{name}] wake latency ...");
            let wake = WakeResults::measure(&stream, &gate_stream)?;
            report.table(wake.table(name));
            if only.is_empty() {
                eprintln!("[{name}] stream stall ...");
                let stall = StallResults::measure(&stream, &gate_stream)?;
                eprintln!("[{name}] CPU cost ...");
                let cpu = CpuResults::measure(&stream)?;
                report.table(stall.table(name));
                report.table(cpu.table(name));
                summaries.push((name, wake, stall, cpu));
            }
        }
        device.set_completion_strategy(CompletionStrategy::default());
    }
    if !summaries.is_empty() {
        report.table(summary_table(&summaries));
    }
    if runs("free") {
        eprintln!("free → waiting task ...");
        let free = FreeResults::measure(&stream)?;
        report.table(free.table());
        let (p50, p99) = free.ratios(Duration::ZERO);
        let (p50_parked, p99_parked) = free.ratios(FREE_SETTLE);
        report.line(format!(
            "free → task resumed / Notify floor (goal ≤ 1.10): p50 {p50:.2}, p99 {p99:.2} \
             (at once); p50 {p50_parked:.2}, p99 {p99_parked:.2} (worker parked); crate's \
             part (a) p99 {} µs (goal ≤ 1)",
            fmt_us(pct(&free.crate_part, 99)),
        ));
    }

    report.line(format!(
        "total bench time: {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    report.publish()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 1. Wake latency

/// Polls an event, counting polls; bumps `armed` once its first poll is over (by then a pending
/// event has asked the completion driver for a wake-up).
struct Watched {
    event: Event,
    polls: u32,
    armed: Option<Arc<AtomicUsize>>,
}

impl Watched {
    fn new(event: Event, armed: Option<Arc<AtomicUsize>>) -> Self {
        Watched {
            event,
            polls: 0,
            armed,
        }
    }
}

impl Future for Watched {
    /// How many polls it took.
    type Output = streamalloc::Result<u32>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        this.polls += 1;
        let out = this.event.poll_unpin(cx);
        if this.polls == 1 {
            if let Some(armed) = &this.armed {
                armed.fetch_add(1, Ordering::Release);
            }
        }
        out.map(|r| r.map(|()| this.polls))
    }
}

/// Latencies of one series.
struct Series {
    samples: Vec<Duration>,
    /// Iterations whose event was already complete at the first poll (no wake-up involved).
    ready_at_first_poll: usize,
}

impl Series {
    /// Runs `one` for warm-up and then for `WAKE_ITERS` measured iterations, or fewer when the
    /// series outlasts `WAKE_SERIES_BUDGET`. `one` returns a latency and whether the event was
    /// complete at once.
    async fn collect<F>(mut one: impl FnMut() -> F) -> Result<Series, BoxError>
    where
        F: Future<Output = Result<(Duration, bool), BoxError>>,
    {
        for _ in 0..WAKE_WARMUP {
            one().await?;
        }
        let mut series = Series {
            samples: Vec::with_capacity(WAKE_ITERS),
            ready_at_first_poll: 0,
        };
        let start = Instant::now();
        while series.samples.len() < WAKE_ITERS && start.elapsed() < WAKE_SERIES_BUDGET {
            let (latency, at_once) = one().await?;
            series.samples.push(latency);
            series.ready_at_first_poll += usize::from(at_once);
        }
        series.samples.sort_unstable();
        Ok(series)
    }

    /// As [`collect`](Series::collect), for iterations that may be invalid (`None`: not
    /// counted); gives up after `WAKE_ITERS` invalid ones in a row.
    async fn collect_some<F>(mut one: impl FnMut() -> F) -> Result<Series, BoxError>
    where
        F: Future<Output = Result<Option<(Duration, bool)>, BoxError>>,
    {
        for _ in 0..WAKE_WARMUP {
            one().await?;
        }
        let mut series = Series {
            samples: Vec::with_capacity(WAKE_ITERS),
            ready_at_first_poll: 0,
        };
        let (start, mut invalid_in_a_row) = (Instant::now(), 0);
        while series.samples.len() < WAKE_ITERS
            && start.elapsed() < WAKE_SERIES_BUDGET
            && invalid_in_a_row < WAKE_ITERS
        {
            match one().await? {
                Some((latency, at_once)) => {
                    invalid_in_a_row = 0;
                    series.samples.push(latency);
                    series.ready_at_first_poll += usize::from(at_once);
                }
                None => invalid_in_a_row += 1,
            }
        }
        // No valid sample: the table says so ("-") instead of failing the whole bench.
        series.samples.sort_unstable();
        Ok(series)
    }

    /// Nearest-rank percentile, `p` in 1..=100.
    ///
    /// # Panics
    /// On a series without samples (see [`fmt_pct`]).
    fn percentile(&self, p: usize) -> Duration {
        let n = self.samples.len();
        let rank = (p * n).div_ceil(100).clamp(1, n);
        self.samples[rank - 1]
    }

    fn median(&self) -> Duration {
        self.percentile(50)
    }
}

/// `series` at percentile `p` in µs, or "-" when it has no sample.
fn fmt_pct(series: &Series, p: usize) -> String {
    if series.samples.is_empty() {
        "-".into()
    } else {
        fmt_us(series.percentile(p))
    }
}

/// `wake.overhead_at(series, p)` with one decimal, or "-" when the series has no sample.
fn fmt_overhead(wake: &WakeResults, series: &Series, p: usize) -> String {
    if series.samples.is_empty() {
        "-".into()
    } else {
        format!("{:.1}", wake.overhead_at(series, p))
    }
}

/// One awaited iteration: a short delay on the idle stream, an event after it, awaited.
async fn await_once(stream: &Stream) -> Result<(Duration, bool), BoxError> {
    stream.enqueue_delay(WAKE_KERNEL)?;
    let event = stream.record()?;
    let t0 = Instant::now();
    let polls = Watched::new(event, None).await?;
    Ok((t0.elapsed(), polls == 1))
}

/// One spinning iteration: the same, with `is_complete()` queried in a busy loop.
fn spin_once(stream: &Stream) -> Result<(Duration, bool), BoxError> {
    stream.enqueue_delay(WAKE_KERNEL)?;
    let event = stream.record()?;
    let t0 = Instant::now();
    let mut queries = 0u32;
    while !event.is_complete()? {
        queries += 1;
        std::hint::spin_loop();
    }
    Ok((t0.elapsed(), queries == 0))
}

/// Events kept pending on other streams behind a `LONG_EVENT` delay, armed (polled once), and
/// replaced when they complete: the "long event pending" case (one stream, one event) and the
/// "many armed events" case (`MANY_STREAMS` streams, `MANY_PER_STREAM` events each).
struct LongPending {
    streams: Vec<Stream>,
    per_stream: usize,
    delay: Duration,
    /// The events of each stream; the last one completes last.
    events: Vec<Vec<Event>>,
}

impl LongPending {
    fn new(streams: &[Stream], per_stream: usize, delay: Duration) -> LongPending {
        LongPending {
            streams: streams.to_vec(),
            per_stream,
            delay,
            events: vec![Vec::new(); streams.len()],
        }
    }

    /// Makes sure every stream has its armed events pending.
    fn refresh(&mut self) -> Result<(), BoxError> {
        let mut cx = Context::from_waker(noop_waker_ref());
        for (stream, events) in self.streams.iter().zip(&mut self.events) {
            if let Some(first) = events.first() {
                if !first.is_complete()? {
                    continue;
                }
            }
            events.clear();
            stream.enqueue_delay(self.delay)?;
            for _ in 0..self.per_stream {
                let event = stream.record()?;
                // The future is dropped after its first poll; the driver keeps watching it.
                let _ = event.clone().poll_unpin(&mut cx);
                events.push(event);
            }
        }
        Ok(())
    }

    /// Whether every armed event is still pending.
    fn pending(&self) -> Result<bool, BoxError> {
        for events in &self.events {
            match events.first() {
                Some(e) if !e.is_complete()? => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }
}

/// `await_once` with the long events pending on other streams throughout; `None` when they
/// were not (the sample is dropped).
async fn await_beside_long(
    stream: &Stream,
    long: &RefCell<LongPending>,
) -> Result<Option<(Duration, bool)>, BoxError> {
    // Untimed: long enough for the poller to back off into its longest parks (sleeps, before
    // this change) over the long event, so the short event is armed during one.
    std::thread::sleep(BESIDE_LONG_GAP);
    long.borrow_mut().refresh()?;
    let sample = await_once(stream).await?;
    let pending = long.borrow().pending()?;
    Ok(pending.then_some(sample))
}

struct WakeResults {
    tokio: Series,
    /// tokio current-thread, with a 10 ms event pending on another stream.
    tokio_beside_long: Series,
    /// tokio current-thread, with 1,008 events armed on 16 other streams.
    tokio_beside_many: Series,
    block_on: Series,
    spin: Series,
}

impl WakeResults {
    fn measure(stream: &Stream, other: &Stream) -> Result<WakeResults, BoxError> {
        let rt = tokio::runtime::Builder::new_current_thread().build()?;
        let tokio = rt.block_on(Series::collect(|| await_once(stream)))?;
        let long = &RefCell::new(LongPending::new(std::slice::from_ref(other), 1, LONG_EVENT));
        let tokio_beside_long =
            rt.block_on(Series::collect_some(|| await_beside_long(stream, long)))?;
        other.synchronize_blocking()?;
        let many: Vec<Stream> = (0..MANY_STREAMS)
            .map(|_| Stream::new(stream.device()))
            .collect::<Result<_, _>>()?;
        let long = &RefCell::new(LongPending::new(&many, MANY_PER_STREAM, MANY_DELAY));
        let tokio_beside_many =
            rt.block_on(Series::collect_some(|| await_beside_long(stream, long)))?;
        for s in &many {
            s.synchronize_blocking()?;
        }
        let block_on = futures::executor::block_on(Series::collect(|| await_once(stream)))?;
        // Nothing in this series awaits; `block_on` only drives the shared loop.
        let spin =
            futures::executor::block_on(Series::collect(|| std::future::ready(spin_once(stream))))?;
        Ok(WakeResults {
            tokio,
            tokio_beside_long,
            tokio_beside_many,
            block_on,
            spin,
        })
    }

    /// `awaited`'s latency at percentile `p` beyond the spin-query's median: the wake path's
    /// own cost at that percentile, counting the delay's own jitter as overhead (an upper
    /// bound; a difference of equal percentiles goes negative when the spin series is noisier).
    fn overhead_at(&self, awaited: &Series, p: usize) -> f64 {
        us(awaited.percentile(p)) - us(self.spin.median())
    }

    fn table(&self, strategy: &str) -> Table {
        let mut t = Table::new(
            format!("[{strategy}] wake latency (µs, from just after record)"),
            &[
                "waiter",
                "n",
                "median",
                "p90",
                "p99",
                "max",
                "ready at 1st poll",
                "overhead vs spin (median)",
            ],
        );
        let with_spin = |s: &Series| Some(fmt_overhead(self, s, 50));
        for (name, s, overhead) in [
            ("tokio current-thread", &self.tokio, with_spin(&self.tokio)),
            (
                "tokio, 10 ms event pending on another stream",
                &self.tokio_beside_long,
                with_spin(&self.tokio_beside_long),
            ),
            (
                "tokio, 1,008 events armed on 16 other streams",
                &self.tokio_beside_many,
                with_spin(&self.tokio_beside_many),
            ),
            (
                "futures block_on",
                &self.block_on,
                with_spin(&self.block_on),
            ),
            ("spin on is_complete", &self.spin, None),
        ] {
            t.row(vec![
                name.into(),
                s.samples.len().to_string(),
                fmt_pct(s, 50),
                fmt_pct(s, 90),
                fmt_pct(s, 99),
                fmt_pct(s, 100),
                s.ready_at_first_poll.to_string(),
                overhead.unwrap_or_else(|| "-".into()),
            ]);
        }
        t
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Stream stall

struct StallRun {
    /// Gated: from the gate opening to the stream's end (device time). Ungated: from the first
    /// enqueue to the stream's end.
    timed: Duration,
    /// Host time to enqueue the operations (and records, and spawn the awaiting tasks).
    enqueue: Duration,
    /// Whether everything was enqueued and armed before the gate opened (ungated: always).
    gated: bool,
    /// When the last awaiting task resumed, relative to the stream's end (µs; may be < 0).
    last_wake_after_end_us: Option<f64>,
}

/// One run: optionally gate the stream, enqueue the operations (with an awaited event after
/// each when `awaiters` is given), open the gate, time the stream.
fn stall_run(
    stream: &Stream,
    gate_stream: Option<&Stream>,
    awaiters: Option<&tokio::runtime::Runtime>,
) -> Result<StallRun, BoxError> {
    let op = if gate_stream.is_some() {
        STALL_OP
    } else {
        STALL_OP_UNGATED
    };
    let gate = match gate_stream {
        Some(g) => {
            g.enqueue_delay(STALL_GATE)?;
            let gate = g.record()?;
            stream.wait(&gate)?;
            Some(gate)
        }
        None => None,
    };

    let armed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    let t_enqueue = Instant::now();
    for _ in 0..STALL_OPS {
        stream.enqueue_delay(op)?;
        if let Some(rt) = awaiters {
            let watched = Watched::new(stream.record()?, Some(armed.clone()));
            tasks.push(rt.spawn(async move {
                watched.await?;
                Ok::<Instant, streamalloc::Error>(Instant::now())
            }));
        }
    }
    let enqueue = t_enqueue.elapsed();
    let (gated, t_start) = match &gate {
        Some(gate) => {
            while armed.load(Ordering::Acquire) < tasks.len() {
                std::thread::yield_now();
            }
            let gated = !gate.is_complete()?;
            while !gate.is_complete()? {
                std::hint::spin_loop();
            }
            (gated, Instant::now())
        }
        None => (true, t_enqueue),
    };
    stream.synchronize_blocking()?;
    let t_end = Instant::now();

    let last_wake_after_end_us = match awaiters {
        None => None,
        Some(rt) => {
            let mut last = None::<Instant>;
            for task in tasks {
                let woke = rt.block_on(task)??;
                last = Some(last.map_or(woke, |l| l.max(woke)));
            }
            last.map(|l| signed_us(l, t_end))
        }
    };
    Ok(StallRun {
        timed: t_end - t_start,
        enqueue,
        gated,
        last_wake_after_end_us,
    })
}

/// The runs of one set-up (gated or ungated), alone and with awaited events.
struct StallSetup {
    alone: Vec<StallRun>,
    awaited: Vec<StallRun>,
}

impl StallSetup {
    fn measure(
        stream: &Stream,
        gate_stream: Option<&Stream>,
        rt: &tokio::runtime::Runtime,
    ) -> Result<StallSetup, BoxError> {
        // One untimed run of each warms the streams, the shadow stream and the poller.
        stall_run(stream, gate_stream, None)?;
        stall_run(stream, gate_stream, Some(rt))?;
        let mut setup = StallSetup {
            alone: Vec::new(),
            awaited: Vec::new(),
        };
        for _ in 0..STALL_REPS {
            setup.alone.push(stall_run(stream, gate_stream, None)?);
            setup
                .awaited
                .push(stall_run(stream, gate_stream, Some(rt))?);
        }
        Ok(setup)
    }

    fn median_timed(runs: &[StallRun]) -> Duration {
        median(runs.iter().map(|r| r.timed))
    }

    fn ratio(&self) -> f64 {
        Self::median_timed(&self.awaited).as_secs_f64()
            / Self::median_timed(&self.alone).as_secs_f64()
    }

    /// Whether every run held its gate, so the figures are device time.
    fn valid(&self) -> bool {
        self.alone.iter().chain(&self.awaited).all(|r| r.gated)
    }

    /// `(a) ms`, `(b) ms` and the ratio, or why there are none.
    fn summary(&self) -> [String; 3] {
        if !self.valid() {
            let why = "gate not held".to_string();
            return [why.clone(), why, "-".into()];
        }
        [
            fmt_ms(Self::median_timed(&self.alone)),
            fmt_ms(Self::median_timed(&self.awaited)),
            format!("{:.3}", self.ratio()),
        ]
    }

    fn rows(&self, setup: &str, t: &mut Table) {
        for (name, runs) in [
            ("(a) ops alone", &self.alone),
            ("(b) + 1,000 awaited events", &self.awaited),
        ] {
            let mut wakes: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.last_wake_after_end_us)
                .collect();
            wakes.sort_unstable_by(f64::total_cmp);
            let gated = runs.iter().filter(|r| r.gated).count();
            t.row(vec![
                format!("{setup} {name}"),
                fmt_ms(Self::median_timed(runs)),
                fmt_ms(runs.iter().map(|r| r.timed).min().unwrap_or_default()),
                fmt_ms(runs.iter().map(|r| r.timed).max().unwrap_or_default()),
                fmt_ms(median(runs.iter().map(|r| r.enqueue))),
                format!("{gated}/{}", runs.len()),
                wakes
                    .get(wakes.len() / 2)
                    .map_or("-".into(), |w| format!("{w:.0}")),
            ]);
        }
        let mut ratio = vec![format!("{setup} ratio (b)/(a)"), self.summary()[2].clone()];
        ratio.resize(7, String::new());
        t.row(ratio);
    }
}

struct StallResults {
    gated: StallSetup,
    ungated: StallSetup,
}

impl StallResults {
    fn measure(stream: &Stream, gate_stream: &Stream) -> Result<StallResults, BoxError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()?;
        Ok(StallResults {
            gated: StallSetup::measure(stream, Some(gate_stream), &rt)?,
            ungated: StallSetup::measure(stream, None, &rt)?,
        })
    }

    fn table(&self, strategy: &str) -> Table {
        let mut t = Table::new(
            format!("[{strategy}] stream stall ({STALL_OPS} ops)"),
            &[
                "set-up, variant",
                "median ms",
                "min ms",
                "max ms",
                "enqueue ms (median)",
                "gate held",
                "last wake after end µs (median)",
            ],
        );
        self.gated.rows("gated", &mut t);
        self.ungated.rows("ungated", &mut t);
        t
    }
}

// ---------------------------------------------------------------------------------------------
// 3. CPU cost

/// CPU time used by the whole process so far, all threads included.
fn process_cpu_time() -> Option<Duration> {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Process CPU milliseconds per wall second while this thread sleeps for `CPU_WINDOW`.
fn cpu_ms_per_s_while_sleeping() -> Option<f64> {
    let (cpu0, wall0) = (process_cpu_time()?, Instant::now());
    std::thread::sleep(CPU_WINDOW);
    let (cpu1, wall1) = (process_cpu_time()?, Instant::now());
    Some((cpu1 - cpu0).as_secs_f64() * 1e3 / (wall1 - wall0).as_secs_f64())
}

struct CpuResults {
    idle: Option<f64>,
    busy: Option<f64>,
    /// Whether the busy case's event was armed (pending at its first poll) and still pending
    /// at the end of the window.
    busy_valid: bool,
}

impl CpuResults {
    fn measure(stream: &Stream) -> Result<CpuResults, BoxError> {
        let idle = cpu_ms_per_s_while_sleeping();

        stream.enqueue_delay(CPU_BUSY_DELAY)?;
        let event = stream.record()?;
        let mut cx = Context::from_waker(noop_waker_ref());
        // One poll arms the completion driver; the future is then dropped, the driver keeps
        // watching the event.
        let armed = event.clone().poll_unpin(&mut cx).is_pending();
        let busy = cpu_ms_per_s_while_sleeping();
        let still_pending = !event.is_complete()?;
        stream.synchronize_blocking()?;
        Ok(CpuResults {
            idle,
            busy,
            busy_valid: armed && still_pending,
        })
    }

    fn table(&self, strategy: &str) -> Table {
        let mut t = Table::new(
            format!("[{strategy}] process CPU while the main thread sleeps"),
            &["case", "CPU ms per wall s", "note"],
        );
        t.row(vec![
            "idle (nothing pending)".into(),
            fmt_opt(self.idle),
            String::new(),
        ]);
        t.row(vec![
            "busy (1 armed event pending)".into(),
            fmt_opt(self.busy),
            if self.busy_valid {
                String::new()
            } else {
                "INVALID: the event was not pending throughout".into()
            },
        ]);
        t
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Free → waiting task

/// The free → waiting task cases: a pool of `FREE_SIZE` bytes, full; a task awaits an
/// allocation of all of it; the main thread frees the held block (as `wake_latency` in
/// benches/workloads.rs).
const FREE_SIZE: usize = 1 << 20;
const FREE_ITERS: usize = 2_000;
const FREE_WARMUP: usize = 50;
/// The "parked" variants wait this long after the task queued before freeing, so the runtime's
/// worker is surely parked (the OS must wake it).
const FREE_SETTLE: Duration = Duration::from_micros(200);

/// A waker that notes when it was woken (nanoseconds after `base`), then wakes `inner`, if any.
struct Stamp {
    base: Instant,
    woken_at: AtomicU64,
    inner: Option<Waker>,
}

impl Stamp {
    fn new(base: Instant, inner: Option<Waker>) -> Arc<Stamp> {
        Arc::new(Stamp {
            base,
            woken_at: AtomicU64::new(0),
            inner,
        })
    }

    fn woken_at(&self) -> Option<Instant> {
        match self.woken_at.load(Ordering::Acquire) {
            0 => None,
            n => Some(self.base + Duration::from_nanos(n)),
        }
    }
}

impl Wake for Stamp {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let n = self.base.elapsed().as_nanos().max(1) as u64;
        // The first wake-up counts.
        let _ = self
            .woken_at
            .compare_exchange(0, n, Ordering::AcqRel, Ordering::Acquire);
        if let Some(w) = &self.inner {
            w.wake_by_ref();
        }
    }
}

/// Polls `inner` with a waker that stamps the time of the first wake-up (into `stamp`) and
/// passes it on to the task's own waker.
struct Stamped<F> {
    inner: Pin<Box<F>>,
    base: Instant,
    stamp: Arc<Mutex<Option<Arc<Stamp>>>>,
    /// Raised once `inner` has returned `Pending`: the task waits.
    pending: Arc<AtomicBool>,
}

impl<F: Future> Future for Stamped<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let stamp = Stamp::new(self.base, Some(cx.waker().clone()));
        {
            let mut slot = self.stamp.lock().expect("stamp lock");
            // Keep the first stamp that fired; a later poll's waker replaces an unfired one.
            if slot.as_ref().is_none_or(|s| s.woken_at().is_none()) {
                *slot = Some(stamp.clone());
            }
        }
        let waker = Waker::from(stamp);
        let out = self.inner.as_mut().poll(&mut Context::from_waker(&waker));
        if out.is_pending() {
            self.pending.store(true, Ordering::Release);
        }
        out
    }
}

/// One sample of an end-to-end case: from the free (or notify) to the waker called, and to
/// the task resumed.
#[derive(Clone, Copy)]
struct FreeSample {
    to_waker: Duration,
    to_resumed: Duration,
}

/// The four end-to-end cases, measured interleaved on one runtime.
#[derive(Clone, Copy, PartialEq)]
enum EndToEnd {
    /// The crate: a pool allocation woken by a free.
    Free,
    /// The executor's floor: a `tokio::sync::Notify` woken by `notify_one`, the same pattern.
    Notify,
}

/// One end-to-end iteration on `rt` (a 1-worker multi-thread runtime).
fn end_to_end_once(
    rt: &tokio::runtime::Runtime,
    mr: &PoolResource<CudaResource>,
    stream: &Stream,
    case: EndToEnd,
    settle: Duration,
) -> Result<FreeSample, BoxError> {
    let base = Instant::now();
    let stamp = Arc::new(Mutex::new(None::<Arc<Stamp>>));
    let pending = Arc::new(AtomicBool::new(false));
    let notify = Arc::new(tokio::sync::Notify::new());
    let held = mr.try_allocate(FREE_SIZE, stream)?;
    let task = {
        let (mr, stream, stamp, pending, notify) = (
            mr.clone(),
            stream.clone(),
            stamp.clone(),
            pending.clone(),
            notify.clone(),
        );
        rt.spawn(async move {
            let got = match case {
                EndToEnd::Free => {
                    let alloc = async { mr.allocate(FREE_SIZE, &stream).await };
                    Some(
                        Stamped {
                            inner: Box::pin(alloc),
                            base,
                            stamp,
                            pending,
                        }
                        .await?,
                    )
                }
                EndToEnd::Notify => {
                    Stamped {
                        inner: Box::pin(notify.notified()),
                        base,
                        stamp,
                        pending,
                    }
                    .await;
                    None
                }
            };
            Ok::<_, streamalloc::Error>((Instant::now(), got))
        })
    };
    // Wait until the task waits (its future returned `Pending`: queued for the pool, or
    // registered with the Notify).
    while !pending.load(Ordering::Acquire) {
        std::hint::spin_loop();
    }
    if !settle.is_zero() {
        let until = Instant::now() + settle;
        while Instant::now() < until {
            std::thread::sleep(until - Instant::now());
        }
    }
    let t0 = Instant::now();
    match case {
        // SAFETY: `held` was allocated above with FREE_SIZE bytes and is used by nothing.
        EndToEnd::Free => unsafe { mr.deallocate(held, FREE_SIZE, stream) },
        EndToEnd::Notify => notify.notify_one(),
    }
    let (resumed, got) = rt.block_on(task)??;
    if let Some(p) = got {
        // SAFETY: the task allocated `p` with FREE_SIZE bytes; nothing uses it.
        unsafe { mr.deallocate(p, FREE_SIZE, stream) };
    } else {
        // SAFETY: as above; the Notify case did not free it.
        unsafe { mr.deallocate(held, FREE_SIZE, stream) };
    }
    let woken = stamp
        .lock()
        .expect("stamp lock")
        .as_ref()
        .and_then(|s| s.woken_at())
        .ok_or("the task resumed without a wake-up")?;
    Ok(FreeSample {
        to_waker: woken.saturating_duration_since(t0),
        to_resumed: resumed.saturating_duration_since(t0),
    })
}

/// The crate's own part: free → the waiting future's waker called, with no executor (the
/// future polled by hand with a stamping waker).
fn free_to_waker_once(
    mr: &PoolResource<CudaResource>,
    stream: &Stream,
    settle: Duration,
) -> Result<Duration, BoxError> {
    let base = Instant::now();
    let held = mr.try_allocate(FREE_SIZE, stream)?;
    let stamp = Stamp::new(base, None);
    let waker = Waker::from(stamp.clone());
    let mut cx = Context::from_waker(&waker);
    let mut alloc = mr.allocate(FREE_SIZE, stream);
    if Pin::new(&mut alloc).poll(&mut cx).is_ready() {
        return Err("the pool was not full".into());
    }
    if !settle.is_zero() {
        std::thread::sleep(settle);
    }
    let t0 = Instant::now();
    // SAFETY: `held` was allocated above with FREE_SIZE bytes and is used by nothing.
    unsafe { mr.deallocate(held, FREE_SIZE, stream) };
    let woken = stamp.woken_at().ok_or("the free woke nobody")?;
    let Poll::Ready(p) = Pin::new(&mut alloc).poll(&mut cx) else {
        return Err("woken, but the memory was not there".into());
    };
    // SAFETY: allocated with FREE_SIZE bytes just above; nothing uses it.
    unsafe { mr.deallocate(p?, FREE_SIZE, stream) };
    Ok(woken.saturating_duration_since(t0))
}

fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort_unstable();
    v
}

/// Nearest-rank percentile of a sorted, non-empty slice, `p` in 1..=100.
fn pct(sorted: &[Duration], p: usize) -> Duration {
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

struct FreeResults {
    /// (a) free → waker called, no executor.
    crate_part: Vec<Duration>,
    /// The same, the free `FREE_SETTLE` after the future queued (this thread slept meanwhile).
    crate_part_after_sleep: Vec<Duration>,
    /// (b)/(c) and their "parked" variants: (case, settle) → samples.
    end_to_end: Vec<((EndToEnd, Duration), Vec<FreeSample>)>,
}

impl FreeResults {
    fn measure(stream: &Stream) -> Result<FreeResults, BoxError> {
        let device = stream.device();
        let mr = PoolResource::new(CudaResource::new(device)?, FREE_SIZE, Some(FREE_SIZE))?;
        let (mut crate_part, mut crate_part_after_sleep) = (Vec::new(), Vec::new());
        for i in 0..FREE_WARMUP + FREE_ITERS {
            let d = free_to_waker_once(&mr, stream, Duration::ZERO)?;
            let slept = free_to_waker_once(&mr, stream, FREE_SETTLE)?;
            if i >= FREE_WARMUP {
                crate_part.push(d);
                crate_part_after_sleep.push(slept);
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let cases = [
            (EndToEnd::Free, Duration::ZERO),
            (EndToEnd::Notify, Duration::ZERO),
            (EndToEnd::Free, FREE_SETTLE),
            (EndToEnd::Notify, FREE_SETTLE),
        ];
        let mut end_to_end: Vec<_> = cases.iter().map(|&c| (c, Vec::new())).collect();
        // Interleaved, so that the crate and the floor see the same machine state.
        for i in 0..FREE_WARMUP + FREE_ITERS {
            for ((case, settle), samples) in end_to_end.iter_mut() {
                let s = end_to_end_once(&rt, &mr, stream, *case, *settle)?;
                if i >= FREE_WARMUP {
                    samples.push(s);
                }
            }
        }
        Ok(FreeResults {
            crate_part: sorted(crate_part),
            crate_part_after_sleep: sorted(crate_part_after_sleep),
            end_to_end,
        })
    }

    fn series(&self, case: EndToEnd, settle: Duration) -> (Vec<Duration>, Vec<Duration>) {
        let samples = &self
            .end_to_end
            .iter()
            .find(|(c, _)| *c == (case, settle))
            .expect("measured")
            .1;
        (
            sorted(samples.iter().map(|s| s.to_waker).collect()),
            sorted(samples.iter().map(|s| s.to_resumed).collect()),
        )
    }

    /// (b)/(c) at p50 and p99 for one settle time.
    fn ratios(&self, settle: Duration) -> (f64, f64) {
        let (_, b) = self.series(EndToEnd::Free, settle);
        let (_, c) = self.series(EndToEnd::Notify, settle);
        let r = |p| us(pct(&b, p)) / us(pct(&c, p));
        (r(50), r(99))
    }

    fn table(&self) -> Table {
        let mut t = Table::new(
            format!(
                "free → waiting task (µs; {FREE_ITERS} iterations each; pool of {} KiB, full; \
                 end to end on a 1-worker multi-thread tokio runtime, cases interleaved)",
                FREE_SIZE >> 10
            ),
            &["case", "to", "n", "p50", "p90", "p99", "max"],
        );
        let mut row = |case: String, to: &str, s: &[Duration]| {
            t.row(vec![
                case,
                to.into(),
                s.len().to_string(),
                fmt_us(pct(s, 50)),
                fmt_us(pct(s, 90)),
                fmt_us(pct(s, 99)),
                fmt_us(pct(s, 100)),
            ]);
        };
        row(
            "(a) crate: free, no executor (goal p99 ≤ 1)".into(),
            "waker called",
            &self.crate_part,
        );
        row(
            format!(
                "(a) crate: free {} µs after queueing (thread slept), no executor",
                FREE_SETTLE.as_micros()
            ),
            "waker called",
            &self.crate_part_after_sleep,
        );
        for settle in [Duration::ZERO, FREE_SETTLE] {
            let when = if settle.is_zero() {
                "at once".to_string()
            } else {
                format!("{} µs after queueing (worker parked)", settle.as_micros())
            };
            for (case, name) in [
                (EndToEnd::Free, "(b) free → task"),
                (EndToEnd::Notify, "(c) floor: Notify → task"),
            ] {
                let (to_waker, to_resumed) = self.series(case, settle);
                row(format!("{name}, {when}"), "waker called", &to_waker);
                row(format!("{name}, {when}"), "task resumed", &to_resumed);
            }
        }
        t
    }
}

// ---------------------------------------------------------------------------------------------
// Report

fn summary_table(rows: &[(&str, WakeResults, StallResults, CpuResults)]) -> Table {
    let mut t = Table::new(
        "summary",
        &[
            "strategy",
            "tokio p50/p99 µs",
            "tokio, 10 ms pending elsewhere p50/p99 µs",
            "completion → tokio task p50/p99 µs, beyond spin p50 (goal ≤ 5 / ≤ 20)",
            "same, 10 ms pending elsewhere",
            "same, 1,008 armed on 16 streams",
            "block_on p50/p99 µs",
            "spin p50 µs",
            "overhead tokio/block_on µs",
            "gated stall (a) / (b) ms",
            "gated (b)/(a)",
            "ungated stall (a) / (b) ms",
            "ungated (b)/(a)",
            "CPU idle ms/s",
            "CPU busy ms/s",
        ],
    );
    for (name, wake, stall, cpu) in rows {
        let [ga, gb, gated_ratio] = stall.gated.summary();
        let [ua, ub, ungated_ratio] = stall.ungated.summary();
        let (gated_ab, ungated_ab) = (format!("{ga} / {gb}"), format!("{ua} / {ub}"));
        t.row(vec![
            name.to_string(),
            format!(
                "{} / {}",
                fmt_pct(&wake.tokio, 50),
                fmt_pct(&wake.tokio, 99)
            ),
            format!(
                "{} / {}",
                fmt_pct(&wake.tokio_beside_long, 50),
                fmt_pct(&wake.tokio_beside_long, 99)
            ),
            format!(
                "{} / {}",
                fmt_overhead(wake, &wake.tokio, 50),
                fmt_overhead(wake, &wake.tokio, 99)
            ),
            format!(
                "{} / {}",
                fmt_overhead(wake, &wake.tokio_beside_long, 50),
                fmt_overhead(wake, &wake.tokio_beside_long, 99)
            ),
            format!(
                "{} / {}",
                fmt_overhead(wake, &wake.tokio_beside_many, 50),
                fmt_overhead(wake, &wake.tokio_beside_many, 99)
            ),
            format!(
                "{} / {}",
                fmt_us(wake.block_on.median()),
                fmt_us(wake.block_on.percentile(99))
            ),
            fmt_us(wake.spin.median()),
            format!(
                "{} / {}",
                fmt_overhead(wake, &wake.tokio, 50),
                fmt_overhead(wake, &wake.block_on, 50)
            ),
            gated_ab,
            gated_ratio,
            ungated_ab,
            ungated_ratio,
            fmt_opt(cpu.idle),
            fmt_opt(cpu.busy),
        ]);
    }
    t
}

/// The upper median of a non-empty sequence.
fn median<T: Ord>(values: impl Iterator<Item = T>) -> T {
    let mut v: Vec<T> = values.collect();
    v.sort_unstable();
    v.swap_remove(v.len() / 2)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn signed_us(later: Instant, earlier: Instant) -> f64 {
    if later >= earlier {
        us(later - earlier)
    } else {
        -us(earlier - later)
    }
}

fn fmt_us(d: Duration) -> String {
    format!("{:.1}", us(d))
}

fn fmt_ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.2}"))
}
