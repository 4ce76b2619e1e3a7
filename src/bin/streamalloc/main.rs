//! `streamalloc`: replay an RMM allocation log on several resources and compare them.
//!
//! ```text
//! streamalloc replay LOG --resource pool,arena,binning,cuda-async [--device host|cuda|N]
//!                        [--mode in-order|per-thread] [--html PATH] [--svg DIR]
//!                        [--torch-snapshot PATH] [--strict]
//! ```
//!
//! Built with the `cli` feature: `cargo install streamalloc --features cli`.

mod exports;
mod resources;
mod table;

use std::fs::File;
use std::io::{BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use streamalloc::replay::{
    replay, scan_log, EventReader, LogSummary, ReplayError, ReplayMode, ReplayOptions,
    ReplayReport, MAX_THREADS,
};
use streamalloc::{Device, HostConfig, DEFAULT_HOST_CAPACITY};

use resources::ResourceKind;

/// Stream-ordered GPU memory management: tools.
#[derive(Debug, Parser)]
#[command(name = "streamalloc", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay an RMM allocation log on each resource and print a what-if table.
    ///
    /// Reads RMM's CSV log (`Thread,Time,Action,Pointer,Size,Stream`, as RMM's
    /// logging_resource_adaptor and streamalloc's LoggingAdaptor write it), with any number of
    /// threads and streams: each logged stream is replayed on a stream of its own. With
    /// --mode in-order (the default) the events run in log order on one thread, and nothing
    /// waits: an allocation refused while memory may come back is retried once after
    /// synchronising the replay's streams (a "wait"), else it is a failure. With --mode
    /// per-thread they run as RMM's REPLAY_BENCHMARK runs them, on one thread per logged
    /// thread, each in its log order, so the threads contend: a free of another thread's
    /// allocation waits until it is made, and a refused allocation waits for memory (up to
    /// --wait-timeout-ms; a "wait", its time in the notes), else it is a failure. The line
    /// above the table says which mode made it. Every resource replays the log twice, each
    /// time fresh: a recording pass (table figures, the snapshot at the log's peak, the
    /// timeline) and a timed pass that makes only the resource calls (ns/op).
    ///
    /// Table columns: peak live (logged bytes live at once in the replay), peak reserved
    /// (bytes the resource held from upstream, from its memory_stats; bytes live where it
    /// reports none), reserved/live, failures, waits, ns/op (timed pass: resource calls and the
    /// pointer map, reading excluded; per thread, the threads' wall time per call, waits
    /// included), largest free extent and free bytes at the log's peak (from the resource's
    /// snapshot; "-" where it gives none; per thread, taken when the thread that replays the
    /// peak's line has replayed it, while the others go on). A resource that cannot be built
    /// on the device has "-" cells and its error under the table.
    ///
    /// On the host backend the emulated device holds 4 times the log's peak, at least 16 GiB
    /// and at most 64 GiB or the machine's memory, whichever is less: larger requests are
    /// counted failures.
    ///
    /// Exit codes: 0: done (refused allocations are figures in the table, not errors); 1: a
    /// device or resource error; 2: bad input (the log cannot be read, is not a regular file,
    /// or is refused with --strict; bad arguments); 3: an export or the table cannot be
    /// written (export files are created before the replay, and every export is attempted).
    Replay(ReplayArgs),
}

#[derive(Debug, clap::Args)]
struct ReplayArgs {
    /// The log (CSV), a regular file: it is read once per pass (1 + 2 per resource), so a pipe
    /// or a device is refused; save a pipe's output to a file first. Lines that do not parse
    /// (lines over 64 KiB included) and events that do not add up (frees of pointers not live,
    /// ...) are counted and skipped, unless --strict.
    log: PathBuf,

    /// Resources to compare, comma-separated. As RMM's replay benchmark builds them: `pool`
    /// is a pool over `cuda` starting empty and unbounded; `arena` an arena over `cuda`
    /// growing on demand; `binning` fixed-size bins of 2^18..2^22 bytes over `pool`; plus
    /// `cuda-async` (the driver's pool), `fixed-size` (1 MiB blocks over `cuda`) and
    /// `mapped-pool` (virtual memory, pages mapped on demand).
    #[arg(short, long, value_enum, value_delimiter = ',', required = true)]
    resource: Vec<ResourceKind>,

    /// Where to replay: `host` (the host backend, emulated device memory), `cuda` (CUDA device
    /// 0) or a CUDA device ordinal. Default: CUDA device 0 when there is one, else host.
    #[arg(short, long, value_parser = DeviceChoice::from_str)]
    device: Option<DeviceChoice>,

    /// Write a self-contained HTML report here: the table, live and reserved bytes over time
    /// per stream, and each resource's segment map at the log's peak.
    #[arg(long, value_name = "PATH")]
    html: Option<PathBuf>,

    /// Write each resource's pictures as standalone SVG files into this directory (created if
    /// missing): `<resource>-timeline.svg` and, where it gives a snapshot,
    /// `<resource>-segments.svg` (the same pictures as the HTML report's).
    #[arg(long, value_name = "DIR")]
    svg: Option<PathBuf>,

    /// Write PyTorch's memory snapshot (a pickle that pytorch.org/memory_viz opens) here: the
    /// snapshot at the log's peak of the first resource that gives a snapshot (in --resource
    /// order), with its trace up to the peak; where none gives one, the first resource's trace
    /// with an empty snapshot.
    #[arg(long, value_name = "PATH")]
    torch_snapshot: Option<PathBuf>,

    /// Refuse the log at its first malformed line or inconsistent event, with its line number
    /// (exit code 2), instead of counting and skipping it.
    #[arg(long)]
    strict: bool,

    /// At most this many distinct logged streams get streams of their own; events of further
    /// streams run on one shared stream (counted), or are refused with --strict.
    #[arg(long, default_value_t = 1024, value_name = "N")]
    max_streams: usize,

    /// How the events run: `in-order`, on one thread in log order (the figures are the
    /// log's); or `per-thread`, on one thread per logged thread as RMM's replay benchmark
    /// runs them (the threads contend, and wait for each other's frees).
    #[arg(long, default_value_t = ReplayMode::InOrder, value_parser = ReplayMode::from_str, value_name = "MODE")]
    mode: ReplayMode,

    /// Per thread: at most this many logged threads get threads of their own; the events of
    /// further threads run, in log order, on one more thread that they share (counted).
    #[arg(long, default_value_t = MAX_THREADS, value_name = "N")]
    max_threads: usize,

    /// Per thread: how long an allocation the resource refuses waits for memory before it
    /// counts as a failure, in milliseconds.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    wait_timeout_ms: u64,
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeviceChoice {
    Host,
    Cuda(usize),
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "host" => Ok(DeviceChoice::Host),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            n => n
                .parse()
                .map(DeviceChoice::Cuda)
                .map_err(|_| format!("`{n}` is none of `host`, `cuda` or a CUDA device ordinal")),
        }
    }
}

/// Exit codes (also in `replay --help`): 0 done, 1 a device or resource error, 2 bad input
/// (unreadable, non-regular or refused log, bad arguments: clap's own code), 3 an export or
/// the table could not be written.
const EXIT_DEVICE: u8 = 1;
const EXIT_INPUT: u8 = 2;
const EXIT_EXPORT: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Replay(args) => match replay_command(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err((code, message)) => {
                eprintln!("streamalloc: {message}");
                ExitCode::from(code)
            }
        },
    }
}

type Failed = (u8, String);

fn input_error(e: ReplayError) -> Failed {
    match e {
        ReplayError::Resource { .. } => (EXIT_DEVICE, e.to_string()),
        _ => (EXIT_INPUT, e.to_string()),
    }
}

/// Refuses a log that is not a regular file, before opening it (opening a FIFO would block):
/// the log is read once per pass, and a pipe gives its lines to the first pass only.
fn check_regular(path: &Path) -> Result<(), Failed> {
    let meta = std::fs::metadata(path).map_err(|e| {
        (
            EXIT_INPUT,
            format!("cannot open the log {}: {e}", path.display()),
        )
    })?;
    if meta.is_file() {
        return Ok(());
    }
    Err((
        EXIT_INPUT,
        format!(
            "the log {} is not a regular file (a pipe, a device or a directory): it is read \
             once per pass, so save it to a file first",
            path.display()
        ),
    ))
}

fn open(path: &Path) -> Result<EventReader<BufReader<File>>, Failed> {
    let file = File::open(path).map_err(|e| {
        (
            EXIT_INPUT,
            format!("cannot open the log {}: {e}", path.display()),
        )
    })?;
    EventReader::new(BufReader::with_capacity(1 << 16, file)).map_err(input_error)
}

/// The most memory the host device emulates for a replay. Nothing touches the memory, but
/// resources map what they are given (`mapped-pool` page by page), so a hostile log's peak
/// must not make the device as large as it asks: a 1 TiB request took 15 s to map.
const HOST_CAPACITY_LIMIT: usize = 64 << 30;

/// The host device's capacity for a log peaking at `peak_live`: room for every resource's
/// overhead (a pool may hold about twice its live bytes), at least the default, at most
/// [`HOST_CAPACITY_LIMIT`] or the machine's memory, whichever is less.
fn host_capacity(peak_live: usize, physical: Option<usize>) -> usize {
    let limit = physical.map_or(HOST_CAPACITY_LIMIT, |ram| ram.min(HOST_CAPACITY_LIMIT));
    peak_live
        .saturating_mul(4)
        .max(DEFAULT_HOST_CAPACITY)
        .min(limit)
}

/// The machine's memory (`MemTotal` of /proc/meminfo), where known.
fn physical_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The device to replay on: as asked, or CUDA device 0 when there is one, else the host
/// backend with room for the log's peak several times over (bounded: [`host_capacity`]).
fn device(choice: Option<DeviceChoice>, summary: &LogSummary) -> Result<Device, Failed> {
    let host = || {
        let capacity = host_capacity(summary.peak_live, physical_memory());
        Device::host_with(HostConfig::default().capacity(capacity))
    };
    match choice {
        Some(DeviceChoice::Host) => Ok(host()),
        Some(DeviceChoice::Cuda(n)) => {
            Device::cuda(n).map_err(|e| (EXIT_DEVICE, format!("CUDA device {n}: {e}")))
        }
        None if Device::cuda_device_count() > 0 => {
            Device::cuda(0).map_err(|e| (EXIT_DEVICE, format!("CUDA device 0: {e}")))
        }
        None => Ok(host()),
    }
}

/// The progress bar moves every this many events read.
const PROGRESS_EVERY: u64 = 4096;

/// A progress bar over every pass, drawn on stderr once the replay has taken a second, and
/// only when stdout is a terminal.
struct Progress {
    bar: ProgressBar,
    start: Instant,
    shown: bool,
    enabled: bool,
}

impl Progress {
    fn new(total: u64) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        if let Ok(style) =
            ProgressStyle::with_template("{msg:>14} [{bar:30}] {pos}/{len} events ({eta})")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        Progress {
            bar,
            start: Instant::now(),
            shown: false,
            enabled: std::io::stdout().is_terminal(),
        }
    }

    fn set(&mut self, done: u64, message: &str) {
        if self.enabled && !self.shown && self.start.elapsed().as_secs() >= 1 {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown = true;
        }
        self.bar.set_message(message.to_owned());
        self.bar.set_position(done);
    }
}

/// `streamalloc replay`.
fn replay_command(args: &ReplayArgs) -> Result<(), Failed> {
    let options = ReplayOptions {
        strict: args.strict,
        max_streams: args.max_streams,
        mode: args.mode,
        max_threads: args.max_threads,
        wait_timeout: Duration::from_millis(args.wait_timeout_ms),
        ..ReplayOptions::default()
    };
    check_regular(&args.log)?;
    let outputs = exports::open(
        args.html.as_deref(),
        args.svg.as_deref(),
        args.torch_snapshot.as_deref(),
    )
    .map_err(|errors| (EXIT_EXPORT, errors.join("\nstreamalloc: ")))?;
    let summary = scan_log(open(&args.log)?, &options).map_err(input_error)?;
    let device = device(args.device, &summary)?;
    let mut resources = args.resource.clone();
    let mut seen = std::collections::HashSet::new();
    resources.retain(|r| seen.insert(*r));

    let mut progress = Progress::new(summary.events * 2 * resources.len() as u64);
    let mut rows: Vec<(ResourceKind, Result<ReplayReport, String>)> = Vec::new();
    let mut done = 0u64;
    for &kind in &resources {
        let name = kind.name();
        let mut run =
            |record: bool, done: &mut u64| -> Result<Result<ReplayReport, String>, Failed> {
                let mr = match kind.build(&device) {
                    Ok(mr) => mr,
                    Err(e) => return Ok(Err(e.to_string())),
                };
                let options = ReplayOptions {
                    record,
                    snapshot_line: record.then_some(summary.peak_line),
                    ..options.clone()
                };
                let base = *done;
                // Counted as the replay reads them, outside its timed loop.
                let mut read = 0u64;
                let events = open(&args.log)?.inspect(|_| {
                    read += 1;
                    if read % PROGRESS_EVERY == 0 {
                        progress.set(base + read, &name);
                    }
                });
                let w = replay(events, &*mr, &device, &options).map_err(input_error)?;
                *done = base + summary.events;
                Ok(Ok(w))
            };
        let recorded = run(true, &mut done)?;
        let row = match recorded {
            Ok(mut w) => {
                // The timed pass, on a fresh resource: only its loop time is kept.
                if let Ok(timed) = run(false, &mut done)? {
                    w.elapsed = timed.elapsed;
                    w.operations = timed.operations;
                }
                Ok(w)
            }
            Err(e) => Err(e),
        };
        rows.push((kind, row));
    }
    progress.bar.finish_and_clear();

    let device_name = device.id().to_string();
    let mut out = std::io::stdout().lock();
    let report = table::Report {
        log: &args.log,
        device: &device_name,
        mode: args.mode,
        summary: &summary,
        rows: &rows,
    };
    // Every output is attempted, whichever fails.
    let mut errors = Vec::new();
    if let Err(e) = report.write(&mut out).and_then(|()| out.flush()) {
        errors.push(format!("writing the table: {e}"));
    }
    if let Some((path, file)) = outputs.html {
        if let Err(e) = exports::html(file, &report) {
            errors.push(format!("writing the HTML report {}: {e}", path.display()));
        }
    }
    if let Some(dir) = &outputs.svg {
        if let Err(e) = exports::svg(dir, &rows) {
            errors.push(format!(
                "writing the SVG pictures into {}: {e}",
                dir.display()
            ));
        }
    }
    if let Some((path, file)) = outputs.torch {
        if let Err(e) = exports::torch(file, &path, &device, &rows) {
            errors.push(format!(
                "writing the torch snapshot {}: {e}",
                path.display()
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err((EXIT_EXPORT, errors.join("\nstreamalloc: ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host device's capacity follows the peak between the default and the limit, and
    /// never exceeds the machine's memory.
    #[test]
    fn the_host_capacity_is_bounded() {
        const GIB: usize = 1 << 30;
        assert_eq!(host_capacity(0, None), DEFAULT_HOST_CAPACITY);
        assert_eq!(host_capacity(10 * GIB, None), 40 * GIB);
        assert_eq!(host_capacity(1 << 40, None), HOST_CAPACITY_LIMIT);
        assert_eq!(host_capacity(usize::MAX, None), HOST_CAPACITY_LIMIT);
        assert_eq!(host_capacity(1 << 40, Some(23 * GIB)), 23 * GIB);
        assert_eq!(host_capacity(0, Some(8 * GIB)), 8 * GIB);
    }
}
