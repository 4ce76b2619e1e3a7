//! The errors of reading and replaying an allocation log, apart from the crate's allocation
//! errors.

use std::io;

/// What can go wrong reading an allocation log ([`EventReader`](crate::replay::EventReader),
/// [`parse_log`](crate::replay::parse_log) and friends) and replaying it
/// ([`replay`](crate::replay::replay), [`scan_log`](crate::replay::scan_log)): a line that is
/// not in RMM's CSV format, a failed read, an event refused in strict mode, a device error.
/// Kept apart from [`Error`](crate::Error), so that callers of `try_allocate` never match on
/// CSV errors.
///
/// # Examples
///
/// ```
/// use streamalloc::replay::{parse_log_str, ReplayError};
///
/// let e = parse_log_str("Thread,Time,Action\n").unwrap_err();
/// assert!(matches!(e, ReplayError::Parse { line: 1, .. }));
/// assert!(e.to_string().starts_with("event log line 1:"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// A line of the log is not in RMM's CSV format.
    #[error("event log line {line}: {message}")]
    #[non_exhaustive]
    Parse {
        /// The line's number, counting from 1 (the header is line 1).
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// An event that cannot be replayed as logged (a free of a pointer that is not live, an
    /// allocation of a pointer that is live, a free with another size), refused in strict mode
    /// ([`ReplayOptions::strict`](crate::replay::ReplayOptions::strict)); counted and skipped otherwise.
    #[error("event log line {line}: {message}")]
    #[non_exhaustive]
    Inconsistent {
        /// The event's line.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The log names more distinct streams than a replay creates
    /// ([`ReplayOptions::max_streams`](crate::replay::ReplayOptions::max_streams)): each is a real
    /// stream (a worker thread on the host backend, a driver stream on CUDA).
    #[error(
        "event log line {line}: more than {limit} distinct streams (each logged stream is \
         replayed on a stream of its own)"
    )]
    #[non_exhaustive]
    TooManyStreams {
        /// The line of the first event on a stream past the limit.
        line: usize,
        /// The limit.
        limit: usize,
    },
    /// The device or the resource failed (not a refused allocation, which is a counted
    /// failure): creating or synchronising a stream, a resource for another device.
    #[error("replaying event log line {line}: {error}")]
    #[non_exhaustive]
    Resource {
        /// The line being replayed (0: before the first event, or after the last).
        line: usize,
        /// The error.
        error: crate::error::Error,
    },
    /// Opening or reading the log failed.
    #[error("{context}: {message}")]
    #[non_exhaustive]
    Io {
        /// What was being done, with the path or line where there is one.
        context: String,
        /// The I/O error's kind.
        kind: io::ErrorKind,
        /// The I/O error's message.
        message: String,
    },
}

impl ReplayError {
    pub(crate) fn parse(line: usize, message: impl Into<String>) -> Self {
        ReplayError::Parse {
            line,
            message: message.into(),
        }
    }

    pub(crate) fn io(context: impl Into<String>, error: &io::Error) -> Self {
        ReplayError::Io {
            context: context.into(),
            kind: error.kind(),
            message: error.to_string(),
        }
    }
}

/// The result of reading an allocation log.
pub type ReplayResult<T> = std::result::Result<T, ReplayError>;
