//! Stream-ordered reuse, shared by the sub-allocators (pool, fixed-size, arena): what it takes
//! for one stream to use memory another stream freed, without an event per free (RMM's
//! `stream_ordered_memory_resource`, the base of its pool and fixed-size resources, records one
//! on every free).
//!
//! Memory freed on stream S may be reused at once by S. Another stream T may use it only after
//! waiting for an event recorded on S after the free. The event is recorded lazily, when memory
//! actually crosses streams, and covers every free on S before it; a stream that waited on it
//! need not wait again until S frees more. Each sub-allocator keeps one such record per stream
//! as the per-stream payload of its core:
//! - [`FreeOrder`]: one stream's frees, owned by whoever holds the resource's lock over them
//!   (the pool's levels, the fixed-size free lists). It numbers the frees, keeps the events
//!   recorded after them with the number each covers, and remembers how far each taker has
//!   waited; a taker of one block the owner stamped with its free's number waits on the first
//!   event after that free, or not at all once it has passed.
//! - [`SharedFreeOrder`], carried as a [`Fence`]: the same record for a resource whose frees
//!   take no shared lock (the arena's): a free only sets a flag, the event sits behind its own
//!   lock, and each taker remembers which events it already waits for
//!   ([`OrderCounters::wait_fences`]). [`SharedFreeOrders`] finds a stream's record.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::error::Result;
use crate::stream::{Event, Stream, StreamId};

/// How many streams a [`FreeOrder`] remembers as having waited on its events; past that, the
/// list restarts (a later taker may then wait once more, which is harmless).
const MAX_WAITERS: usize = 32;

/// How many events a [`FreeOrder`] keeps; past that the oldest goes (a block it covered is
/// then covered by the next one, later on the stream: a longer wait, never a missing one).
const MAX_EVENTS: usize = 64;

/// Past this many events, a new one first drops the completed ones from the front (one query
/// each), so that the list stays as long as the frees the device has not reached.
const PRUNE_EVENTS_AT: usize = 8;

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
///
/// Frees are numbered (1, 2, ...): the owner stamps each free block with its number, so that a
/// taker of one block waits for the first event recorded after *that* free — not for the
/// stream's newest one, which would also cover work the stream queued after the free — and not
/// at all once that event has passed.
#[derive(Debug)]
pub(crate) struct FreeOrder {
    stream: Stream,
    /// Frees on this stream so far, and other changes other streams must be ordered after
    /// (memory allocated upstream on this stream, memory merged into it after a wait).
    frees: u64,
    /// Events recorded on this stream for other streams to wait on, oldest first, each with
    /// the number of frees it covers (increasing). At most [`MAX_EVENTS`].
    events: VecDeque<(Event, u64)>,
    /// Streams that waited on one of `events`, each with the most frees that covered. At most
    /// [`MAX_WAITERS`].
    waiters: Vec<(StreamId, u64)>,
    /// Set (by the owner, [`set_eager`](Self::set_eager)) once another stream has taken this
    /// stream's memory: from then on each free records its event at once, so that the next
    /// taker waits for this stream's work up to the free, not for all the work queued on it
    /// until the take (a lazy event recorded at the take covers that too).
    eager: bool,
}

impl FreeOrder {
    pub(crate) fn new(stream: &Stream) -> Self {
        FreeOrder {
            stream: stream.clone(),
            frees: 0,
            events: VecDeque::new(),
            waiters: Vec::new(),
            eager: false,
        }
    }

    /// The stream whose frees these are.
    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Records an event at each free from now on (see `eager`), for a stream whose memory
    /// crossed streams before this record was made.
    pub(crate) fn set_eager(&mut self) {
        self.eager = true;
    }

    /// Notes a free on the stream, or another change other streams must be ordered after;
    /// records the covering event now if the stream's memory has crossed streams before (a
    /// failed record leaves it to the next taker, lazily).
    #[inline]
    pub(crate) fn changed(&mut self) {
        self.changed_to(self.frees + 1);
    }

    /// [`changed`](Self::changed) for an owner that numbers the frees itself: `frees` is the
    /// number of the latest (the pool's core stamps blocks with it).
    #[inline]
    pub(crate) fn changed_to(&mut self, frees: u64) {
        debug_assert!(frees >= self.frees, "free numbers go up");
        self.frees = frees;
        if self.eager {
            // A failed record leaves the frees to a lazy event at the next take.
            let _ = self.record();
        }
    }

    /// Whether the device has passed every free so far: an event recorded after them has
    /// completed, so another stream may use the memory without waiting (for snapshots; a
    /// query, never a record).
    pub(crate) fn passed(&self) -> bool {
        match self.events.back() {
            Some((event, covered)) if *covered == self.frees => {
                event.is_complete().unwrap_or(false)
            }
            _ => false,
        }
    }

    /// Records the covering event now, so that a snapshot sees the frees passed once the
    /// stream reaches them (the pool's own stream of its initial chunk, which no user sees).
    ///
    /// # Errors
    /// A driver error recording the event; nothing is changed then.
    pub(crate) fn record(&mut self) -> Result<()> {
        if self.events.back().is_some_and(|(_, c)| *c == self.frees) {
            return Ok(());
        }
        let event = self.stream.record()?;
        if self.events.len() >= PRUNE_EVENTS_AT {
            // Completed events are only ever skipped: keep the newest of them as a floor.
            while self.events.len() > 1 && matches!(self.events[1].0.is_complete(), Ok(true)) {
                self.events.pop_front();
            }
        }
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back((event, self.frees));
        Ok(())
    }

    /// The most frees an event that `waiter` waited on covers.
    fn waited(&self, waiter: StreamId) -> u64 {
        self.waiters
            .iter()
            .find(|(id, _)| *id == waiter)
            .map_or(0, |&(_, covered)| covered)
    }

    pub(crate) fn wait_cost(&self, waiter: StreamId) -> WaitCost {
        match self.events.back() {
            Some((_, covered)) if *covered == self.frees => {
                if self.waited(waiter) >= self.frees {
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
        self.order_upto(waiter, self.frees)
    }

    /// The number of the free whose block carries `stamp`, the low 32 bits of its number (the
    /// block was freed fewer than 2³² frees ago).
    pub(crate) fn free_of_stamp(&self, stamp: u32) -> u64 {
        let back = (self.frees as u32).wrapping_sub(stamp);
        if back > u32::MAX / 2 {
            // A stamp ahead of the count would be a bookkeeping bug: wait for every free.
            debug_assert!(false, "stamp {stamp} ahead of {} frees", self.frees);
            return self.frees;
        }
        self.frees.saturating_sub(u64::from(back))
    }

    /// Makes `waiter` wait for this stream's work up to free number `free` (and what came
    /// before it): on the first event recorded after that free, or on a new one if none was;
    /// no wait at all when `waiter` already waited on such an event or the event has passed.
    ///
    /// # Errors
    /// A driver error recording the event, querying it or enqueueing the wait; nothing is
    /// changed then.
    pub(crate) fn order_upto(&mut self, waiter: &Stream, free: u64) -> Result<()> {
        let me = waiter.id();
        let free = free.min(self.frees);
        if self.waited(me) >= free {
            return Ok(());
        }
        if self.events.back().is_none_or(|(_, c)| *c < free) {
            self.record()?;
        }
        let (event, covered) = self
            .events
            .iter()
            .find(|(_, c)| *c >= free)
            .expect("the newest event covers every free");
        let covered = *covered;
        if !event.is_complete()? {
            waiter.wait(event)?;
        }
        match self.waiters.iter_mut().find(|(id, _)| *id == me) {
            Some((_, w)) => *w = covered,
            None => {
                if self.waiters.len() == MAX_WAITERS {
                    self.waiters.clear();
                }
                self.waiters.push((me, covered));
            }
        }
        Ok(())
    }
}

/// One stream's frees into a resource whose frees take no shared lock, and what other streams
/// need to take that memory: [`FreeOrder`] for concurrent use. Aligned so that the flag written
/// on every free does not share a cache line with another stream's.
#[repr(align(128))]
pub(crate) struct SharedFreeOrder {
    stream: Stream,
    /// Set by every free on the stream; cleared when an event is recorded after it.
    dirty: AtomicBool,
    /// The latest event recorded for another stream to wait on, and its generation (1, 2, ...).
    event: Mutex<Option<(Event, u64)>>,
    /// For each other stream, the generation of its latest event this stream already waits
    /// for, so that taking more memory behind the same event adds no second wait.
    waited: Mutex<FxHashMap<StreamId, u64>>,
}

/// How many other streams' waited-for events a [`SharedFreeOrder`] remembers.
const WAITED_LIMIT: usize = 256;

impl SharedFreeOrder {
    pub(crate) fn new(stream: Stream) -> Arc<Self> {
        Arc::new(SharedFreeOrder {
            stream,
            // No event recorded yet.
            dirty: AtomicBool::new(true),
            event: Mutex::new(None),
            waited: Mutex::new(FxHashMap::default()),
        })
    }

    /// The stream whose frees this orders (for out-of-memory details).
    pub(crate) fn stream_id(&self) -> crate::stream::StreamId {
        self.stream.id()
    }

    /// Whether the device has passed every free on the stream so far: no free came since the
    /// latest event, which has completed (for snapshots; a query, never a record).
    pub(crate) fn passed(&self) -> bool {
        let cached = self.event.lock();
        !self.dirty.load(Ordering::Acquire)
            && cached
                .as_ref()
                .is_some_and(|(e, _)| e.is_complete().unwrap_or(false))
    }

    /// Notes a free on the stream, before the freed block becomes visible to anyone else.
    pub(crate) fn note_free(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// An event on the stream after every free on it that happened before this call: the
    /// cached one when no free came since, else a new one. With its generation, and whether
    /// it is new.
    fn covering_event(&self) -> Result<(Event, u64, bool)> {
        let mut cached = self.event.lock();
        if !self.dirty.swap(false, Ordering::AcqRel) {
            if let Some((e, g)) = &*cached {
                return Ok((e.clone(), *g, false));
            }
        }
        match self.stream.record() {
            Ok(e) => {
                static GENERATION: AtomicU64 = AtomicU64::new(1);
                let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
                *cached = Some((e.clone(), generation));
                Ok((e, generation, true))
            }
            Err(err) => {
                self.dirty.store(true, Ordering::Release);
                Err(err)
            }
        }
    }
}

/// What the arena's cores carry: the stream whose frees must be waited for.
#[derive(Clone)]
pub(crate) struct Fence(pub(crate) Arc<SharedFreeOrder>);

impl PartialEq for Fence {
    fn eq(&self, other: &Fence) -> bool {
        self.0.stream.id() == other.0.stream.id()
    }
}

/// Every stream's [`SharedFreeOrder`] while someone holds it: what frees and takers look up.
pub(crate) struct SharedFreeOrders {
    orders: FxHashMap<StreamId, Weak<SharedFreeOrder>>,
    /// `orders` is pruned of dead entries when it reaches this length.
    prune_at: usize,
}

impl Default for SharedFreeOrders {
    fn default() -> Self {
        SharedFreeOrders {
            orders: FxHashMap::default(),
            prune_at: 64,
        }
    }
}

impl SharedFreeOrders {
    /// The record of `stream`, if someone holds it.
    pub(crate) fn get(&self, stream: StreamId) -> Option<Arc<SharedFreeOrder>> {
        self.orders.get(&stream).and_then(Weak::upgrade)
    }

    /// The record of `stream`, made on first use.
    pub(crate) fn get_or_make(&mut self, stream: &Stream) -> Arc<SharedFreeOrder> {
        if let Some(r) = self.get(stream.id()) {
            return r;
        }
        if self.orders.len() >= self.prune_at {
            self.orders.retain(|_, r| r.strong_count() > 0);
            self.prune_at = (2 * self.orders.len()).max(64);
        }
        let r = SharedFreeOrder::new(stream.clone());
        self.orders.insert(stream.id(), Arc::downgrade(&r));
        r
    }
}

/// Counts the events and waits that [`wait_fences`](OrderCounters::wait_fences) inserts, for a
/// resource's statistics.
#[derive(Default)]
pub(crate) struct OrderCounters {
    events_recorded: AtomicU64,
    stream_waits: AtomicU64,
}

impl OrderCounters {
    /// Events recorded so that memory freed on one stream could be used on another.
    pub(crate) fn events_recorded(&self) -> u64 {
        self.events_recorded.load(Ordering::Relaxed)
    }

    /// Stream waits inserted for the same purpose.
    pub(crate) fn stream_waits(&self) -> u64 {
        self.stream_waits.load(Ordering::Relaxed)
    }

    /// Makes `taker`'s stream wait for every fence of another stream, recording events lazily
    /// and skipping events it already waits for or that are complete.
    ///
    /// # Errors
    /// A driver error recording an event, querying it or enqueueing the wait.
    pub(crate) fn wait_fences(&self, taker: &SharedFreeOrder, fences: &[Fence]) -> Result<()> {
        for Fence(record) in fences {
            let id = record.stream.id();
            if id == taker.stream.id() {
                continue;
            }
            let (event, generation, fresh) = record.covering_event()?;
            if fresh {
                self.events_recorded.fetch_add(1, Ordering::Relaxed);
            }
            let mut waited = taker.waited.lock();
            if waited.get(&id).is_some_and(|&g| g >= generation) {
                continue;
            }
            if !event.is_complete()? {
                taker.stream.wait(&event)?;
                // What the taker hands on from now must be ordered after this wait too.
                taker.note_free();
                self.stream_waits.fetch_add(1, Ordering::Relaxed);
            }
            if waited.len() >= WAITED_LIMIT {
                // Forgetting only costs a redundant wait later.
                waited.clear();
            }
            waited.insert(id, generation);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
