//! The per-thread replay's first step, on the calling thread and untimed: the log read once, in
//! order, through the live set (the one reading of what each event means), and each event that
//! reaches the resource given to its logged thread's list as an operation on a numbered
//! allocation (its slot). The log's consistency is read here, as if every allocation
//! succeeds; which ones the resource refuses is known only once the threads run.

use rustc_hash::FxHashMap;

use super::super::failure::{ReplayFailure, ReplayFailureKind};
use super::super::live::{Held, LiveSet};
use super::super::options::ReplayOptions;
use super::super::report::ReplayReport;
use super::super::stack::name_stream;
use super::super::streams::{Placed, ReplayStreams};
use crate::adaptor::TimelineAdaptor;
use crate::device::Device;
use crate::resource::{DevicePtr, MemoryResource};
use crate::rmm_csv::{Action, Event, ReplayError, ReplayResult};
use crate::stream::Stream;

/// One call a thread makes, with the log line it replays.
#[derive(Debug)]
pub(super) enum Op {
    /// Allocate `bytes` on `stream` into `slot`.
    Allocate {
        slot: usize,
        /// The pointer as logged (for a failure's report).
        logged: DevicePtr,
        bytes: usize,
        line: usize,
        stream: Stream,
    },
    /// Free `slot`'s allocation, of `bytes` (its allocated size), on `stream`.
    Free {
        slot: usize,
        bytes: usize,
        line: usize,
        stream: Stream,
        /// The allocation is another thread's: wait until it is made.
        cross: bool,
    },
}

impl Op {
    pub(super) fn line(&self) -> usize {
        match self {
            Op::Allocate { line, .. } | Op::Free { line, .. } => *line,
        }
    }
}

/// What the live set keeps for a planned allocation.
#[derive(Debug, Clone)]
pub(super) struct Planned {
    pub(super) slot: usize,
    /// The thread (index into [`Plan::threads`]) that makes it.
    thread: usize,
    pub(super) stream: Stream,
}

/// The log, split into the threads' lists.
#[derive(Debug)]
pub(super) struct Plan {
    /// Each thread's operations, in log order: one list per logged thread up to the cap, then
    /// one shared by the threads past it.
    pub(super) threads: Vec<Vec<Op>>,
    /// Per slot: another thread frees it, so making it wakes the waiters.
    pub(super) awaited: Vec<bool>,
    /// Allocations the log never frees, in log order.
    pub(super) left: Vec<Held<Planned>>,
    pub(super) streams: ReplayStreams,
    /// The last line read.
    pub(super) line: usize,
    /// The figures known before the threads run: events, logged failures, what was skipped.
    pub(super) out: ReplayReport,
}

/// Reads `events` into a [`Plan`], making a stream per logged stream (named in `timeline`).
///
/// # Errors
/// As the in-order replay's reading: I/O, and in strict mode a malformed line, an
/// inconsistent event or a stream past the cap; a stream that cannot be made.
pub(super) fn plan<T: MemoryResource>(
    events: impl Iterator<Item = ReplayResult<Event>>,
    device: &Device,
    options: &ReplayOptions,
    timeline: Option<&TimelineAdaptor<T>>,
) -> ReplayResult<Plan> {
    let mut p = Planner {
        device,
        options,
        timeline,
        by_thread: FxHashMap::default(),
        live: LiveSet::default(),
        plan: Plan {
            threads: Vec::new(),
            awaited: Vec::new(),
            left: Vec::new(),
            streams: ReplayStreams::new(options.max_streams),
            line: 0,
            out: ReplayReport::default(),
        },
    };
    for item in events {
        match item {
            Ok(e) => p.event(&e)?,
            Err(ReplayError::Parse { .. }) if !options.strict => {
                p.plan.out.skipped.malformed += 1;
            }
            Err(e) => return Err(e),
        }
    }
    p.plan.left = p.live.drain();
    Ok(p.plan)
}

struct Planner<'a, T: MemoryResource> {
    device: &'a Device,
    options: &'a ReplayOptions,
    timeline: Option<&'a TimelineAdaptor<T>>,
    /// Logged thread → its list's index.
    by_thread: FxHashMap<u64, usize>,
    live: LiveSet<Planned>,
    plan: Plan,
}

impl<T: MemoryResource> Planner<'_, T> {
    fn event(&mut self, e: &Event) -> ReplayResult<()> {
        self.plan.out.events += 1;
        self.plan.line = e.line;
        let thread = self.thread(e.thread);
        match e.action {
            Action::AllocateFailure => self.plan.out.logged_failures += 1,
            Action::Allocate => self.allocate(e, thread)?,
            Action::Free => self.free(e, thread)?,
        }
        Ok(())
    }

    /// The list of logged thread `logged`: its own up to the cap, else the shared one (the
    /// last), made at its first event.
    fn thread(&mut self, logged: u64) -> usize {
        let max = self.options.max_threads;
        if let Some(&i) = self.by_thread.get(&logged) {
            if i == max {
                self.plan.out.skipped.threads_over_limit += 1;
            }
            return i;
        }
        let i = self.by_thread.len().min(max);
        if i == max {
            self.plan.out.skipped.threads_over_limit += 1;
        }
        self.by_thread.insert(logged, i);
        if i == self.plan.threads.len() {
            self.plan.threads.push(Vec::new());
        }
        i
    }

    fn stream(&mut self, handle: u64, line: usize) -> ReplayResult<Stream> {
        let (s, placed) =
            self.plan
                .streams
                .place(handle, line, self.device, self.options.strict)?;
        match placed {
            Placed::Known => {}
            Placed::OverLimit => self.plan.out.skipped.streams_over_limit += 1,
            Placed::New => name_stream(self.timeline, s, handle),
        }
        Ok(s.clone())
    }

    fn skip(&mut self, e: &Event, kind: ReplayFailureKind) -> ReplayResult<()> {
        self.options.refuse(e, &kind)?;
        self.plan.out.skipped.add(&kind);
        let failure = ReplayFailure::at(e, kind);
        self.plan.out.keep(failure, self.options.max_failures);
        Ok(())
    }

    fn allocate(&mut self, e: &Event, thread: usize) -> ReplayResult<()> {
        if let Err(kind) = self.live.check_allocate(e) {
            return self.skip(e, kind);
        }
        let stream = self.stream(e.stream, e.line)?;
        let slot = self.plan.awaited.len();
        self.plan.awaited.push(false);
        let planned = Planned {
            slot,
            thread,
            stream: stream.clone(),
        };
        self.live.allocated(e, planned);
        self.plan.threads[thread].push(Op::Allocate {
            slot,
            logged: e.ptr,
            bytes: e.bytes,
            line: e.line,
            stream,
        });
        Ok(())
    }

    fn free(&mut self, e: &Event, thread: usize) -> ReplayResult<()> {
        let held = match self.live.free(e) {
            Ok(Some(held)) => held,
            Ok(None) => return Ok(()),
            Err(kind) => return self.skip(e, kind),
        };
        if let Some(kind) = held.size_mismatch(e) {
            self.skip(e, kind)?;
        }
        let stream = self.stream(e.stream, e.line)?;
        let cross = held.value.thread != thread;
        if cross {
            self.plan.awaited[held.value.slot] = true;
        }
        self.plan.threads[thread].push(Op::Free {
            slot: held.value.slot,
            bytes: held.bytes,
            line: e.line,
            stream,
            cross,
        });
        Ok(())
    }
}
