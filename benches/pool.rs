//! Criterion benches of the allocation workloads W1–W3 (`../shared/bench/WORKLOADS.md`) on
//! `PoolResource`, plus the allocation future's ready path against `try_allocate`, W1 through two
//! adaptors, and the wake latency from a free to the waiting task resuming.
//!
//! Run: `cargo bench --bench pool`. They run on `Device::default()`: the host backend here,
//! CUDA device 0 on a GPU machine, where `benches/workloads.rs` prints the side-by-side table.
//! On the host backend only the pool's own bookkeeping is measured: its upstream is touched at
//! start-up alone.

#[path = "common/workloads.rs"]
mod workloads;

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use streamalloc::{
    percent_of_free_device_memory, CudaResource, Device, MemoryResource, PoolResource,
    StatisticsAdaptor, Stream, TracingAdaptor,
};

use workloads::{pair_sizes, pair_step, random, threaded, RAND_1MIB, RAND_64MIB};

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

fn w1_pair(c: &mut Criterion) {
    let device = Device::default();
    let stream = Stream::new(&device).unwrap();
    let mr = pool(&device);
    let sizes = pair_sizes();
    let mut g = c.benchmark_group("W1");
    g.throughput(Throughput::Elements(1));
    let mut i = 0;
    g.bench_function("pair/try_allocate", |b| {
        b.iter(|| {
            pair_step(&mr, &stream, &sizes, i);
            i += 1;
        })
    });
    // The allocation future on its ready path: one poll, no waiting.
    g.bench_function("pair/allocate().await", |b| {
        b.iter_custom(|iters| {
            futures::executor::block_on(async {
                let t = Instant::now();
                for i in 0..iters as usize {
                    let n = sizes[i & 63];
                    let p = mr.allocate(n, &stream).await.unwrap();
                    // SAFETY: allocated just above from `mr` with `n` bytes, unused.
                    unsafe { mr.deallocate(std::hint::black_box(p), n, &stream) };
                }
                t.elapsed()
            })
        })
    });
    // Through two adaptors, statically composed: what the adaptors' forwarding adds to the
    // pair (tracing with no subscriber, so both adaptors take their fast path).
    let adapted = StatisticsAdaptor::new(TracingAdaptor::new(pool(&device)));
    let mut i = 0;
    g.bench_function("pair/statistics(tracing(pool))", |b| {
        b.iter(|| {
            pair_step(&adapted, &stream, &sizes, i);
            i += 1;
        })
    });
    g.finish();
}

fn w2_random(c: &mut Criterion) {
    let device = Device::default();
    let stream = Stream::new(&device).unwrap();
    let mr = pool(&device);
    let mut g = c.benchmark_group("W2");
    g.sample_size(20);
    for (name, w) in [("rand1MiB", RAND_1MIB), ("rand64MiB", RAND_64MIB)] {
        // One element per loop iteration, so criterion's per-element time is the W2 figure.
        g.throughput(Throughput::Elements(2 * w.n as u64));
        g.bench_function(name, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| random(&mr, &stream, w)).sum())
        });
    }
    g.finish();
}

fn w3_threads(c: &mut Criterion) {
    let device = Device::default();
    let mr = pool(&device);
    let mut g = c.benchmark_group("W3");
    g.sample_size(10);
    for threads in [1usize, 4, 16] {
        let streams: Vec<Stream> = (0..threads)
            .map(|_| Stream::new(&device).unwrap())
            .collect();
        g.throughput(Throughput::Elements((2 * 5_000 * threads) as u64));
        g.bench_with_input(BenchmarkId::new("mt", threads), &streams, |b, streams| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        let ns_per_op = threaded(&mr, streams);
                        Duration::from_nanos((ns_per_op * (2 * 5_000 * threads) as f64) as u64)
                    })
                    .sum()
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = w1_pair, w2_random, w3_threads
}
criterion_main!(benches);
