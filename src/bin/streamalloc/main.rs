//! `streamalloc`: replay an RMM allocation log on several resources and compare them.
//!
//! ```text
//! streamalloc replay LOG --resource pool,arena,binning,cuda-async [--device host|cuda|N]
//!                        [--html PATH] [--svg DIR] [--torch-snapshot PATH] [--strict]
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
use std::time::Instant;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use streamalloc::replay::{
    replay_log, scan_log, EventReader, LogSummary, ReplayError, WhatIf, WhatIfOptions,
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
    /// threads and streams: each logged stream is replayed on a stream of its own, events in
    /// log order on one thread. Every resource replays the log twice, each time fresh: a
    /// recording pass (table figures, the snapshot at the log's peak, the timeline) and a timed
    /// pass that makes only the resource calls (ns/op). Nothing waits: an allocation refused
    /// while memory may come back is retried once after synchronising the replay's streams
    /// (a "wait"), else it is a failure.
    ///
    /// Table columns: peak live (logged bytes live at once in the replay), peak reserved
    /// (bytes the resource held from upstream, from its memory_stats; bytes live where it
    /// reports none), reserved/live, failures, waits, ns/op (timed pass: resource calls and the
    /// pointer map, reading excluded), largest free extent and free bytes at the log's peak
    /// (from the resource's snapshot; "-" where it gives none).
    Replay(ReplayArgs),
}

#[derive(Debug, clap::Args)]
struct ReplayArgs {
    /// The log (CSV). Lines that do not parse and events that do not add up (frees of
    /// pointers not live, ...) are counted and skipped, unless --strict.
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

    /// Write PyTorch's memory snapshot (a pickle that pytorch.org/memory_viz opens) of the
    /// first resource at the log's peak, with its trace, here.
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

/// Exit codes: 0 done, 1 a device or resource error, 2 bad input (unreadable or refused log,
/// bad arguments: clap's own code), 3 an export could not be written.
const EXIT_DEVICE: u8 = 1;
const EXIT_INPUT: u8 = 2;
const EXIT_EXPORT: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Replay(args) => match replay(&args) {
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

fn open(path: &Path) -> Result<EventReader<BufReader<File>>, Failed> {
    let file = File::open(path).map_err(|e| {
        (
            EXIT_INPUT,
            format!("cannot open the log {}: {e}", path.display()),
        )
    })?;
    EventReader::new(BufReader::with_capacity(1 << 16, file)).map_err(input_error)
}

/// The device to replay on: as asked, or CUDA device 0 when there is one, else the host
/// backend with room for the log's peak several times over.
fn device(choice: Option<DeviceChoice>, summary: &LogSummary) -> Result<Device, Failed> {
    let host = || {
        // Room for every resource's overhead over the log's peak (a pool may hold about twice
        // its live bytes); the host backend takes untouched memory lazily.
        let capacity = DEFAULT_HOST_CAPACITY.max(summary.peak_live.saturating_mul(4).min(1 << 40));
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

fn replay(args: &ReplayArgs) -> Result<(), Failed> {
    let options = WhatIfOptions {
        strict: args.strict,
        max_streams: args.max_streams,
        ..WhatIfOptions::default()
    };
    let summary = scan_log(open(&args.log)?, &options).map_err(input_error)?;
    let device = device(args.device, &summary)?;
    let mut resources = args.resource.clone();
    let mut seen = std::collections::HashSet::new();
    resources.retain(|r| seen.insert(*r));

    let mut progress = Progress::new(summary.events * 2 * resources.len() as u64);
    let mut rows: Vec<(ResourceKind, Result<WhatIf, String>)> = Vec::new();
    let mut done = 0u64;
    for &kind in &resources {
        let name = kind.name();
        let mut run = |record: bool, done: &mut u64| -> Result<Result<WhatIf, String>, Failed> {
            let mr = match kind.build(&device) {
                Ok(mr) => mr,
                Err(e) => return Ok(Err(e.to_string())),
            };
            let options = WhatIfOptions {
                record,
                snapshot_line: record.then_some(summary.peak_line),
                ..options.clone()
            };
            let base = *done;
            let w = replay_log(open(&args.log)?, &*mr, &device, &options, &mut |n| {
                progress.set(base + n, &name)
            })
            .map_err(input_error)?;
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
        summary: &summary,
        rows: &rows,
    };
    report
        .write(&mut out)
        .and_then(|()| out.flush())
        .map_err(|e| (EXIT_EXPORT, format!("writing the table: {e}")))?;

    if let Some(path) = &args.html {
        exports::html(path, &report).map_err(|e| {
            (
                EXIT_EXPORT,
                format!("writing the HTML report {}: {e}", path.display()),
            )
        })?;
    }
    if let Some(dir) = &args.svg {
        exports::svg(dir, &rows).map_err(|e| {
            (
                EXIT_EXPORT,
                format!("writing the SVG pictures into {}: {e}", dir.display()),
            )
        })?;
    }
    if let Some(path) = &args.torch_snapshot {
        exports::torch(path, &device, &rows).map_err(|e| {
            (
                EXIT_EXPORT,
                format!("writing the torch snapshot {}: {e}", path.display()),
            )
        })?;
    }
    Ok(())
}
