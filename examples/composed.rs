//! A composed stack, installed as the device's current resource and shared by several tokio
//! tasks: statistics over logging over binning over a pool.
//!
//! ```text
//! StatisticsAdaptor            counts bytes and allocations: now, peak, total
//!   LoggingAdaptor             RMM's CSV allocation log, to a file
//!     BinningResource          64 KiB .. 1 MiB fixed-size bins; larger requests go to the pool
//!       PoolResource           256 MiB now, at most 1 GiB
//!         CudaResource         cuMemAlloc (host memory on the host backend)
//! ```
//!
//! Each task allocates device buffers of random sizes through the current resource, fills them
//! on its own stream and drops them (a stream-ordered free). At the end the program prints the
//! statistics, what the pool holds, and what the log says.
//!
//! ```sh
//! cargo run --example composed   # on CUDA device 0 when there is one, else on the host backend
//! ```

use std::sync::Arc;
use std::time::Instant;

use streamalloc::replay::{parse_log_file, Action};
use streamalloc::{
    reset_current_device_resource_for, set_current_device_resource_for, BinningResource,
    CudaResource, Device, DeviceBuffer, LoggingAdaptor, PoolResource, StatisticsAdaptor, Stream,
};

const TASKS: u64 = 8;
const BUFFERS_PER_TASK: usize = 200;

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let device = Device::default();
    println!(
        "device {} ({}, {} backend)",
        device.id(),
        device.name(),
        device.backend()
    );

    let pool = PoolResource::new(CudaResource::new(&device)?, 256 << 20, Some(1 << 30))?;
    let binning = BinningResource::with_range(pool.clone(), 16, 20)?;
    let log_path =
        std::env::temp_dir().join(format!("streamalloc-composed-{}.csv", std::process::id()));
    let logged = LoggingAdaptor::to_file(binning, &log_path)?;
    let stats = StatisticsAdaptor::new(logged.clone());
    // Every container that is given no resource now uses this stack on this device.
    set_current_device_resource_for(&device, Arc::new(stats.clone()))?;

    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let device = device.clone();
            tokio::spawn(async move {
                let stream = Stream::new(&device)?;
                let mut rng = SplitMix64(task + 1);
                let mut held = Vec::new();
                for _ in 0..BUFFERS_PER_TASK {
                    // Mostly small buffers (served by the bins), now and then a large one
                    // (served by the pool).
                    let bytes = if rng.next() % 10 == 0 {
                        (2 << 20) + (rng.next() % (6 << 20)) as usize
                    } else {
                        1 + (rng.next() % (1 << 20)) as usize
                    };
                    let mut buf = DeviceBuffer::with_current_resource(bytes, &stream).await?;
                    buf.fill(task as u8)?;
                    held.push(buf);
                    if held.len() > 16 {
                        held.swap_remove((rng.next() % 16) as usize); // freed on `stream`
                    }
                }
                drop(held);
                stream.synchronize().await
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a task panicked")?;
    }
    let elapsed = started.elapsed();
    reset_current_device_resource_for(&device);

    let counters = stats.counters();
    println!(
        "{TASKS} tasks x {BUFFERS_PER_TASK} buffers through the current device resource in {elapsed:?}"
    );
    println!(
        "bytes:       now {:>12}, peak {:>12}, total {:>12}",
        counters.bytes.value, counters.bytes.peak, counters.bytes.total
    );
    println!(
        "allocations: now {:>12}, peak {:>12}, total {:>12}",
        counters.allocations.value, counters.allocations.peak, counters.allocations.total
    );
    let pool_stats = pool.statistics();
    println!(
        "pool: {} bytes from the upstream in {} chunks, {} free, {} live allocations (the bins' batches among them)",
        pool_stats.reserved_bytes, pool_stats.upstream_chunks, pool_stats.free_bytes, pool_stats.live_allocations
    );

    logged.flush()?;
    let events = parse_log_file(&log_path)?;
    let count = |a: Action| events.iter().filter(|e| e.action == a).count();
    println!(
        "log {}: {} allocations, {} frees, {} failures",
        log_path.display(),
        count(Action::Allocate),
        count(Action::Free),
        count(Action::AllocateFailure)
    );
    std::fs::remove_file(&log_path).ok();
    Ok(())
}

/// SplitMix64: deterministic sizes without a dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
