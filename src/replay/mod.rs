//! RMM-compatible allocation logs: parse them and replay them against any resource.
//!
//! [`LoggingAdaptor`](crate::LoggingAdaptor) writes RMM's CSV format byte for byte; the parser
//! here ([`parse_log`], [`parse_log_file`], [`EventReader`]) reads both its logs and RMM's
//! (`logging_resource_adaptor`, `rmm.reinitialize(logging=True)`), and [`replay`] runs the
//! events against a [`MemoryResource`] of your choosing, as RMM's `REPLAY_BENCHMARK` does, to
//! compare resources on a recorded workload or to reproduce a failure. [`scan_log`] reads a
//! log once for its peak; a [`replay`] with [`ReplayOptions::record`] also records the
//! timeline and the snapshot at that peak (what `streamalloc replay` reports).
//!
//! # Examples
//!
//! Record a workload, then replay it against a bounded pool and compare the figures:
//!
//! ```
//! use streamalloc::replay::{parse_log_str, replay, ReplayOptions};
//! use streamalloc::{CudaResource, Device, LoggingAdaptor, MemoryResource, PoolResource,
//!                   StatisticsAdaptor, Stream};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A shared buffer to log into (any `Write + Send` will do; a file is usual).
//! #[derive(Clone, Default)]
//! struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
//! impl std::io::Write for Shared {
//!     fn write(&mut self, b: &[u8]) -> std::io::Result<usize> { self.0.lock().unwrap().write(b) }
//!     fn flush(&mut self) -> std::io::Result<()> { Ok(()) }
//! }
//!
//! let device = Device::host();
//! let stream = Stream::new(&device)?;
//! let log = Shared::default();
//! let recorded = StatisticsAdaptor::new(CudaResource::new(&device)?);
//! let mr = LoggingAdaptor::to_writer(recorded.clone(), log.clone())?;
//! let a = mr.try_allocate(1 << 20, &stream)?;
//! let b = mr.try_allocate(4096, &stream)?;
//! unsafe { mr.deallocate(a, 1 << 20, &stream) };
//! unsafe { mr.deallocate(b, 4096, &stream) };
//! mr.flush()?;
//!
//! let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
//! let events = parse_log_str(&text)?;
//! let target = StatisticsAdaptor::new(PoolResource::new(CudaResource::new(&device)?, 0, Some(8 << 20))?);
//! let report = replay(&events, &target, &device, &ReplayOptions::default())?;
//! assert!(report.is_clean(), "{report}");
//! assert_eq!(target.bytes_counter(), recorded.bytes_counter());
//! assert_eq!(target.allocations_counter(), recorded.allocations_counter());
//! # Ok(())
//! # }
//! ```

mod failure;
mod live;
mod options;
mod per_thread;
mod report;
mod run;
mod scan;
mod stack;
mod streams;

pub use crate::adaptor::logging::LOG_FILE_ENV;
pub use crate::rmm_csv::{
    parse_log, parse_log_file, parse_log_str, Action, Event, EventReader, ReplayError,
    ReplayResult, LOG_HEADER,
};
pub use failure::{ReplayFailure, ReplayFailureKind};
pub use options::{ReplayMode, ReplayOptions, MAX_THREADS};
pub use report::{ReplayReport, Skipped, Unfreed};
pub use scan::{scan_log, LogSummary};
pub use streams::MAX_STREAMS;

use crate::device::Device;
use crate::resource::MemoryResource;

/// Replays a log's events against `mr`, in order, on streams of `device`: RMM's replay
/// benchmark, with its figures. `events` is a parsed log (`&[Event]`) or a log read as it goes
/// (an [`EventReader`]): events are taken 4096 at a time and only the live set is kept, so
/// memory stays within the log's live allocations whatever its length.
///
/// Each logged pointer is mapped to the pointer `mr` returns for it, each logged stream handle
/// to a stream of `device` created for it (the default stream, handle 0, included) up to
/// [`ReplayOptions::max_streams`] of them (the events of further logged streams run on one
/// shared stream, counted in [`Skipped::streams_over_limit`]: on the host backend a stream is a
/// thread), and each free goes to `mr` with the size the replay allocated, on its logged
/// stream's stream. `allocate failure` events are counted, not retried. Allocations are
/// [`try_allocate`](MemoryResource::try_allocate) calls; one refused now, when
/// [`MemoryResource::may_regain_memory`] says waiting could help, is retried once after
/// synchronising the replay's streams (so their stream-ordered frees land): success counts as a
/// wait, else it is refused (in order; per thread it is awaited: see "Modes"). Nothing waits
/// longer, so a replay never hangs. Malformed lines
/// and events that do not add up (frees of pointers not live, ...) are counted, kept with their
/// line ([`ReplayReport::failures`]) and skipped, or refused in
/// [strict mode](ReplayOptions::strict). Allocations the log never frees are freed at the end
/// ([`ReplayReport::unfreed`]), and the function returns once every stream has reached its
/// frees.
///
/// # Modes
/// [`ReplayOptions::mode`] says how the events run:
/// - [`ReplayMode::InOrder`] (the default): on the calling thread, in log order, so the
///   order, and every figure of a [`StatisticsAdaptor`](crate::StatisticsAdaptor) over `mr`,
///   is the log's. An allocation refused while memory may come back is retried once after
///   synchronising the streams (above).
/// - [`ReplayMode::PerThread`]: as RMM's `REPLAY_BENCHMARK`, one OS thread per logged thread
///   (up to [`ReplayOptions::max_threads`]; the rest share one more), each running its own
///   events in log order on their logged streams, all started together, so they contend for
///   `mr`. The log is read whole first (untimed; its consistency decided in log order, as if
///   every allocation succeeds), so memory grows with the log. A free of an allocation logged
///   on another thread parks until that allocation is made ([`ReplayReport::free_waits`]); an
///   allocation `mr` refuses while memory may come back is awaited
///   ([`MemoryResource::allocate`]) up to [`ReplayOptions::wait_timeout`]: served, a wait
///   ([`ReplayReport::waits`], [`ReplayReport::waited`]), else refused. Waits for frees go to
///   earlier lines only, and waits for memory have a deadline, so the replay always ends.
///   Unlike RMM's benchmark, which makes each event wait for the one before it in the log
///   (threads take turns), only these waits order the threads. [`ReplayReport::peak_live`] is
///   the threads' interleaving's; the timeline records events at the replay's own times; the
///   snapshot is taken right after the thread that replays
///   [`ReplayOptions::snapshot_line`] has done so, while the others go on.
///
/// Only the replay loop is timed ([`ReplayReport::elapsed`]; per thread, from the threads'
/// start to the last one's end); with [`ReplayOptions::record`] off it makes nothing but the
/// resource calls and the pointer-map look-ups, as RMM's replay benchmark does.
///
/// # Stream ordering
/// Nothing touches the memory, so frees need no ordering beyond their stream's; the function
/// blocks until every stream it used is idle.
///
/// # Errors
/// [`ReplayError::Resource`] when `mr` is of another device or a stream cannot be made or
/// synchronised; [`ReplayError::Io`] when reading fails; in strict mode as [`scan_log`].
/// Allocations the resource refuses are counted ([`ReplayReport::refused`]), not errors.
///
/// # Examples
///
/// An RMM log (RMM writes the default stream as `0` and null pointers as `(nil)`):
///
/// ```
/// use streamalloc::replay::{parse_log_str, replay, ReplayOptions};
/// use streamalloc::{CudaResource, Device, StatisticsAdaptor};
///
/// let log = "\
/// Thread,Time,Action,Pointer,Size,Stream
/// 140187014588416,16:36:43.474583,allocate,0x7f8a7a000000,1000,0
/// 140187014588416,16:36:43.474595,allocate,0x7f8a7a000400,2000,0
/// 140187014588416,16:36:43.474601,allocate failure,(nil),1099511627776,0
/// 140187014588416,16:36:43.474610,free,0x7f8a7a000000,1000,0
/// 140187014588416,16:36:43.474618,free,0x7f8a7a000400,2000,0
/// ";
/// let device = Device::host();
/// let mr = StatisticsAdaptor::new(CudaResource::new(&device)?);
/// let report = replay(&parse_log_str(log)?, &mr, &device, &ReplayOptions::default())?;
/// assert!(report.is_clean());
/// assert_eq!((report.allocations, report.frees, report.logged_failures), (2, 2, 1));
/// assert_eq!(mr.bytes_counter().peak, 3000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Streaming a log, recording its timeline and the pool's snapshot at its peak:
///
/// ```
/// use streamalloc::replay::{replay, EventReader, ReplayOptions};
/// use streamalloc::{CudaResource, Device, PoolResource};
///
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n\
///            1,00:00:00.000001,allocate,0x100,1000,0x5\n\
///            2,00:00:00.000002,allocate,0x800,3000,0x6\n\
///            1,00:00:00.000003,free,0x100,1000,0x5\n\
///            2,00:00:00.000004,free,0x800,3000,0x6\n";
/// let device = Device::host();
/// let pool = PoolResource::new(CudaResource::new(&device)?, 0, None)?;
/// let options = ReplayOptions { record: true, snapshot_line: Some(3), ..Default::default() };
/// let r = replay(EventReader::new(log.as_bytes())?, &pool, &device, &options)?;
/// assert_eq!((r.peak_live, r.refused, r.waits, r.streams), (4000, 0, 0, 2));
/// assert!(r.peak_reserved >= 4000);
/// assert_eq!(r.timeline.unwrap().peak_live_bytes(), 4000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// One thread per logged thread: thread 2 frees what thread 1 allocated, under a limit that
/// holds one allocation at a time, so whichever thread comes second waits for memory:
///
/// ```
/// use std::time::Duration;
/// use streamalloc::replay::{replay, EventReader, ReplayMode, ReplayOptions};
/// use streamalloc::{CudaResource, Device, LimitingAdaptor};
///
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n\
///            1,00:00:00.000001,allocate,0x100,4096,0\n\
///            2,00:00:00.000002,free,0x100,4096,0\n\
///            1,00:00:00.000003,allocate,0x200,4096,0\n\
///            1,00:00:00.000004,free,0x200,4096,0\n";
/// let device = Device::host();
/// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 4096);
/// let options = ReplayOptions { mode: ReplayMode::PerThread, ..Default::default() };
/// let r = replay(EventReader::new(log.as_bytes())?, &mr, &device, &options)?;
/// assert_eq!((r.mode, r.threads, r.allocations, r.frees, r.refused), (ReplayMode::PerThread, 2, 2, 2, 0));
/// assert!(r.waits <= 1 && r.free_waits <= 1); // as the threads happened to run
/// assert_eq!(mr.allocated_bytes(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn replay<R, I>(
    events: I,
    mr: &R,
    device: &Device,
    options: &ReplayOptions,
) -> ReplayResult<ReplayReport>
where
    R: MemoryResource + ?Sized,
    I: IntoIterator,
    I::Item: Into<ReplayResult<Event>>,
{
    let events = events.into_iter().map(Into::into);
    stack::on_stack::<ByMode, R>(events, mr, device, options)
}

/// The replay of [`ReplayOptions::mode`].
struct ByMode;

impl stack::Replayer for ByMode {
    fn replay<M: MemoryResource + ?Sized, T: MemoryResource>(
        events: impl Iterator<Item = ReplayResult<Event>>,
        to: stack::Target<'_, M, T>,
    ) -> ReplayResult<ReplayReport> {
        match to.options.mode {
            ReplayMode::InOrder => run::in_order(events, to),
            ReplayMode::PerThread => per_thread::per_thread(events, to),
        }
    }
}

#[cfg(test)]
mod tests;
