//! The per-thread replay ([`ReplayMode::PerThread`]): one OS
//! thread per logged thread, each running its own events in log order, all at once.
//!
//! The log is read first, untimed, into one list of operations per thread ([`plan`]); then
//! the threads start together and run them ([`worker`]). A free of an allocation logged on
//! another thread parks until that allocation is made (each free refers to an allocation on
//! an earlier line, so waits never form a circle); an allocation the resource refuses waits,
//! as `allocate().await` does, up to the options' deadline. So every wait ends, and the
//! replay with it.

mod plan;
mod worker;

use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::Instant;

use super::options::ReplayMode;
use super::report::{ReplayReport, Unfreed};
use super::stack::{synchronize, Target};
use crate::adaptor::TimelineAdaptor;
use crate::resource::MemoryResource;
use crate::rmm_csv::{Event, ReplayError, ReplayResult};
use plan::Plan;
use worker::{Shared, Tally};

/// The per-thread replay ([`ReplayMode::PerThread`]) of `events`: see the module.
pub(crate) fn per_thread<M: MemoryResource + ?Sized, T: MemoryResource>(
    events: impl Iterator<Item = ReplayResult<Event>>,
    to: Target<'_, M, T>,
) -> ReplayResult<ReplayReport> {
    let plan = plan::plan(events, to.device, to.options, to.timeline)?;
    let shared = Shared::new(to.mr, to.timeline, to.options, &plan.awaited);
    let run = run_threads(&plan, &shared);
    let mut out = plan.out;
    out.mode = ReplayMode::PerThread;
    out.threads = plan.threads.len();
    out.streams = plan.streams.len();
    let (tallies, elapsed) = run?;
    out.elapsed = elapsed;
    let mut refused = Vec::new();
    for t in tallies {
        out.allocations += t.allocations;
        out.frees += t.frees;
        out.refused += t.refused;
        out.waits += t.waits;
        out.waited += t.waited;
        out.free_waits += t.free_waits;
        out.operations += t.operations;
        refused.extend(t.failures);
        if let Some(peak) = t.peak {
            out.peak_snapshot = peak.snapshot;
            out.peak_fragmentation = peak.fragmentation;
            out.timeline_at_peak = peak.timeline;
        }
    }
    // The first failures in log order, of the plan's and the threads' (each kept its
    // first ones, so the merge's first are the log's).
    out.failures.extend(refused);
    out.failures.sort_by_key(|f| f.line);
    out.failures.truncate(to.options.max_failures);
    out.peak_live = shared.peak_live.load(std::sync::atomic::Ordering::Acquire);
    out.peak_reserved = shared
        .peak_reserved
        .load(std::sync::atomic::Ordering::Acquire);
    // The end's frees are no events of the log: the timeline stops before them.
    out.timeline = to.timeline.map(TimelineAdaptor::timeline);
    // What the log left allocated, freed in log order on its allocation's stream.
    for held in &plan.left {
        let Some(ptr) = shared.made_for(held.value.slot) else {
            continue;
        };
        out.unfreed.push(Unfreed {
            line: held.line,
            ptr: held.logged,
            bytes: held.bytes,
        });
        // SAFETY: made by `mr` for this slot with this size, never freed by a thread
        // (the log has no free of it), never used.
        unsafe { to.mr.deallocate(ptr, held.bytes, &held.value.stream) };
        out.frees += 1;
    }
    synchronize(plan.streams.all(), plan.line)?;
    Ok(out)
}

/// Runs each of the plan's lists on a thread of its own, started together; what each did, and
/// the time from their start to the last one's end.
///
/// # Errors
/// [`ReplayError::Io`] when a thread cannot be started (those started end at once).
///
/// # Panics
/// Resumes a thread's panic (the others end first: see [`Shared`]).
fn run_threads<M: MemoryResource + ?Sized, T: MemoryResource>(
    plan: &Plan,
    shared: &Shared<'_, M, T>,
) -> ReplayResult<(Vec<Tally>, std::time::Duration)> {
    if plan.threads.is_empty() {
        return Ok((Vec::new(), std::time::Duration::ZERO));
    }
    let start = Start::default();
    thread::scope(|scope| {
        let mut handles = Vec::with_capacity(plan.threads.len());
        for (i, ops) in plan.threads.iter().enumerate() {
            let start = &start;
            let spawned = thread::Builder::new()
                .name(format!("replay-{i}"))
                .spawn_scoped(scope, move || start.wait().then(|| shared.run(ops)));
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    start.release(false);
                    return Err(ReplayError::Io {
                        context: format!(
                            "starting replay thread {} of {}",
                            i + 1,
                            plan.threads.len()
                        ),
                        kind: e.kind(),
                        message: e.to_string(),
                    });
                }
            }
        }
        let began = Instant::now();
        start.release(true);
        let mut tallies = Vec::with_capacity(handles.len());
        for h in handles {
            match h.join() {
                Ok(t) => tallies.push(t.unwrap_or_default()),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        Ok((tallies, began.elapsed()))
    })
}

/// The threads' start: they wait until it is released, to run (`true`) or to end (`false`).
#[derive(Debug, Default)]
struct Start {
    go: Mutex<Option<bool>>,
    released: Condvar,
}

impl Start {
    fn wait(&self) -> bool {
        let mut go = self.go.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(go) = *go {
                return go;
            }
            go = self.released.wait(go).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn release(&self, go: bool) {
        *self.go.lock().unwrap_or_else(|p| p.into_inner()) = Some(go);
        self.released.notify_all();
    }
}

#[cfg(test)]
mod tests;
