//! A service under memory pressure: many concurrent requests share one bounded pool, and a
//! request that does not fit waits its turn (with a deadline) instead of failing.
//!
//! Each request needs a buffer of 1–16 MiB for 2–10 ms of device work; the pool
//! holds 64 MiB, far less than the requests in flight ask for together. The program prints how
//! many requests were served, how long the longest one waited for memory, and how many found
//! the pool full when they arrived: those a service built on `try_allocate` alone would have
//! failed.
//!
//! ```sh
//! cargo run --example memory_pressure   # on CUDA device 0 when there is one, else on the host backend
//! ```

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use streamalloc::{CudaResource, Device, DeviceBuffer, PoolResource, Result, Stream, StreamPool};

const POOL_BYTES: usize = 64 << 20;
const REQUESTS: usize = 400;
const MAX_REQUEST: u64 = 16 << 20;
/// How long a request waits for memory before it gives up.
const DEADLINE: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Tally {
    served: AtomicUsize,
    timed_out: AtomicUsize,
    /// Requests whose first poll found no memory: a plain `try_allocate` would have failed them.
    full_on_arrival: AtomicUsize,
    longest_wait_us: AtomicU64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    let device = Device::default();
    println!(
        "device {} ({}, {} backend)",
        device.id(),
        device.name(),
        device.backend()
    );
    // A bounded pool: initial size = maximum, so it never grows past 64 MiB.
    let pool = PoolResource::new(CudaResource::new(&device)?, POOL_BYTES, Some(POOL_BYTES))?;
    let streams = StreamPool::new(&device, 8)?;
    let tally = Arc::new(Tally::default());

    let started = Instant::now();
    let mut rng = SplitMix64(2026);
    let mut requests = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let bytes = 1 + (rng.next() % MAX_REQUEST) as usize;
        let work = Duration::from_micros(2_000 + rng.next() % 8_000);
        let (pool, stream, tally) = (pool.clone(), streams.get(), tally.clone());
        requests.push(tokio::spawn(serve(bytes, work, pool, stream, tally)));
        // Requests arrive faster than they finish.
        tokio::time::sleep(Duration::from_micros(rng.next() % 500)).await;
    }
    for r in requests {
        r.await.expect("a request panicked")?;
    }

    let stats = pool.statistics();
    println!(
        "{REQUESTS} requests of up to {} MiB over a {} MiB pool in {:?}",
        MAX_REQUEST >> 20,
        POOL_BYTES >> 20,
        started.elapsed()
    );
    println!("served: {}", tally.served.load(Ordering::Relaxed));
    println!(
        "timed out after {DEADLINE:?}: {}",
        tally.timed_out.load(Ordering::Relaxed)
    );
    println!(
        "longest wait for memory: {:?}",
        Duration::from_micros(tally.longest_wait_us.load(Ordering::Relaxed))
    );
    println!(
        "found the pool full on arrival (would have failed with plain try_allocate): {}",
        tally.full_on_arrival.load(Ordering::Relaxed)
    );
    println!(
        "pool at the end: {} bytes, {} free, {} allocations live",
        stats.reserved_bytes, stats.free_bytes, stats.live_allocations
    );
    Ok(())
}

/// One request: wait for a buffer, do the work on the device, give the buffer back.
async fn serve(
    bytes: usize,
    work: Duration,
    pool: PoolResource<CudaResource>,
    stream: Stream,
    tally: Arc<Tally>,
) -> Result<()> {
    let arrived = Instant::now();
    let mut request = pin!(DeviceBuffer::new(bytes, &stream, pool));
    // The first poll is the synchronous fast path: it resolves at once when memory is there.
    // (When other requests already wait, it queues behind them, first come, first served.)
    let first = std::future::poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))).await;
    let buffer = match first {
        Poll::Ready(buffer) => buffer?,
        Poll::Pending => {
            tally.full_on_arrival.fetch_add(1, Ordering::Relaxed);
            // Dropping the request at the deadline takes it out of the queue; nothing leaks.
            match tokio::time::timeout(DEADLINE, request).await {
                Ok(buffer) => buffer?,
                Err(_) => {
                    tally.timed_out.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
            }
        }
    };
    let waited = arrived.elapsed().as_micros() as u64;
    tally.longest_wait_us.fetch_max(waited, Ordering::Relaxed);

    let mut buffer = buffer;
    buffer.fill(0x5a)?; // the request's input, written on its stream
    stream.enqueue_delay(work)?; // a stand-in for the request's kernels
    stream.synchronize().await?; // the response is ready; no thread blocks meanwhile
    drop(buffer); // a stream-ordered free: the memory goes to the next request in line
    tally.served.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// SplitMix64: deterministic request sizes without a dependency.
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
