//! What went wrong with one event of a replay, with its line.

use std::fmt;

use crate::error::Error;
use crate::resource::DevicePtr;
use crate::rmm_csv::{Action, Event};

/// Why one event of a [`replay`](super::replay) did not go as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayFailureKind {
    /// The resource refused an allocation the log records as successful.
    AllocationFailed(Error),
    /// A free of a pointer that is not live in the replay: the log never allocated it (it was
    /// allocated before logging began), or freed it already.
    UnknownPointer,
    /// An allocation returned a pointer that the log has live already: the log is not a
    /// complete record (a free is missing). The allocation is not replayed.
    PointerAlreadyLive {
        /// The line of the allocation that holds the pointer.
        allocated_at: usize,
    },
    /// A free with another size than its allocation. The replay frees the size it allocated.
    SizeMismatch {
        /// The size the allocation had.
        allocated: usize,
    },
}

impl fmt::Display for ReplayFailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayFailureKind::AllocationFailed(e) => write!(f, "the resource refused it: {e}"),
            ReplayFailureKind::UnknownPointer => f.write_str("the pointer is not live"),
            ReplayFailureKind::PointerAlreadyLive { allocated_at } => write!(
                f,
                "the pointer is live already, allocated at line {allocated_at}"
            ),
            ReplayFailureKind::SizeMismatch { allocated } => {
                write!(f, "{allocated} B were allocated")
            }
        }
    }
}

/// One event of a [`replay`](super::replay) that did not go as logged, with its log line.
///
/// # Examples
///
/// ```
/// use streamalloc::replay::{parse_log_str, replay, ReplayFailureKind, ReplayOptions};
/// use streamalloc::{CudaResource, Device};
///
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n\
///            7,10:00:00.000000,free,0x7f0000001000,256,0\n";
/// let device = Device::host();
/// let mr = CudaResource::new(&device)?;
/// let report = replay(parse_log_str(log)?, &mr, &device, &ReplayOptions::default())?;
/// let failure = &report.failures[0];
/// assert_eq!((failure.line, &failure.kind), (2, &ReplayFailureKind::UnknownPointer));
/// assert_eq!(failure.to_string(), "line 2: free of 0x7f0000001000 (256 B): the pointer is not live");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayFailure {
    /// The event's line in the log.
    pub line: usize,
    /// The event's action.
    pub action: Action,
    /// The event's pointer, as logged.
    pub ptr: DevicePtr,
    /// The event's size.
    pub bytes: usize,
    /// What went wrong.
    pub kind: ReplayFailureKind,
}

impl fmt::Display for ReplayFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}: {} of {} ({} B): {}",
            self.line, self.action, self.ptr, self.bytes, self.kind
        )
    }
}

impl ReplayFailure {
    /// `kind` at event `e`.
    pub(crate) fn at(e: &Event, kind: ReplayFailureKind) -> Self {
        ReplayFailure {
            line: e.line,
            action: e.action,
            ptr: e.ptr,
            bytes: e.bytes,
            kind,
        }
    }
}
