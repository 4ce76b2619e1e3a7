//! A multi-stream data service under memory pressure: 1,000 concurrent requests, each a tokio
//! task that allocates its scratch vector from one pool capped near a third of what the
//! requests ask for together, with a deadline on the wait for memory; a tenth of them are
//! cancelled by their clients (the task is aborted, wherever it is). Each served request runs a
//! kernel on its scratch and reads a few results back.
//!
//! It prints how many requests were served, timed out and cancelled, the median and 99th
//! percentile wait for memory, the pool's statistics, and shows that nothing leaked: the
//! allocation counters are back to zero, no allocation is live in the pool, and (host backend)
//! the device holds no memory once the pool is dropped.
//!
//! ```sh
//! cargo run --release --example service   # CUDA device 0 (a PTX kernel), else the host backend
//! ```

use std::time::{Duration, Instant};

use streamalloc::{
    BackendKind, CudaAsyncResource, Device, DeviceVec, Error, PoolResource, StatisticsAdaptor,
    Stream, StreamPool,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const REQUESTS: usize = 1000;
const STREAMS: usize = 8;
/// Scratch per request: between these many f32 elements (256 KiB to 2 MiB).
const MIN_ELEMS: usize = 64 << 10;
const MAX_ELEMS: usize = 512 << 10;
/// How long a request waits for memory before it gives up.
const DEADLINE: Duration = Duration::from_millis(500);
/// Kernel iterations per element.
const ITERS: u32 = 4;
/// The rest of a request's device work after its kernel (a stand-in: the stream is busy
/// this long), during which it holds its scratch.
const WORK: Duration = Duration::from_millis(2);

/// What the kernel leaves in element `j`: `x = j % 1024 / 64`, then `x = 0.75 x + 0.25`,
/// `ITERS` times (`mul.rn` then `add.rn` in the PTX, so the host check is bit-exact).
fn expected(j: usize) -> f32 {
    let mut x = (j & 1023) as f32 * 0.015625;
    for _ in 0..ITERS {
        x = x * 0.75 + 0.25;
    }
    x
}

/// How a request's kernel is launched.
#[derive(Clone)]
enum Kernel {
    Host,
    #[cfg(feature = "nvrtc")]
    Ptx(std::sync::Arc<streamalloc::cudarc::driver::CudaFunction>),
}

impl Kernel {
    /// Enqueues the kernel on `stream`, which owns `x`.
    fn launch(&self, stream: &Stream, x: &mut DeviceVec<f32>) -> Result<(), BoxError> {
        match self {
            Kernel::Host => stream.launch_host_kernel(x.host_write(), |x: &mut [f32]| {
                x.iter_mut().enumerate().for_each(|(j, v)| *v = expected(j))
            })?,
            #[cfg(feature = "nvrtc")]
            Kernel::Ptx(f) => {
                use streamalloc::cudarc::driver::{LaunchConfig, PushKernelArg};
                let (n, iters) = (x.len() as u32, ITERS);
                let cs = stream.cudarc_stream()?;
                // SAFETY: `fill(float*, unsigned n, unsigned iters)` over the vector's `n`
                // elements, on its owner stream.
                unsafe {
                    cs.launch_builder(f)
                        .arg(x)
                        .arg(&n)
                        .arg(&iters)
                        .launch(LaunchConfig::for_num_elems(n))
                }?;
            }
        }
        Ok(())
    }
}

/// `x[i] = (i % 1024) / 64`, then `x = 0.75 x + 0.25`, `iters` times.
#[cfg(feature = "nvrtc")]
const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry fill(
    .param .u64 x_param,
    .param .u32 n_param,
    .param .u32 iters_param
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<9>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [x_param];
    ld.param.u32 %r2, [n_param];
    ld.param.u32 %r3, [iters_param];
    mov.u32 %r4, %ctaid.x;
    mov.u32 %r5, %ntid.x;
    mov.u32 %r6, %tid.x;
    mad.lo.s32 %r1, %r4, %r5, %r6;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    and.b32 %r8, %r1, 1023;
    cvt.rn.f32.u32 %f1, %r8;
    mul.rn.f32 %f1, %f1, 0f3C800000;
    mov.u32 %r7, 0;
    setp.eq.u32 %p2, %r3, 0;
    @%p2 bra STORE;
LOOP:
    mul.rn.f32 %f1, %f1, 0f3F400000;
    add.rn.f32 %f1, %f1, 0f3E800000;
    add.u32 %r7, %r7, 1;
    setp.lt.u32 %p2, %r7, %r3;
    @%p2 bra LOOP;
STORE:
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f1;
DONE:
    ret;
}
"#;

/// How a request ended.
enum Outcome {
    /// Served, after waiting this long for memory.
    Served(Duration),
    TimedOut,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<(), BoxError> {
    let mut device = Device::default();
    let kernel = match device.backend() {
        BackendKind::Host => Kernel::Host,
        BackendKind::Cuda => cuda_kernel(&mut device)?,
    };
    println!(
        "device {} ({}, {} backend)",
        device.id(),
        device.name(),
        device.backend()
    );

    // The requests, decided up front: scratch sizes, arrival gaps, who cancels and when.
    let mut rng = SplitMix64(13);
    let plan: Vec<(usize, Duration, Option<Duration>)> = (0..REQUESTS)
        .map(|_| {
            let elems = MIN_ELEMS + (rng.next() as usize % (MAX_ELEMS - MIN_ELEMS));
            // Bursts: 50 requests at once, every 10 ms on average.
            let gap = Duration::from_micros(if rng.next() % 50 == 0 { 10_000 } else { 0 });
            let cancel = (rng.next() % 10 == 0).then(|| Duration::from_micros(rng.next() % 50_000));
            (elems, gap, cancel)
        })
        .collect();
    let demand: usize = plan.iter().map(|(e, ..)| e * size_of::<f32>()).sum();
    let cap = demand / 3 / 256 * 256;
    let pool = PoolResource::new(CudaAsyncResource::new(&device)?, cap, Some(cap))?;
    let mr = StatisticsAdaptor::new(pool.clone());
    let streams = StreamPool::new(&device, STREAMS)?;
    println!(
        "{REQUESTS} requests of {}-{} KiB scratch, {} MiB in all, over a pool capped at {} MiB \
         (1/3); wait deadline {DEADLINE:?}; {STREAMS} streams",
        (MIN_ELEMS * 4) >> 10,
        (MAX_ELEMS * 4) >> 10,
        demand >> 20,
        cap >> 20
    );

    let cancels = plan.iter().filter(|(_, _, c)| c.is_some()).count();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(REQUESTS);
    for (elems, gap, cancel) in plan {
        let (mr, stream, kernel) = (mr.clone(), streams.get(), kernel.clone());
        let task = tokio::spawn(serve(elems, mr, stream, kernel));
        if let Some(after) = cancel {
            // The client gives up: the task is aborted wherever it is (waiting for memory,
            // awaiting its kernel), and its future is dropped.
            let abort = task.abort_handle();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                abort.abort();
            });
        }
        tasks.push(task);
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    let (mut waits, mut timed_out, mut cancelled) = (Vec::new(), 0, 0);
    for task in tasks {
        match task.await {
            Ok(Ok(Outcome::Served(w))) => waits.push(w),
            Ok(Ok(Outcome::TimedOut)) => timed_out += 1,
            Ok(Err(e)) => return Err(e),
            Err(e) if e.is_cancelled() => cancelled += 1,
            Err(e) => return Err(e.into()),
        }
    }
    let elapsed = started.elapsed();
    for s in 0..STREAMS {
        streams.get_at(s).synchronize().await?;
    }

    waits.sort();
    let pct = |p: usize| {
        waits
            .get((waits.len() * p / 100).min(waits.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!("done in {:.2} s", elapsed.as_secs_f64());
    println!(
        "served {}, timed out {timed_out}, cancelled {cancelled} (of {REQUESTS}; {cancels} \
         clients gave up, {} of them after being served)",
        waits.len(),
        cancels - cancelled
    );
    println!(
        "wait for memory (served): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        pct(50).as_secs_f64() * 1e3,
        pct(99).as_secs_f64() * 1e3,
        waits.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    let counters = mr.counters();
    println!(
        "allocations: {} in all, peak {} MiB live; now {} live, {} bytes",
        counters.allocations.total,
        counters.bytes.peak >> 20,
        counters.allocations.value,
        counters.bytes.value
    );
    let stats = pool.statistics();
    println!(
        "pool: {} MiB in {} chunk(s), {} MiB free in {} block(s) (largest {} MiB), {} live allocations",
        stats.reserved_bytes >> 20,
        stats.upstream_chunks,
        stats.free_bytes >> 20,
        stats.free_blocks,
        stats.largest_free_block >> 20,
        stats.live_allocations
    );

    // Nothing leaked: no allocation outstanding, none live in the pool, no deferred error.
    assert_eq!(
        (counters.allocations.value, counters.bytes.value),
        (0, 0),
        "an allocation leaked"
    );
    assert_eq!(stats.live_allocations, 0, "the pool still has live blocks");
    assert_eq!(stats.free_bytes, stats.reserved_bytes);
    if let Some(e) = device.take_deferred_error() {
        return Err(format!("deferred error: {e}").into());
    }
    drop((mr, pool));
    if let Some(controls) = device.host_controls() {
        for s in 0..STREAMS {
            streams.get_at(s).synchronize().await?;
        }
        println!(
            "device memory held after the pool is dropped: {} bytes",
            controls.allocated_bytes()
        );
        assert_eq!(controls.allocated_bytes(), 0, "device memory leaked");
    }
    println!("nothing leaked");
    Ok(())
}

/// One request: scratch from the pool (with a deadline), a kernel on it, a few results read
/// back and checked.
async fn serve(
    elems: usize,
    mr: StatisticsAdaptor<PoolResource<CudaAsyncResource>>,
    stream: Stream,
    kernel: Kernel,
) -> Result<Outcome, BoxError> {
    let arrived = Instant::now();
    let mut x = match DeviceVec::<f32>::new(elems, &stream, mr)
        .timeout(DEADLINE)
        .await
    {
        Ok(x) => x,
        Err(Error::Timeout { .. }) => return Ok(Outcome::TimedOut),
        Err(e) => return Err(e.into()),
    };
    let waited = arrived.elapsed();
    kernel.launch(&stream, &mut x)?;
    stream.enqueue_delay(WORK)?;
    let head = x.slice(..4)?.to_vec().await?; // waits for the kernel; blocks no thread
    let tail = x.slice(elems - 1..)?.to_vec().await?;
    if head != [0, 1, 2, 3].map(expected) || tail[0] != expected(elems - 1) {
        return Err(format!("wrong results: {head:?} ... {tail:?}").into());
    }
    drop(x); // stream-ordered free: the memory goes to the next request in line
    Ok(Outcome::Served(waited))
}

/// The PTX kernel on `device`, or the host backend (in `device`) when this build cannot load
/// PTX.
fn cuda_kernel(device: &mut Device) -> Result<Kernel, BoxError> {
    #[cfg(feature = "nvrtc")]
    {
        let module = device.load_ptx(PTX)?;
        Ok(Kernel::Ptx(std::sync::Arc::new(
            module.load_function("fill")?,
        )))
    }
    #[cfg(not(feature = "nvrtc"))]
    {
        println!(
            "built without the `nvrtc` feature (cudarc's PTX loader): running on the host \
             backend instead; build with the `nvrtc` feature (a default) for the GPU"
        );
        *device = Device::host();
        Ok(Kernel::Host)
    }
}

/// SplitMix64: a deterministic plan without a dependency.
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
