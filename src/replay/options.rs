//! How a replay (and a scan) treats a log: strictness, limits, what it records.

use super::failure::{ReplayFailure, ReplayFailureKind};
use super::streams::MAX_STREAMS;
use crate::rmm_csv::Event;
use crate::rmm_csv::{ReplayError, ReplayResult};

/// How a [`replay`](super::replay) (and a [`scan_log`](super::scan_log)) treats the log.
///
/// # Examples
///
/// ```
/// use streamalloc::replay::ReplayOptions;
///
/// let o = ReplayOptions::default();
/// assert!(!o.strict && o.max_failures == 100 && o.max_streams == 1024);
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
    /// [`Timeline`](crate::Timeline), with each event at its logged time, and reserved bytes
    /// are read through `memory_stats` after every resource call. Off, the replay only calls
    /// the resource (the timed pass).
    pub record: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            strict: false,
            max_failures: 100,
            max_streams: MAX_STREAMS,
            snapshot_line: None,
            record: false,
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
