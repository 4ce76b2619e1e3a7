//! Criterion benches of the allocation workloads W1–W3 (`../shared/bench/WORKLOADS.md`) on
//! `PoolResource`, plus the allocation future's ready path against `try_allocate`, W1 through two
//! adaptors, and the wake latency from a free to the waiting task resuming.
//!
//! `OOM` times a `try_allocate` that cannot fit at 10^5 live blocks.
//! W4's footprint (peak memory taken from the device / peak live bytes) of the pool as W4 sets it
//! up (initial size 0, no maximum) is printed first, before criterion's groups; W4's timed pass is
//! the `W4/footprint` bench.
//!
//! Run: `cargo bench --features bench --bench pool`. They run on `Device::default()`: the host backend here,
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

/// W4's pool: over device memory, empty at first, no maximum.
fn empty_pool(device: &Device) -> PoolResource<CudaResource> {
    PoolResource::new(CudaResource::new(device).expect("device resource"), 0, None).expect("pool")
}

/// The device's memory in use now.
fn device_used(device: &Device) -> usize {
    let info = device.memory_info().expect("memory info");
    info.total - info.free
}

/// One W4 pass (`../shared/bench/WORKLOADS.md`): seed 9, 20,000 steps on one stream. With
/// `sample`, reads after every allocation the device memory in use (above `base`) and the
/// pool's size; returns (peak live, peak device use, peak pool size) and the pass's time.
fn w4_pass(
    device: &Device,
    mr: &PoolResource<CudaResource>,
    stream: &Stream,
    sample: bool,
) -> ([usize; 3], Duration) {
    let base = device_used(device);
    let mut rng = workloads::SplitMix64(9);
    let mut live: Vec<(usize, streamalloc::DevicePtr, usize)> = Vec::new();
    let (mut live_bytes, mut peaks) = (0usize, [0usize; 3]);
    let t = Instant::now();
    for i in 0..20_000usize {
        let k = rng.next() % 100;
        let block = if k < 50 {
            Some((
                1 + (rng.next() % 65_536) as usize,
                1 + (rng.next() % 1_000) as usize,
            ))
        } else if k < 55 {
            let bytes = (1 << 20) + (rng.next() % (63 << 20)) as usize;
            Some((bytes, 1 + (rng.next() % 50) as usize))
        } else {
            None
        };
        if let Some((bytes, lifetime)) = block {
            let p = mr.try_allocate(bytes, stream).expect("W4 allocation");
            live.push((i + lifetime, p, bytes));
            live_bytes += bytes;
            if sample {
                peaks[0] = peaks[0].max(live_bytes);
                peaks[1] = peaks[1].max(device_used(device).saturating_sub(base));
                peaks[2] = peaks[2].max(mr.pool_size());
            }
        }
        live.retain(|&(expiry, p, bytes)| {
            if expiry == i {
                // SAFETY: allocated above from `mr` with `bytes`; no device work uses it.
                unsafe { mr.deallocate(p, bytes, stream) };
                live_bytes -= bytes;
            }
            expiry != i
        });
    }
    for (_, p, bytes) in live.drain(..) {
        // SAFETY: as above.
        unsafe { mr.deallocate(p, bytes, stream) };
    }
    (peaks, t.elapsed())
}

/// W4's figures: the sampled pass, printed (device use includes frees the device has not
/// reached yet on the host backend; the pool's size is what it holds from its upstream).
fn w4_footprint(c: &mut Criterion) {
    let device = Device::default();
    let stream = Stream::new(&device).unwrap();
    let mut g = c.benchmark_group("W4");
    g.sample_size(10);
    g.throughput(Throughput::Elements(20_000));
    let mut printed = false;
    g.bench_function("footprint", |b| {
        // The sampled pass, once, when this bench is selected.
        if !std::mem::replace(&mut printed, true) {
            let mr = empty_pool(&device);
            let ([live, used, held], _) = w4_pass(&device, &mr, &stream, true);
            println!(
                "W4 footprint PoolResource(0, None) on {}: peak live {live} B, peak device use \
                 {used} B ({:.3}x), peak pool size {held} B ({:.3}x)",
                device.id(),
                used as f64 / live as f64,
                held as f64 / live as f64,
            );
            drop(mr);
            stream.synchronize_blocking().unwrap();
        }
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| w4_pass(&device, &empty_pool(&device), &stream, false).1)
                .sum()
        })
    });
    g.finish();
}

/// A "won't fit" answer at 10^5 live blocks: a pool of 256 MiB (its maximum, taken at once)
/// holds 100,000 blocks of 2 KiB from one stream; a request of 128 MiB fits the maximum but
/// not the free memory, so `try_allocate` fails with out-of-memory and the pool's details.
/// Goal (issue 14): at most 1 µs.
fn oom_answer(c: &mut Criterion) {
    const BLOCKS: usize = 100_000;
    const BLOCK: usize = 2 << 10;
    const MAXIMUM: usize = 256 << 20;
    let device = Device::default();
    let stream = Stream::new(&device).unwrap();
    let mut g = c.benchmark_group("OOM");
    // Set up on first use, when this bench is selected (criterion calls the closure for each
    // sample).
    let mut state: Option<(PoolResource<CudaResource>, Vec<streamalloc::DevicePtr>)> = None;
    g.bench_function("try_allocate won't fit, 1e5 live", |b| {
        let (mr, _) = state.get_or_insert_with(|| {
            let mr = PoolResource::new(
                CudaResource::new(&device).expect("device resource"),
                MAXIMUM,
                Some(MAXIMUM),
            )
            .expect("pool");
            let live: Vec<_> = (0..BLOCKS)
                .map(|_| mr.try_allocate(BLOCK, &stream).expect("a block"))
                .collect();
            let e = mr.try_allocate(128 << 20, &stream).unwrap_err();
            assert!(e.out_of_memory_details().is_some(), "{e}");
            (mr, live)
        });
        b.iter(|| mr.try_allocate(128 << 20, &stream).unwrap_err());
    });
    g.finish();
    if let Some((mr, live)) = state {
        for p in live {
            // SAFETY: allocated above from `mr` with `BLOCK` bytes; no device work uses it.
            unsafe { mr.deallocate(p, BLOCK, &stream) };
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = w4_footprint, oom_answer, w1_pair, w2_random, w3_threads
}
criterion_main!(benches);
