//! What a replay did: its figures, the events that did not go as logged, what it recorded.

use std::fmt;
use std::time::Duration;

use super::failure::{ReplayFailure, ReplayFailureKind};
use super::options::ReplayMode;
use crate::resource::{DevicePtr, Fragmentation, MemorySnapshot, Timeline};

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

/// What a [`replay`](super::replay) did with a log: its figures (a row of the what-if table),
/// the events that did not go as logged, and, from a recording pass, its timeline and its
/// snapshot at the log's peak.
///
/// Its `Display` is a summary line, then one line per failure kept.
///
/// # Examples
///
/// ```
/// use streamalloc::replay::{parse_log_str, replay, ReplayOptions, Unfreed};
/// use streamalloc::{CudaResource, Device, DevicePtr};
///
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n\
///            3,12:00:00.000000,allocate,0x7f0000000000,4096,0x10\n";
/// let device = Device::host();
/// let mr = CudaResource::new(&device)?;
/// let report = replay(&parse_log_str(log)?, &mr, &device, &ReplayOptions::default())?;
/// assert!(report.is_clean());
/// assert_eq!(report.unfreed, [Unfreed { line: 2, ptr: DevicePtr::from_raw(0x7f00_0000_0000), bytes: 4096 }]);
/// assert_eq!((report.frees, report.peak_live), (1, 4096)); // the replay freed it at the end
/// assert_eq!(
///     report.to_string(),
///     "1 events on 1 streams: 1 allocations, 1 frees, 0 logged failures, 1 unfreed, 0 failures\n"
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReplayReport {
    /// How the events were run ([`ReplayOptions::mode`](super::ReplayOptions::mode)).
    pub mode: ReplayMode,
    /// OS threads the events ran on: 1 in order; in per-thread mode one per logged thread up
    /// to [`ReplayOptions::max_threads`](super::ReplayOptions::max_threads), plus one shared by
    /// the threads past it.
    pub threads: usize,
    /// Events replayed (lines that parse).
    pub events: u64,
    /// Allocations that succeeded (at once or after a wait).
    pub allocations: u64,
    /// Frees made (of allocations the replay made), the ones at the end included.
    pub frees: u64,
    /// `allocate failure` events: logged failures are not retried, as in RMM.
    pub logged_failures: u64,
    /// Distinct logged streams replayed on a stream of their own: at most
    /// [`ReplayOptions::max_streams`](super::ReplayOptions::max_streams), the first ones met.
    pub streams: usize,
    /// The most logged bytes live at once in this replay (lower than the log's when
    /// allocations failed; in per-thread mode, those of the threads' interleaving, which may
    /// differ from the log's either way).
    pub peak_live: usize,
    /// The most bytes the resource held from upstream at once: its `memory_stats`'
    /// reserved bytes where it counts them, else the bytes live (recording pass only; 0
    /// otherwise).
    pub peak_reserved: usize,
    /// Allocations the resource refused, after a wait where one could help.
    pub refused: u64,
    /// Allocations refused at first that were served after a wait. In order: once the
    /// replay's streams were synchronised (their stream-ordered frees landed), where an
    /// `allocate().await` would have waited. Per thread: an awaited allocation that waited
    /// for another thread's free.
    pub waits: u64,
    /// The time those waits took, in all (the synchronisations in order, the awaited
    /// allocations per thread, those that ended refused included).
    pub waited: Duration,
    /// Per-thread mode: frees that waited for their allocation, logged on another thread, to
    /// be made (0 in order).
    pub free_waits: u64,
    /// The first [`ReplayOptions::max_failures`](super::ReplayOptions::max_failures) events
    /// that did not go as logged (refused allocations and skipped events), in log order.
    pub failures: Vec<ReplayFailure>,
    /// Events skipped or changed, by kind.
    pub skipped: Skipped,
    /// Allocations the log never freed, in log order; freed at the end of the replay.
    pub unfreed: Vec<Unfreed>,
    /// Resource calls made in the replay loop (allocations tried, retries and frees).
    pub operations: u64,
    /// Time spent in the replay loop (resource calls and the pointer map), reading and
    /// parsing excluded; in per-thread mode, from the threads' start to the last one's end
    /// (waits included).
    pub elapsed: Duration,
    /// The resource's snapshot right after
    /// [`ReplayOptions::snapshot_line`](super::ReplayOptions::snapshot_line) (in per-thread
    /// mode, taken by the thread that replayed that line, while the others go on).
    pub peak_snapshot: Option<MemorySnapshot>,
    /// Its fragmentation figures at the same point.
    pub peak_fragmentation: Option<Fragmentation>,
    /// The timeline (recording pass only): events at their logged times in order, at the
    /// replay's own times (since it began) per thread.
    pub timeline: Option<Timeline>,
    /// The timeline up to the snapshot (recording pass only): the trace that goes with
    /// `peak_snapshot` (PyTorch's viewer replays a trace backwards from its snapshot).
    pub timeline_at_peak: Option<Timeline>,
}

impl ReplayReport {
    /// Events that did not go as logged: allocations the resource refused, and events skipped
    /// or changed because they do not add up (all of them, kept in
    /// [`failures`](Self::failures) or not).
    pub fn failure_count(&self) -> u64 {
        let s = &self.skipped;
        self.refused + s.unknown_pointer + s.pointer_already_live + s.size_mismatch
    }

    /// True when every event went as logged and every line parsed.
    pub fn is_clean(&self) -> bool {
        self.failure_count() == 0 && self.skipped.malformed == 0
    }

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

    /// Keeps `failure` if fewer than `max` are kept.
    pub(crate) fn keep(&mut self, failure: ReplayFailure, max: usize) {
        if self.failures.len() < max {
            self.failures.push(failure);
        }
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
            self.failure_count()
        )?;
        if self.skipped.streams_over_limit > 0 {
            // Streams go over the limit only once `streams` has reached it.
            writeln!(
                f,
                "{} events of streams past the first {} ran on one shared stream",
                self.skipped.streams_over_limit, self.streams
            )?;
        }
        if self.skipped.threads_over_limit > 0 {
            writeln!(
                f,
                "{} events of threads past the first {} ran on one shared thread",
                self.skipped.threads_over_limit,
                self.threads.saturating_sub(1)
            )?;
        }
        if self.skipped.malformed > 0 {
            writeln!(f, "{} malformed lines skipped", self.skipped.malformed)?;
        }
        for failure in &self.failures {
            writeln!(f, "{failure}")?;
        }
        let more = self
            .failure_count()
            .saturating_sub(self.failures.len() as u64);
        if more > 0 {
            writeln!(f, "{more} more failures")?;
        }
        Ok(())
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
    /// Events on streams past [`ReplayOptions::max_streams`](super::ReplayOptions::max_streams): replayed on one shared stream.
    pub streams_over_limit: u64,
    /// Per-thread mode: events of threads past
    /// [`ReplayOptions::max_threads`](super::ReplayOptions::max_threads): replayed, in log
    /// order, on one shared thread.
    pub threads_over_limit: u64,
}

impl Skipped {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.malformed
            + self.unknown_pointer
            + self.pointer_already_live
            + self.size_mismatch
            + self.streams_over_limit
            + self.threads_over_limit
    }

    pub(crate) fn add(&mut self, kind: &ReplayFailureKind) {
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
            (
                self.threads_over_limit,
                "events on threads past the limit (run on one shared thread)",
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
