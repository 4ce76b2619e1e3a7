//! How a replay (and a scan) treats a log: its mode, strictness, limits, what it records.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::failure::{ReplayFailure, ReplayFailureKind};
use super::streams::MAX_STREAMS;
use crate::rmm_csv::Event;
use crate::rmm_csv::{ReplayError, ReplayResult};

/// How a [`replay`](super::replay) (and a [`scan_log`](super::scan_log)) treats the log.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamalloc::replay::{ReplayMode, ReplayOptions};
///
/// let o = ReplayOptions::default();
/// assert!(!o.strict && o.max_failures == 100 && o.max_streams == 1024);
/// assert_eq!((o.mode, o.max_threads, o.wait_timeout), (ReplayMode::InOrder, 256, Duration::from_secs(1)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayOptions {
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
    /// Take [`MemoryResource::snapshot`](crate::MemoryResource::snapshot) right after the
    /// event on this line (the log's peak, from
    /// [`LogSummary::peak_line`](super::LogSummary::peak_line)).
    pub snapshot_line: Option<usize>,
    /// Record (the recording pass): a [`TimelineAdaptor`](crate::TimelineAdaptor) over a
    /// [`StatisticsAdaptor`](crate::StatisticsAdaptor) over the resource records the
    /// [`Timeline`](crate::Timeline), with each event at its logged time and the resource's
    /// segments coming and going ([`TimelineAdaptor::record_segments`](crate::TimelineAdaptor::record_segments):
    /// a snapshot per event), and reserved bytes are read through `memory_stats` after every
    /// resource call. Off, the replay only calls
    /// the resource (the timed pass).
    pub record: bool,
    /// How the events are run: in log order on the calling thread (the default), or on one
    /// thread per logged thread, as RMM's replay benchmark runs them.
    pub mode: ReplayMode,
    /// [`ReplayMode::PerThread`]: the most logged threads replayed on OS threads of their own;
    /// the events of further threads run, in log order, on one more thread that they share
    /// (counted in [`Skipped::threads_over_limit`](super::Skipped::threads_over_limit)).
    /// Default [`MAX_THREADS`].
    pub max_threads: usize,
    /// [`ReplayMode::PerThread`]: how long an allocation the resource refuses waits for memory
    /// to come back (an awaited allocation with this deadline) before it counts as refused.
    /// Default 1 s.
    pub wait_timeout: Duration,
}

/// How many logged threads a per-thread replay runs on threads of their own by default
/// ([`ReplayOptions::max_threads`]); the events of further threads share one more thread.
///
/// ```
/// use streamalloc::replay::{ReplayOptions, MAX_THREADS};
///
/// assert_eq!(ReplayOptions::default().max_threads, MAX_THREADS);
/// ```
pub const MAX_THREADS: usize = 256;

/// How a [`replay`](super::replay) runs a log's events.
///
/// Its `Display` and `FromStr` are the command line's names, `in-order` and `per-thread`.
///
/// # Examples
///
/// ```
/// use streamalloc::replay::ReplayMode;
///
/// assert_eq!("per-thread".parse::<ReplayMode>(), Ok(ReplayMode::PerThread));
/// assert_eq!(ReplayMode::InOrder.to_string(), "in-order");
/// assert!("sideways".parse::<ReplayMode>().is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReplayMode {
    /// Every event in log order on the calling thread: the figures are the log's, not the
    /// scheduler's. An allocation refused while memory may come back is retried once after
    /// synchronising the replay's streams (a wait); nothing waits longer.
    #[default]
    InOrder,
    /// One OS thread per logged thread (RMM's `REPLAY_BENCHMARK`), each replaying its own
    /// events in log order on their logged streams, all at once: threads contend for the
    /// resource. A free of an allocation logged on another thread waits (parked) until that
    /// allocation is made; an allocation refused while memory may come back waits for it, up
    /// to [`ReplayOptions::wait_timeout`].
    PerThread,
}

impl ReplayMode {
    /// The command line's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            ReplayMode::InOrder => "in-order",
            ReplayMode::PerThread => "per-thread",
        }
    }
}

impl fmt::Display for ReplayMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReplayMode {
    type Err = String;

    /// `in-order` or `per-thread`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "in-order" => Ok(ReplayMode::InOrder),
            "per-thread" => Ok(ReplayMode::PerThread),
            other => Err(format!(
                "`{other}` is no replay mode: `in-order` or `per-thread`"
            )),
        }
    }
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            strict: false,
            max_failures: 100,
            max_streams: MAX_STREAMS,
            snapshot_line: None,
            record: false,
            mode: ReplayMode::InOrder,
            max_threads: MAX_THREADS,
            wait_timeout: Duration::from_secs(1),
        }
    }
}

impl ReplayOptions {
    /// Refuses the inconsistent event `e` in strict mode; otherwise it is counted and skipped.
    pub(crate) fn refuse(&self, e: &Event, kind: &ReplayFailureKind) -> ReplayResult<()> {
        if self.strict {
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
}
