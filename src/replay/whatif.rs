//! The streaming what-if replay behind `streamalloc replay`: one pass over a log to find its
//! peak ([`scan_log`]), then one pass per resource ([`replay_log`]) that counts failures and
//! waits, follows reserved memory, takes a snapshot at the log's peak and records a
//! [`Timeline`], all in memory bounded by the log's live set.

use std::fmt;
use std::io::BufRead;
use std::time::{Duration, Instant};

use rustc_hash::FxHashSet;

use super::error::{ReplayError, ReplayResult};
use super::failure::{ReplayFailure, ReplayFailureKind};
use super::live::LiveSet;
use super::parser::{Action, Event, EventReader};
use super::streams::{Placed, ReplayStreams, MAX_STREAMS};
use crate::device::Device;
use crate::resource::{DevicePtr, Fragmentation, MemoryResource, MemorySnapshot};
use crate::resource::{Timeline, TraceAction};
use crate::stream::Stream;

/// Events are read this many at a time, then replayed; only the replay is timed.
const BATCH: usize = 4096;

/// How a [`replay_log`] (and a [`scan_log`]) treats the log.
///
/// # Examples
///
/// ```
/// use streamalloc::replay::WhatIfOptions;
///
/// let o = WhatIfOptions::default();
/// assert!(!o.strict && o.max_failures == 100 && o.max_streams == 1024);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhatIfOptions {
    /// Refuse the log at its first malformed line or inconsistent event (a typed error with the
    /// line) instead of counting and skipping it. Default `false`.
    pub strict: bool,
    /// How many failures (and skips) are kept with their line; the rest are only counted.
    /// Default 100.
    pub max_failures: usize,
    /// The most distinct logged streams replayed on streams of their own; the events of
    /// further streams run on one shared stream (counted), or are an error in strict mode.
    /// Default 1024.
    pub max_streams: usize,
    /// Take [`MemoryResource::snapshot`] right after the event on this line (the log's peak,
    /// from [`LogSummary::peak_line`]).
    pub snapshot_line: Option<usize>,
    /// Record a [`Timeline`] and follow reserved bytes through `memory_stats` after every
    /// event (the recording pass). Off, the replay only calls the resource (the timed pass).
    pub record: bool,
}

impl Default for WhatIfOptions {
    fn default() -> Self {
        WhatIfOptions {
            strict: false,
            max_failures: 100,
            max_streams: MAX_STREAMS,
            snapshot_line: None,
            record: false,
        }
    }
}

/// Events of a log that a replay skipped or changed, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Skipped {
    /// Lines that do not parse (malformed, truncated, not UTF-8): skipped.
    pub malformed: u64,
    /// Frees of pointers that are not live (never allocated in the log, or freed twice):
    /// skipped.
    pub unknown_pointer: u64,
    /// Allocations of a pointer the log has live already (a free is missing): skipped.
    pub pointer_already_live: u64,
    /// Frees with another size than their allocation: replayed with the allocated size.
    pub size_mismatch: u64,
    /// Events on streams past [`WhatIfOptions::max_streams`]: replayed on one shared stream.
    pub streams_over_limit: u64,
}

impl Skipped {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.malformed
            + self.unknown_pointer
            + self.pointer_already_live
            + self.size_mismatch
            + self.streams_over_limit
    }

    fn add(&mut self, kind: &ReplayFailureKind) {
        match kind {
            ReplayFailureKind::UnknownPointer => self.unknown_pointer += 1,
            ReplayFailureKind::PointerAlreadyLive { .. } => self.pointer_already_live += 1,
            ReplayFailureKind::SizeMismatch { .. } => self.size_mismatch += 1,
            ReplayFailureKind::AllocationFailed(_) => {}
        }
    }
}

impl fmt::Display for Skipped {
    /// `12 malformed lines, 3 frees of pointers not live` (kinds with a count only), or
    /// `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            (self.malformed, "malformed lines skipped"),
            (self.unknown_pointer, "frees of pointers not live skipped"),
            (
                self.pointer_already_live,
                "allocations of live pointers skipped",
            ),
            (
                self.size_mismatch,
                "frees with another size (freed with the allocated size)",
            ),
            (
                self.streams_over_limit,
                "events on streams past the limit (run on one shared stream)",
            ),
        ];
        let mut first = true;
        for (n, what) in parts.into_iter().filter(|(n, _)| *n > 0) {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{n} {what}")?;
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// What a first pass over a log found ([`scan_log`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogSummary {
    /// Events read (lines that parse).
    pub events: u64,
    /// `allocate` events.
    pub allocations: u64,
    /// `free` events.
    pub frees: u64,
    /// `allocate failure` events.
    pub logged_failures: u64,
    /// Distinct streams, exactly up to [`LogSummary::COUNT_LIMIT`]; `COUNT_LIMIT + 1` means
    /// more.
    pub streams: usize,
    /// Distinct threads, exactly up to [`LogSummary::COUNT_LIMIT`]; `COUNT_LIMIT + 1` means
    /// more.
    pub threads: usize,
    /// The most bytes the log has live at once (logged sizes). An `allocate` of `(nil)` counts
    /// as the replay makes it: its logged size is live until the next free of `(nil)`.
    pub peak_live: usize,
    /// The line of the event that first reaches `peak_live` (0: none).
    pub peak_line: usize,
    /// The last line read.
    pub lines: usize,
    /// What the scan skipped (malformed lines, inconsistent events).
    pub skipped: Skipped,
}

impl LogSummary {
    /// Distinct streams and threads are counted exactly up to this many (a set of a million
    /// handles is 16 MiB at most); a log with more reads as `COUNT_LIMIT + 1`.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::replay::LogSummary;
    ///
    /// assert_eq!(LogSummary::COUNT_LIMIT, 1 << 20);
    /// ```
    pub const COUNT_LIMIT: usize = 1 << 20;
}

/// Reads a whole log once, keeping only its live set: its peak of live bytes and where it
/// is, its streams and threads, and what does not parse or add up.
///
/// # Errors
/// [`ReplayError::Io`] when reading fails; in strict mode the first malformed line
/// ([`ReplayError::Parse`]) or inconsistent event ([`ReplayError::Inconsistent`]), and
/// [`ReplayError::TooManyStreams`].
///
/// # Examples
///
/// ```
/// use streamalloc::replay::{scan_log, EventReader, WhatIfOptions};
///
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n\
///            1,00:00:00.000001,allocate,0x100,256,0x5\n\
///            2,00:00:00.000002,allocate,0x200,512,0x6\n\
///            1,00:00:00.000003,free,0x100,256,0x5\n\
///            garbage\n\
///            1,00:00:00.000004,free,0x900,64,0x5\n";
/// let s = scan_log(EventReader::new(log.as_bytes())?, &WhatIfOptions::default())?;
/// assert_eq!((s.peak_live, s.peak_line, s.streams, s.threads), (768, 3, 2, 2));
/// assert_eq!((s.skipped.malformed, s.skipped.unknown_pointer), (1, 1));
/// # Ok::<(), streamalloc::replay::ReplayError>(())
/// ```
pub fn scan_log<B: BufRead>(
    mut reader: EventReader<B>,
    options: &WhatIfOptions,
) -> ReplayResult<LogSummary> {
    let mut s = LogSummary::default();
    let mut live: LiveSet<()> = LiveSet::default();
    let mut streams: FxHashSet<u64> = FxHashSet::default();
    let mut threads: FxHashSet<u64> = FxHashSet::default();
    for item in reader.by_ref() {
        let e = match item {
            Ok(e) => e,
            Err(ReplayError::Parse { .. }) if !options.strict => {
                s.skipped.malformed += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        s.events += 1;
        let new_stream = streams.len() <= LogSummary::COUNT_LIMIT && streams.insert(e.stream);
        if new_stream && options.strict && streams.len() > options.max_streams {
            return Err(ReplayError::TooManyStreams {
                line: e.line,
                limit: options.max_streams,
            });
        }
        if threads.len() <= LogSummary::COUNT_LIMIT {
            threads.insert(e.thread);
        }
        let kind = match e.action {
            Action::AllocateFailure => {
                s.logged_failures += 1;
                continue;
            }
            Action::Allocate => {
                s.allocations += 1;
                // An `allocate` of `(nil)` counts as the replay makes it: its logged size is
                // live until the next free of `(nil)`.
                live.check_allocate(&e).map(|()| live.allocated(&e, ()))
            }
            Action::Free => {
                s.frees += 1;
                live.free(&e).and_then(|held| match held {
                    Some(held) => held.size_mismatch(&e).map_or(Ok(()), Err),
                    None => Ok(()),
                })
            }
        };
        if let Err(kind) = kind {
            inconsistent(options, &e, &kind)?;
            s.skipped.add(&kind);
        }
    }
    s.peak_live = live.peak();
    s.peak_line = live.peak_line();
    s.streams = streams.len();
    s.threads = threads.len();
    s.lines = reader.line();
    Ok(s)
}

fn inconsistent(options: &WhatIfOptions, e: &Event, kind: &ReplayFailureKind) -> ReplayResult<()> {
    if options.strict {
        let message = ReplayFailure::at(e, kind.clone()).to_string();
        // "line N: " is in the error's own prefix.
        let message = message
            .split_once(": ")
            .map_or(message.clone(), |(_, m)| m.to_owned());
        return Err(ReplayError::Inconsistent {
            line: e.line,
            message,
        });
    }
    Ok(())
}

/// What one resource did with a log ([`replay_log`]): the what-if table's row.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct WhatIf {
    /// Events replayed.
    pub events: u64,
    /// Allocations that succeeded (at once or after a wait).
    pub allocations: u64,
    /// Frees made, the ones at the end included.
    pub frees: u64,
    /// `allocate failure` events of the log (not retried).
    pub logged_failures: u64,
    /// Distinct logged streams, each replayed on a stream of its own (up to the limit).
    pub streams: usize,
    /// The most logged bytes live at once in this replay (lower than the log's when
    /// allocations failed).
    pub peak_live: usize,
    /// The most bytes the resource held from upstream at once: its `memory_stats`'
    /// reserved bytes where it counts them, else the bytes live (recording pass only; 0
    /// otherwise).
    pub peak_reserved: usize,
    /// Allocations the resource refused, after a wait where one could help.
    pub failures: u64,
    /// Allocations refused at first that succeeded once the replay's streams were
    /// synchronised (their stream-ordered frees landed): an `allocate().await` would have
    /// waited.
    pub waits: u64,
    /// The first [`WhatIfOptions::max_failures`] failures and skipped events, in log order.
    pub failure_samples: Vec<ReplayFailure>,
    /// Events skipped or changed, by kind.
    pub skipped: Skipped,
    /// Allocations the log never freed (freed at the end).
    pub unfreed: u64,
    /// Resource calls made in the replay loop (allocations tried, retries and frees).
    pub operations: u64,
    /// Time spent in the replay loop (resource calls and the pointer map), reading and
    /// parsing excluded.
    pub elapsed: Duration,
    /// The resource's snapshot right after [`WhatIfOptions::snapshot_line`].
    pub peak_snapshot: Option<MemorySnapshot>,
    /// Its fragmentation figures at the same point.
    pub peak_fragmentation: Option<Fragmentation>,
    /// The timeline (recording pass only).
    pub timeline: Option<Timeline>,
    /// The timeline up to the snapshot (recording pass only): the trace that goes with
    /// `peak_snapshot` (PyTorch's viewer replays a trace backwards from its snapshot).
    pub timeline_at_peak: Option<Timeline>,
}

impl WhatIf {
    /// Reserved bytes per live byte at their peaks (0 when nothing was live).
    pub fn reserved_ratio(&self) -> f64 {
        if self.peak_live == 0 {
            0.0
        } else {
            self.peak_reserved as f64 / self.peak_live as f64
        }
    }

    /// Nanoseconds per resource call in the replay loop.
    pub fn ns_per_operation(&self) -> f64 {
        if self.operations == 0 {
            0.0
        } else {
            self.elapsed.as_nanos() as f64 / self.operations as f64
        }
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

/// The replay's state across batches.
struct Run<'a, R: ?Sized> {
    mr: &'a R,
    device: &'a Device,
    options: &'a WhatIfOptions,
    streams: ReplayStreams,
    live: LiveSet<Replayed>,
    /// Bytes the replay holds from `mr` (its own sizes), for resources that report no
    /// reserved bytes.
    held_bytes: usize,
    first_time: Option<Duration>,
    out: WhatIf,
}

impl<R: MemoryResource + ?Sized> Run<'_, R> {
    fn keep(&mut self, failure: ReplayFailure) {
        if self.out.failure_samples.len() < self.options.max_failures {
            self.out.failure_samples.push(failure);
        }
    }

    fn stream(&mut self, handle: u64, line: usize) -> ReplayResult<Stream> {
        if self.options.strict && self.streams.is_over_limit(handle) {
            return Err(ReplayError::TooManyStreams {
                line,
                limit: self.options.max_streams,
            });
        }
        let (s, placed) = self
            .streams
            .get(handle, self.device)
            .map_err(|error| ReplayError::Resource { line, error })?;
        match placed {
            Placed::Known => {}
            Placed::OverLimit => self.out.skipped.streams_over_limit += 1,
            Placed::New => {
                if let Some(t) = self.out.timeline.as_mut() {
                    let name = if handle == 0 {
                        "default stream (0)".to_owned()
                    } else {
                        format!("stream {handle:#x}")
                    };
                    t.name_stream(s.id(), name);
                }
            }
        }
        Ok(s.clone())
    }

    fn synchronize(&self, line: usize) -> ReplayResult<()> {
        for s in self.streams.all() {
            s.synchronize_blocking()
                .map_err(|error| ReplayError::Resource { line, error })?;
        }
        Ok(())
    }

    /// The time to record an event at: the logged time since the first event (a log that
    /// runs past midnight wraps), or the event's order in microseconds.
    fn time(&mut self, e: &Event) -> Duration {
        match e.time {
            Some(t) => {
                let first = *self.first_time.get_or_insert(t);
                if t >= first {
                    t - first
                } else {
                    t + Duration::from_secs(86_400) - first
                }
            }
            None => Duration::from_micros(self.out.events),
        }
    }

    fn record(&mut self, e: &Event, action: TraceAction, ptr: DevicePtr, stream: &Stream) {
        if !self.options.record {
            return;
        }
        let reserved = self
            .mr
            .memory_stats()
            .reserved_bytes
            .unwrap_or(self.held_bytes);
        self.out.peak_reserved = self.out.peak_reserved.max(reserved);
        let time = self.time(e);
        if let Some(t) = self.out.timeline.as_mut() {
            t.set_reserved(reserved);
            t.record_at(time, action, ptr, e.bytes, stream.id());
        }
    }

    fn skip(&mut self, e: &Event, kind: ReplayFailureKind) -> ReplayResult<()> {
        inconsistent(self.options, e, &kind)?;
        self.out.skipped.add(&kind);
        self.keep(ReplayFailure::at(e, kind));
        Ok(())
    }

    fn event(&mut self, e: &Event) -> ReplayResult<()> {
        self.out.events += 1;
        match e.action {
            Action::AllocateFailure => self.out.logged_failures += 1,
            Action::Allocate => self.allocate(e)?,
            Action::Free => self.free(e)?,
        }
        if self.options.snapshot_line == Some(e.line) {
            self.out.peak_snapshot = self.mr.snapshot();
            self.out.peak_fragmentation = match &self.out.peak_snapshot {
                Some(s) => Some(s.fragmentation()),
                None => self.mr.fragmentation(),
            };
            self.out.timeline_at_peak = self.out.timeline.clone();
        }
        Ok(())
    }

    fn allocate(&mut self, e: &Event) -> ReplayResult<()> {
        if let Err(kind) = self.live.check_allocate(e) {
            return self.skip(e, kind);
        }
        let stream = self.stream(e.stream, e.line)?;
        self.out.operations += 1;
        let mut result = self.mr.try_allocate(e.bytes, &stream);
        if let Err(error) = &result {
            // A request refused now that may succeed once memory comes back: let the
            // streams' stream-ordered frees land, and try once more. An awaited allocation
            // would have waited here; a replay never waits longer.
            if error.is_out_of_memory() && self.mr.may_regain_memory(e.bytes) {
                self.synchronize(e.line)?;
                self.out.operations += 1;
                result = self.mr.try_allocate(e.bytes, &stream);
                if result.is_ok() {
                    self.out.waits += 1;
                }
            }
        }
        match result {
            Ok(ptr) => {
                self.out.allocations += 1;
                let logged = e.stream;
                self.live.allocated(
                    e,
                    Replayed {
                        ptr,
                        stream: logged,
                    },
                );
                self.held_bytes = self.held_bytes.saturating_add(e.bytes);
                self.out.peak_live = self.live.peak();
                self.record(e, TraceAction::Alloc, ptr, &stream);
            }
            Err(error) => {
                self.out.failures += 1;
                self.live.refused(e);
                self.keep(ReplayFailure::at(
                    e,
                    ReplayFailureKind::AllocationFailed(error),
                ));
                self.record(e, TraceAction::Oom, DevicePtr::NULL, &stream);
            }
        }
        Ok(())
    }

    fn free(&mut self, e: &Event) -> ReplayResult<()> {
        let held = match self.live.free(e) {
            Ok(Some(held)) => held,
            Ok(None) => return Ok(()),
            Err(kind) => return self.skip(e, kind),
        };
        if let Some(kind) = held.size_mismatch(e) {
            if let Err(refused) = self.skip(e, kind) {
                // Strict: the allocation stays live, so that the end frees it.
                self.live.restore(held);
                return Err(refused);
            }
        }
        let stream = self.stream(e.stream, e.line)?;
        self.out.operations += 1;
        // SAFETY: `held.value.ptr` came from `mr.try_allocate(held.bytes, ..)` and left the
        // live set just now, so it is freed once, with its size; the replay never touches the
        // memory, so no work needs ordering before the free.
        unsafe { self.mr.deallocate(held.value.ptr, held.bytes, &stream) };
        self.out.frees += 1;
        self.held_bytes = self.held_bytes.saturating_sub(held.bytes);
        let logged = Event {
            bytes: held.bytes,
            ..*e
        };
        self.record(&logged, TraceAction::Free, held.value.ptr, &stream);
        Ok(())
    }

    /// Frees what the log left allocated, in log order, on its allocation's stream.
    fn free_the_rest(&mut self) {
        for held in self.live.drain() {
            self.out.unfreed += 1;
            let stream = self
                .streams
                .of(held.value.stream)
                .expect("an allocation's stream was made for it")
                .clone();
            // SAFETY: as in `free`: allocated by `mr` with this size, freed once, never used.
            unsafe { self.mr.deallocate(held.value.ptr, held.bytes, &stream) };
            self.out.frees += 1;
        }
    }
}

/// Replays a log read from `reader` against `mr` on streams of `device`, streaming: events are
/// read 4096 at a time and only the live set is kept, so memory stays within the log's
/// live allocations whatever its length.
///
/// Each logged stream is replayed on a stream of its own (up to
/// [`WhatIfOptions::max_streams`]), each logged pointer mapped to the one `mr` returns. An
/// allocation refused now, when [`MemoryResource::may_regain_memory`] says waiting could
/// help, is retried once after synchronising the replay's streams (so their stream-ordered
/// frees land): success counts as a wait, else a failure. Nothing waits longer, so a replay
/// never hangs. Malformed lines and events that do not add up (frees of pointers not live,
/// ...) are counted and skipped, or refused in strict mode. `progress` is called with the
/// number of events read after every batch.
///
/// Only the replay loop is timed ([`WhatIf::elapsed`]); with
/// [`WhatIfOptions::record`] off it makes nothing but the resource calls and the pointer-map
/// look-ups, as RMM's replay benchmark does.
///
/// # Errors
/// [`ReplayError::Resource`] when `mr` is of another device or a stream cannot be made or
/// synchronised; [`ReplayError::Io`] when reading fails; in strict mode as [`scan_log`].
/// Allocations the resource refuses are counted ([`WhatIf::failures`]), not errors.
///
/// # Examples
///
/// ```
/// use streamalloc::replay::{replay_log, EventReader, WhatIfOptions};
/// use streamalloc::{CudaResource, Device, PoolResource};
///
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n\
///            1,00:00:00.000001,allocate,0x100,1000,0x5\n\
///            2,00:00:00.000002,allocate,0x800,3000,0x6\n\
///            1,00:00:00.000003,free,0x100,1000,0x5\n\
///            2,00:00:00.000004,free,0x800,3000,0x6\n";
/// let device = Device::host();
/// let pool = PoolResource::new(CudaResource::new(&device)?, 0, None)?;
/// let options = WhatIfOptions { record: true, snapshot_line: Some(3), ..Default::default() };
/// let w = replay_log(EventReader::new(log.as_bytes())?, &pool, &device, &options, &mut |_| {})?;
/// assert_eq!((w.peak_live, w.failures, w.waits, w.streams), (4000, 0, 0, 2));
/// assert!(w.peak_reserved >= 4000);
/// assert_eq!(w.timeline.unwrap().peak_live_bytes(), 4000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn replay_log<B: BufRead, R: MemoryResource + ?Sized>(
    mut reader: EventReader<B>,
    mr: &R,
    device: &Device,
    options: &WhatIfOptions,
    progress: &mut dyn FnMut(u64),
) -> ReplayResult<WhatIf> {
    let properties = mr.properties();
    if properties.device != device.id() {
        return Err(ReplayError::Resource {
            line: 0,
            error: crate::Error::DeviceMismatch {
                expected: properties.device,
                actual: device.id(),
            },
        });
    }
    let mut run = Run {
        mr,
        device,
        options,
        streams: ReplayStreams::new(options.max_streams),
        live: LiveSet::default(),
        held_bytes: 0,
        first_time: None,
        out: WhatIf {
            timeline: options.record.then(Timeline::new),
            ..WhatIf::default()
        },
    };
    let mut batch: Vec<Event> = Vec::with_capacity(BATCH);
    let mut read = 0u64;
    let result = (|| loop {
        batch.clear();
        for item in reader.by_ref() {
            match item {
                Ok(e) => batch.push(e),
                Err(ReplayError::Parse { line, message }) => {
                    if options.strict {
                        return Err(ReplayError::Parse { line, message });
                    }
                    run.out.skipped.malformed += 1;
                }
                Err(e) => return Err(e),
            }
            read += 1;
            if batch.len() == BATCH {
                break;
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        for e in &batch {
            run.event(e)?;
        }
        run.out.elapsed += start.elapsed();
        progress(read);
    })();
    run.free_the_rest();
    run.out.streams = run.streams.len();
    result?;
    run.synchronize(reader.line())?;
    Ok(run.out)
}

#[cfg(test)]
mod tests;
