//! The replay itself: a log's events against a resource, in batches, asking the live set what
//! each event means, with the crate's adaptors stacked over the resource to record.

use std::time::{Duration, Instant};

use super::failure::{ReplayFailure, ReplayFailureKind};
use super::live::LiveSet;
use super::options::ReplayOptions;
use super::report::{ReplayReport, Unfreed};
use super::stack::{name_stream, reserved_now, synchronize, Target};
use super::streams::{Placed, ReplayStreams};
use crate::adaptor::TimelineAdaptor;
use crate::device::Device;
use crate::resource::DevicePtr;
use crate::resource::MemoryResource;
use crate::rmm_csv::{Action, Event};
use crate::rmm_csv::{ReplayError, ReplayResult};
use crate::stream::Stream;

/// Events are read this many at a time, then replayed; only the replay is timed.
const BATCH: usize = 4096;

/// Where the replay made a logged allocation.
#[derive(Debug, Clone, Copy)]
struct Replayed {
    /// The pointer the replay got for it.
    ptr: DevicePtr,
    /// Its logged stream.
    stream: u64,
}

/// The in-order replay ([`ReplayMode::InOrder`](super::ReplayMode::InOrder)) of `events`:
/// in log order on the calling thread.
pub(crate) fn in_order<M: MemoryResource + ?Sized, T: MemoryResource>(
    events: impl Iterator<Item = ReplayResult<Event>>,
    to: Target<'_, M, T>,
) -> ReplayResult<ReplayReport> {
    Run::new(to).replay(events)
}

/// The replay's state across batches: `mr` is what events go to, `timeline` the recording
/// adaptor among them, if any.
struct Run<'a, M: ?Sized, T: MemoryResource> {
    mr: &'a M,
    timeline: Option<&'a TimelineAdaptor<T>>,
    device: &'a Device,
    options: &'a ReplayOptions,
    streams: ReplayStreams,
    live: LiveSet<Replayed>,
    first_time: Option<Duration>,
    out: ReplayReport,
}

impl<'a, M: MemoryResource + ?Sized, T: MemoryResource> Run<'a, M, T> {
    fn new(to: Target<'a, M, T>) -> Self {
        let Target {
            mr,
            timeline,
            device,
            options,
        } = to;
        Run {
            mr,
            timeline,
            device,
            options,
            streams: ReplayStreams::new(options.max_streams),
            live: LiveSet::default(),
            first_time: None,
            out: ReplayReport {
                threads: 1,
                ..ReplayReport::default()
            },
        }
    }

    /// Reads `events` a batch at a time and replays each batch, timed; frees what the log
    /// left allocated (also after an error, so that nothing leaks) and waits for the streams.
    fn replay(
        mut self,
        mut events: impl Iterator<Item = ReplayResult<Event>>,
    ) -> ReplayResult<ReplayReport> {
        let mut batch: Vec<Event> = Vec::with_capacity(BATCH);
        let mut line = 0;
        let result = (|| loop {
            batch.clear();
            for item in events.by_ref() {
                match item {
                    Ok(e) => batch.push(e),
                    Err(ReplayError::Parse { .. }) if !self.options.strict => {
                        self.out.skipped.malformed += 1;
                    }
                    Err(e) => return Err(e),
                }
                if batch.len() == BATCH {
                    break;
                }
            }
            let Some(last) = batch.last() else {
                return Ok(());
            };
            line = last.line;
            let start = Instant::now();
            for e in &batch {
                self.event(e)?;
            }
            self.out.elapsed += start.elapsed();
        })();
        // The end's frees are no events of the log: the timeline stops before them.
        self.out.timeline = self.timeline.map(TimelineAdaptor::timeline);
        self.free_the_rest();
        self.out.streams = self.streams.len();
        self.out.peak_live = self.live.peak();
        result?;
        self.synchronize(line)?;
        Ok(self.out)
    }

    fn stream(&mut self, handle: u64, line: usize) -> ReplayResult<Stream> {
        let (s, placed) = self
            .streams
            .place(handle, line, self.device, self.options.strict)?;
        match placed {
            Placed::Known => {}
            Placed::OverLimit => self.out.skipped.streams_over_limit += 1,
            Placed::New => name_stream(self.timeline, s, handle),
        }
        Ok(s.clone())
    }

    fn synchronize(&self, line: usize) -> ReplayResult<()> {
        synchronize(self.streams.all(), line)
    }

    /// Before a resource call for `e` in a recording pass: the timeline records it at the
    /// logged time since the first call's (a log that runs past midnight wraps), or at the
    /// event's order in microseconds where the log has no times.
    fn at(&mut self, e: &Event) {
        let Some(timeline) = self.timeline else {
            return;
        };
        let time = match e.time {
            Some(t) => {
                let first = *self.first_time.get_or_insert(t);
                if t >= first {
                    t - first
                } else {
                    t + Duration::from_secs(86_400) - first
                }
            }
            None => Duration::from_micros(self.out.events),
        };
        timeline.set_time(time);
    }

    /// After a resource call in a recording pass: the reserved bytes' peak, or the bytes live
    /// (the statistics adaptor's) where the resource counts none.
    fn called(&mut self) {
        if self.timeline.is_some() {
            self.out.peak_reserved = self.out.peak_reserved.max(reserved_now(self.mr));
        }
    }

    fn skip(&mut self, e: &Event, kind: ReplayFailureKind) -> ReplayResult<()> {
        self.options.refuse(e, &kind)?;
        self.out.skipped.add(&kind);
        let failure = ReplayFailure::at(e, kind);
        self.out.keep(failure, self.options.max_failures);
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
            // The picture is the log's, not the emulated device's pace: with every replay
            // stream past its frees, no block reads as pending only because a stream's worker
            // had not got there yet (which made the arena's figures differ between runs).
            self.synchronize(e.line)?;
            self.out.peak_snapshot = self.mr.snapshot();
            self.out.peak_fragmentation = match &self.out.peak_snapshot {
                Some(s) => Some(s.fragmentation()),
                None => self.mr.fragmentation(),
            };
            self.out.timeline_at_peak = self.timeline.map(TimelineAdaptor::timeline);
        }
        Ok(())
    }

    fn allocate(&mut self, e: &Event) -> ReplayResult<()> {
        if let Err(kind) = self.live.check_allocate(e) {
            return self.skip(e, kind);
        }
        let stream = self.stream(e.stream, e.line)?;
        self.at(e);
        self.out.operations += 1;
        let mut result = self.mr.try_allocate(e.bytes, &stream);
        if let Err(error) = &result {
            // A request refused now that may succeed once memory comes back: let the
            // streams' stream-ordered frees land, and try once more. An awaited allocation
            // would have waited here; a replay never waits longer.
            if error.is_out_of_memory() && self.mr.may_regain_memory(e.bytes) {
                let waiting = Instant::now();
                self.synchronize(e.line)?;
                self.out.operations += 1;
                result = self.mr.try_allocate(e.bytes, &stream);
                self.out.waited += waiting.elapsed();
                if result.is_ok() {
                    self.out.waits += 1;
                }
            }
        }
        self.called();
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
            }
            Err(error) => {
                self.out.refused += 1;
                self.live.refused(e);
                let failure = ReplayFailure::at(e, ReplayFailureKind::AllocationFailed(error));
                self.out.keep(failure, self.options.max_failures);
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
        self.at(e);
        self.out.operations += 1;
        // SAFETY: `held.value.ptr` came from `mr.try_allocate(held.bytes, ..)` and left the
        // live set just now, so it is freed once, with its size; the replay never touches the
        // memory, so no work needs ordering before the free.
        unsafe { self.mr.deallocate(held.value.ptr, held.bytes, &stream) };
        self.called();
        self.out.frees += 1;
        Ok(())
    }

    /// Frees what the log left allocated, in log order, on its allocation's stream.
    fn free_the_rest(&mut self) {
        for held in self.live.drain() {
            self.out.unfreed.push(Unfreed {
                line: held.line,
                ptr: held.logged,
                bytes: held.bytes,
            });
            let stream = self
                .streams
                .of(held.value.stream)
                .expect("an allocation's stream was made for it");
            // SAFETY: as in `free`: allocated by `mr` with this size, freed once, never used.
            unsafe { self.mr.deallocate(held.value.ptr, held.bytes, stream) };
            self.out.frees += 1;
        }
    }
}

#[cfg(test)]
mod tests;
