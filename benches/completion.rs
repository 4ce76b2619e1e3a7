//! Completion-driver measurements: how fast an awaited event wakes its task, whether awaiting
//! events stalls the user stream, and what the poller costs in CPU, for each strategy.
//!
//! `cargo bench --bench completion` (host backend here; CUDA device 0 in the GPU bundle, run as
//! `.gpu/bench/completion --bench`). With `STREAMALLOC_BENCH_OUT=path` the report is also
//! written there as Markdown.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::{Duration, Instant};

use futures::task::noop_waker;
use streamalloc::{CompletionStrategy, Device, Event, Stream};

const STRATEGIES: [CompletionStrategy; 2] =
    [CompletionStrategy::HostFunction, CompletionStrategy::Poller];

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

struct Dist {
    median: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

fn dist(mut v: Vec<f64>) -> Dist {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Dist {
        median: percentile(&v, 0.5),
        p90: percentile(&v, 0.9),
        p99: percentile(&v, 0.99),
        max: *v.last().unwrap(),
    }
}

/// Polls `event` once so the completion driver is armed for it, without waiting.
fn arm(event: &mut Event) {
    let waker = noop_waker();
    let _ = Pin::new(event).poll(&mut Context::from_waker(&waker));
}

fn spin_until_complete(event: &Event) -> Instant {
    while !event.is_complete().unwrap() {
        std::hint::spin_loop();
    }
    Instant::now()
}

/// µs from just after `record` to the awaiting task resuming, behind a short device operation.
fn wake_latency(stream: &Stream, iterations: usize, op: Duration) -> (Dist, Dist, Dist) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut spin, mut tokio_await, mut block_on_await) = (vec![], vec![], vec![]);
    for i in 0..iterations * 3 {
        stream.enqueue_delay(op).unwrap();
        let event = stream.record().unwrap();
        let t0 = Instant::now();
        let t1 = match i % 3 {
            0 => spin_until_complete(&event),
            1 => rt.block_on(async {
                event.await.unwrap();
                Instant::now()
            }),
            _ => {
                futures::executor::block_on(event).unwrap();
                Instant::now()
            }
        };
        let us = (t1 - t0).as_secs_f64() * 1e6;
        [&mut spin, &mut tokio_await, &mut block_on_await][i % 3].push(us);
    }
    (dist(spin), dist(tokio_await), dist(block_on_await))
}

/// Device time of 1,000 small operations, with and without an armed event after each. A long
/// gate first holds the stream while everything is enqueued, so host enqueue cost is excluded.
fn stream_stall(device: &Device, ops: usize, op: Duration) -> (f64, f64, f64) {
    let mut result = [0.0; 2];
    let mut last_wake_after = 0.0;
    for (k, with_events) in [false, true].into_iter().enumerate() {
        let s = Stream::new(device).unwrap();
        s.enqueue_delay(Duration::from_millis(100)).unwrap();
        let gate = s.record().unwrap();
        let mut events = Vec::with_capacity(ops);
        for _ in 0..ops {
            s.enqueue_delay(op).unwrap();
            if with_events {
                let mut e = s.record().unwrap();
                arm(&mut e);
                events.push(e);
            }
        }
        let last = s.record().unwrap();
        assert!(
            !gate.is_complete().unwrap(),
            "enqueueing outlasted the gate; raise it"
        );
        let t0 = spin_until_complete(&gate);
        let t1 = spin_until_complete(&last);
        result[k] = (t1 - t0).as_secs_f64() * 1e3;
        if with_events {
            futures::executor::block_on(futures::future::join_all(events));
            last_wake_after = (Instant::now() - t1).as_secs_f64() * 1e3;
        }
    }
    (result[0], result[1], last_wake_after)
}

/// CPU time of all threads of this process, in ms (sum of /proc/self/task/*/schedstat).
fn process_cpu_ms() -> Option<f64> {
    let mut total_ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        let text = std::fs::read_to_string(path).ok()?;
        total_ns += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total_ns as f64 / 1e6)
}

/// CPU ms per wall second while the main thread sleeps: idle, and with one event pending.
fn poller_cpu(device: &Device) -> Option<(f64, f64)> {
    let s = Stream::new(device).unwrap();
    // Start whatever the strategy needs (shadow stream, poller thread) and let it go idle.
    s.enqueue_delay(Duration::from_millis(1)).unwrap();
    futures::executor::block_on(s.record().unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let window = Duration::from_secs(1);
    let c0 = process_cpu_ms()?;
    std::thread::sleep(window);
    let idle = process_cpu_ms()? - c0;
    s.enqueue_delay(window + Duration::from_millis(300))
        .unwrap();
    let mut pending = s.record().unwrap();
    arm(&mut pending);
    std::thread::sleep(Duration::from_millis(50));
    let c0 = process_cpu_ms()?;
    std::thread::sleep(window);
    let busy = process_cpu_ms()? - c0;
    futures::executor::block_on(pending).unwrap();
    Some((idle / window.as_secs_f64(), busy / window.as_secs_f64()))
}

fn main() {
    let device = Device::default();
    let host = device.backend() == streamalloc::BackendKind::Host;
    let (iterations, op) = if host {
        (300, Duration::from_micros(20))
    } else {
        (2000, Duration::from_micros(20))
    };
    let (ops, small_op) = (1000, Duration::from_micros(2));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "device: {} ({}, {} backend)\n",
        device.id(),
        device.name(),
        device.backend()
    );
    let _ = writeln!(
        md,
        "wake latency: µs from `record()` to the task running again, behind a {} µs device \
         operation, {iterations} samples each\n",
        op.as_micros()
    );
    let _ = writeln!(
        md,
        "| strategy | how | median | p90 | p99 | max |\n|---|---|---|---|---|---|"
    );
    let mut stall_rows = String::new();
    let mut cpu_rows = String::new();
    for strategy in STRATEGIES {
        device.set_completion_strategy(strategy);
        let s = Stream::new(&device).unwrap();
        // Warm up: shadow stream, poller thread, spin kernel module, event cache.
        let _ = wake_latency(&s, 20, op);
        let (spin, tokio_await, block_on_await) = wake_latency(&s, iterations, op);
        for (how, d) in [
            ("spin on is_complete", &spin),
            ("tokio .await", &tokio_await),
            ("block_on", &block_on_await),
        ] {
            let _ = writeln!(
                md,
                "| {strategy:?} | {how} | {:.1} | {:.1} | {:.1} | {:.1} |",
                d.median, d.p90, d.p99, d.max
            );
        }
        let _ = writeln!(
            md,
            "| {strategy:?} | notification overhead (tokio median − spin median) | {:.1} | | | |",
            tokio_await.median - spin.median
        );
        let (plain, with_events, last_wake) = stream_stall(&device, ops, small_op);
        let _ = writeln!(
            stall_rows,
            "| {strategy:?} | {plain:.2} | {with_events:.2} | {:.3} | {last_wake:.3} |",
            with_events / plain
        );
        match poller_cpu(&device) {
            Some((idle, busy)) => {
                let _ = writeln!(cpu_rows, "| {strategy:?} | {idle:.1} | {busy:.1} |");
            }
            None => {
                let _ = writeln!(cpu_rows, "| {strategy:?} | n/a | n/a |");
            }
        }
    }
    let _ = writeln!(
        md,
        "\nstream stall: device time (ms) of {ops} operations of {} µs on one stream, without \
         and with an awaited event after each (all enqueued behind a gate, so host enqueue cost \
         is excluded)\n",
        small_op.as_micros()
    );
    let _ = writeln!(md, "| strategy | plain ms | with events ms | ratio | last wake after stream done, ms |\n|---|---|---|---|---|");
    md.push_str(&stall_rows);
    let _ = writeln!(
        md,
        "\nCPU ms per wall second of the whole process while the main thread sleeps\n"
    );
    let _ = writeln!(md, "| strategy | idle | one event pending |\n|---|---|---|");
    md.push_str(&cpu_rows);
    println!("{md}");
    if let Ok(path) = std::env::var("STREAMALLOC_BENCH_OUT") {
        std::fs::write(&path, &md).unwrap_or_else(|e| eprintln!("writing {path}: {e}"));
    }
}
