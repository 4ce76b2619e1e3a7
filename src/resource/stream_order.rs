//! The stream-ordering bookkeeping shared by the sub-allocators (pool, fixed-size): what it takes
//! for one stream to use memory another stream freed, without an event per free.
//!
//! Memory freed on stream S may be reused at once by S. Another stream T may use it only after
//! waiting for an event recorded on S after the free. A [`FreeOrder`] per stream counts S's
//! frees and keeps the latest such event with the number of frees it covers: the event is
//! recorded lazily, when memory actually crosses streams, and covers every free before it; a
//! stream that waited on it need not wait again until S frees more.

use crate::error::Result;
use crate::stream::{Event, Stream, StreamId};

/// How many streams a [`FreeOrder`] remembers as having waited on its latest event; past that,
/// the list restarts (a later taker may then wait once more, which is harmless).
const MAX_WAITERS: usize = 32;

/// What it costs a stream to be ordered after another stream's frees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum WaitCost {
    /// It already waited on an event that covers every free: nothing to do.
    AlreadyWaited,
    /// The latest event still covers every free: one wait.
    Wait,
    /// Frees came since the latest event (or there is none): a record and a wait.
    RecordAndWait,
}

/// One stream's frees into a sub-allocator, and what other streams need to take that memory.
#[derive(Debug)]
pub(crate) struct FreeOrder {
    stream: Stream,
    /// Frees on this stream so far, and other changes other streams must be ordered after
    /// (memory allocated upstream on this stream, memory merged into it after a wait).
    frees: u64,
    /// The latest event recorded on this stream for other streams to wait on, and how many of
    /// `frees` it covers.
    event: Option<(Event, u64)>,
    /// Streams that waited on `event` since it was recorded. At most [`MAX_WAITERS`].
    waiters: Vec<StreamId>,
}

impl FreeOrder {
    pub(crate) fn new(stream: &Stream) -> Self {
        FreeOrder {
            stream: stream.clone(),
            frees: 0,
            event: None,
            waiters: Vec::new(),
        }
    }

    /// The stream whose frees these are.
    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Notes a free on the stream, or another change other streams must be ordered after.
    pub(crate) fn changed(&mut self) {
        self.frees += 1;
    }

    pub(crate) fn wait_cost(&self, waiter: StreamId) -> WaitCost {
        match &self.event {
            Some((_, covered)) if *covered == self.frees => {
                if self.waiters.contains(&waiter) {
                    WaitCost::AlreadyWaited
                } else {
                    WaitCost::Wait
                }
            }
            _ => WaitCost::RecordAndWait,
        }
    }

    /// Makes `waiter` wait for an event on this stream recorded after all its frees so far: the
    /// latest one if no free came since, else a new one; no wait at all if `waiter` already
    /// waited on that event.
    ///
    /// # Errors
    /// A driver error recording the event or enqueueing the wait; nothing is changed then.
    pub(crate) fn order(&mut self, waiter: &Stream) -> Result<()> {
        let me = waiter.id();
        match self.wait_cost(me) {
            WaitCost::AlreadyWaited => return Ok(()),
            WaitCost::Wait => {}
            WaitCost::RecordAndWait => {
                self.event = Some((self.stream.record()?, self.frees));
                self.waiters.clear();
            }
        }
        let (event, _) = self.event.as_ref().expect("recorded above");
        waiter.wait(event)?;
        if self.waiters.len() == MAX_WAITERS {
            self.waiters.clear();
        }
        self.waiters.push(me);
        Ok(())
    }
}
