//! The 3-stage pipeline of `examples/pipeline.rs` (its module doc draws the stages), shared
//! with `benches/pipeline.rs`: the kernel (PTX on CUDA, its host twin on the host backend),
//! the inputs and the check of the results, the shapes, the pools and staging vectors a run
//! needs, the calibration, the stages timed alone, and [`run`], the pipeline as tokio tasks
//! joined by channels.
//!
//! The example and the bench include this file with `#[path = ...] mod pipeline;`; as a folder
//! without a `main.rs`, `examples/common/` is no example of its own.

#![allow(dead_code)] // the example and the bench each use part of it

use std::collections::VecDeque;
use std::future::Future;
#[cfg(feature = "nvrtc")]
use std::sync::Arc;
use std::time::{Duration, Instant};

use streamalloc::{
    BackendKind, CopyFromHost, CopyToHost, CudaAsyncResource, Device, DeviceVec,
    PinnedHostResource, PinnedHostVec, PoolResource, Stream,
};
use tokio::sync::mpsc;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How much work one run is: `batches` batches of `elems` f32 each.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub batches: usize,
    pub elems: usize,
}

impl Shape {
    /// The example's shape. On CUDA that of the plain-CUDA control
    /// (`../shared/anchors/pipeline/pipeline_limit.cu`): 64 batches of 16 MiB. On the host
    /// backend smaller, to keep a run near a second.
    pub fn standard(backend: BackendKind) -> Shape {
        match backend {
            BackendKind::Host => Shape {
                batches: 48,
                elems: 1 << 20,
            },
            BackendKind::Cuda => Shape {
                batches: 64,
                elems: 4 << 20,
            },
        }
    }

    /// Bytes per batch.
    pub fn bytes(&self) -> usize {
        self.elems * size_of::<f32>()
    }

    /// "64 batches of 16 MiB"
    pub fn describe(&self) -> String {
        let kib = self.bytes() >> 10;
        let size = if kib % 1024 == 0 {
            format!("{} MiB", kib >> 10)
        } else {
            format!("{kib} KiB")
        };
        format!("{} batches of {size}", self.batches)
    }
}

/// The per-element transform, as the PTX computes it (`mul.rn` then `add.rn`, no fused
/// multiply-add), so the host check is bit-exact.
pub fn transform(mut x: f32, iters: u32) -> f32 {
    for _ in 0..iters {
        x = x * 0.75 + 0.25;
    }
    x
}

/// The input of element `j` in staging slot `slot`.
pub fn input(slot: usize, j: usize) -> f32 {
    ((slot * 131 + j) % 1024) as f32 / 64.0
}

/// `transform(float *x, unsigned n, unsigned iters)`: `x = 0.75 x + 0.25`, `iters` times, for
/// `x[0..n]`; one thread per element.
pub const PTX: &str = r#"
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

/// How one batch is transformed on the kernel stage's stream.
#[derive(Clone)]
pub enum Kernel {
    /// A host kernel ([`Stream::launch_host_kernel`]; host backend).
    Host,
    /// [`PTX`], loaded through cudarc (CUDA).
    #[cfg(feature = "nvrtc")]
    Ptx(Arc<streamalloc::cudarc::driver::CudaFunction>),
}

impl Kernel {
    /// The kernel for `device`: [`PTX`] on CUDA, the host twin on the host backend. A build
    /// without the `nvrtc` feature (cudarc's PTX loader; libnvrtc itself is not needed)
    /// cannot load PTX: `device` then becomes the host backend, and it says so.
    pub fn for_device(device: &mut Device) -> Result<Kernel, BoxError> {
        match device.backend() {
            BackendKind::Host => Ok(Kernel::Host),
            #[cfg(feature = "nvrtc")]
            BackendKind::Cuda => {
                let module = device.load_ptx(PTX)?;
                Ok(Kernel::Ptx(Arc::new(module.load_function("transform")?)))
            }
            #[cfg(not(feature = "nvrtc"))]
            BackendKind::Cuda => {
                println!(
                    "built without the `nvrtc` feature (cudarc's PTX loader): running on the \
                     host backend instead; build with the `nvrtc` feature (a default) for the GPU"
                );
                *device = Device::host();
                Ok(Kernel::Host)
            }
        }
    }

    /// Enqueues `x = transform(x, iters)` on `stream`, which owns `x`.
    pub fn launch(
        &self,
        stream: &Stream,
        x: &mut DeviceVec<f32>,
        iters: u32,
    ) -> Result<(), BoxError> {
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

/// What a run of the pipeline needs; cheap to clone (handles).
#[derive(Clone)]
pub struct Setup {
    pub device: Device,
    pub kernel: Kernel,
    /// Holds `pool_batches` batches at most.
    pub pool: PoolResource<CudaAsyncResource>,
    /// Staging memory, pooled: each run's staging vectors reuse the last run's without a
    /// `cuMemHostAlloc` (or a `cuMemFreeHost` while the next run is timed).
    pub pinned: PoolResource<PinnedHostResource>,
    pub shape: Shape,
    /// Pinned staging vectors per direction: copies in flight per copy stream.
    pub staging: usize,
    /// The pool's size in batches; also the capacity of the channels between the stages.
    pub pool_batches: usize,
    /// Kernel iterations per element (from [`calibrate`]).
    pub iters: u32,
}

impl Setup {
    /// A set-up on `device` whose pool holds `pool_batches` batches of `shape`, with
    /// `staging` staging vectors per direction and 1 kernel iteration.
    pub fn new(
        device: &Device,
        kernel: Kernel,
        shape: Shape,
        staging: usize,
        pool_batches: usize,
    ) -> Result<Setup, BoxError> {
        let pool_bytes = pool_batches * shape.bytes();
        Ok(Setup {
            pool: PoolResource::new(
                CudaAsyncResource::new(device)?,
                pool_bytes,
                Some(pool_bytes),
            )?,
            pinned: PoolResource::new(
                PinnedHostResource::new(device)?,
                2 * staging * shape.bytes(),
                None,
            )?,
            device: device.clone(),
            kernel,
            shape,
            staging,
            pool_batches,
            iters: 1,
        })
    }

    /// The input staging vectors, made on `up`: slot `i` holds `input(i, ..)`.
    pub async fn uploads(&self, up: &Stream) -> Result<Uploads, BoxError> {
        let mut free = Vec::new();
        for slot in 0..self.staging {
            let mut v =
                PinnedHostVec::<f32>::new(self.shape.elems, up, self.pinned.clone()).await?;
            v.iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = input(slot, j));
            free.push((slot, v));
        }
        Ok(Ring::new(free))
    }

    /// The output staging vectors, made on `down`.
    pub async fn downloads(&self, down: &Stream) -> Result<Downloads, BoxError> {
        let mut free = Vec::new();
        for _ in 0..self.staging {
            free.push((
                None,
                PinnedHostVec::<f32>::zeroed(self.shape.elems, down, self.pinned.clone()).await?,
            ));
        }
        Ok(Ring::new(free))
    }

    /// An output staging vector from `ring`; the results of the batch it brings back, if
    /// any, are checked first.
    pub async fn take_output(&self, ring: &mut Downloads) -> Result<PinnedHostVec<f32>, BoxError> {
        let (done, out) = ring.take().await?;
        if let Some((batch, slot)) = done {
            self.check(batch, slot, &out)?;
        }
        Ok(out)
    }

    /// Waits for the downloads in flight in `ring` and checks their results.
    pub async fn finish_outputs(&self, ring: &mut Downloads) -> Result<(), BoxError> {
        ring.finish().await?;
        for (done, out) in ring.free_mut() {
            if let Some((batch, slot)) = done.take() {
                self.check(batch, slot, out)?;
            }
        }
        Ok(())
    }

    /// Checks a sample of batch `batch`'s results (its input from staging slot `slot`)
    /// against the host.
    pub fn check(&self, batch: usize, slot: usize, out: &[f32]) -> Result<(), BoxError> {
        let elems = self.shape.elems;
        for j in (0..elems).step_by(elems / 64 + 1) {
            let want = transform(input(slot, j), self.iters);
            if out[j] != want {
                return Err(
                    format!("batch {batch}, element {j}: {} instead of {want}", out[j]).into(),
                );
            }
        }
        Ok(())
    }
}

/// Pinned staging vectors used round-robin by copies: a vector is lent to a copy and comes
/// back, with the tag it was lent with, when the copy's future resolves.
pub struct Ring<T, C> {
    free: VecDeque<(T, PinnedHostVec<f32>)>,
    lent: VecDeque<(T, C)>,
    /// Vectors that came back from a copy so far.
    returned: usize,
}

/// Inputs, tagged with their staging slot.
pub type Uploads = Ring<usize, CopyFromHost<PinnedHostVec<f32>>>;
/// Outputs, tagged with the batch whose results they receive and its input's slot.
pub type Downloads = Ring<Option<(usize, usize)>, CopyToHost<PinnedHostVec<f32>>>;

impl<T, C> Ring<T, C>
where
    C: Future<Output = streamalloc::Result<PinnedHostVec<f32>>> + Unpin,
{
    pub fn new(free: Vec<(T, PinnedHostVec<f32>)>) -> Self {
        Ring {
            free: free.into(),
            lent: VecDeque::new(),
            returned: 0,
        }
    }

    /// A free vector, else the one lent longest ago, once its copy is done.
    pub async fn take(&mut self) -> Result<(T, PinnedHostVec<f32>), BoxError> {
        if let Some(free) = self.free.pop_front() {
            return Ok(free);
        }
        let (tag, copy) = self
            .lent
            .pop_front()
            .expect("a ring of at least one vector");
        self.returned += 1;
        Ok((tag, copy.await?))
    }

    /// Lends a vector to `copy`, which resolves to it.
    pub fn lend(&mut self, tag: T, copy: C) {
        self.lent.push_back((tag, copy));
    }

    /// Waits for every copy in flight; their vectors join the free ones, with their tags.
    pub async fn finish(&mut self) -> Result<(), BoxError> {
        while let Some((tag, copy)) = self.lent.pop_front() {
            let v = copy.await?;
            self.returned += 1;
            self.free.push_back((tag, v));
        }
        Ok(())
    }

    /// The free vectors, with their tags.
    pub fn free_mut(&mut self) -> impl Iterator<Item = &mut (T, PinnedHostVec<f32>)> {
        self.free.iter_mut()
    }

    /// How many vectors came back from copies.
    pub fn returned(&self) -> usize {
        self.returned
    }
}

/// What bounds the overlap on `device`'s backend, when that is not the GPU's copy engines
/// and SMs: the host backend's streams are worker threads sharing the CPUs.
pub fn backend_note(device: &Device) -> Option<String> {
    (device.backend() == BackendKind::Host).then(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        format!(
            "(host backend: each stream is a worker thread and the kernel runs on the CPU, so \
             the overlap is bounded by the free CPU cores: {cores} here, shared with the tokio \
             workers)"
        )
    })
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The outcome of [`calibrate`].
pub struct Calibration {
    /// One batch's upload.
    pub upload: Duration,
    /// One kernel at `probe` iterations.
    pub kernel: Duration,
    pub probe: u32,
    /// The iterations that make the kernel as long as an upload.
    pub iters: u32,
}

impl Calibration {
    pub fn describe(&self) -> String {
        format!(
            "calibration: upload {:.3} ms/batch; kernel {:.3} ms at {} iterations -> {} iterations",
            ms(self.upload),
            ms(self.kernel),
            self.probe,
            self.iters
        )
    }
}

/// Picks the kernel's iteration count so that it takes about as long as a batch's upload.
pub async fn calibrate(setup: &Setup) -> Result<Calibration, BoxError> {
    let s = Stream::new(&setup.device)?;
    let mut x = DeviceVec::<f32>::new(setup.shape.elems, &s, setup.pool.clone()).await?;
    let mut uploads = setup.uploads(&s).await?;
    upload_all(&mut uploads, &mut x, setup.staging).await?; // warm-up
    let reps = 8;
    let t = Instant::now();
    upload_all(&mut uploads, &mut x, reps).await?;
    let upload = t.elapsed() / reps as u32;
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
        let kernel = t.elapsed() / reps as u32;
        if kernel >= upload || probe >= 1 << 24 {
            break kernel;
        }
        probe *= 4;
    };
    let iters =
        ((probe as f64 * upload.as_secs_f64() / kernel.as_secs_f64()).round() as u32).max(1);
    Ok(Calibration {
        upload,
        kernel,
        probe,
        iters,
    })
}

/// Uploads `count` batches into `x` through the staging vectors of `ring` (as many copies in
/// flight as it has vectors), and waits for the last.
pub async fn upload_all(
    ring: &mut Uploads,
    x: &mut DeviceVec<f32>,
    count: usize,
) -> Result<(), BoxError> {
    for _ in 0..count {
        let (slot, v) = ring.take().await?;
        ring.lend(slot, x.copy_from_host(v));
    }
    ring.finish().await?;
    Ok(())
}

/// Downloads `x` `count` times through the staging vectors of `ring`, and waits for the last.
pub async fn download_all(
    ring: &mut Downloads,
    x: &DeviceVec<f32>,
    count: usize,
) -> Result<(), BoxError> {
    for _ in 0..count {
        let (_, v) = ring.take().await?;
        ring.lend(None, x.copy_to_host(v));
    }
    ring.finish().await?;
    Ok(())
}

/// How long each stage takes alone for all batches, each on its stream of
/// `[upload, kernel, download]`: the bound a pipeline's wall time approaches when the stages
/// overlap. Every allocation is made before the clock starts.
pub async fn stage_times(setup: &Setup, streams: [&Stream; 3]) -> Result<[Duration; 3], BoxError> {
    let [up, k, down] = streams;
    let batches = setup.shape.batches;
    let mut x = DeviceVec::<f32>::new(setup.shape.elems, up, setup.pool.clone()).await?;
    let mut uploads = setup.uploads(up).await?;
    let mut downloads = setup.downloads(down).await?;
    up.synchronize().await?;
    let t = Instant::now();
    upload_all(&mut uploads, &mut x, batches).await?;
    let upload = t.elapsed();
    x.set_stream(k)?;
    let t = Instant::now();
    for _ in 0..batches {
        setup.kernel.launch(k, &mut x, setup.iters)?;
    }
    k.synchronize().await?;
    let kernel = t.elapsed();
    x.set_stream(down)?;
    let t = Instant::now();
    download_all(&mut downloads, &x, batches).await?;
    Ok([upload, kernel, t.elapsed()])
}

/// Runs the pipeline once with its stages on `[upload, kernel, download]`, as tokio tasks
/// joined by channels; returns the wall time. Every batch's results are checked.
pub async fn run(setup: &Setup, streams: [&Stream; 3]) -> Result<Duration, BoxError> {
    let [up, k, down] = streams.map(Stream::clone);
    let mut uploads = setup.uploads(&up).await?;
    let mut downloads = setup.downloads(&down).await?;
    // (batch, staging slot of its input, data)
    type Batch = (usize, usize, DeviceVec<f32>);
    let (to_kernel, mut kernel_rx) = mpsc::channel::<Batch>(setup.pool_batches);
    let (to_download, mut download_rx) = mpsc::channel::<Batch>(setup.pool_batches);
    let start = Instant::now();

    let upload = tokio::spawn({
        let setup = setup.clone();
        async move {
            for batch in 0..setup.shape.batches {
                let (slot, input) = uploads.take().await?;
                // Awaits memory when the pool is full.
                let mut x =
                    DeviceVec::<f32>::new(setup.shape.elems, &up, setup.pool.clone()).await?;
                uploads.lend(slot, x.copy_from_host(input));
                to_kernel.send((batch, slot, x)).await?;
            }
            uploads.finish().await?;
            Ok::<_, BoxError>(())
        }
    });

    let kernel = tokio::spawn({
        let (setup, down_for_kernel) = (setup.clone(), down.clone());
        async move {
            // Each stage takes a batch when it receives it: after a copy the crate knows where
            // the batch's last use ended. A kernel launched through cudarc tells it nothing, so
            // the kernel stage hands the batch on right after its launch, where hand-written
            // CUDA records its event.
            while let Some((batch, slot, mut x)) = kernel_rx.recv().await {
                x.set_stream(&k)?;
                setup.kernel.launch(&k, &mut x, setup.iters)?;
                x.set_stream(&down_for_kernel)?;
                to_download.send((batch, slot, x)).await?;
            }
            Ok::<_, BoxError>(())
        }
    });

    let download = tokio::spawn({
        let setup = setup.clone();
        async move {
            while let Some((batch, slot, x)) = download_rx.recv().await {
                let out = setup.take_output(&mut downloads).await?;
                downloads.lend(Some((batch, slot)), x.copy_to_host(out));
            }
            setup.finish_outputs(&mut downloads).await?;
            Ok::<_, BoxError>(downloads.returned())
        }
    });

    upload.await??;
    kernel.await??;
    let checked = download.await??;
    let wall = start.elapsed();
    assert_eq!(checked, setup.shape.batches, "every batch checked");
    Ok(wall)
}
