//! The allocation workloads W1–W4 of `../shared/bench/WORKLOADS.md`, shared by the criterion
//! bench (`benches/pool.rs`) and the side-by-side table (`benches/workloads.rs`). They must stay
//! identical to `../shared/anchors/rmm/rmm_bench.cpp`, which RMM runs in the same GPU run.

#![allow(dead_code)] // each bench binary uses part of it

use std::sync::Barrier;
use std::time::{Duration, Instant};

use streamalloc::{DevicePtr, MemoryResource, Stream};

#[path = "../../tests/common/rng.rs"]
mod rng;
pub use rng::SplitMix64;

pub const MIB: usize = 1 << 20;
pub const GIB: usize = 1 << 30;

/// W1's 64 sizes in `1..=1 MiB` (seed 42).
pub fn pair_sizes() -> [usize; 64] {
    let mut rng = SplitMix64(42);
    std::array::from_fn(|_| 1 + (rng.next() % (1 << 20)) as usize)
}

fn alloc<R: MemoryResource + ?Sized>(mr: &R, bytes: usize, stream: &Stream) -> DevicePtr {
    mr.try_allocate(bytes, stream)
        .unwrap_or_else(|e| panic!("allocating {bytes} bytes: {e}"))
}

fn free<R: MemoryResource + ?Sized>(mr: &R, p: DevicePtr, bytes: usize, stream: &Stream) {
    // SAFETY: every caller frees a pointer it allocated from `mr` with `bytes`, which no device
    // work uses (the workloads launch none).
    unsafe { mr.deallocate(p, bytes, stream) }
}

/// One W1 step: allocate `sizes[i % 64]` and free it at once.
#[inline(always)]
pub fn pair_step<R: MemoryResource + ?Sized>(
    mr: &R,
    stream: &Stream,
    sizes: &[usize; 64],
    i: usize,
) {
    let n = sizes[i & 63];
    let p = alloc(mr, n, stream);
    free(mr, std::hint::black_box(p), n, stream);
}

/// W1 `pair`: 1,000 warm-up pairs, then `iters` timed ones. Returns ns per pair.
pub fn pair<R: MemoryResource + ?Sized>(mr: &R, stream: &Stream, iters: usize) -> f64 {
    let sizes = pair_sizes();
    for i in 0..1_000 {
        pair_step(mr, stream, &sizes, i);
    }
    let t = Instant::now();
    for i in 0..iters {
        pair_step(mr, stream, &sizes, i);
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

/// W1 through the allocation future: `mr.allocate(..).await` inside one `block_on`, each
/// completing at its first poll. Returns ns per pair.
pub fn pair_awaited<R: MemoryResource>(mr: &R, stream: &Stream, iters: usize) -> f64 {
    let sizes = pair_sizes();
    futures::executor::block_on(async {
        for i in 0..1_000 {
            let n = sizes[i & 63];
            let p = mr.allocate(n, stream).await.expect("allocate");
            free(mr, p, n, stream);
        }
        let t = Instant::now();
        for i in 0..iters {
            let n = sizes[i & 63];
            let p = mr.allocate(n, stream).await.expect("allocate");
            free(mr, std::hint::black_box(p), n, stream);
        }
        t.elapsed().as_nanos() as f64 / iters as f64
    })
}

/// W2's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Random {
    pub n: usize,
    pub max: usize,
    pub seed: u64,
    pub cap: usize,
}

/// W2 `rand1MiB`.
pub const RAND_1MIB: Random = Random {
    n: 10_000,
    max: MIB,
    seed: 1,
    cap: 16 * GIB,
};
/// W2 `rand64MiB`.
pub const RAND_64MIB: Random = Random {
    n: 1_000,
    max: 64 * MIB,
    seed: 2,
    cap: 16 * GIB,
};

/// W2 `random`: RMM's random_allocations, restated. Returns the total time; the figure is that
/// over `2 n`.
pub fn random<R: MemoryResource + ?Sized>(mr: &R, stream: &Stream, w: Random) -> Duration {
    let mut rng = SplitMix64(w.seed);
    let mut live: Vec<(DevicePtr, usize)> = Vec::with_capacity(w.n);
    let (mut made, mut used) = (0usize, 0usize);
    let t = Instant::now();
    for _ in 0..2 * w.n {
        let mut do_alloc = made < w.n && (live.is_empty() || rng.next() % 100 < 73);
        if do_alloc {
            let bytes = 1 + (rng.next() % w.max as u64) as usize;
            if used + bytes > w.cap {
                do_alloc = false;
            } else {
                match mr.try_allocate(bytes, stream) {
                    Ok(p) => {
                        live.push((p, bytes));
                        made += 1;
                        used += bytes;
                    }
                    Err(e) if e.is_out_of_memory() => do_alloc = false,
                    Err(e) => panic!("allocating {bytes} bytes: {e}"),
                }
            }
        }
        if !do_alloc && !live.is_empty() {
            let k = (rng.next() % live.len() as u64) as usize;
            let (p, bytes) = live.swap_remove(k);
            free(mr, p, bytes, stream);
            used -= bytes;
        }
    }
    for (p, bytes) in live {
        free(mr, p, bytes, stream);
    }
    t.elapsed()
}

/// W2 as a figure: ns per loop iteration.
pub fn random_ns<R: MemoryResource + ?Sized>(mr: &R, stream: &Stream, w: Random) -> f64 {
    random(mr, stream, w).as_nanos() as f64 / (2 * w.n) as f64
}

/// W3 `mtT`: `threads` threads, each on its own stream, warm up with W2 (n = 1,000, seed 7 + i),
/// then start together and run W2 (n = 5,000, seed 100 + i, cap 16 GiB / T). Returns the
/// aggregate ns per operation: wall time / (2 × 5,000 × T).
pub fn threaded<R: MemoryResource + ?Sized>(mr: &R, streams: &[Stream]) -> f64 {
    const N: usize = 5_000;
    let threads = streams.len();
    let barrier = Barrier::new(threads + 1);
    let wall = std::thread::scope(|scope| {
        for (i, stream) in streams.iter().enumerate() {
            let barrier = &barrier;
            scope.spawn(move || {
                let warm = Random {
                    n: 1_000,
                    max: MIB,
                    seed: 7 + i as u64,
                    cap: 16 * GIB,
                };
                random(mr, stream, warm);
                barrier.wait();
                let timed = Random {
                    n: N,
                    max: MIB,
                    seed: 100 + i as u64,
                    cap: 16 * GIB / threads,
                };
                random(mr, stream, timed);
                barrier.wait();
            });
        }
        barrier.wait();
        let t = Instant::now();
        barrier.wait();
        t.elapsed()
    });
    wall.as_nanos() as f64 / (2 * N * threads) as f64
}

/// W4's seed and length.
pub const FOOTPRINT_SEED: u64 = 9;
pub const FOOTPRINT_STEPS: usize = 20_000;

/// W4's draw for one step: `Some((bytes, lifetime in steps))`, or `None` (no allocation).
/// Small blocks: `1 + next() % 65,536` bytes for `1 + next() % 1,000` steps (k < 50); large:
/// `1 MiB + next() % 63 MiB` bytes for `1 + next() % 50` steps (50 <= k < 55).
pub fn footprint_draw(rng: &mut SplitMix64) -> Option<(usize, usize)> {
    let k = rng.next() % 100;
    if k < 50 {
        let bytes = 1 + (rng.next() % 65_536) as usize;
        Some((bytes, 1 + (rng.next() % 1_000) as usize))
    } else if k < 55 {
        let bytes = MIB + (rng.next() % (63 << 20)) as usize;
        Some((bytes, 1 + (rng.next() % 50) as usize))
    } else {
        None
    }
}

/// What one W4 pass measured.
#[derive(Clone, Copy, Debug)]
pub struct FootprintRun {
    /// Wall time over the steps (sampling included when sampled).
    pub ns_per_step: f64,
    /// The peak of the bytes live at once (as requested, not as rounded by the resource).
    pub peak_live: usize,
    /// The peak of `device_used()` read after every allocation; 0 when not sampled.
    pub peak_used: usize,
    /// Allocations made.
    pub allocations: usize,
}

/// W4 `footprint` on `mr` for `steps` steps (`FOOTPRINT_STEPS` in the figures), as RMM's anchor
/// runs it: the draw of [`footprint_draw`], then the frees of every block expiring at this step,
/// in allocation order (a scan of the live list, as the anchor's), then everything left is freed.
/// With `device_used`, reads it after every allocation and keeps the peak (the sampled pass);
/// without, times the steps (the timed pass). An allocation that fails ends the run: every
/// live block is freed and the error returned with the step (W4 has no cap, so a failure is a
/// finding about the resource).
pub fn footprint<R: MemoryResource + ?Sized>(
    mr: &R,
    stream: &Stream,
    steps: usize,
    device_used: Option<&dyn Fn() -> usize>,
) -> Result<FootprintRun, String> {
    struct Live {
        p: DevicePtr,
        bytes: usize,
        expiry: usize,
    }
    let mut rng = SplitMix64(FOOTPRINT_SEED);
    let mut live: Vec<Live> = Vec::new();
    let (mut used, mut peak_live, mut peak_used, mut allocations) = (0usize, 0usize, 0usize, 0);
    let t = Instant::now();
    for i in 0..steps {
        if let Some((bytes, life)) = footprint_draw(&mut rng) {
            let p = match mr.try_allocate(bytes, stream) {
                Ok(p) => p,
                Err(e) => {
                    for b in live {
                        free(mr, b.p, b.bytes, stream);
                    }
                    return Err(format!(
                        "step {i}: allocating {bytes} bytes with {used} live: {e}"
                    ));
                }
            };
            live.push(Live {
                p,
                bytes,
                expiry: i + life,
            });
            allocations += 1;
            used += bytes;
            peak_live = peak_live.max(used);
            if let Some(read) = device_used {
                peak_used = peak_used.max(read());
            }
        }
        live.retain(|b| {
            if b.expiry == i {
                free(mr, b.p, b.bytes, stream);
                used -= b.bytes;
                false
            } else {
                true
            }
        });
    }
    for b in live {
        free(mr, b.p, b.bytes, stream);
    }
    Ok(FootprintRun {
        ns_per_step: t.elapsed().as_nanos() as f64 / steps as f64,
        peak_live,
        peak_used,
        allocations,
    })
}
