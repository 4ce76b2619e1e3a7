//! What the counting and recording adaptors add to W1 (`../shared/bench/WORKLOADS.md`: one
//! stream, allocate + free pairs of the 64 seeded sizes) over a `PoolResource`: the bare pool,
//! then `StatisticsAdaptor`, `TrackingAdaptor` and `LoggingAdaptor` (to a file in a temporary
//! directory and to `io::sink()`), each over a fresh pool.
//!
//! Run: `cargo bench --features bench --bench adaptors`. It first prints a table, ns per pair and the ratio to the
//! bare pool (the median of five runs of 200,000 pairs, as `benches/workloads.rs` measures W1),
//! then runs the same cases under criterion. `cargo bench --features bench --bench adaptors -- --table` prints
//! the table alone. Issue 14's goals: statistics and tracking ≤ 1.15× the bare pool, logging
//! ≤ 100 ns per pair.

#[path = "common/workloads.rs"]
mod workloads;

use std::path::PathBuf;

use criterion::Criterion;
use streamalloc::{
    percent_of_free_device_memory, CudaResource, Device, LoggingAdaptor, MemoryResource,
    PoolResource, StatisticsAdaptor, Stream, TrackingAdaptor,
};

use workloads::{pair, pair_sizes, pair_step};

/// Pairs per timed run, and runs per figure (the median is kept), as in `benches/workloads.rs`.
const PAIR_ITERS: usize = 200_000;
const TRIALS: usize = 5;

/// Pairs per run: `PAIR_ITERS`, or `ADAPTORS_ITERS` (for counting instructions under
/// callgrind: the difference between two counts over the difference of pairs).
fn pair_iters() -> usize {
    std::env::var("ADAPTORS_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PAIR_ITERS)
}

/// Whether to run the case `name`: all, or those whose name starts with `ADAPTORS_CASE`.
fn selected(name: &str) -> bool {
    std::env::var("ADAPTORS_CASE").map_or(true, |c| name.starts_with(&c))
}

/// The pool of WORKLOADS.md: over plain device memory, initial size 50 % of free memory, no
/// maximum.
fn pool(device: &Device) -> PoolResource<CudaResource> {
    let initial = percent_of_free_device_memory(device, 50).expect("memory info");
    PoolResource::new(
        CudaResource::new(device).expect("device resource"),
        initial,
        None,
    )
    .expect("pool")
}

/// A directory of its own under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("streamalloc-adaptors-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

type Case = (&'static str, Box<dyn MemoryResource>);

/// Each case over a fresh pool; the log files go to `dir`.
fn cases(device: &Device, dir: &TempDir) -> Vec<Case> {
    let file = dir.0.join("w1.csv");
    vec![
        ("PoolResource", Box::new(pool(device))),
        (
            "StatisticsAdaptor<PoolResource>",
            Box::new(StatisticsAdaptor::new(pool(device))),
        ),
        (
            "TrackingAdaptor<PoolResource>",
            Box::new(TrackingAdaptor::new(pool(device))),
        ),
        (
            "LoggingAdaptor<PoolResource> (file)",
            Box::new(LoggingAdaptor::to_file(pool(device), file).expect("log file")),
        ),
        (
            "LoggingAdaptor<PoolResource> (io::sink)",
            Box::new(LoggingAdaptor::to_writer(pool(device), std::io::sink()).expect("log")),
        ),
    ]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn table(device: &Device, dir: &TempDir) {
    println!(
        "W1 over a PoolResource, {} backend, {} host CPUs: ns per pair (median of {TRIALS} x \
         {}), ratio to the bare pool",
        device.backend(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        pair_iters(),
    );
    let mut bare = None;
    let iters = pair_iters();
    for (name, mr) in cases(device, dir) {
        if !selected(name) {
            continue;
        }
        let stream = Stream::new(device).expect("stream");
        let ns = median((0..TRIALS).map(|_| pair(&*mr, &stream, iters)).collect());
        let base = *bare.get_or_insert(ns);
        println!("  {name:<42} {ns:>8.1} ns  {:>5.2}x", ns / base);
    }
}

fn criterion_cases(c: &mut Criterion, device: &Device, dir: &TempDir) {
    let mut g = c.benchmark_group("adaptors/W1");
    let sizes = pair_sizes();
    for (name, mr) in cases(device, dir) {
        let stream = Stream::new(device).expect("stream");
        let mut i = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                pair_step(&*mr, &stream, &sizes, i);
                i = i.wrapping_add(1);
            })
        });
    }
    g.finish();
}

fn main() {
    let device = Device::default();
    let dir = TempDir::new();
    table(&device, &dir);
    if std::env::args().any(|a| a == "--table") {
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    criterion_cases(&mut c, &device, &dir);
    c.final_summary();
}
