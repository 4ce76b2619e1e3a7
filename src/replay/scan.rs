//! The first pass over a log: its peak of live bytes and where it is, its streams and threads,
//! and what does not parse or add up, in memory bounded by its live set.

use std::io::BufRead;

use rustc_hash::FxHashSet;

use super::live::LiveSet;
use super::options::ReplayOptions;
use super::report::Skipped;
use crate::rmm_csv::{Action, EventReader};
use crate::rmm_csv::{ReplayError, ReplayResult};

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
/// use streamalloc::replay::{scan_log, EventReader, ReplayOptions};
///
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n\
///            1,00:00:00.000001,allocate,0x100,256,0x5\n\
///            2,00:00:00.000002,allocate,0x200,512,0x6\n\
///            1,00:00:00.000003,free,0x100,256,0x5\n\
///            garbage\n\
///            1,00:00:00.000004,free,0x900,64,0x5\n";
/// let s = scan_log(EventReader::new(log.as_bytes())?, &ReplayOptions::default())?;
/// assert_eq!((s.peak_live, s.peak_line, s.streams, s.threads), (768, 3, 2, 2));
/// assert_eq!((s.skipped.malformed, s.skipped.unknown_pointer), (1, 1));
/// # Ok::<(), streamalloc::replay::ReplayError>(())
/// ```
pub fn scan_log<B: BufRead>(
    mut reader: EventReader<B>,
    options: &ReplayOptions,
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
            options.refuse(&e, &kind)?;
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
