//! The side-by-side table: workloads W1–W4 (`../shared/bench/WORKLOADS.md`) on this crate's
//! resources, on raw `cuMemAllocFromPoolAsync` and, when the RMM anchor is bundled
//! (`ANCHORS=1 ../shared/gpu/bundle.sh`), on RMM's resources in the same run, with the ratios.
//!
//! Run: `cargo bench --features bench --bench workloads` (the host backend here), or on the GPU machine the
//! bundled binary with `--bench` from the checkout's root (`bash .gpu/run.sh` does). Set
//! `STREAMALLOC_RMM=0` to skip RMM (its run builds it with nvcc first), and
//! `STREAMALLOC_WORKLOADS_OUT=path.md` to also get the report as Markdown. The argument
//! `footprint` (`cargo bench --features bench --bench workloads -- footprint`) runs W4 alone; further arguments
//! keep only the W4 set-ups whose names contain one of them (`-- footprint Arena Pool`).
//! `STREAMALLOC_WORKLOADS_ONLY=Binning,FixedSize` keeps only the set-ups whose names contain one
//! of its comma-separated parts, in W1–W3 and W4 alike; the W1–W3 pool always runs, as the
//! reference for the ratios and for the adaptor and future figures.
//!
//! W4 (`footprint`) runs every set-up twice, each time on a freshly built resource: a timed
//! pass (ns per step) and a sampled pass that reads the device's used memory
//! ([`Device::memory_info`]: `cuMemGetInfo` on CUDA; on the host backend the bytes of the
//! emulated device's live raw allocations, read after waiting for every stream, since its raw
//! frees run late on stream workers) after every allocation. The figure is the peak of that,
//! minus what was in use before the resource was built, over the peak of live bytes.
//!
//! Besides the table it measures, on the pool: the allocation future's ready path against
//! `try_allocate` (W1 with `allocate().await` in one `block_on`), and the wake latency from a
//! free to a task waiting for that memory resuming (tokio, one worker thread).

#[path = "common/workloads.rs"]
mod workloads;

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

#[cfg(feature = "cuda-driver")]
use streamalloc::BackendKind;
use streamalloc::{
    percent_of_free_device_memory, ArenaResource, BinningResource, CudaAsyncResource, CudaResource,
    Device, FixedSizeResource, MappedPoolResource, MemoryResource, PoolResource, StatisticsAdaptor,
    Stream, TracingAdaptor, TrackingAdaptor,
};

use workloads::{
    pair, pair_awaited, random_ns, threaded, FOOTPRINT_STEPS, MIB, RAND_1MIB, RAND_64MIB,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const PAIR_ITERS: usize = 200_000;
/// Each figure is the median of this many runs of its workload, on the same resource: one run
/// of W1 on these machines varied by tens of percent.
const TRIALS: usize = 5;

/// The median of `TRIALS` runs of `f`.
fn median_of(mut f: impl FnMut() -> f64) -> f64 {
    median((0..TRIALS).map(|_| f()).collect())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_unstable_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Wake latency samples, after untimed warm-up ones.
const WAKE_ITERS: usize = 2_000;
const WAKE_WARMUP: usize = 50;

/// The figures of one resource, ns per operation (W1: per pair).
#[derive(Clone, Debug)]
struct Row {
    name: String,
    /// W1, W2 rand1MiB, W2 rand64MiB, W3 mt1, mt4, mt16.
    ns: [Option<f64>; 6],
}

const COLUMNS: [&str; 6] = ["pair", "rand1MiB", "rand64MiB", "mt1", "mt4", "mt16"];

/// Runs W1–W3 on `mr`, each on fresh streams of `device`.
fn measure<R: MemoryResource>(name: &str, mr: &R, device: &Device) -> Result<Row, BoxError> {
    measure_up_to(name, mr, device, usize::MAX)
}

/// [`measure`] for a resource that serves requests of up to `largest` bytes only: workloads
/// that ask for more get no figure.
fn measure_up_to<R: MemoryResource>(
    name: &str,
    mr: &R,
    device: &Device,
    largest: usize,
) -> Result<Row, BoxError> {
    eprintln!("[{name}] W1 ...");
    let stream = Stream::new(device)?;
    let p = median_of(|| pair(mr, &stream, PAIR_ITERS));
    eprintln!("[{name}] W2 ...");
    let r1 = median_of(|| random_ns(mr, &stream, RAND_1MIB));
    let r64 = (largest >= RAND_64MIB.max).then(|| median_of(|| random_ns(mr, &stream, RAND_64MIB)));
    let mut mt = [0.0; 3];
    for (i, threads) in [1, 4, 16].into_iter().enumerate() {
        eprintln!("[{name}] W3 mt{threads} ...");
        let streams: Vec<Stream> = (0..threads)
            .map(|_| Stream::new(device))
            .collect::<Result<_, _>>()?;
        mt[i] = median_of(|| threaded(mr, &streams));
        for s in &streams {
            s.synchronize_blocking()?;
        }
    }
    stream.synchronize_blocking()?;
    Ok(Row {
        name: name.into(),
        ns: [
            Some(p),
            Some(r1),
            r64,
            Some(mt[0]),
            Some(mt[1]),
            Some(mt[2]),
        ],
    })
}

/// The pool of WORKLOADS.md: over plain device memory, 50 % of free memory, no maximum.
fn workload_pool(device: &Device) -> Result<PoolResource<CudaResource>, BoxError> {
    let initial = percent_of_free_device_memory(device, 50)?;
    Ok(PoolResource::new(
        CudaResource::new(device)?,
        initial,
        None,
    )?)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("workloads bench failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), BoxError> {
    let device = Device::default();
    let only_footprint = std::env::args().skip(1).any(|a| a == "footprint");
    let mut out = String::new();
    writeln!(
        out,
        "streamalloc allocation workloads ({} of WORKLOADS.md) on {} ({}, {} backend); {} host CPUs",
        if only_footprint { "W4" } else { "W1-W4" },
        device.id(),
        device.name(),
        device.backend(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    )?;
    writeln!(
        out,
        "ns per operation (pair: per allocate+free); mtT: aggregate wall time / (2 x 5,000 x T); \
         ours: median of {TRIALS} runs on one resource, RMM's: one run"
    )?;

    let w1_to_w3 = if only_footprint {
        None
    } else {
        Some(measure_w1_to_w3(&device)?)
    };
    let footprints = footprint_rows(&device)?;
    let rmm_text = rmm_output(&mut out);
    if let Some(measured) = w1_to_w3 {
        report_w1_to_w3(&mut out, measured, rmm_text.as_deref())?;
    }
    report_footprint(&mut out, &footprints, rmm_text.as_deref())?;
    print!("{out}");
    if let Some(path) = std::env::var_os("STREAMALLOC_WORKLOADS_OUT") {
        std::fs::write(&path, format!("```text\n{out}```\n"))?;
        println!("report written to {}", path.to_string_lossy());
    }
    Ok(())
}

/// What W1–W3 measured on this crate's side.
struct W1ToW3 {
    rows: Vec<Row>,
    awaited: (f64, f64),
    wake: Vec<Duration>,
    adaptors: Vec<(String, f64)>,
}

/// Whether the set-up `name` runs: `STREAMALLOC_WORKLOADS_ONLY` (comma-separated parts of
/// names) keeps those that contain one of its parts; unset keeps all.
fn selected(name: &str) -> bool {
    std::env::var("STREAMALLOC_WORKLOADS_ONLY").map_or(true, |only| {
        only.split(',').any(|part| name.contains(part.trim()))
    })
}

fn measure_w1_to_w3(device: &Device) -> Result<W1ToW3, BoxError> {
    let device = device.clone();
    // Made first: on the host backend, memory the big pools free reaches the device only when
    // their streams get there.
    let wake_pool = PoolResource::new(CudaResource::new(&device)?, WAKE_SIZE, Some(WAKE_SIZE))?;
    let mut rows = Vec::new();
    #[cfg(feature = "cuda-driver")]
    if device.backend() == BackendKind::Cuda && selected("raw cuMemAllocFromPoolAsync") {
        let mr = raw::RawAsync::new(&device)?;
        rows.push(measure("raw cuMemAllocFromPoolAsync", &mr, &device)?);
    }
    if selected("streamalloc CudaAsyncResource") {
        let mr = CudaAsyncResource::new(&device)?;
        rows.push(measure("streamalloc CudaAsyncResource", &mr, &device)?);
    }
    let awaited = {
        let mr = workload_pool(&device)?;
        rows.push(measure("streamalloc PoolResource", &mr, &device)?);
        let stream = Stream::new(&device)?;
        eprintln!("[streamalloc PoolResource] allocate().await ...");
        // Alternated, so that a drift of the machine hits both alike.
        let (mut tries, mut awaits) = (Vec::new(), Vec::new());
        for _ in 0..TRIALS {
            tries.push(pair(&mr, &stream, PAIR_ITERS));
            awaits.push(pair_awaited(&mr, &stream, PAIR_ITERS));
        }
        (median(tries), median(awaits))
    };
    if selected("streamalloc ArenaResource") {
        // WORKLOADS.md's arena: over plain device memory, 50 % of free memory.
        let size = percent_of_free_device_memory(&device, 50)?;
        let mr = ArenaResource::new(CudaResource::new(&device)?, Some(size))?;
        rows.push(measure("streamalloc ArenaResource", &mr, &device)?);
    }
    if selected("streamalloc BinningResource") {
        // WORKLOADS.md's binning: bins of 2^18..2^22 bytes (128 blocks each) over a pool of
        // 50 % of free memory.
        let mr = BinningResource::with_range(workload_pool(&device)?, 18, 22)?;
        rows.push(measure("streamalloc BinningResource", &mr, &device)?);
    }
    if selected("streamalloc FixedSizeResource") {
        // Blocks of 1 MiB, RMM's default, which hold every request of W1, W2 rand1MiB and W3.
        let mr = FixedSizeResource::with_defaults(CudaResource::new(&device)?)?;
        rows.push(measure_up_to(
            "streamalloc FixedSizeResource (1 MiB blocks)",
            &mr,
            &device,
            mr.block_size(),
        )?);
    }
    eprintln!("[streamalloc PoolResource] wake latency ...");
    let wake = wake_latency(&wake_pool)?;
    eprintln!("[adaptors] W1 over the pool ...");
    let adaptors = adaptor_overhead(&device)?;

    Ok(W1ToW3 {
        rows,
        awaited,
        wake,
        adaptors,
    })
}

fn report_w1_to_w3(out: &mut String, m: W1ToW3, rmm_text: Option<&str>) -> Result<(), BoxError> {
    let W1ToW3 {
        mut rows,
        awaited,
        wake,
        adaptors,
    } = m;
    let rmm = rmm_text.map(|t| rmm_rows(out, t)).unwrap_or_default();
    rows.extend(rmm.iter().cloned());

    writeln!(out)?;
    table(out, &rows, |_, v| {
        v.map_or("-".into(), |v| format!("{v:.1}"))
    })?;

    let counterpart = |name: &str| -> Option<&str> {
        Some(match name {
            "streamalloc CudaAsyncResource" => "rmm.cuda_async",
            "streamalloc PoolResource" => "rmm.pool",
            "streamalloc ArenaResource" => "rmm.arena",
            "streamalloc BinningResource" => "rmm.binning",
            _ => return None,
        })
    };
    let ours: Vec<Row> = rows
        .iter()
        .filter(|r| r.name.starts_with("streamalloc"))
        .cloned()
        .collect();
    if let Some(raw) = rows.iter().find(|r| r.name.starts_with("raw")).cloned() {
        writeln!(
            out,
            "\nratio to raw cuMemAllocFromPoolAsync in this run (< 1: faster)"
        )?;
        let ratios: Vec<Row> = ours.iter().map(|r| ratio_row(r, &raw)).collect();
        table(out, &ratios, |_, v| {
            v.map_or("-".into(), |v| format!("{v:.3}"))
        })?;
    }
    if !rmm.is_empty() {
        writeln!(
            out,
            "\nratio to RMM's counterpart in this run (< 1: faster)"
        )?;
        let ratios: Vec<Row> = ours
            .iter()
            .filter_map(|r| {
                let theirs = rmm
                    .iter()
                    .find(|x| Some(x.name.as_str()) == counterpart(&r.name))?;
                let mut row = ratio_row(r, theirs);
                row.name = format!("{} / {}", r.name, theirs.name);
                Some(row)
            })
            .collect();
        table(out, &ratios, |_, v| {
            v.map_or("-".into(), |v| format!("{v:.3}"))
        })?;
    }

    writeln!(
        out,
        "\nadaptor overhead on W1 over the workload pool, ns per pair (ratio to the bare pool)"
    )?;
    let bare = adaptors[0].1;
    for (name, ns) in &adaptors {
        writeln!(out, "  {name:<44} {ns:>8.1}  ({:.3})", ns / bare)?;
    }
    let (try_ns, await_ns) = awaited;
    writeln!(
        out,
        "\nPoolResource W1 pair: try_allocate {try_ns:.1} ns, allocate().await {await_ns:.1} ns: \
         ratio {:.3} (target <= 1.25)",
        await_ns / try_ns
    )?;
    writeln!(
        out,
        "PoolResource wake latency, free -> waiting task resumed (tokio, 1 worker, {} samples): \
         median {:.1} us, p90 {:.1} us, p99 {:.1} us, max {:.1} us",
        wake.len(),
        us(percentile(&wake, 50)),
        us(percentile(&wake, 90)),
        us(percentile(&wake, 99)),
        us(percentile(&wake, 100)),
    )?;
    Ok(())
}

fn ratio_row(r: &Row, base: &Row) -> Row {
    let mut ns = [None; 6];
    for (i, v) in ns.iter_mut().enumerate() {
        *v = match (r.ns[i], base.ns[i]) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
    }
    Row {
        name: r.name.clone(),
        ns,
    }
}

fn table(
    out: &mut String,
    rows: &[Row],
    cell: impl Fn(usize, Option<f64>) -> String,
) -> std::fmt::Result {
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(8).max(8);
    write!(out, "{:<width$}", "resource")?;
    for c in COLUMNS {
        write!(out, " {c:>11}")?;
    }
    writeln!(out)?;
    for r in rows {
        write!(out, "{:<width$}", r.name)?;
        for (i, v) in r.ns.iter().enumerate() {
            write!(out, " {:>11}", cell(i, *v))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// The RMM anchor's output, from running the bundled anchor (`.gpu/rmm/run.sh`) now, when it
/// is there, or from a saved output of it named by `STREAMALLOC_RMM_OUTPUT`.
fn rmm_output(out: &mut String) -> Option<String> {
    let text = if let Some(saved) = std::env::var_os("STREAMALLOC_RMM_OUTPUT") {
        match std::fs::read_to_string(&saved) {
            Ok(t) => t,
            Err(e) => {
                let _ = writeln!(out, "RMM: cannot read {}: {e}", saved.to_string_lossy());
                return None;
            }
        }
    } else {
        let script = std::path::Path::new(".gpu/rmm/run.sh");
        if std::env::var("STREAMALLOC_RMM").is_ok_and(|v| v == "0") || !script.exists() {
            let _ = writeln!(
                out,
                "RMM: not run (no .gpu/rmm/run.sh, or STREAMALLOC_RMM=0)"
            );
            return None;
        }
        eprintln!("[rmm] building and running the RMM anchor ...");
        match Command::new("bash").arg(script).output() {
            Ok(o) => {
                eprintln!("{}", String::from_utf8_lossy(&o.stderr));
                String::from_utf8_lossy(&o.stdout).into_owned()
            }
            Err(e) => {
                let _ = writeln!(out, "RMM: could not run {}: {e}", script.display());
                return None;
            }
        }
    };
    eprintln!("{text}");
    Some(text)
}

/// RMM's W1–W3 rows from the anchor's output `text`, with a note in `out` on what is missing.
fn rmm_rows(out: &mut String, text: &str) -> Vec<Row> {
    let rows = parse_rmm(text);
    if rows.is_empty() {
        let _ = writeln!(out, "RMM: the anchor printed no figures");
    } else if let Some(l) = text.lines().find(|l| l.starts_with("device free=")) {
        let _ = writeln!(out, "RMM anchor (librmm 26.10, same machine): {l}");
    }
    for r in rows.iter().filter(|r| r.ns.contains(&None)) {
        let _ = writeln!(
            out,
            "RMM: {} has figures missing (the anchor stopped early)",
            r.name
        );
    }
    rows
}

/// Parses the anchor's output. It prints progress lines (`  rmm.pool pair 544.6`, for pair, r1,
/// r64, mt1 and mt4) and then a summary row per resource (a name and seven figures: pair,
/// rand1MiB, rand64MiB, rand10k_1MiB, mt1, mt4, mt16). Progress lines fill in a resource whose
/// summary row never came (the anchor aborted in its mt16 run). It stops at W4's `footprint`
/// header ([`parse_rmm_footprint`] reads what follows).
fn parse_rmm(text: &str) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for line in text.lines().take_while(|l| !is_footprint_header(l)) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let Some(&name) = parts.first().filter(|n| n.starts_with("rmm.")) else {
            continue;
        };
        let i = rows.iter().position(|r| r.name == name).unwrap_or_else(|| {
            rows.push(Row {
                name: name.into(),
                ns: [None; 6],
            });
            rows.len() - 1
        });
        let figures: Vec<f64> = parts[1..].iter().filter_map(|x| x.parse().ok()).collect();
        if line.starts_with("rmm.") && figures.len() == 7 {
            // mt figures of 0 mean "not run" in the anchor.
            let v = [
                figures[0], figures[1], figures[2], figures[4], figures[5], figures[6],
            ];
            rows[i].ns = v.map(|x| (x > 0.0).then_some(x));
        } else if let (Some(metric), [value]) = (parts.get(1), figures.as_slice()) {
            // The progress metrics, in the order of the table's first five columns.
            if let Some(c) = ["pair", "r1", "r64", "mt1", "mt4"]
                .iter()
                .position(|m| m == metric)
            {
                rows[i].ns[c] = Some(*value);
            }
        }
    }
    rows
}

/// One W4 row: a set-up's figures, or why it has none.
#[derive(Clone, Debug)]
struct FootRow {
    name: String,
    figures: Result<Foot, String>,
}

/// W4's figures: ns per step (timed pass); peak live bytes and peak device memory in use above
/// the base, in bytes (sampled pass).
#[derive(Clone, Copy, Debug)]
struct Foot {
    step_ns: f64,
    peak_live: f64,
    peak_dev: f64,
}

impl Foot {
    fn ratio(&self) -> f64 {
        self.peak_dev / self.peak_live
    }
}

/// The goals of issue 14 on W4's ratio (peak device / peak live), by row name.
const FOOTPRINT_GOALS: &[(&str, f64)] = &[
    ("streamalloc PoolResource", 1.10),
    ("streamalloc MappedPoolResource", 1.05),
];

/// The device memory in use now: total − free.
fn device_used(device: &Device) -> Result<usize, BoxError> {
    let info = device.memory_info()?;
    Ok(info.total - info.free)
}

/// Whether the W4 set-up `name` runs: the arguments after `footprint` name the set-ups to
/// keep (a part of the name each), and [`selected`] must keep it too; none keeps all.
fn footprint_wanted(name: &str) -> bool {
    if !selected(name) {
        return false;
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .skip_while(|a| a != "footprint")
        .skip(1)
        .collect();
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}

/// The device memory in use once what dropped resources gave back has arrived: on the host
/// backend a resource's last frees run on its own stream's worker after the resource is gone,
/// so the reading is repeated until it holds still for 20 ms (at most 2 s).
fn settled_device_used(device: &Device) -> Result<usize, BoxError> {
    device.synchronize_blocking()?;
    let mut used = device_used(device)?;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(20));
        let now = device_used(device)?;
        if now == used {
            break;
        }
        used = now;
    }
    Ok(used)
}

/// W4 on the set-up `make` builds: a timed pass on one fresh resource, then, with that one
/// dropped and the device synchronized, the device memory in use as the base, and a sampled
/// pass on another fresh resource (RMM's anchor does the same). `None` when the arguments
/// leave the set-up out ([`footprint_wanted`]). A set-up is one line in [`footprint_rows`]:
/// `rows.extend(footprint("streamalloc X", device, || X::new(..))?);`.
fn footprint<R, E>(
    name: &str,
    device: &Device,
    make: impl Fn() -> Result<R, E>,
) -> Result<Option<FootRow>, BoxError>
where
    R: MemoryResource,
    E: Into<BoxError>,
{
    if !footprint_wanted(name) {
        return Ok(None);
    }
    eprintln!("[{name}] W4 ...");
    let stream = Stream::new(device)?;
    let timed = {
        let mr = make().map_err(Into::into)?;
        let run = workloads::footprint(&mr, &stream, FOOTPRINT_STEPS, None);
        stream.synchronize_blocking()?;
        run
    };
    let base = settled_device_used(device)?;
    let sampled = {
        let mr = make().map_err(Into::into)?;
        // On the host backend, frees of raw memory run on a stream's worker thread, which on a
        // busy machine lags far behind (on CUDA `cuMemFree` returns the memory at once): the
        // reading there waits for every stream first, so that it shows what the resource holds,
        // not how far the emulation's workers are behind.
        let host = device.host_controls().is_some();
        let read = || {
            if host {
                device
                    .synchronize_blocking()
                    .expect("synchronizing the device");
            }
            device_used(device).expect("reading the device's memory")
        };
        let run = workloads::footprint(&mr, &stream, FOOTPRINT_STEPS, Some(&read));
        stream.synchronize_blocking()?;
        run
    };
    device.synchronize_blocking()?;
    let (timed, sampled) = match (timed, sampled) {
        (Ok(t), Ok(s)) => (t, s),
        (Err(e), _) => {
            return Ok(Some(footprint_skipped(
                name,
                format!("failed (timed pass): {e}"),
            )))
        }
        (_, Err(e)) => {
            return Ok(Some(footprint_skipped(
                name,
                format!("failed (sampled pass): {e}"),
            )))
        }
    };
    eprintln!(
        "[{name}] W4 base {base} B, peak in use {} B, peak live {} B, {} allocations",
        sampled.peak_used, sampled.peak_live, sampled.allocations
    );
    Ok(Some(FootRow {
        name: name.into(),
        figures: Ok(Foot {
            step_ns: timed.ns_per_step,
            peak_live: sampled.peak_live as f64,
            peak_dev: sampled.peak_used.saturating_sub(base) as f64,
        }),
    }))
}

/// A row for a set-up that cannot run W4 or failed in it, with the reason.
fn footprint_skipped(name: &str, why: impl Into<String>) -> FootRow {
    let why = why.into();
    eprintln!("[{name}] W4: {why}");
    FootRow {
        name: name.into(),
        figures: Err(why),
    }
}

/// W4 on every set-up of WORKLOADS.md (each starts with nothing reserved and grows), the
/// crate's resources with their defaults, and the crate's modes made to cut the footprint.
fn footprint_rows(device: &Device) -> Result<Vec<FootRow>, BoxError> {
    let pool = || PoolResource::new(CudaResource::new(device)?, 0, None);
    let mut rows = Vec::new();
    rows.extend(footprint("streamalloc CudaResource", device, || {
        CudaResource::new(device)
    })?);
    // The builder's default release threshold is u64::MAX, RMM's cuda_async setting.
    rows.extend(footprint("streamalloc CudaAsyncResource", device, || {
        CudaAsyncResource::new(device)
    })?);
    rows.extend(footprint("streamalloc PoolResource", device, pool)?);
    // Pages mapped on demand into one reserved range (CUDA virtual memory management).
    rows.extend(footprint("streamalloc MappedPoolResource", device, || {
        MappedPoolResource::new(device)
    })?);
    rows.extend(footprint("streamalloc BinningResource", device, || {
        BinningResource::with_range(pool()?, 18, 22)
    })?);
    // The default: an arena that starts empty and grows on demand.
    rows.extend(footprint("streamalloc ArenaResource", device, || {
        ArenaResource::new(CudaResource::new(device)?, None)
    })?);
    // RMM's arena (and this crate's before it grew): half of the free memory at construction.
    rows.extend(footprint(
        "streamalloc ArenaResource (50 % of free)",
        device,
        || {
            let size = percent_of_free_device_memory(device, 50)?;
            ArenaResource::new(CudaResource::new(device)?, Some(size))
        },
    )?);
    if footprint_wanted("streamalloc FixedSizeResource") {
        let fixed = FixedSizeResource::with_defaults(CudaResource::new(device)?)?;
        rows.push(footprint_skipped(
            "streamalloc FixedSizeResource",
            format!(
                "skipped: serves blocks of at most {} bytes; W4's large blocks are up to 64 MiB",
                fixed.block_size()
            ),
        ));
    }
    // Modes made to cut the footprint.
    rows.extend(footprint(
        "streamalloc CudaAsyncResource (release threshold 0)",
        device,
        || {
            CudaAsyncResource::builder(device)
                .release_threshold(0)
                .build()
        },
    )?);
    Ok(rows)
}

fn is_footprint_header(line: &str) -> bool {
    line.split_whitespace().next() == Some("footprint")
}

/// RMM's W4 rows from the anchor's output: after the `footprint` header, a name and four
/// figures per line (step_ns, peak_live_MiB, peak_dev_MiB, ratio).
fn parse_rmm_footprint(text: &str) -> Vec<FootRow> {
    text.lines()
        .skip_while(|l| !is_footprint_header(l))
        .skip(1)
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let (&name, rest) = parts.split_first()?;
            let figures: Vec<f64> = rest.iter().filter_map(|x| x.parse().ok()).collect();
            (name.starts_with("rmm.") && figures.len() == 4).then(|| FootRow {
                name: name.into(),
                figures: Ok(Foot {
                    step_ns: figures[0],
                    peak_live: figures[1] * MIB as f64,
                    peak_dev: figures[2] * MIB as f64,
                }),
            })
        })
        .collect()
}

/// RMM's W4 counterpart of one of our rows.
fn footprint_counterpart(name: &str) -> Option<&'static str> {
    Some(match name {
        "streamalloc CudaResource" => "rmm.cuda",
        "streamalloc CudaAsyncResource" => "rmm.cuda_async",
        "streamalloc PoolResource" => "rmm.pool",
        "streamalloc BinningResource" => "rmm.binning",
        _ => return None,
    })
}

/// The W4 table (ours, then RMM's), the ratios to RMM's counterparts, and the goals.
fn report_footprint(
    out: &mut String,
    ours: &[FootRow],
    rmm_text: Option<&str>,
) -> Result<(), BoxError> {
    let rmm = rmm_text.map(parse_rmm_footprint).unwrap_or_default();
    if rmm_text.is_some() && rmm.is_empty() {
        writeln!(out, "RMM: the anchor printed no W4 (footprint) rows")?;
    }
    writeln!(
        out,
        "\nW4 footprint ({FOOTPRINT_STEPS} steps, seed 9): step_ns from the timed pass; peak live \
         and peak device memory in use above the base from the sampled pass (one run each); \
         ratio = peak_dev / peak_live (1.0 is the limit)"
    )?;
    let width = ours
        .iter()
        .chain(&rmm)
        .map(|r| r.name.len())
        .max()
        .unwrap_or(8)
        .max(9);
    writeln!(
        out,
        "{:<width$} {:>12} {:>14} {:>14} {:>8}",
        "footprint", "step_ns", "peak_live_MiB", "peak_dev_MiB", "ratio"
    )?;
    for r in ours.iter().chain(&rmm) {
        match &r.figures {
            Ok(f) => writeln!(
                out,
                "{:<width$} {:>12.1} {:>14.1} {:>14.1} {:>8.3}",
                r.name,
                f.step_ns,
                f.peak_live / MIB as f64,
                f.peak_dev / MIB as f64,
                f.ratio()
            )?,
            Err(why) => writeln!(out, "{:<width$} {why}", r.name)?,
        }
    }
    let pairs: Vec<(&FootRow, &Foot, &FootRow, &Foot)> = ours
        .iter()
        .filter_map(|r| {
            let theirs = rmm
                .iter()
                .find(|x| Some(x.name.as_str()) == footprint_counterpart(&r.name))?;
            Some((
                r,
                r.figures.as_ref().ok()?,
                theirs,
                theirs.figures.as_ref().ok()?,
            ))
        })
        .collect();
    if !pairs.is_empty() {
        writeln!(
            out,
            "\nW4 ratio to RMM's counterpart in this run (< 1: faster / smaller)"
        )?;
        for (r, f, theirs, t) in pairs {
            writeln!(
                out,
                "  {:<width$} step_ns {:>7.3}  footprint ratio {:>7.3}",
                format!("{} / {}", r.name, theirs.name),
                f.step_ns / t.step_ns,
                f.ratio() / t.ratio(),
            )?;
        }
    }
    for (name, goal) in FOOTPRINT_GOALS {
        if let Some(f) = ours
            .iter()
            .find(|r| r.name == *name)
            .and_then(|r| r.figures.as_ref().ok())
        {
            writeln!(
                out,
                "W4 goal: {name} peak device / peak live {:.3} (goal <= {goal:.2}): {}",
                f.ratio(),
                if f.ratio() <= *goal { "met" } else { "NOT met" }
            )?;
        }
    }
    Ok(())
}

/// W1 on the workload pool bare and under adaptors, each on its own fresh pool.
fn adaptor_overhead(device: &Device) -> Result<Vec<(String, f64)>, BoxError> {
    let mut rows = Vec::new();
    let mut w1 = |name: &str, mr: &dyn MemoryResource| -> Result<(), BoxError> {
        let stream = Stream::new(device)?;
        rows.push((
            name.to_string(),
            median_of(|| pair(mr, &stream, PAIR_ITERS)),
        ));
        Ok(())
    };
    w1("PoolResource", &workload_pool(device)?)?;
    w1(
        "StatisticsAdaptor<PoolResource>",
        &StatisticsAdaptor::new(workload_pool(device)?),
    )?;
    w1(
        "TracingAdaptor<PoolResource> (no subscriber)",
        &TracingAdaptor::new(workload_pool(device)?),
    )?;
    w1(
        "TrackingAdaptor<PoolResource>",
        &TrackingAdaptor::new(workload_pool(device)?),
    )?;
    Ok(rows)
}

/// The size of the wake-latency pool, and of each request in it.
const WAKE_SIZE: usize = 1 << 20;

/// Latency from freeing the memory a task waits for to that task resuming: `mr`, a pool of
/// `WAKE_SIZE` bytes, is full, a task awaits an allocation of the whole pool, the main thread
/// frees.
fn wake_latency(mr: &PoolResource<CudaResource>) -> Result<Vec<Duration>, BoxError> {
    const SIZE: usize = WAKE_SIZE;
    let stream = Stream::new(mr.upstream().device())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut samples = Vec::with_capacity(WAKE_ITERS);
    for i in 0..WAKE_WARMUP + WAKE_ITERS {
        let held = mr.try_allocate(SIZE, &stream)?;
        let waiter = {
            let (mr, stream) = (mr.clone(), stream.clone());
            rt.spawn(async move {
                let p = mr.allocate(SIZE, &stream).await?;
                Ok::<_, streamalloc::Error>((Instant::now(), p))
            })
        };
        // Wait until the task has found the pool full and queued.
        let availability = mr.availability().expect("pools have a wait queue");
        while !availability.has_waiters() {
            std::hint::spin_loop();
        }
        let freed = Instant::now();
        // SAFETY: `held` was allocated above with SIZE bytes and is used by nothing.
        unsafe { mr.deallocate(held, SIZE, &stream) };
        let (resumed, p) = rt.block_on(waiter)??;
        // SAFETY: the task allocated `p` with SIZE bytes; nothing uses it.
        unsafe { mr.deallocate(p, SIZE, &stream) };
        if i >= WAKE_WARMUP {
            samples.push(resumed - freed);
        }
    }
    samples.sort_unstable();
    Ok(samples)
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[((sorted.len() - 1) * p / 100).min(sorted.len() - 1)]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The baseline: the driver's stream-ordered allocator called directly, on a pool of its own
/// with RMM's cuda_async settings (release threshold `u64::MAX`).
#[cfg(feature = "cuda-driver")]
mod raw {
    use std::cell::Cell;

    use streamalloc::cudarc::driver::sys;
    use streamalloc::{
        CudaAsyncResource, Device, DevicePtr, Error, MemoryResource, Properties, Result, Stream,
    };

    thread_local! {
        static BOUND: Cell<bool> = const { Cell::new(false) };
    }

    #[derive(Debug)]
    pub struct RawAsync {
        /// Owns the driver pool (created with a `u64::MAX` release threshold).
        pool: CudaAsyncResource,
        /// The device's primary context, as the crate made it current on this thread.
        ctx: usize,
        device: Device,
    }

    impl RawAsync {
        pub fn new(device: &Device) -> std::result::Result<Self, super::BoxError> {
            let pool = CudaAsyncResource::new(device)?;
            // Creating the pool made the device's context current on this thread.
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: `ctx` is a valid out-pointer.
            let r = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
            if r != sys::CUresult::CUDA_SUCCESS || ctx.is_null() {
                return Err(format!("cuCtxGetCurrent: {r:?}").into());
            }
            BOUND.with(|b| b.set(true));
            Ok(RawAsync {
                pool,
                ctx: ctx as usize,
                device: device.clone(),
            })
        }

        fn bind(&self) {
            if !BOUND.with(Cell::get) {
                // SAFETY: the primary context is retained by `self.pool`'s device.
                let r = unsafe { sys::cuCtxSetCurrent(self.ctx as sys::CUcontext) };
                assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuCtxSetCurrent");
                BOUND.with(|b| b.set(true));
            }
        }
    }

    // SAFETY: every pointer is a fresh block of the device's pool (`cuMemAllocFromPoolAsync`:
    // at least the size asked, 256-byte aligned, the caller's until `cuMemFreeAsync`), and the
    // properties are those of the `CudaAsyncResource` that owns the pool.
    unsafe impl MemoryResource for RawAsync {
        fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
            self.bind();
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: the context is current; the pool and the stream are live handles of it;
            // `ptr` is a valid out-pointer.
            let r = unsafe {
                sys::cuMemAllocFromPoolAsync(
                    &mut ptr,
                    bytes.max(1),
                    self.pool.pool_handle() as sys::CUmemoryPool,
                    stream.raw_handle() as sys::CUstream,
                )
            };
            match r {
                sys::CUresult::CUDA_SUCCESS => Ok(DevicePtr::from_raw(ptr)),
                sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                    Err(Error::out_of_memory(bytes, None, self.device.id()))
                }
                other => panic!("cuMemAllocFromPoolAsync: {other:?}"),
            }
        }

        unsafe fn deallocate(&self, ptr: DevicePtr, _bytes: usize, stream: &Stream) {
            self.bind();
            // SAFETY: `ptr` came from this pool (caller's contract) and the stream is live.
            let r =
                unsafe { sys::cuMemFreeAsync(ptr.addr(), stream.raw_handle() as sys::CUstream) };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuMemFreeAsync");
        }

        fn properties(&self) -> Properties {
            self.pool.properties()
        }
    }
}
