//! RMM-compatible allocation logs: parse them and replay them against any resource.
//!
//! [`LoggingAdaptor`](crate::LoggingAdaptor) writes RMM's CSV format byte for byte; the parser
//! here ([`parse_log`], [`parse_log_file`], [`EventReader`]) reads both its logs and RMM's
//! (`logging_resource_adaptor`, `rmm.reinitialize(logging=True)`), and [`replay`] runs the
//! events against a [`MemoryResource`] of your choosing, as RMM's `REPLAY_BENCHMARK` does, to
//! compare resources on a recorded workload or to reproduce a failure.
//!
//! # Examples
//!
//! Record a workload, then replay it against a bounded pool and compare the figures:
//!
//! ```
//! use streamalloc::replay::{parse_log_str, replay};
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
//! let report = replay(&events, &target, &device)?;
//! assert!(report.is_clean(), "{report}");
//! assert_eq!(target.bytes_counter(), recorded.bytes_counter());
//! assert_eq!(target.allocations_counter(), recorded.allocations_counter());
//! # Ok(())
//! # }
//! ```

mod error;
mod failure;
mod live;
mod parser;
mod streams;
mod whatif;

use std::fmt;

pub use crate::adaptor::logging::{LOG_FILE_ENV, LOG_HEADER};
pub use error::{ReplayError, ReplayResult};
pub use failure::{ReplayFailure, ReplayFailureKind};
use live::LiveSet;
pub use parser::{parse_log, parse_log_file, parse_log_str, Action, Event, EventReader};
pub use streams::MAX_STREAMS;
use streams::{Placed, ReplayStreams};
pub use whatif::{replay_log, scan_log, LogSummary, Skipped, WhatIf, WhatIfOptions};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::{DevicePtr, MemoryResource};
use crate::stream::Stream;

/// An allocation the log never freed; the replay frees it at the end, as RMM's does (see
/// [`ReplayReport`]'s example).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unfreed {
    /// The allocation's line in the log.
    pub line: usize,
    /// Its pointer, as logged.
    pub ptr: DevicePtr,
    /// Its size.
    pub bytes: usize,
}

/// What a [`replay`] did.
///
/// Its `Display` is a summary line, then one line per failure.
///
/// # Examples
///
/// ```
/// use streamalloc::replay::{parse_log_str, replay, Unfreed};
/// use streamalloc::{CudaResource, Device, DevicePtr};
///
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n\
///            3,12:00:00.000000,allocate,0x7f0000000000,4096,0x10\n";
/// let device = Device::host();
/// let report = replay(&parse_log_str(log)?, &CudaResource::new(&device)?, &device)?;
/// assert!(report.is_clean());
/// assert_eq!(report.unfreed, [Unfreed { line: 2, ptr: DevicePtr::from_raw(0x7f00_0000_0000), bytes: 4096 }]);
/// assert_eq!(report.frees, 1); // the replay freed it at the end
/// assert_eq!(
///     report.to_string(),
///     "1 events on 1 streams: 1 allocations, 1 frees, 0 logged failures, 1 unfreed, 0 failures\n"
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Events replayed.
    pub events: usize,
    /// Allocations that succeeded.
    pub allocations: usize,
    /// Frees made (of allocations the replay made), the ones at the end included.
    pub frees: usize,
    /// `allocate failure` events: logged failures are not retried, as in RMM.
    pub logged_failures: usize,
    /// Distinct streams of the log replayed on a stream of their own: at most
    /// [`MAX_STREAMS`], the first ones met.
    pub streams: usize,
    /// Events of the log's further streams, past [`MAX_STREAMS`]: replayed on one shared
    /// stream.
    pub streams_over_limit: usize,
    /// Events that did not go as logged, in log order.
    pub failures: Vec<ReplayFailure>,
    /// Allocations the log never freed, in log order; freed at the end of the replay.
    pub unfreed: Vec<Unfreed>,
}

impl ReplayReport {
    /// True when every event went as logged.
    pub fn is_clean(&self) -> bool {
        self.failures.is_empty()
    }
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} events on {} streams: {} allocations, {} frees, {} logged failures, {} \
             unfreed, {} failures",
            self.events,
            self.streams,
            self.allocations,
            self.frees,
            self.logged_failures,
            self.unfreed.len(),
            self.failures.len()
        )?;
        if self.streams_over_limit > 0 {
            writeln!(
                f,
                "{} events of streams past the first {MAX_STREAMS} ran on one shared stream",
                self.streams_over_limit
            )?;
        }
        for failure in &self.failures {
            writeln!(f, "{failure}")?;
        }
        Ok(())
    }
}

/// Where the replay made a logged allocation.
#[derive(Debug, Clone, Copy)]
struct Replayed {
    /// The pointer the replay got for it.
    ptr: DevicePtr,
    /// Its logged stream.
    stream: u64,
}

/// Replays `events` against `mr`, in order, on streams of `device`: RMM's replay benchmark
/// without the timing.
///
/// Each logged pointer is mapped to the pointer `mr` returns for it, each logged stream handle
/// to a stream of `device` created for it (the default stream, handle 0, included) up to
/// [`MAX_STREAMS`] of them (the events of further logged streams run on one shared stream,
/// counted in [`ReplayReport::streams_over_limit`]: on the host backend a stream is a thread),
/// and each free goes to `mr` with the size the replay allocated, on its logged stream's stream.
/// `allocate failure` events are counted, not retried; allocations are
/// [`try_allocate`](MemoryResource::try_allocate) calls, so a replay never waits for memory.
/// Events that do not go as logged are reported with their line
/// ([`ReplayReport::failures`]) and the replay goes on. Allocations the log never frees are
/// freed at the end ([`ReplayReport::unfreed`]), and the function returns once every stream has
/// reached its frees.
///
/// Unlike RMM's benchmark, which runs one thread per logged thread in the logged order, the
/// replay runs on the calling thread: the order, and so every figure of a
/// [`StatisticsAdaptor`](crate::StatisticsAdaptor) over `mr`, is the log's.
///
/// # Stream ordering
/// Nothing touches the memory, so frees need no ordering beyond their stream's; the function
/// blocks until every stream it used is idle.
///
/// # Errors
/// [`Error::DeviceMismatch`] when `mr` allocates for another device; errors creating or
/// synchronising a stream. Failures of single events are in the report, not errors.
///
/// # Examples
///
/// An RMM log (RMM writes the default stream as `0` and null pointers as `(nil)`):
///
/// ```
/// use streamalloc::replay::{parse_log_str, replay};
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
/// let report = replay(&parse_log_str(log)?, &mr, &device)?;
/// assert!(report.is_clean());
/// assert_eq!((report.allocations, report.frees, report.logged_failures), (2, 2, 1));
/// assert_eq!(mr.bytes_counter().peak, 3000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn replay<R: MemoryResource + ?Sized>(
    events: &[Event],
    mr: &R,
    device: &Device,
) -> Result<ReplayReport> {
    let properties = mr.properties();
    if properties.device != device.id() {
        return Err(Error::DeviceMismatch {
            expected: properties.device,
            actual: device.id(),
        });
    }
    let mut streams = ReplayStreams::new(MAX_STREAMS);
    let mut live: LiveSet<Replayed> = LiveSet::default();
    let mut report = ReplayReport {
        events: events.len(),
        ..ReplayReport::default()
    };
    let result = (|| {
        for e in events {
            match e.action {
                Action::AllocateFailure => report.logged_failures += 1,
                Action::Allocate => {
                    if let Err(kind) = live.check_allocate(e) {
                        report.failures.push(ReplayFailure::at(e, kind));
                        continue;
                    }
                    let stream = stream_for(&mut streams, &mut report, e.stream, device)?;
                    match mr.try_allocate(e.bytes, stream) {
                        Ok(ptr) => {
                            report.allocations += 1;
                            let stream = e.stream;
                            live.allocated(e, Replayed { ptr, stream });
                        }
                        Err(error) => {
                            live.refused(e);
                            let kind = ReplayFailureKind::AllocationFailed(error);
                            report.failures.push(ReplayFailure::at(e, kind));
                        }
                    }
                }
                Action::Free => {
                    let held = match live.free(e) {
                        Ok(Some(held)) => held,
                        Ok(None) => continue,
                        Err(kind) => {
                            report.failures.push(ReplayFailure::at(e, kind));
                            continue;
                        }
                    };
                    if let Some(kind) = held.size_mismatch(e) {
                        report.failures.push(ReplayFailure::at(e, kind));
                    }
                    let stream = stream_for(&mut streams, &mut report, e.stream, device)?;
                    // SAFETY: `held.value.ptr` came from `mr.try_allocate(held.bytes, ..)`
                    // above and left the live set just now, so it is freed once, with its
                    // size; the replay never uses the memory, so no work needs ordering
                    // before the free.
                    unsafe { mr.deallocate(held.value.ptr, held.bytes, stream) };
                    report.frees += 1;
                }
            }
        }
        Ok(())
    })();
    // Free what the log left allocated, on its allocation's stream, in log order (also after
    // an error, so that nothing leaks).
    for held in live.drain() {
        report.unfreed.push(Unfreed {
            line: held.line,
            ptr: held.logged,
            bytes: held.bytes,
        });
        let stream = streams
            .of(held.value.stream)
            .expect("an allocation's stream was made for it");
        // SAFETY: as above: allocated by `mr` with this size, freed once, never used.
        unsafe { mr.deallocate(held.value.ptr, held.bytes, stream) };
        report.frees += 1;
    }
    report.streams = streams.len();
    result?;
    for stream in streams.all() {
        stream.synchronize_blocking()?;
    }
    Ok(report)
}

/// The stream an event of `handle` runs on, counting it in `report` when it is past the cap.
fn stream_for<'s>(
    streams: &'s mut ReplayStreams,
    report: &mut ReplayReport,
    handle: u64,
    device: &Device,
) -> Result<&'s Stream> {
    let (stream, placed) = streams.get(handle, device)?;
    if placed == Placed::OverLimit {
        report.streams_over_limit += 1;
    }
    Ok(stream)
}

#[cfg(test)]
mod tests;
