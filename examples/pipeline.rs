//! An async 3-stage pipeline on 3 streams: upload from pinned host memory, a kernel, download.
//!
//! ```text
//! task "upload"    DeviceVec::new from a bounded pool (awaits when the pool is full)
//!                  + copy from a pinned staging vector on stream U      --channel-->
//! task "kernel"    set_stream(K) (K waits for U's copy, no manual event)
//!                  + x = 0.75 x + 0.25, `iters` times, on stream K
//!                  + set_stream(D) (D waits for this kernel)             --channel-->
//! task "download"  copy into a pinned staging vector on D; the batch is dropped at once:
//!                  its memory goes back to the pool after D's copy
//! ```
//!
//! Batches are `DeviceVec<f32>`s passed between the stages through tokio channels; memory is
//! bounded by a `PoolResource` with a maximum, so the upload stage awaits memory when the later
//! stages fall behind. The kernel is calibrated so the three stages take about as long each,
//! and the same work then runs with all three stages on one stream: the ratio of the two wall
//! times is the overlap the streams buy (3x is the limit). The stages, the kernel and the
//! check live in `examples/common/pipeline.rs`, which `benches/pipeline.rs` shares.
//!
//! ```sh
//! cargo run --release --example pipeline   # CUDA device 0 (a PTX kernel), else the host backend
//! ```
//!
//! The figures print in the form of the plain-CUDA control's
//! (`../shared/anchors/pipeline/pipeline_limit.cu`, the same shapes on CUDA), line for line.
//! Environment variables: `PIPELINE_STAGING` (pinned staging vectors per direction, default
//! 2), `PIPELINE_POOL_BATCHES` (the pool's size in batches, at least 2, default 16), `PIPELINE_ITERS`
//! (kernel iterations, instead of the calibration), and `PIPELINE_COPIES=1`, which also times
//! all uploads on one stream and all downloads on another at once, against each direction
//! alone.
//!
//! On a GPU the kernel is hand-written PTX, loaded through cudarc (the `nvrtc` feature only
//! provides cudarc's PTX loader: libnvrtc is not needed). On the host backend the same
//! transform runs as a host kernel ([`Stream::launch_host_kernel`]) on the same stream,
//! tracked the same way. Results are checked against the host.

#[path = "common/pipeline.rs"]
mod pipeline;

use std::str::FromStr;
use std::time::{Duration, Instant};

use pipeline::{
    backend_note, calibrate, download_all, ms, run, stage_times, upload_all, BoxError, Kernel,
    Setup, Shape,
};
use streamalloc::{Device, DeviceVec, Stream};

/// Pinned staging vectors per direction (`PIPELINE_STAGING`).
const STAGING: usize = 2;
/// The pool's size in batches (`PIPELINE_POOL_BATCHES`).
const POOL_BATCHES: usize = 16;

/// The environment variable `name`, parsed.
fn env<T: FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<(), BoxError> {
    let mut device = Device::default();
    let kernel = Kernel::for_device(&mut device)?;
    let shape = Shape::standard(device.backend());
    let staging = env("PIPELINE_STAGING")
        .filter(|&n| n >= 1)
        .unwrap_or(STAGING);
    let pool_batches = env("PIPELINE_POOL_BATCHES")
        .filter(|&n| n >= 2)
        .unwrap_or(POOL_BATCHES);
    let mut setup = Setup::new(&device, kernel, shape, staging, pool_batches)?;
    println!(
        "device {} ({}, {} backend); {}; pool of {pool_batches} batches",
        device.id(),
        device.name(),
        device.backend(),
        shape.describe(),
    );
    setup.iters = match env("PIPELINE_ITERS") {
        Some(iters) => iters,
        None => {
            let calibration = calibrate(&setup).await?;
            println!("{}", calibration.describe());
            calibration.iters
        }
    };

    let streams: [Stream; 3] = [
        Stream::new(&device)?,
        Stream::new(&device)?,
        Stream::new(&device)?,
    ];
    let three = [&streams[0], &streams[1], &streams[2]];
    let one = Stream::new(&device)?;

    let [t_up, t_k, t_down] = stage_times(&setup, three).await?;
    let gb_s = |t: Duration| (shape.batches * shape.bytes()) as f64 / t.as_secs_f64() / 1e9;
    println!(
        "staging {staging} per direction; each alone, {}: upload {:.1} ms ({:.1} GB/s), kernel \
         {:.1} ms ({} iters), download {:.1} ms ({:.1} GB/s)",
        shape.describe(),
        ms(t_up),
        gb_s(t_up),
        ms(t_k),
        setup.iters,
        ms(t_down),
        gb_s(t_down)
    );
    if env::<String>("PIPELINE_COPIES").is_some_and(|v| v != "0") {
        let both = copies_at_once(&setup, &streams[0], &streams[2]).await?;
        println!(
            "uploads and downloads at once on two streams: {:.1} ms ({:.2}x of the two apart)",
            ms(both),
            (t_up + t_down).as_secs_f64() / both.as_secs_f64()
        );
    }

    run(&setup, three).await?; // warm-up: page faults, module load, the pool's first takes
    let t3 = run(&setup, three).await?;
    let t1 = run(&setup, [&one, &one, &one]).await?;
    println!(
        "pipeline: 3 streams {:.1} ms, 1 stream {:.1} ms: overlap {:.2}x (limit 3x; stages sum \
         {:.1} ms, longest {:.1} ms)",
        ms(t3),
        ms(t1),
        t1.as_secs_f64() / t3.as_secs_f64(),
        ms(t_up + t_k + t_down),
        ms(t_up.max(t_k).max(t_down))
    );
    let rate = |t: Duration| shape.batches as f64 / t.as_secs_f64();
    println!(
        "throughput: {:.1} batches/s on 3 streams, {:.1} on 1 stream",
        rate(t3),
        rate(t1)
    );
    if let Some(note) = backend_note(&device) {
        println!("{note}");
    }
    let stats = setup.pool.statistics();
    println!(
        "pool at the end: {} live allocations, {} of {} bytes free",
        stats.live_allocations, stats.free_bytes, stats.reserved_bytes
    );
    assert_eq!(stats.live_allocations, 0, "a batch leaked");
    Ok(())
}

/// All uploads on `up` and all downloads on `down` at the same time, copies only (no kernel,
/// no hand-off; every allocation is made before the clock starts): whether the device runs
/// the two directions of copies concurrently.
async fn copies_at_once(setup: &Setup, up: &Stream, down: &Stream) -> Result<Duration, BoxError> {
    let (elems, batches) = (setup.shape.elems, setup.shape.batches);
    let mut to = DeviceVec::<f32>::new(elems, up, setup.pool.clone()).await?;
    let from = DeviceVec::<f32>::zeroed(elems, down, setup.pool.clone()).await?;
    let mut uploads = setup.uploads(up).await?;
    let mut downloads = setup.downloads(down).await?;
    up.synchronize().await?;
    down.synchronize().await?;
    let start = Instant::now();
    let (a, b) = tokio::join!(
        upload_all(&mut uploads, &mut to, batches),
        download_all(&mut downloads, &from, batches)
    );
    a?;
    b?;
    Ok(start.elapsed())
}
