//! An async 3-stage pipeline on 3 streams: upload from pinned host memory, a kernel, download.
//!
//! ```text
//! task "upload"    DeviceVec::new from a bounded pool (awaits when the pool is full)
//!                  + copy from a pinned staging vector on stream U      --channel-->
//! task "kernel"    set_stream(K) (K waits for U's copy, no manual event)
//!                  + x = 0.75 x + 0.25, `iters` times, on stream K        --channel-->
//! task "download"  set_stream(D) + copy into a pinned staging vector on D; the vector is
//!                  dropped at once: its memory goes back to the pool after D's copy
//! ```
//!
//! Batches are `DeviceVec<f32>`s passed between the stages through tokio channels; memory is
//! bounded by a `PoolResource` with a maximum, so the upload stage awaits memory when the later
//! stages fall behind. The kernel is calibrated so the three stages take about as long each,
//! and the same work then runs with all three stages on one stream: the ratio of the two wall
//! times is the overlap the streams buy (3x is the limit).
//!
//! ```sh
//! cargo run --release --example pipeline   # CUDA device 0 (a PTX kernel), else the host backend
//! ```
//!
//! On a GPU the kernel is the hand-written PTX below, loaded through cudarc (the `nvrtc`
//! feature only provides cudarc's PTX loader: libnvrtc is not needed). On the host backend the
//! same transform runs as a host kernel ([`Stream::launch_host_kernel`]) on the same stream,
//! tracked the same way. Results are checked against the host.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use streamalloc::{
    BackendKind, CopyFromHost, CopyToHost, CudaAsyncResource, Device, DeviceVec,
    PinnedHostResource, PinnedHostVec, PoolResource, Stream,
};
use tokio::sync::mpsc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Batches in flight at most: the pool holds this many batches' memory (default; the
/// `PIPELINE_POOL_BATCHES` environment variable overrides it).
const POOL_BATCHES: usize = 16;

fn pool_batches() -> usize {
    std::env::var("PIPELINE_POOL_BATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        // The download stage keeps up to STAGING batches until their copies are done.
        .filter(|&n| n > staging() + 1)
        .unwrap_or(POOL_BATCHES)
}
/// Pinned staging vectors per direction (copies in flight per copy stream).
const STAGING: usize = 2;

/// [`STAGING`], or the `PIPELINE_STAGING` environment variable.
fn staging() -> usize {
    std::env::var("PIPELINE_STAGING")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(STAGING)
}

/// The per-element transform, as the PTX computes it (`mul.rn` then `add.rn`, no fused
/// multiply-add), so the host check is bit-exact.
fn transform(mut x: f32, iters: u32) -> f32 {
    for _ in 0..iters {
        x = x * 0.75 + 0.25;
    }
    x
}

/// The input of element `j` of batch slot `slot`.
fn input(slot: usize, j: usize) -> f32 {
    ((slot * 131 + j) % 1024) as f32 / 64.0
}

/// How one batch is transformed on the kernel stage's stream.
#[derive(Clone)]
enum Kernel {
    /// A host kernel (host backend).
    Host,
    /// The PTX kernel (CUDA).
    #[cfg(feature = "nvrtc")]
    Ptx(Arc<streamalloc::cudarc::driver::CudaFunction>),
}

impl Kernel {
    /// Enqueues `x = transform(x, iters)` on `stream`, which owns `x`.
    fn launch(&self, stream: &Stream, x: &mut DeviceVec<f32>, iters: u32) -> Result<(), BoxError> {
        match self {
            Kernel::Host => stream.launch_host_kernel(x.host_write(), move |x: &mut [f32]| {
                x.iter_mut().for_each(|v| *v = transform(*v, iters))
            })?,
            #[cfg(feature = "nvrtc")]
            Kernel::Ptx(f) => {
                use streamalloc::cudarc::driver::{LaunchConfig, PushKernelArg};
                let n = x.len() as u32;
                let cs = stream.cudarc_stream()?;
                // SAFETY: `transform(float*, unsigned n, unsigned iters)` over the vector's `n`
                // elements, launched on the vector's owner stream.
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

/// `x = 0.75 x + 0.25`, `iters` times, for `x[0..n]`.
#[cfg(feature = "nvrtc")]
const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry transform(
    .param .u64 x_param,
    .param .u32 n_param,
    .param .u32 iters_param
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<8>;
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
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
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
    st.global.f32 [%rd4], %f1;
DONE:
    ret;
}
"#;

/// What one run of the pipeline needs.
#[derive(Clone)]
struct Setup {
    device: Device,
    kernel: Kernel,
    pool: PoolResource<CudaAsyncResource>,
    pinned: PinnedHostResource,
    batches: usize,
    elems: usize,
    iters: u32,
}

/// The outcome of one run.
struct Run {
    wall: Duration,
    peak_in_flight: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<(), BoxError> {
    let mut device = Device::default();
    let kernel = match device.backend() {
        BackendKind::Host => Kernel::Host,
        BackendKind::Cuda => cuda_kernel(&mut device)?,
    };
    // Batch sizes that keep each run to about a second.
    let (batches, elems) = match device.backend() {
        BackendKind::Host => (48, 1 << 20),
        BackendKind::Cuda => (64, 4 << 20),
    };
    let bytes = elems * size_of::<f32>();
    println!(
        "device {} ({}, {} backend); {batches} batches of {elems} f32 ({} KiB); pool of {} batches",
        device.id(),
        device.name(),
        device.backend(),
        bytes >> 10,
        pool_batches()
    );
    let pool_bytes = pool_batches() * bytes;
    let mut setup = Setup {
        pool: PoolResource::new(
            CudaAsyncResource::new(&device)?,
            pool_bytes,
            Some(pool_bytes),
        )?,
        pinned: PinnedHostResource::new(&device)?,
        device,
        kernel,
        batches,
        elems,
        iters: 1,
    };
    setup.iters = match std::env::var("PIPELINE_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(iters) => iters,
        None => calibrate(&setup).await?,
    };

    let streams: [Stream; 3] = [
        Stream::new(&setup.device)?,
        Stream::new(&setup.device)?,
        Stream::new(&setup.device)?,
    ];
    let one = Stream::new(&setup.device)?;
    // A warm-up run (page faults, module load, pool warm), then the two measured runs.
    run(&setup, [&streams[0], &streams[1], &streams[2]]).await?;
    let three = run(&setup, [&streams[0], &streams[1], &streams[2]]).await?;
    let single = run(&setup, [&one, &one, &one]).await?;

    let stages = stage_times(&setup, &one).await?;
    println!(
        "each stage alone, {} batches on one stream ({} staging vectors): upload {:.1} ms, kernel {:.1} ms, download {:.1} ms",
        setup.batches,
        staging(),
        stages[0].as_secs_f64() * 1e3,
        stages[1].as_secs_f64() * 1e3,
        stages[2].as_secs_f64() * 1e3
    );
    if std::env::var_os("PIPELINE_COPIES").is_some() {
        let both = copies_together(&setup, &streams[0], &streams[2]).await?;
        println!(
            "uploads and downloads at once on two streams: {:.1} ms (each alone: see above)",
            both.as_secs_f64() * 1e3
        );
    }
    let rate = |r: &Run| setup.batches as f64 / r.wall.as_secs_f64();
    println!(
        "3 streams: {:>8.1} ms, {:>7.1} batches/s, peak {} batches in flight (allocated, not yet back on the host)",
        three.wall.as_secs_f64() * 1e3,
        rate(&three),
        three.peak_in_flight
    );
    println!(
        "1 stream:  {:>8.1} ms, {:>7.1} batches/s, peak {} batches in flight (allocated, not yet back on the host)",
        single.wall.as_secs_f64() * 1e3,
        rate(&single),
        single.peak_in_flight
    );
    println!(
        "overlap: {:.2}x (one stream's wall time / three streams'; 3x is the limit)",
        single.wall.as_secs_f64() / three.wall.as_secs_f64()
    );
    if setup.device.backend() == BackendKind::Host {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        println!(
            "(host backend: each stream is a worker thread, so the overlap is bounded by the free \
             CPU cores: {cores} here, shared with the tokio workers)"
        );
    }
    let stats = setup.pool.statistics();
    println!(
        "pool at the end: {} live allocations, {} of {} bytes free",
        stats.live_allocations, stats.free_bytes, stats.pool_size
    );
    assert_eq!(stats.live_allocations, 0, "a batch leaked");
    Ok(())
}

/// The PTX kernel on `device`, or the host backend (in `device`) when this build cannot load
/// PTX.
fn cuda_kernel(device: &mut Device) -> Result<Kernel, BoxError> {
    #[cfg(feature = "nvrtc")]
    {
        let module = device.load_ptx(PTX)?;
        Ok(Kernel::Ptx(Arc::new(module.load_function("transform")?)))
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

/// Picks the kernel's iteration count so that it takes about as long as a batch's upload.
async fn calibrate(setup: &Setup) -> Result<u32, BoxError> {
    let s = Stream::new(&setup.device)?;
    let staging = PinnedHostVec::<f32>::zeroed(setup.elems, &s, setup.pinned.clone()).await?;
    let mut x = DeviceVec::<f32>::new(setup.elems, &s, setup.pool.clone()).await?;
    let mut staging = x.copy_from_host(staging).await?; // warm-up
    let reps = 4;
    let t = Instant::now();
    for _ in 0..reps {
        staging = x.copy_from_host(staging).await?;
    }
    let copy = t.elapsed() / reps;
    // Kernel time = a fixed part + iters * a per-iteration part: raise the iterations until the
    // kernel takes at least the copy's time, then scale down linearly.
    let mut probe = 16u32;
    let kernel = loop {
        setup.kernel.launch(&s, &mut x, probe)?; // warm-up
        s.synchronize().await?;
        let t = Instant::now();
        for _ in 0..reps {
            setup.kernel.launch(&s, &mut x, probe)?;
        }
        s.synchronize().await?;
        let kernel = t.elapsed() / reps;
        if kernel >= copy || probe >= 1 << 24 {
            break kernel;
        }
        probe *= 4;
    };
    let iters = ((probe as f64 * copy.as_secs_f64() / kernel.as_secs_f64()).round() as u32).max(1);
    println!(
        "calibration: upload {:.3} ms/batch; kernel {:.3} ms at {probe} iterations -> {iters} iterations",
        copy.as_secs_f64() * 1e3,
        kernel.as_secs_f64() * 1e3
    );
    Ok(iters)
}

/// How long each stage takes alone for all batches on `s` (one device vector, one staging
/// vector): the bound a pipeline's wall time approaches when the stages overlap.
async fn stage_times(setup: &Setup, s: &Stream) -> Result<[Duration; 3], BoxError> {
    let mut x = DeviceVec::<f32>::new(setup.elems, s, setup.pool.clone()).await?;
    let mut ring = VecDeque::new();
    for _ in 0..staging() {
        ring.push_back(PinnedHostVec::<f32>::zeroed(setup.elems, s, setup.pinned.clone()).await?);
    }
    s.synchronize().await?;
    let start = Instant::now();
    for _ in 0..setup.batches {
        let staging = ring.pop_front().expect("a staging vector");
        ring.push_back(x.copy_from_host(staging).await?);
    }
    let upload = start.elapsed();
    let start = Instant::now();
    for _ in 0..setup.batches {
        setup.kernel.launch(s, &mut x, setup.iters)?;
    }
    s.synchronize().await?;
    let kernel = start.elapsed();
    let start = Instant::now();
    for _ in 0..setup.batches {
        let staging = ring.pop_front().expect("a staging vector");
        ring.push_back(x.copy_to_host(staging).await?);
    }
    Ok([upload, kernel, start.elapsed()])
}

/// Diagnostic: all uploads on `up` and all downloads on `down` at the same time (no kernel,
/// no hand-off, no pool): whether the device runs the two directions of copies concurrently.
async fn copies_together(setup: &Setup, up: &Stream, down: &Stream) -> Result<Duration, BoxError> {
    async fn copies(setup: &Setup, s: &Stream, to_device: bool) -> Result<(), BoxError> {
        let mut x = DeviceVec::<f32>::new(setup.elems, s, setup.pool.clone()).await?;
        let mut ring = VecDeque::new();
        for _ in 0..staging() {
            ring.push_back(
                PinnedHostVec::<f32>::zeroed(setup.elems, s, setup.pinned.clone()).await?,
            );
        }
        s.synchronize().await?;
        let mut in_flight = VecDeque::new();
        for _ in 0..setup.batches {
            let staging = match ring.pop_front() {
                Some(v) => v,
                None => match in_flight.pop_front().expect("a copy in flight") {
                    Ok::<CopyFromHost<_>, CopyToHost<_>>(c) => c.await?,
                    Err(c) => c.await?,
                },
            };
            in_flight.push_back(if to_device {
                Ok(x.copy_from_host(staging))
            } else {
                Err(x.copy_to_host(staging))
            });
        }
        for c in in_flight {
            match c {
                Ok(c) => drop(c.await?),
                Err(c) => drop(c.await?),
            }
        }
        Ok(())
    }
    let start = Instant::now();
    let (a, b) = tokio::join!(copies(setup, up, true), copies(setup, down, false));
    a?;
    b?;
    Ok(start.elapsed())
}

/// Runs the pipeline once with its stages on `[upload, kernel, download]`.
async fn run(setup: &Setup, streams: [&Stream; 3]) -> Result<Run, BoxError> {
    let [up, k, down] = streams.map(Stream::clone);
    let (k_for_upload, down_for_kernel) = (k.clone(), down.clone());
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    // Staging vectors, made before the clock starts (their inputs are written once).
    let mut up_staging = Vec::new();
    let mut down_staging = Vec::new();
    for slot in 0..staging() {
        let mut v = PinnedHostVec::<f32>::new(setup.elems, &up, setup.pinned.clone()).await?;
        v.iter_mut()
            .enumerate()
            .for_each(|(j, x)| *x = input(slot, j));
        up_staging.push((slot, v));
        down_staging
            .push(PinnedHostVec::<f32>::zeroed(setup.elems, &down, setup.pinned.clone()).await?);
    }
    // (batch, staging slot of its input, data)
    type Batch = (usize, usize, DeviceVec<f32>);
    let (to_kernel, mut kernel_rx) = mpsc::channel::<Batch>(pool_batches());
    let (to_download, mut download_rx) = mpsc::channel::<Batch>(pool_batches());
    let start = Instant::now();

    let upload = tokio::spawn({
        let (setup, in_flight, peak) = (setup.clone(), in_flight.clone(), peak.clone());
        async move {
            let mut copies: VecDeque<(usize, CopyFromHost<PinnedHostVec<f32>>)> = VecDeque::new();
            let mut free: Vec<(usize, PinnedHostVec<f32>)> = up_staging;
            for batch in 0..setup.batches {
                let (slot, staging) = match free.pop() {
                    Some(s) => s,
                    None => {
                        let (slot, copy) = copies.pop_front().expect("a copy in flight");
                        (slot, copy.await?)
                    }
                };
                // Awaits memory when the pool is full: the later stages hold it.
                let mut x = DeviceVec::<f32>::new(setup.elems, &up, setup.pool.clone()).await?;
                let now = in_flight.fetch_add(1, Ordering::Relaxed) + 1;
                peak.fetch_max(now, Ordering::Relaxed);
                copies.push_back((slot, x.copy_from_host(staging))); // enqueued now, on `up`
                                                                     // Hand the batch on at once: the event `k` waits for is recorded on `up` now,
                                                                     // right after this upload. Handed on later, it would also cover the uploads
                                                                     // queued meanwhile, and the kernel would wait for them too.
                x.set_stream(&k_for_upload)?;
                to_kernel.send((batch, slot, x)).await?;
            }
            for (_, c) in copies {
                c.await?;
            }
            Ok::<_, BoxError>(())
        }
    });

    let kernel = tokio::spawn({
        let setup = setup.clone();
        async move {
            while let Some((batch, slot, mut x)) = kernel_rx.recv().await {
                setup.kernel.launch(&k, &mut x, setup.iters)?; // after the upload: no event by hand
                x.set_stream(&down_for_kernel)?; // `down` waits for this kernel only
                to_download.send((batch, slot, x)).await?;
            }
            Ok::<_, BoxError>(())
        }
    });

    let download = tokio::spawn({
        let (setup, in_flight) = (setup.clone(), in_flight.clone());
        async move {
            // Each batch's memory is kept until its download is done. Freed on `down` at once,
            // the upload stage would take it back at once, and the pool's cross-stream wait (an
            // event recorded on `down` when memory changes stream) would make that upload wait
            // for every download queued by then: the stages would run one after another.
            type Download = (usize, usize, CopyToHost<PinnedHostVec<f32>>, DeviceVec<f32>);
            let mut copies: VecDeque<Download> = VecDeque::new();
            let mut free: Vec<PinnedHostVec<f32>> = down_staging;
            let mut checked = 0;
            while let Some((batch, slot, x)) = download_rx.recv().await {
                let staging = match free.pop() {
                    Some(s) => s,
                    None => {
                        let (b, slot, c, done) = copies.pop_front().expect("a copy in flight");
                        let s = c.await?;
                        drop(done); // idle now: freed on `down`, reused without a stall
                        in_flight.fetch_sub(1, Ordering::Relaxed);
                        check(&setup, b, slot, &s)?;
                        checked += 1;
                        s
                    }
                };
                let copy = x.copy_to_host(staging); // enqueued now, on `down`
                copies.push_back((batch, slot, copy, x));
            }
            for (b, slot, c, done) in copies {
                check(&setup, b, slot, &c.await?)?;
                drop(done);
                checked += 1;
            }
            Ok::<_, BoxError>(checked)
        }
    });

    upload.await??;
    kernel.await??;
    let checked = download.await??;
    let wall = start.elapsed();
    assert_eq!(checked, setup.batches);
    Ok(Run {
        wall,
        peak_in_flight: peak.load(Ordering::Relaxed),
    })
}

/// Checks a sample of batch `batch`'s results (its input from staging slot `slot`) against the
/// host.
fn check(setup: &Setup, batch: usize, slot: usize, out: &[f32]) -> Result<(), BoxError> {
    for j in (0..setup.elems).step_by(setup.elems / 64 + 1) {
        let want = transform(input(slot, j), setup.iters);
        if out[j] != want {
            return Err(format!("batch {batch}, element {j}: {} instead of {want}", out[j]).into());
        }
    }
    Ok(())
}
