//! The mapped pool's figures on W4 and W1 (`../shared/bench/WORKLOADS.md`), on the device
//! `Device::default()` picks (CUDA device 0 when there is one, else the host emulation):
//!
//! `cargo bench --features bench --bench mapped_pool`
//!
//! W4: ns per step (timed pass) and peak device memory in use / peak live bytes (sampled pass,
//! `memory_info` after every allocation), each pass on a fresh pool, for the default pool
//! (free pages kept up to 1/32 of the mapped memory), one releasing every wholly free page
//! (threshold 0) and one keeping 64 MiB of free pages mapped. W1: ns per allocate+free pair
//! for the same three and for a `PoolResource` beside them (with threshold 0, each pair maps
//! and unmaps a page; the default maps nothing in the loop). Plain timing (no criterion): the
//! workloads are the figures.

#[path = "common/workloads.rs"]
mod workloads;

use std::hint::black_box;
use std::time::Instant;

use streamalloc::{
    CudaResource, Device, MappedPoolConfig, MappedPoolResource, MemoryResource, PoolResource,
    Stream,
};
use workloads::{footprint, FootprintRun, SplitMix64, FOOTPRINT_STEPS};

fn used(device: &Device) -> usize {
    let info = device.memory_info().unwrap();
    info.total - info.free
}

/// One W4 pass (the workloads' shared `footprint`) on a fresh pool; with `sample`, device
/// memory in use above what it was before the pool is read after every allocation.
fn w4(device: &Device, config: &MappedPoolConfig, sample: bool) -> FootprintRun {
    let before = used(device);
    let mr = MappedPoolResource::with_config(device, config.clone()).unwrap();
    let s = Stream::new(device).unwrap();
    let read = || used(device).saturating_sub(before);
    let run = footprint(
        &mr,
        &s,
        FOOTPRINT_STEPS,
        sample.then_some(&read as &dyn Fn() -> usize),
    )
    .unwrap();
    s.synchronize_blocking().unwrap();
    run
}

fn w1(device: &Device, mr: &impl MemoryResource) -> f64 {
    let s = Stream::new(device).unwrap();
    let mut rng = SplitMix64(42);
    let sizes: Vec<usize> = (0..64)
        .map(|_| 1 + (rng.next() % (1 << 20)) as usize)
        .collect();
    let pair = |i: usize| {
        let n = sizes[i % 64];
        let p = mr.try_allocate(n, &s).unwrap();
        // SAFETY: just allocated from `mr` with `n`, used by nothing.
        unsafe { mr.deallocate(black_box(p), n, &s) };
    };
    (0..1_000).for_each(pair);
    let iterations = 200_000;
    let start = Instant::now();
    (0..iterations).for_each(pair);
    start.elapsed().as_nanos() as f64 / iterations as f64
}

fn main() {
    let device = Device::default();
    println!("device: {}", device.name());
    let configs = [
        ("mapped_pool (default)", MappedPoolConfig::default()),
        (
            "mapped_pool threshold 0",
            MappedPoolConfig::default().release_threshold(0),
        ),
        (
            "mapped_pool keep 64 MiB",
            MappedPoolConfig::default().release_threshold(64 << 20),
        ),
    ];
    // `MAPPED_POOL_CASE=W1` (or `W4`) runs one workload only (to profile it).
    let case = std::env::var("MAPPED_POOL_CASE").ok();
    let run = |workload: &str| case.as_deref().is_none_or(|c| c == workload);
    for (name, config) in configs.iter().filter(|_| run("W4")) {
        let ns = w4(&device, config, false).ns_per_step;
        let sampled = w4(&device, config, true);
        let (live, peak) = (sampled.peak_live, sampled.peak_used);
        println!(
            "W4 {name:<24} {ns:>9.0} ns/step  peak live {:>8.1} MiB  peak device {:>8.1} MiB  ratio {:.3}",
            live as f64 / (1 << 20) as f64,
            peak as f64 / (1 << 20) as f64,
            peak as f64 / live as f64
        );
    }
    if !run("W1") {
        return;
    }
    for (name, config) in &configs {
        let mr = MappedPoolResource::with_config(&device, config.clone()).unwrap();
        println!("W1 {name:<24} {:>9.1} ns/pair", w1(&device, &mr));
    }
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 64 << 20, None).unwrap();
    println!(
        "W1 {:<24} {:>9.1} ns/pair",
        "PoolResource (64 MiB)",
        w1(&device, &pool)
    );
}
