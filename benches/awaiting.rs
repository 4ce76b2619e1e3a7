//! Awaited allocations from many tokio tasks at once: what the deadlock-detection ledger (the
//! bytes each task holds, `src/resource/contract/availability.rs`) costs an `allocate().await` + free
//! pair when every worker of a multi-thread runtime allocates from one `PoolResource`.
//!
//! Each case runs one task per worker (1, 2, 4 workers), each on a stream of its own (as W3
//! gives each thread one), doing W1 pairs (`../shared/bench/WORKLOADS.md`: the 64 seeded sizes
//! in `1..=1 MiB`, allocate then free at once) through `allocate(..).await` — every one ready at
//! its first poll, so what is measured is the fast path plus the ledger — and, beside it, the
//! same pairs through `try_allocate` (no ledger) as the floor. Pools: over plain device memory,
//! 50 % of free memory at first, with no maximum and with that size as the maximum.
//!
//! Run: `cargo bench --features bench --bench awaiting`. Prints, per case, the aggregate ns per pair (wall time
//! over all tasks' pairs, the median of five runs of `AWAITING_ITERS` pairs per task, default
//! 200,000) and the ratio to `try_allocate` at the same worker count.
//!
//! Instructions per pair (for a loaded machine, where wall clock says little): run the one-worker
//! case under callgrind twice with different pair counts and divide the difference:
//!
//! ```text
//! cargo bench --features bench --bench awaiting --no-run   # note the binary's path
//! for n in 20000 40000; do AWAITING_ITERS=$n AWAITING_TRIALS=1 AWAITING_WORKERS=1 \
//!   AWAITING_POOL=unbounded AWAITING_CASE=await valgrind --tool=callgrind \
//!   --callgrind-out-file=/tmp/cg.$n target/release/deps/awaiting-<hash> 2>&1 | grep refs; done
//! # (Ir(40000) - Ir(20000)) / 20000 = instructions per awaited pair (warm-up cancels out);
//! # AWAITING_CASE=try_allocate gives the floor, AWAITING_POOL=bounded the other pool
//! ```

#[path = "common/workloads.rs"]
mod workloads;

use std::sync::Arc;
use std::time::Instant;

use streamalloc::{
    percent_of_free_device_memory, CudaResource, Device, MemoryResource, PoolResource, Stream,
};

use workloads::pair_sizes;

const PAIR_ITERS: usize = 200_000;
const TRIALS: usize = 5;
const WARM_UP: usize = 1_000;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Whether to run the case `name`: all, or those whose name starts with `AWAITING_CASE`.
fn selected(name: &str) -> bool {
    std::env::var("AWAITING_CASE").map_or(true, |c| name.starts_with(&c))
}

fn pool(device: &Device, bounded: bool) -> PoolResource<CudaResource> {
    let initial = percent_of_free_device_memory(device, 50).expect("memory info");
    PoolResource::new(
        CudaResource::new(device).expect("device resource"),
        initial,
        bounded.then_some(initial),
    )
    .expect("pool")
}

/// One W1 pair through the allocation future (`awaited`) or `try_allocate`.
async fn pair(mr: &PoolResource<CudaResource>, stream: &Stream, n: usize, awaited: bool) {
    let p = if awaited {
        mr.allocate(n, stream).await
    } else {
        mr.try_allocate(n, stream)
    }
    .unwrap_or_else(|e| panic!("allocating {n} bytes: {e}"));
    // SAFETY: `p` was allocated from `mr` with `n` bytes just above; no device work uses it.
    unsafe { mr.deallocate(std::hint::black_box(p), n, stream) };
}

/// `workers` tasks on a runtime of `workers` workers, each doing `iters` pairs after a
/// warm-up, started together. Returns the aggregate ns per pair (wall / all pairs).
fn run(
    rt: &tokio::runtime::Runtime,
    mr: &Arc<PoolResource<CudaResource>>,
    streams: &[Stream],
    iters: usize,
    awaited: bool,
) -> f64 {
    let workers = streams.len();
    rt.block_on(async {
        let start = Arc::new(tokio::sync::Barrier::new(workers + 1));
        let end = Arc::new(tokio::sync::Barrier::new(workers + 1));
        let tasks: Vec<_> = streams
            .iter()
            .map(|s| {
                let (mr, s, start, end) = (mr.clone(), s.clone(), start.clone(), end.clone());
                tokio::spawn(async move {
                    let sizes = pair_sizes();
                    for i in 0..WARM_UP {
                        pair(&mr, &s, sizes[i & 63], awaited).await;
                    }
                    start.wait().await;
                    for i in 0..iters {
                        pair(&mr, &s, sizes[i & 63], awaited).await;
                    }
                    end.wait().await;
                })
            })
            .collect();
        start.wait().await;
        let t = Instant::now();
        end.wait().await;
        let wall = t.elapsed();
        for t in tasks {
            t.await.expect("bench task");
        }
        wall.as_nanos() as f64 / (iters * workers) as f64
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let device = Device::default();
    let iters = env_or("AWAITING_ITERS", PAIR_ITERS);
    let trials = env_or("AWAITING_TRIALS", TRIALS).max(1);
    let only_workers = std::env::var("AWAITING_WORKERS").ok();
    println!(
        "W1 pairs from one task per worker, one PoolResource, {} backend, {} host CPUs: aggregate \
         ns per pair (median of {trials} x {iters} pairs per task), ratio to try_allocate",
        device.backend(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    for workers in [1usize, 2, 4] {
        if only_workers
            .as_deref()
            .is_some_and(|w| w != workers.to_string())
        {
            continue;
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .build()
            .expect("runtime");
        for bounded in [false, true] {
            let wanted = std::env::var("AWAITING_POOL").ok();
            if wanted.is_some_and(|w| w != if bounded { "bounded" } else { "unbounded" }) {
                continue;
            }
            let bound = if bounded { "maximum" } else { "no maximum" };
            let mr = Arc::new(pool(&device, bounded));
            let streams: Vec<Stream> = (0..workers)
                .map(|_| Stream::new(&device).expect("stream"))
                .collect();
            let mut floor = None;
            for (name, awaited) in [("try_allocate", false), ("await", true)] {
                if !selected(name) {
                    continue;
                }
                let ns = median(
                    (0..trials)
                        .map(|_| run(&rt, &mr, &streams, iters, awaited))
                        .collect(),
                );
                let base = *floor.get_or_insert(ns);
                println!(
                    "  {workers} worker(s), {bound:<10}  {name:<12} {ns:>8.1} ns  {:>5.2}x",
                    ns / base
                );
            }
        }
    }
}
