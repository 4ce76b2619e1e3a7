//! Criterion benches of the typed containers against the untyped buffer they wrap: making a
//! `DeviceVec<f32>` and dropping it, against a `DeviceBuffer` of the same bytes, on a
//! `PoolResource`. The goal is a typed layer that costs nothing: at most 1.05x the buffer.
//!
//! Run: `cargo bench --features bench --bench containers`. They run on `Device::default()`: the host backend
//! here, CUDA device 0 on a GPU machine. The pool serves every request from its free list, so
//! what is measured is the container's own work (size checks, use state, the stream-ordered
//! free) plus the pool's bookkeeping; the upstream is touched at start-up alone.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use streamalloc::{
    CudaResource, Device, DeviceBuffer, DeviceVec, MemoryResource, PoolResource, SharedResource,
    Stream,
};

/// A pool over plain device memory with room for every request, as a shared handle (what a
/// buffer keeps; passing it makes no new `Arc` per call).
fn pool(device: &Device) -> SharedResource {
    let pool = PoolResource::new(
        CudaResource::new(device).expect("device resource"),
        64 << 20,
        None,
    )
    .expect("pool");
    std::sync::Arc::new(pool) as std::sync::Arc<dyn MemoryResource>
}

/// Runs `iters` calls of `timed` in blocks of 64, each followed by as many untimed calls of
/// `other`; returns the time spent in `timed`.
fn interleaved(iters: u64, mut timed: impl FnMut(), mut other: impl FnMut()) -> Duration {
    const BLOCK: u64 = 64;
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = BLOCK.min(iters - done);
        let t = Instant::now();
        for _ in 0..n {
            timed();
        }
        total += t.elapsed();
        for _ in 0..n {
            other();
        }
        done += n;
    }
    total
}

fn new_and_drop(c: &mut Criterion) {
    let device = Device::default();
    let stream = Stream::new(&device).unwrap();
    let mr = pool(&device);
    let mut g = c.benchmark_group("containers");
    g.throughput(Throughput::Elements(1));
    for elems in [256usize, 1 << 18] {
        let bytes = elems * std::mem::size_of::<f32>();
        let buffer = || {
            drop(black_box(
                DeviceBuffer::try_new(bytes, &stream, mr.clone()).unwrap(),
            ))
        };
        let vec = || {
            drop(black_box(
                DeviceVec::<f32>::try_new(elems, &stream, mr.clone()).unwrap(),
            ))
        };
        // Each timed block of one is followed by an untimed block of the other, so both see
        // the same cache state and the same load from whatever else runs on the machine.
        g.bench_function(BenchmarkId::new("DeviceBuffer::try_new+drop", bytes), |b| {
            b.iter_custom(|iters| interleaved(iters, buffer, vec))
        });
        g.bench_function(
            BenchmarkId::new("DeviceVec::<f32>::try_new+drop", bytes),
            |b| b.iter_custom(|iters| interleaved(iters, vec, buffer)),
        );
        // The builder futures on their ready path: one poll, no waiting.
        g.bench_with_input(
            BenchmarkId::new("DeviceBuffer::new().await+drop", bytes),
            &bytes,
            |b, &bytes| {
                b.iter_custom(|iters| {
                    futures::executor::block_on(async {
                        let t = Instant::now();
                        for _ in 0..iters {
                            let buf = DeviceBuffer::new(bytes, &stream, mr.clone()).await;
                            drop(black_box(buf.unwrap()));
                        }
                        t.elapsed()
                    })
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("DeviceVec::<f32>::new().await+drop", bytes),
            &elems,
            |b, &elems| {
                b.iter_custom(|iters| {
                    futures::executor::block_on(async {
                        let t = Instant::now();
                        for _ in 0..iters {
                            let v = DeviceVec::<f32>::new(elems, &stream, mr.clone()).await;
                            drop(black_box(v.unwrap()));
                        }
                        t.elapsed()
                    })
                })
            },
        );
    }
    g.finish();
}

/// The ratio the book reports, robust against a loaded machine: blocks of 200 pairs of each,
/// alternated 3,000 times; the ratio of the two per-pair times at the minimum, the 10th
/// percentile and the median of the blocks. Printed, not a criterion measurement.
fn ratio_summary(_: &mut Criterion) {
    let device = Device::default();
    let stream = Stream::new(&device).unwrap();
    let mr = pool(&device);
    println!("DeviceVec::<f32>::try_new+drop / DeviceBuffer::try_new+drop on {device:?}:");
    for elems in [256usize, 1 << 18] {
        let bytes = elems * std::mem::size_of::<f32>();
        let (mut buffer, mut vec) = (Vec::new(), Vec::new());
        let per_pair = |t: Instant| t.elapsed().as_nanos() as f64 / 200.0;
        for round in 0..3000 {
            let mut run_buffer = || {
                let t = Instant::now();
                for _ in 0..200 {
                    drop(black_box(
                        DeviceBuffer::try_new(bytes, &stream, mr.clone()).unwrap(),
                    ));
                }
                buffer.push(per_pair(t));
            };
            let mut run_vec = || {
                let t = Instant::now();
                for _ in 0..200 {
                    drop(black_box(
                        DeviceVec::<f32>::try_new(elems, &stream, mr.clone()).unwrap(),
                    ));
                }
                vec.push(per_pair(t));
            };
            // Alternate which goes first, so neither always follows the other.
            if round % 2 == 0 {
                run_buffer();
                run_vec();
            } else {
                run_vec();
                run_buffer();
            }
        }
        buffer.sort_by(f64::total_cmp);
        vec.sort_by(f64::total_cmp);
        let at = |v: &[f64], q: usize| v[v.len() * q / 100];
        println!(
            "  {bytes} bytes: buffer {:.1} / {:.1} / {:.1} ns, vec {:.1} / {:.1} / {:.1} ns \
             (min / p10 / median); ratio {:.3} / {:.3} / {:.3}",
            at(&buffer, 0),
            at(&buffer, 10),
            at(&buffer, 50),
            at(&vec, 0),
            at(&vec, 10),
            at(&vec, 50),
            at(&vec, 0) / at(&buffer, 0),
            at(&vec, 10) / at(&buffer, 10),
            at(&vec, 50) / at(&buffer, 50),
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = ratio_summary, new_and_drop
}
criterion_main!(benches);
