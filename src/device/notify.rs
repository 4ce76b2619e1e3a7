//! The completion driver: the one place that turns device progress into task wake-ups.
//!
//! Two strategies, selectable per device (figures in the book's "Completion driver" page):
//! - [`CompletionStrategy::HostFunction`]: a private *shadow stream* per user stream waits for
//!   the event, then runs a host function that sets the flag and wakes the tasks. The user
//!   stream never runs the host function itself, so it never stalls behind it.
//! - [`CompletionStrategy::Poller`]: one thread per device queries the oldest pending event of
//!   each stream (events on a stream complete in order), spins briefly, then backs off and
//!   parks when nothing is pending. A new arm cuts any back-off short: the poller parks (never
//!   sleeps), and arming unparks it and starts the spin again.
//! - [`CompletionStrategy::FlagWrite`]: the poller's thread, but the shadow stream waits for
//!   the event and writes a flag word ([`DeviceFlag`], `cuStreamWriteValue32` into pinned
//!   memory) that the thread reads with a load while it spins; once it backs off it queries the
//!   events too, so a stream's error is still seen.
//!
//! Wake-ups follow record order per stream, whatever order the events were armed in: recording
//! numbers each event of a stream ([`ShadowStream::record`]); the poller keeps each stream's
//! pending events sorted by that number, and under the host-function strategy each host
//! function completes every event of its stream armed up to its own, oldest first.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::backend::{AnyBackend, AnyEvent, AnyStream, Completion, DeviceFlag};
use crate::device::config::CompletionStrategy;
use crate::error::{Error, Result};
use crate::ids::StreamId;

/// Per-device state of the completion driver.
pub(crate) struct CompletionDriver {
    strategy: AtomicU8,
    poller: OnceLock<Poller>,
    /// The poller's back-off, read when the poller starts (tests shorten or lengthen it).
    backoff: Mutex<Backoff>,
}

impl CompletionDriver {
    pub(crate) fn new(strategy: CompletionStrategy) -> Self {
        CompletionDriver {
            strategy: AtomicU8::new(strategy.to_u8()),
            poller: OnceLock::new(),
            backoff: Mutex::new(Backoff::DEFAULT),
        }
    }

    pub(crate) fn strategy(&self) -> CompletionStrategy {
        CompletionStrategy::from_u8(self.strategy.load(Ordering::Relaxed))
    }

    pub(crate) fn set_strategy(&self, strategy: CompletionStrategy) {
        self.strategy.store(strategy.to_u8(), Ordering::Relaxed)
    }

    /// Arranges for `completion` to be completed once `event` is: `event` was recorded on the
    /// stream `stream` as its `seq`-th event ([`ShadowStream::record`]); `shadow` is that
    /// stream's shadow, whose stream (created on `backend` when first needed) runs the host
    /// function.
    pub(crate) fn arm(
        &self,
        backend: &AnyBackend,
        stream: StreamId,
        shadow: &ShadowStream,
        event: &AnyEvent,
        seq: u64,
        completion: &Arc<Completion>,
    ) -> Result<()> {
        match self.strategy() {
            CompletionStrategy::HostFunction => shadow.arm(backend, event, seq, completion),
            CompletionStrategy::Poller => {
                self.poller().submit(
                    stream,
                    seq,
                    Signal::Event(event.clone()),
                    completion.clone(),
                );
                Ok(())
            }
            CompletionStrategy::FlagWrite => {
                let signal = match shadow.arm_flag(backend, event) {
                    Some(flag) => Signal::Flag(flag, event.clone()),
                    None => Signal::Event(event.clone()),
                };
                self.poller()
                    .submit(stream, seq, signal, completion.clone());
                Ok(())
            }
        }
    }

    fn poller(&self) -> &Poller {
        self.poller
            .get_or_init(|| Poller::start(*self.backoff.lock()))
    }

    /// Replaces the poller's back-off; only before the poller's first arm.
    #[cfg(test)]
    pub(crate) fn set_backoff(&self, backoff: Backoff) {
        assert!(self.poller.get().is_none(), "the poller is running");
        *self.backoff.lock() = backoff;
    }

    /// What the poller has done so far, if it runs.
    #[cfg(test)]
    pub(crate) fn poller_counters(&self) -> Option<&PollerCounters> {
        self.poller.get().map(|p| &p.shared.counters)
    }
}

impl Drop for CompletionDriver {
    /// Stops the poller and waits for it, so that it queries no event after the device is
    /// gone (unless the device's last handle drops on the poller itself, through a waker).
    fn drop(&mut self) {
        if let Some(p) = self.poller.take() {
            p.shared.shutdown.store(true, Ordering::Release);
            p.thread.unpark();
            if p.thread.id() != thread::current().id() {
                let _ = p.handle.join();
            }
        }
    }
}

impl fmt::Debug for CompletionDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionDriver")
            .field("strategy", &self.strategy())
            .finish()
    }
}

/// The completion driver's side of one user stream: the private stream on which its
/// host-function notifications run (so a user stream never stalls behind a host callback),
/// created on first use, and the numbering of its events that keeps wake-ups in record order.
/// The user stream's handle owns it, so it lives exactly as long.
#[derive(Debug, Default)]
pub(crate) struct ShadowStream {
    stream: OnceLock<AnyStream>,
    /// The number the next event recorded on the user stream gets. Its lock is held across
    /// the record itself, so numbers follow the stream's order even when threads race.
    next_seq: Mutex<u64>,
    /// Completions armed under the host-function strategy, not completed yet.
    armed: Arc<ArmedInOrder>,
}

impl ShadowStream {
    /// Records an event on `stream` (the user stream this shadow belongs to) and numbers it:
    /// an event recorded later gets a larger number.
    pub(crate) fn record(&self, stream: &AnyStream) -> Result<(AnyEvent, u64)> {
        let mut next = self.next_seq.lock();
        let event = stream.record()?;
        let seq = *next;
        *next += 1;
        Ok((event, seq))
    }

    fn get_or_create(&self, backend: &AnyBackend) -> Result<&AnyStream> {
        if let Some(s) = self.stream.get() {
            return Ok(s);
        }
        let created = backend.create_stream()?;
        // A racing thread may have set it first; keep theirs and drop ours.
        Ok(self.stream.get_or_init(|| created))
    }

    /// The flag strategy: the shadow stream waits for `event`, then writes a flag of the
    /// device's; `None` when there is no flag to be had or the shadow stream refused the work
    /// (the caller then queries the event).
    fn arm_flag(&self, backend: &AnyBackend, event: &AnyEvent) -> Option<DeviceFlag> {
        let flag = backend.flag_slab()?.take()?;
        let enqueued = self.get_or_create(backend).and_then(|shadow| {
            shadow.wait_event(event)?;
            shadow.write_flag(&flag)
        });
        match enqueued {
            Ok(()) => Some(flag),
            Err(error) => {
                tracing::debug!(%error, "arming a completion flag failed; querying the event");
                flag.unwritten();
                None
            }
        }
    }

    /// The host-function strategy: the shadow stream waits for `event`, then a host function
    /// completes `completion` together with every earlier-recorded event of this stream armed
    /// by the time it runs, oldest first.
    fn arm(
        &self,
        backend: &AnyBackend,
        event: &AnyEvent,
        seq: u64,
        completion: &Arc<Completion>,
    ) -> Result<()> {
        let shadow = self.get_or_create(backend)?;
        self.armed.insert(seq, completion.clone());
        // The host function completes `trigger`, whose only waker completes this stream's
        // armed completions up to `seq`.
        let trigger = Arc::new(Completion::default());
        trigger.register(&Waker::from(Arc::new(CompleteThrough {
            armed: self.armed.clone(),
            seq,
            trigger: Arc::downgrade(&trigger),
        })));
        let enqueued = shadow
            .wait_event(event)
            .and_then(|()| shadow.notify(trigger));
        if enqueued.is_err() {
            self.armed.remove(seq);
        }
        enqueued
    }
}

/// Completions of one stream armed under the host-function strategy, by record number.
///
/// A host function that runs after the stream passed event `seq` has also passed every event
/// recorded before it, so it completes all of them, oldest first: wake-ups come in record
/// order even when a later event was armed first (its host function runs first). The host
/// function of an event completed that way finds nothing left to do.
#[derive(Debug, Default)]
struct ArmedInOrder {
    pending: Mutex<BTreeMap<u64, Arc<Completion>>>,
}

impl ArmedInOrder {
    fn insert(&self, seq: u64, completion: Arc<Completion>) {
        self.pending.lock().insert(seq, completion);
    }

    fn remove(&self, seq: u64) {
        self.pending.lock().remove(&seq);
    }

    /// Fails the completion of `seq`, if still armed, with `error`.
    fn fail(&self, seq: u64, error: Error) {
        let completion = self.pending.lock().remove(&seq);
        if let Some(c) = completion {
            c.fail(error);
        }
    }

    /// Runs inside a host function: no allocation, no driver call, nothing that panics. Each
    /// completion is completed (its tasks woken) outside the lock.
    fn complete_through(&self, seq: u64) {
        loop {
            let next = {
                let mut pending = self.pending.lock();
                match pending.first_key_value() {
                    Some((&first, _)) if first <= seq => pending.pop_first().map(|(_, c)| c),
                    _ => None,
                }
            };
            match next {
                Some(completion) => completion.complete(),
                None => return,
            }
        }
    }
}

/// The waker a host function wakes: it completes the stream's armed completions up to `seq`,
/// or, when the backend failed `trigger` (the stream reported an error at this point), fails
/// the completion of `seq` alone with that error (the earlier ones get their own outcome from
/// their own host functions).
struct CompleteThrough {
    armed: Arc<ArmedInOrder>,
    seq: u64,
    /// Weak: the trigger holds this waker until it completes. It is alive while it wakes us.
    trigger: Weak<Completion>,
}

impl CompleteThrough {
    fn run(&self) {
        let error = self.trigger.upgrade().and_then(|t| t.error().cloned());
        match error {
            None => self.armed.complete_through(self.seq),
            Some(e) => self.armed.fail(self.seq, e),
        }
    }
}

impl Wake for CompleteThrough {
    fn wake(self: Arc<Self>) {
        self.run();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.run();
    }
}

/// How the poller learns that the device passed an armed event.
enum Signal {
    /// By querying the event (a driver call).
    Event(AnyEvent),
    /// By reading the flag the shadow stream writes after the event (a load); the event is
    /// queried too once the poller backs off, for errors.
    Flag(DeviceFlag, AnyEvent),
}

impl Signal {
    /// Whether the device passed the event: `Ok(false)` while not (or not known without a
    /// query when `query` is false), the stream's error if it failed. A set flag is confirmed
    /// by one query, which carries the stream's outcome (the shadow stream may write the flag
    /// after a failed event; the event has passed all the same).
    fn passed(&mut self, query: bool) -> Result<bool> {
        match self {
            Signal::Event(event) => event.query(),
            Signal::Flag(flag, event) => {
                if flag.is_set() {
                    event.query().map(|_| true)
                } else if query {
                    event.query()
                } else {
                    Ok(false)
                }
            }
        }
    }

    /// [`passed`](Self::passed) for an event known to be passed (a later event of its stream
    /// has): its outcome.
    fn outcome(&self) -> Result<()> {
        match self {
            Signal::Event(event) | Signal::Flag(_, event) => event.query().map(drop),
        }
    }

    /// Whether a flag says the device passed the event (no query).
    fn flagged(&mut self) -> bool {
        match self {
            Signal::Flag(flag, _) => flag.is_set(),
            Signal::Event(_) => false,
        }
    }
}

/// An armed event: how to learn it completed, and what completes when it does.
type Pending = (Signal, Arc<Completion>);

struct Poller {
    shared: Arc<PollerShared>,
    thread: Thread,
    /// Joined when the device goes.
    handle: std::thread::JoinHandle<()>,
}

struct PollerShared {
    inbox: Mutex<Vec<(StreamId, u64, Pending)>>,
    shutdown: AtomicBool,
    counters: PollerCounters,
}

/// What the poller has done, for tests that check how it was woken.
#[derive(Debug, Default)]
pub(crate) struct PollerCounters {
    /// Timed parks begun (back-off while events are pending).
    pub(crate) timed_parks: AtomicU64,
    /// The timeout of the timed park in progress, in nanoseconds; 0 when not in one.
    pub(crate) parked_for_nanos: AtomicU64,
    /// Timed parks that an arm ended before their timeout.
    pub(crate) cut_short_by_arm: AtomicU64,
    /// Events found passed through their flag rather than by a query of their own.
    pub(crate) flagged: AtomicU64,
}

/// How the poller waits while events are pending and none completes: it spins, then yields,
/// then parks with a timeout that doubles from `first_park` up to `max_park`. Every arm
/// unparks it and starts over with the spin.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    /// Spin for this long after the last progress or arm.
    pub(crate) spin: Duration,
    /// Then yield the thread until this long after it.
    pub(crate) yield_until: Duration,
    /// Then park, first for this long.
    pub(crate) first_park: Duration,
    /// And never longer than this.
    pub(crate) max_park: Duration,
}

impl Backoff {
    /// A short kernel's completion is seen while spinning; a long one costs at most one
    /// `max_park` of lateness and little CPU.
    const DEFAULT: Backoff = Backoff {
        spin: Duration::from_micros(100),
        yield_until: Duration::from_micros(400),
        first_park: Duration::from_micros(1),
        max_park: Duration::from_micros(500),
    };
}

impl Poller {
    fn start(backoff: Backoff) -> Poller {
        let shared = Arc::new(PollerShared {
            inbox: Mutex::new(Vec::new()),
            shutdown: AtomicBool::new(false),
            counters: PollerCounters::default(),
        });
        let for_thread = shared.clone();
        let handle = thread::Builder::new()
            .name("streamalloc-poller".into())
            .spawn(move || poll_loop(&for_thread, backoff))
            .expect("failed to spawn the completion poller thread");
        Poller {
            shared,
            thread: handle.thread().clone(),
            handle,
        }
    }

    fn submit(&self, stream: StreamId, seq: u64, signal: Signal, completion: Arc<Completion>) {
        self.shared
            .inbox
            .lock()
            .push((stream, seq, (signal, completion)));
        // Ends a park at once (a park begun after this returns at once too).
        self.thread.unpark();
    }
}

/// The pending events of each stream, by record number: only the first of each is queried.
type Queues = HashMap<StreamId, BTreeMap<u64, Pending>>;

fn poll_loop(shared: &PollerShared, backoff: Backoff) {
    let mut queues = Queues::new();
    // When the poller last completed an event or took a new arm: the back-off counts from it.
    let mut active_at = Instant::now();
    let mut park = backoff.first_park;
    loop {
        if take_inbox(shared, &mut queues) {
            active_at = Instant::now();
            park = backoff.first_park;
        }
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Flags are read while spinning; once backing off, events are queried too.
        let query = active_at.elapsed() >= backoff.spin;
        if complete_oldest(shared, &mut queues, query) {
            active_at = Instant::now();
            park = backoff.first_park;
        }
        if queues.is_empty() {
            // Nothing pending: sleep until the next arm, with no timeout and no spinning.
            if shared.inbox.lock().is_empty() {
                thread::park();
            }
            continue;
        }
        let idle = active_at.elapsed();
        if idle < backoff.spin {
            std::hint::spin_loop();
        } else if idle < backoff.yield_until {
            thread::yield_now();
        } else {
            park_for(shared, park);
            park = (park * 2).min(backoff.max_park);
        }
    }
}

/// Moves newly armed events into their streams' queues; returns whether there were any.
fn take_inbox(shared: &PollerShared, queues: &mut Queues) -> bool {
    let armed = std::mem::take(&mut *shared.inbox.lock());
    let any = !armed.is_empty();
    for (stream, seq, pending) in armed {
        queues.entry(stream).or_default().insert(seq, pending);
    }
    any
}

/// Completes, stream by stream and in record order, every event the device has passed;
/// queries only the oldest pending event of each stream (events on a stream complete in
/// order), and only when `query` (else reads flags alone). A set flag of a later event also
/// completes every event recorded before it on its stream: the shadow stream writes flags in
/// the order they were armed, which need not be the record order. Returns whether any
/// completed.
///
/// A completion (or dropping it) may release the device's last handle on this thread; the
/// driver's drop then sets `shutdown` without joining (it cannot join its own thread), and the
/// poller queries nothing more: a query would be a driver call after the device is gone.
fn complete_oldest(shared: &PollerShared, queues: &mut Queues, query: bool) -> bool {
    let mut progressed = false;
    queues.retain(|_, queue| {
        let passed_through = queue
            .iter_mut()
            .rev()
            .find_map(|(&seq, (signal, _))| signal.flagged().then_some(seq));
        while let Some(mut entry) = queue.first_entry() {
            if shared.shutdown.load(Ordering::Acquire) {
                return true;
            }
            let flagged_later = passed_through.is_some_and(|last| *entry.key() <= last);
            let (signal, completion) = entry.get_mut();
            let outcome = if flagged_later {
                signal.outcome().map(|()| true)
            } else {
                signal.passed(query)
            };
            if outcome.is_ok() && (flagged_later || signal.flagged()) {
                shared.counters.flagged.fetch_add(1, Ordering::Relaxed);
            }
            match outcome {
                Ok(false) => break,
                Ok(true) => completion.complete(),
                Err(e) => completion.fail(e),
            }
            entry.remove();
            progressed = true;
        }
        !queue.is_empty()
    });
    progressed
}

/// Parks for `timeout` or until the next arm, whichever comes first.
fn park_for(shared: &PollerShared, timeout: Duration) {
    let counters = &shared.counters;
    counters.timed_parks.fetch_add(1, Ordering::Relaxed);
    let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
    counters.parked_for_nanos.store(nanos, Ordering::Release);
    let parked = Instant::now();
    thread::park_timeout(timeout);
    counters.parked_for_nanos.store(0, Ordering::Release);
    if parked.elapsed() < timeout && !shared.inbox.lock().is_empty() {
        counters.cut_short_by_arm.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
