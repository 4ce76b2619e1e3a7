//! The 3-stage pipeline of `examples/pipeline.rs` (upload from pinned staging memory on stream
//! U, a kernel on stream K, download on stream D; on CUDA 64 batches of 16 MiB, the shapes of
//! the plain-CUDA control `../shared/anchors/pipeline/pipeline_limit.cu`) written three ways
//! and timed in one run, on `Device::default()` (CUDA device 0, else the host backend):
//!
//! - **(i) tasks + channels**: the example's own [`run`] (shared through
//!   `examples/common/pipeline.rs`): tokio tasks per stage, batches allocated per batch from a
//!   bounded `PoolResource` with `DeviceVec::new(..).await`, the kernel stage taking a batch
//!   onto its stream with `set_stream` when it receives it and handing it to the download
//!   stream after its launch, each batch dropped as soon as its download is enqueued.
//! - **(ii) one thread, synchronous calls**: the same stages with the crate's synchronous
//!   API on this thread, no runtime: one loop enqueues upload, kernel and download of batch
//!   `i` on the three streams (`DeviceVec::try_new`, `set_stream` right after each stage's
//!   work, the batch dropped after its download is enqueued), and blocks only when a staging
//!   vector must be reused (`futures::executor::block_on` of its copy).
//! - **(iii) cudarc by hand**: what a cudarc user writes today, with no type of this crate:
//!   raw cudarc `CudaStream`s on a context with cudarc's event tracking off, a ring of
//!   `CudaSlice` device buffers (as many as the crate's pool holds) allocated before the
//!   clock starts, page-locked host memory from `CudaContext::alloc_pinned_with_flags`, and
//!   `record_event` / `wait` / `CudaEvent::synchronize` by hand. Built with the `nvrtc`
//!   feature (cudarc's PTX loader, a default) and run on a CUDA device only.
//!
//! Each version runs on three streams and on one; its overlap is its own one-stream time over
//! its three-stream time (3x is the limit). The table has each median of 5 interleaved runs,
//! and the ratio of (i)'s throughput to (iii)'s (goal ≥ 0.95). A second table times (i) and
//! (ii) with 2, 8, 32 and 128 staging vectors per direction on smaller batches, so that 128 of
//! them fit in pinned memory: the cost per batch should not grow with the copies in flight.
//! Every batch's results are checked in every version.
//!
//! Run: `cargo bench --features bench --bench pipeline` (the host backend here), or on the GPU machine the
//! bundled binary from the checkout's root: `.gpu/bench/pipeline --bench` (`bash .gpu/run.sh`
//! runs it with the others). Arguments are ignored. Set `STREAMALLOC_BENCH_OUT=path.md` to
//! also get the report as Markdown.

#[path = "../examples/common/pipeline.rs"]
mod pipeline;
#[path = "common/report.rs"]
mod report;

use std::time::{Duration, Instant};

use futures::executor::block_on;
use pipeline::{backend_note, calibrate, ms, run, stage_times, BoxError, Kernel, Setup, Shape};
use report::{Report, Table};
use streamalloc::{BackendKind, Device, DeviceVec, Stream};

/// Staging vectors per direction in the main table (the example's default).
const STAGING: usize = 2;
/// The pool's size in batches (the example's default); also (iii)'s device buffers.
const POOL_BATCHES: usize = 16;
/// Runs of each version and stream count in the main table; the median is reported.
const TRIALS: usize = 5;
/// The scaling table's staging vectors per direction, and runs per figure.
const SCALING_STAGING: [usize; 4] = [2, 8, 32, 128];
const SCALING_TRIALS: usize = 3;

fn main() {
    // `--bench` (and anything else the bundle runner or cargo passes) is ignored.
    if let Err(e) = bench() {
        eprintln!("pipeline bench failed: {e}");
        std::process::exit(1);
    }
}

/// The scaling table's shape: 1 MiB batches on CUDA (128 staging vectors per direction are
/// then 256 MiB of pinned memory), 64 KiB on the host backend.
fn scaling_shape(backend: BackendKind) -> Shape {
    match backend {
        BackendKind::Host => Shape {
            batches: 512,
            elems: 16 << 10,
        },
        BackendKind::Cuda => Shape {
            batches: 512,
            elems: 256 << 10,
        },
    }
}

fn bench() -> Result<(), BoxError> {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    let mut device = Device::default();
    let kernel = Kernel::for_device(&mut device)?;
    let mut report = Report::new("streamalloc pipeline benchmark");
    report.line(format!(
        "device: {} ({}); {} host CPUs; {} build",
        device.id(),
        device.name(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    ));
    eprintln!("pipeline bench on {} ({})", device.id(), device.name());

    let shape = Shape::standard(device.backend());
    let mut setup = Setup::new(&device, kernel.clone(), shape, STAGING, POOL_BATCHES)?;
    let calibration = rt.block_on(calibrate(&setup))?;
    setup.iters = calibration.iters;
    report.line(calibration.describe());
    let streams = [
        Stream::new(&device)?,
        Stream::new(&device)?,
        Stream::new(&device)?,
    ];
    let three = [&streams[0], &streams[1], &streams[2]];
    let one = Stream::new(&device)?;
    let [t_up, t_k, t_down] = rt.block_on(stage_times(&setup, three))?;
    report.line(format!(
        "{}, {STAGING} staging vectors per direction, a pool of {POOL_BATCHES} batches; each \
         stage alone (the crate): upload {:.1} ms, kernel {:.1} ms, download {:.1} ms",
        shape.describe(),
        ms(t_up),
        ms(t_k),
        ms(t_down)
    ));

    eprintln!("main table ...");
    let (setup, rt) = (&setup, &rt);
    let on = |three_streams: bool| if three_streams { three } else { [&one; 3] };
    type Version<'a> = Box<dyn FnMut(bool) -> Result<Duration, BoxError> + 'a>;
    let mut versions: Vec<(&str, Version)> = vec![
        (
            "(i) tasks + channels",
            Box::new(|three_streams| rt.block_on(run(setup, on(three_streams)))),
        ),
        (
            "(ii) one thread, sync calls",
            Box::new(|three_streams| run_sync(setup, on(three_streams))),
        ),
    ];
    #[cfg(feature = "nvrtc")]
    if device.backend() == BackendKind::Cuda {
        let mut by_hand = by_hand::ByHand::new(setup, device.id().ordinal as usize)?;
        versions.push((
            "(iii) cudarc by hand",
            Box::new(move |three_streams| by_hand.run(setup, three_streams)),
        ));
    }
    let mut times = vec![[Vec::new(), Vec::new()]; versions.len()];
    for (_, version) in &mut versions {
        version(true)?; // warm-up: page faults, module load, the pool's first takes
    }
    for _ in 0..TRIALS {
        for ((_, version), [t3, t1]) in versions.iter_mut().zip(&mut times) {
            t3.push(version(true)?);
            t1.push(version(false)?);
        }
    }
    let mut table = Table::new(
        format!("{}, median of {TRIALS} runs", shape.describe()),
        &[
            "version",
            "3 streams (ms)",
            "batches/s",
            "1 stream (ms)",
            "overlap (1 stream / 3 streams)",
        ],
    );
    let rates: Vec<f64> = versions
        .iter()
        .zip(times)
        .map(|((name, _), [t3, t1])| {
            let (t3, t1) = (median(t3), median(t1));
            let rate = shape.batches as f64 / t3.as_secs_f64();
            table.row(vec![
                name.to_string(),
                format!("{:.1}", ms(t3)),
                format!("{rate:.1}"),
                format!("{:.1}", ms(t1)),
                format!("{:.2}x", t1.as_secs_f64() / t3.as_secs_f64()),
            ]);
            rate
        })
        .collect();
    report.table(table);
    if let Some(note) = backend_note(&device) {
        report.line(note);
    }
    match rates.get(2) {
        Some(by_hand) => report.line(format!(
            "(i) throughput / (iii) throughput: {:.2} (goal ≥ 0.95); (ii) / (iii): {:.2}",
            rates[0] / by_hand,
            rates[1] / by_hand
        )),
        None => report.line(
            "(iii) cudarc by hand: skipped (it needs a CUDA device and the `nvrtc` feature)".into(),
        ),
    }
    drop(versions);

    eprintln!("scaling table ...");
    report.table(scaling(rt, &device, &kernel)?);
    report.line(format!(
        "total bench time: {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    report.publish()?;
    Ok(())
}

/// (i) and (ii) with more and more staging vectors per direction, on three streams.
fn scaling(
    rt: &tokio::runtime::Runtime,
    device: &Device,
    kernel: &Kernel,
) -> Result<Table, BoxError> {
    let shape = scaling_shape(device.backend());
    let streams = [
        Stream::new(device)?,
        Stream::new(device)?,
        Stream::new(device)?,
    ];
    let three = [&streams[0], &streams[1], &streams[2]];
    let iters = rt
        .block_on(calibrate(&Setup::new(
            device,
            kernel.clone(),
            shape,
            STAGING,
            POOL_BATCHES,
        )?))?
        .iters;
    let mut table = Table::new(
        format!(
            "scaling: {} (smaller than above, so that 128 staging vectors per direction fit), \
             {iters} kernel iterations, 3 streams, a pool of {POOL_BATCHES} batches; median of \
             {SCALING_TRIALS} runs",
            shape.describe()
        ),
        &[
            "staging vectors per direction",
            "pinned (MiB)",
            "longest stage alone (µs/batch)",
            "(i) tasks + channels (µs/batch)",
            "(ii) one thread, sync calls (µs/batch)",
        ],
    );
    for staging in SCALING_STAGING {
        let mut setup = Setup::new(device, kernel.clone(), shape, staging, POOL_BATCHES)?;
        setup.iters = iters;
        let stages = rt.block_on(stage_times(&setup, three))?;
        rt.block_on(run(&setup, three))?; // warm-up
        run_sync(&setup, three)?;
        let (mut tasks, mut sync) = (Vec::new(), Vec::new());
        for _ in 0..SCALING_TRIALS {
            tasks.push(rt.block_on(run(&setup, three))?);
            sync.push(run_sync(&setup, three)?);
        }
        let per_batch =
            |t: Duration| format!("{:.1}", t.as_secs_f64() * 1e6 / shape.batches as f64);
        table.row(vec![
            staging.to_string(),
            format!(
                "{:.2}",
                (2 * staging * shape.bytes()) as f64 / (1 << 20) as f64
            ),
            per_batch(stages.into_iter().max().expect("three stages")),
            per_batch(median(tasks)),
            per_batch(median(sync)),
        ]);
    }
    Ok(table)
}

/// The median of a non-empty list.
fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

/// (ii): the pipeline with the crate's synchronous calls on this thread, its stages on
/// `[upload, kernel, download]`; returns the wall time. Every batch's results are checked.
fn run_sync(setup: &Setup, streams: [&Stream; 3]) -> Result<Duration, BoxError> {
    let [up, k, down] = streams;
    let mut uploads = block_on(setup.uploads(up))?;
    let mut downloads = block_on(setup.downloads(down))?;
    let start = Instant::now();
    for batch in 0..setup.shape.batches {
        let (slot, input) = block_on(uploads.take())?;
        let mut x = DeviceVec::<f32>::try_new(setup.shape.elems, up, setup.pool.clone())?;
        uploads.lend(slot, x.copy_from_host(input));
        x.set_stream(k)?;
        setup.kernel.launch(k, &mut x, setup.iters)?;
        x.set_stream(down)?;
        let out = block_on(setup.take_output(&mut downloads))?;
        downloads.lend(Some((batch, slot)), x.copy_to_host(out));
    }
    block_on(uploads.finish())?;
    block_on(setup.finish_outputs(&mut downloads))?;
    let wall = start.elapsed();
    assert_eq!(
        downloads.returned(),
        setup.shape.batches,
        "every batch checked"
    );
    Ok(wall)
}

/// (iii): the pipeline in plain cudarc, no type of this crate.
#[cfg(feature = "nvrtc")]
mod by_hand {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use streamalloc::cudarc::driver::{
        CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PinnedHostSlice,
        PushKernelArg,
    };
    use streamalloc::cudarc::nvrtc::Ptx;

    use crate::pipeline::{input, BoxError, Setup, PTX};

    /// Everything allocated before the clock starts: streams, device buffers, staging memory.
    pub struct ByHand {
        ctx: Arc<CudaContext>,
        transform: CudaFunction,
        /// U, K, D.
        streams: [Arc<CudaStream>; 3],
        one: Arc<CudaStream>,
        /// Device buffers, used round-robin: batch `b` in `buffers[b % len]`.
        buffers: Vec<CudaSlice<f32>>,
        /// Staging memory per direction: batch `b` in `[b % len]`; inputs hold `input(slot, ..)`.
        inputs: Vec<PinnedHostSlice<f32>>,
        outputs: Vec<PinnedHostSlice<f32>>,
    }

    impl ByHand {
        /// As many device buffers as `setup`'s pool holds batches, as many staging buffers
        /// as it has, on CUDA device `ordinal`.
        pub fn new(setup: &Setup, ordinal: usize) -> Result<ByHand, BoxError> {
            let ctx = CudaContext::new(ordinal)?;
            // Every wait is written below; with tracking on, cudarc would also record and wait
            // on events around every use of every buffer.
            // SAFETY: no `CudaSlice` made from now on is used on two streams without the
            // events below ordering the uses, nor freed before its last use completes (the
            // drop synchronizes the context first).
            unsafe { ctx.disable_event_tracking() };
            let transform = ctx
                .load_module(Ptx::from_src(PTX))?
                .load_function("transform")?;
            let streams = [ctx.new_stream()?, ctx.new_stream()?, ctx.new_stream()?];
            let elems = setup.shape.elems;
            let buffers = (0..setup.pool_batches)
                // SAFETY: every element is written by an upload before a kernel reads it.
                .map(|_| unsafe { streams[0].alloc::<f32>(elems) })
                .collect::<Result<_, _>>()?;
            // Page-locked as `cudaMallocHost` makes it (flags 0), like the crate's pinned
            // memory: cudarc's `alloc_pinned` is write-combined, slow for the host to read.
            // SAFETY: each slice is filled (inputs) or written by a download (outputs) before
            // it is read.
            let pinned = || unsafe { ctx.alloc_pinned_with_flags::<f32>(elems, 0) };
            let mut inputs = Vec::new();
            let mut outputs = Vec::new();
            for slot in 0..setup.staging {
                let mut v = pinned()?;
                for (j, x) in v.as_mut_slice()?.iter_mut().enumerate() {
                    *x = input(slot, j);
                }
                inputs.push(v);
                outputs.push(pinned()?);
            }
            ctx.synchronize()?;
            Ok(ByHand {
                one: ctx.new_stream()?,
                ctx,
                transform,
                streams,
                buffers,
                inputs,
                outputs,
            })
        }

        /// One run, on the three streams or all on one; returns the wall time. Every batch's
        /// results are checked.
        pub fn run(&mut self, setup: &Setup, on_three: bool) -> Result<Duration, BoxError> {
            let [u, k, d] = if on_three {
                self.streams.clone()
            } else {
                [self.one.clone(), self.one.clone(), self.one.clone()]
            };
            let (batches, staging) = (setup.shape.batches, self.inputs.len());
            let n = setup.shape.elems as u32;
            let config = LaunchConfig::for_num_elems(n);
            let mut uploaded: Vec<CudaEvent> = Vec::with_capacity(batches);
            let mut downloaded: Vec<CudaEvent> = Vec::with_capacity(batches);
            self.ctx.synchronize()?;
            let start = Instant::now();
            for b in 0..batches {
                let (slot, buffer) = (b % staging, b % self.buffers.len());
                if b >= staging {
                    uploaded[b - staging].synchronize()?; // its input staging is free again
                }
                if b >= self.buffers.len() {
                    u.wait(&downloaded[b - self.buffers.len()])?; // its device buffer is free
                }
                u.memcpy_htod(&self.inputs[slot], &mut self.buffers[buffer])?;
                uploaded.push(u.record_event(None)?);
                k.wait(&uploaded[b])?;
                // SAFETY: `transform(float*, unsigned n, unsigned iters)` over the buffer's
                // `n` elements, ordered after their upload and before their download.
                unsafe {
                    k.launch_builder(&self.transform)
                        .arg(&mut self.buffers[buffer])
                        .arg(&n)
                        .arg(&setup.iters)
                        .launch(config)
                }?;
                d.wait(&k.record_event(None)?)?;
                if b >= staging {
                    // Its output staging holds batch b - staging: check it, then reuse it.
                    downloaded[b - staging].synchronize()?;
                    setup.check(b - staging, slot, self.outputs[slot].as_slice()?)?;
                }
                d.memcpy_dtoh(&self.buffers[buffer], &mut self.outputs[slot])?;
                downloaded.push(d.record_event(None)?);
            }
            let last = batches.saturating_sub(staging);
            for (b, done) in downloaded.iter().enumerate().skip(last) {
                done.synchronize()?;
                setup.check(b, b % staging, self.outputs[b % staging].as_slice()?)?;
            }
            Ok(start.elapsed())
        }
    }

    impl Drop for ByHand {
        fn drop(&mut self) {
            // The buffers are freed on U: let every stream finish with them first.
            if let Err(e) = self.ctx.synchronize() {
                eprintln!("cudarc pipeline: synchronizing before the frees: {e}");
            }
        }
    }
}
