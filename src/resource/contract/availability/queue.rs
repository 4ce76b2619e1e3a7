//! The queue of waiting allocations behind an [`Availability`](super::Availability): by
//! level (a priority that ages), in arrival order within one; only the head retries.
//!
//! # A head that never takes its turn
//!
//! Only the head retries, so the queue moves only when the head acts on a notification. A head
//! whose future is forgotten (`mem::forget` of an `Allocate`, a `NewBuffer`, a `NewVec`), or
//! whose task stops polling it, would hold every later waiter for ever. So a notification is a
//! turn that must be taken: a waiter told to retry is *untaken* until its next poll, and when a
//! told head has someone behind it a watchdog (a `futures-timer` delay, no thread of its own)
//! looks again after [`STALLED_TURN`]. A head still untaken, on the same notification, is taken
//! out of the queue and the turn passes to the next waiter. The evicted waiter is not lost: its
//! next poll puts it back where its level and arrival order had it, so every waiter that is
//! polled keeps its place; only one that was not polled for that long lets the next one try
//! first.

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::atomic::Ordering;
use std::task::Waker;
#[cfg(not(loom))]
use std::time::{Duration, Instant};

use crate::sync::{fence, Arc, AtomicUsize, Mutex};

/// How long a waiter told to retry may go without polling before the next waiter gets its turn:
/// far longer than any executor takes to poll a woken task, so only a forgotten future or a
/// task that stopped polling it loses its place.
#[cfg(not(loom))]
pub(crate) const STALLED_TURN: Duration = Duration::from_secs(1);

/// A queue's stalled-turn time: [`STALLED_TURN`], or in unit tests what
/// [`TEST_STALLED_TURN`] held on the thread that made the queue, so that the tests of the
/// watchdog need not wait out a second per turn while every other test keeps the real one.
#[cfg(not(loom))]
#[derive(Debug, Clone, Copy)]
struct StalledTurn(Duration);

#[cfg(not(loom))]
impl Default for StalledTurn {
    fn default() -> Self {
        #[cfg(test)]
        if let Some(turn) = TEST_STALLED_TURN.get() {
            return Self(turn);
        }
        Self(STALLED_TURN)
    }
}

#[cfg(all(test, not(loom)))]
thread_local! {
    /// The stalled-turn time of the queues this thread makes from now on (unit tests only).
    pub(crate) static TEST_STALLED_TURN: std::cell::Cell<Option<Duration>> =
        const { std::cell::Cell::new(None) };
}

/// One waiting allocation.
#[derive(Debug, Default)]
pub(crate) struct Waiter {
    waker: Mutex<Option<Waker>>,
    /// The tokio task it waits in, if any.
    task: Option<tokio::task::Id>,
    /// Its turn; read and written with the queue's lock held.
    turn: Mutex<Turn>,
}

/// Whether a waiter has a notification it has not acted on.
#[derive(Debug, Default)]
struct Turn {
    /// How many times it was told to retry (as the head, by a notify or by the waiter before
    /// it leaving): what tells one notification from the next.
    told: u64,
    /// Told, and not polled since.
    untaken: bool,
    /// Taken out of the queue for not taking its turn, with the rank it had there: its next
    /// poll puts it back at that rank.
    evicted: Option<Rank>,
}

/// Where a waiter stands in the queue: by level (higher first), then by arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rank {
    /// Its effective priority: the request's priority, raised by one each time `age_step`
    /// serves have passed it over at its level (see [`Queue::age`]). Never above the level of
    /// the waiter whose serve raised it, so never above the highest priority that waited.
    level: i32,
    /// Its arrival in this queue (unique, increasing): first come, first served within a level.
    seq: u64,
    /// Serves that passed it over since it last rose a level.
    passed: u32,
}

impl Rank {
    /// The order of the queue: higher level first, then earlier arrival.
    fn key(&self) -> (Reverse<i32>, u64) {
        (Reverse(self.level), self.seq)
    }
}

/// A queued waiter and its rank.
#[derive(Debug)]
struct Entry {
    rank: Rank,
    waiter: Arc<Waiter>,
}

/// The waiters, sorted by [`Rank::key`], and the next arrival number.
#[derive(Debug, Default)]
struct Queue {
    entries: VecDeque<Entry>,
    next_seq: u64,
}

impl Queue {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn front(&self) -> Option<&Arc<Waiter>> {
        self.entries.front().map(|e| &e.waiter)
    }

    fn position(&self, waiter: &Arc<Waiter>) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| Arc::ptr_eq(&e.waiter, waiter))
    }

    /// Puts `waiter` at `rank`'s place: behind every waiter of a higher level, and behind the
    /// earlier arrivals of its own. A binary search: the entries are sorted by key.
    fn insert(&mut self, waiter: &Arc<Waiter>, rank: Rank) {
        let at = self.entries.partition_point(|e| e.rank.key() < rank.key());
        self.entries.insert(
            at,
            Entry {
                rank,
                waiter: waiter.clone(),
            },
        );
    }

    /// A waiter of level `served` was just served: every waiter left of a lower level was
    /// passed over by it, and rises one level once `step` serves have passed it over since it
    /// last rose. Returns how many rose.
    ///
    /// The waiters passed over are a suffix (the entries are sorted by level), so the common
    /// case (nobody waits at a lower level) is one comparison; a waiter that rises is placed
    /// by its new key with an in-place sort, which allocates nothing.
    fn age(&mut self, served: i32, step: NonZeroU32) -> u32 {
        if self.entries.back().is_none_or(|e| e.rank.level >= served) {
            return 0;
        }
        let from = self.entries.partition_point(|e| e.rank.level >= served);
        let mut rose = 0;
        for e in self.entries.range_mut(from..) {
            e.rank.passed += 1;
            if e.rank.passed >= step.get() {
                // `level < served`: no overflow, and never above the level that passed it.
                e.rank.level += 1;
                e.rank.passed = 0;
                rose += 1;
            }
        }
        if rose > 0 {
            // Keys are unique (`seq`), so the unstable sort is deterministic.
            self.entries
                .make_contiguous()
                .sort_unstable_by_key(|e| e.rank.key());
        }
        rose
    }
}

impl Waiter {
    pub(crate) fn set_waker(&self, waker: &Waker) {
        let mut slot = self.waker.lock();
        match &*slot {
            Some(w) if w.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
    }

    pub(crate) fn task(&self) -> Option<tokio::task::Id> {
        self.task
    }

    fn wake(&self) {
        let waker = self.waker.lock().clone();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Tells it to retry (it is the head): its turn until it polls. Returns which notification
    /// this is. Called with the queue's lock held.
    fn tell(&self) -> u64 {
        let mut turn = self.turn.lock();
        turn.told += 1;
        turn.untaken = true;
        turn.told
    }
}

/// Queue of waiters by level (higher first), FIFO within a level; a waiter's level is its
/// priority, raised by ageing (see [`Queue::age`]). Only the head retries; it is woken by
/// `notify` and whenever the waiter before it leaves (or ageing puts one before it). A waiter
/// of higher priority than the head's level becomes the head when it is pushed; it retries on
/// its own right after (as every new waiter does), so the old head needs no wake-up. A head
/// that does not take its turn loses it (see the module docs).
///
/// No lost wake-up: a waiter is pushed (with its waker) *before* its retry, so a free that lands
/// between a failed retry and the waiter's `Pending` finds it in the queue and wakes it. The
/// free side (resource state written, then `len` read) and the waiter side (`len` written, then
/// resource state read) form a store-load pattern, so each side puts a `SeqCst` fence between
/// its store and its load: at least one of them sees the other's store. (The loom model found
/// the lost wake-up that acquire/release alone allows.) An evicted waiter that polls again
/// goes back in the same way, before its retry.
#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    /// Shared with the watchdog's waker, which holds it weakly.
    core: std::sync::Arc<Core>,
}

#[derive(Debug, Default)]
struct Core {
    /// Number of queued waiters; read without the lock on every fast path.
    len: AtomicUsize,
    /// Sorted by level, highest first; in arrival order within a level.
    waiters: Mutex<Queue>,
    /// The watch on a told head, while one runs (see the module docs).
    #[cfg(not(loom))]
    watchdog: parking_lot::Mutex<Option<Watch>>,
    #[cfg(not(loom))]
    stalled_turn: StalledTurn,
}

/// A look, after [`STALLED_TURN`], at whether `head` took notification `told`.
#[cfg(not(loom))]
struct Watch {
    /// Kept for its registration with the timer thread: dropping it ends the watch.
    _delay: futures_timer::Delay,
    head: Arc<Waiter>,
    told: u64,
    since: Instant,
}

#[cfg(not(loom))]
impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("told", &self.told)
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

/// The head to watch, and its notification, when it has someone behind it.
type Watched = Option<(Arc<Waiter>, u64)>;

impl WaitQueue {
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.core.len.load(Ordering::Acquire)
    }

    /// [`len`](Self::len) as a relaxed load, for a reader ordered by a lock of its own (see
    /// `Availability::nobody_to_notify`).
    #[inline]
    pub(crate) fn len_relaxed(&self) -> usize {
        self.core.len.load(Ordering::Relaxed)
    }

    /// The tokio tasks of the waiters (`None` for a waiter outside a task), in queue order.
    pub(crate) fn tasks(&self) -> Vec<Option<tokio::task::Id>> {
        self.core
            .waiters
            .lock()
            .entries
            .iter()
            .map(|e| e.waiter.task())
            .collect()
    }

    /// Queues a new waiter behind every waiter of equal or higher `priority`; calls `first`
    /// (before the fence) if the queue was empty.
    pub(crate) fn push(&self, waker: &Waker, priority: i32, first: impl FnOnce()) -> Arc<Waiter> {
        let waiter = Arc::new(Waiter {
            task: tokio::task::try_id(),
            ..Waiter::default()
        });
        waiter.set_waker(waker);
        let mut waiters = self.core.waiters.lock();
        let seq = waiters.next_seq;
        waiters.next_seq += 1;
        let rank = Rank {
            level: priority,
            seq,
            passed: 0,
        };
        waiters.insert(&waiter, rank);
        self.core.len.store(waiters.len(), Ordering::Release);
        let was_empty = waiters.len() == 1;
        // Behind a head that was told to retry and has not yet: watch it.
        let watch = watched(&waiters, false);
        drop(waiters);
        if was_empty {
            first();
        }
        // Pairs with the fence in `notify`: the caller's retry after this reads resource state.
        fence(Ordering::SeqCst);
        self.watch(watch);
        waiter
    }

    /// Whether `waiter` is the head (the one allowed to retry).
    #[cfg(loom)]
    pub(crate) fn is_head(&self, waiter: &Arc<Waiter>) -> bool {
        self.core
            .waiters
            .lock()
            .front()
            .is_some_and(|h| Arc::ptr_eq(h, waiter))
    }

    /// `waiter` is being polled: it takes any turn it was given, goes back in the queue if it
    /// was taken out for not taking one (at the rank it had, calling `first` if the queue was
    /// empty, then `joined`), and learns whether it is the head, the one allowed to retry.
    pub(crate) fn take_turn(
        &self,
        waiter: &Arc<Waiter>,
        first: impl FnOnce(),
        joined: impl FnOnce(),
    ) -> bool {
        let mut waiters = self.core.waiters.lock();
        let rejoined = {
            let mut turn = waiter.turn.lock();
            turn.untaken = false;
            turn.evicted.take()
        };
        if let Some(rank) = rejoined {
            // Back where arrival order (and its ageing) had it.
            waiters.insert(waiter, rank);
            self.core.len.store(waiters.len(), Ordering::Release);
        }
        let head = waiters.front().is_some_and(|h| Arc::ptr_eq(h, waiter));
        let was_empty = waiters.len() == 1;
        drop(waiters);
        if rejoined.is_some() {
            if was_empty {
                first();
            }
            // As in `push`: back in the queue before the caller's retry reads resource state.
            fence(Ordering::SeqCst);
            joined();
        }
        head
    }

    /// Takes `waiter` out of the queue (failed, timed out or cancelled); calls `emptied` if
    /// the queue is empty now. If it was the head, the new head is woken to retry: memory it
    /// could use may be there already.
    pub(crate) fn remove(&self, waiter: &Arc<Waiter>, emptied: impl FnOnce()) {
        self.leave(waiter, None, emptied);
    }

    /// Takes `waiter` out of the queue as [`remove`](Self::remove) does, after it got its
    /// memory: with `age_step`, the waiters of lower level it passed over age (see
    /// [`Queue::age`]). Returns how many of them rose a level.
    pub(crate) fn serve(
        &self,
        waiter: &Arc<Waiter>,
        age_step: Option<NonZeroU32>,
        emptied: impl FnOnce(),
    ) -> u32 {
        self.leave(waiter, age_step, emptied)
    }

    fn leave(
        &self,
        waiter: &Arc<Waiter>,
        age_step: Option<NonZeroU32>,
        emptied: impl FnOnce(),
    ) -> u32 {
        let mut waiters = self.core.waiters.lock();
        let Some(i) = waiters.position(waiter) else {
            return 0;
        };
        let head_before = waiters.entries.front().map(|e| e.rank.seq);
        let Some(gone) = waiters.entries.remove(i) else {
            unreachable!("found above")
        };
        let rose = age_step.map_or(0, |step| waiters.age(gone.rank.level, step));
        self.core.len.store(waiters.len(), Ordering::Release);
        // A new head (the old one left, or, rarely, ageing put a waiter before it) retries.
        let next = waiters
            .entries
            .front()
            .filter(|e| Some(e.rank.seq) != head_before)
            .map(|e| e.waiter.clone());
        let watch = if next.is_some() {
            watched(&waiters, true)
        } else {
            None
        };
        let is_empty = waiters.is_empty();
        drop(waiters);
        // Woken outside the lock: the woken task's first step takes it (`take_turn`).
        if let Some(head) = next {
            head.wake();
        }
        if is_empty {
            emptied();
        }
        self.watch(watch);
        rose
    }

    /// Wakes the head so it retries.
    pub(crate) fn notify(&self) {
        // Pairs with the fence in `push`: the caller changed resource state before this.
        fence(Ordering::SeqCst);
        if self.is_empty() {
            return;
        }
        // Woken outside the lock: waking a parked worker is a system call, and the woken task's
        // first step takes this lock (`take_turn`).
        let (head, watch) = {
            let waiters = self.core.waiters.lock();
            (waiters.front().cloned(), watched(&waiters, true))
        };
        if let Some(head) = head {
            head.wake();
        }
        self.watch(watch);
    }

    /// Starts a watch on `watched`'s head unless one runs (it looks at whoever is the head
    /// then, and watches again as needed).
    #[cfg(not(loom))]
    fn watch(&self, watched: Watched) {
        if let Some((head, told)) = watched {
            self.core.watch(head, told, Instant::now());
        }
    }

    /// Under loom there is no timer: the models check the queue's protocol, not the watchdog.
    #[cfg(loom)]
    fn watch(&self, watched: Watched) {
        let _ = watched;
    }
}

/// The head and its notification when someone waits behind it; with `tell`, the head is told
/// to retry first (a notification, or the turn passed on). Called with the queue's lock held.
fn watched(waiters: &Queue, tell: bool) -> Watched {
    let head = waiters.front()?;
    let told = if tell {
        head.tell()
    } else {
        let turn = head.turn.lock();
        if !turn.untaken {
            return None;
        }
        turn.told
    };
    (waiters.len() >= 2).then(|| (head.clone(), told))
}

#[cfg(not(loom))]
impl Core {
    /// Starts a watch on `head`'s notification `told`, given at `since`, unless one runs.
    fn watch(self: &std::sync::Arc<Self>, head: Arc<Waiter>, told: u64, since: Instant) {
        use std::future::Future;

        let mut slot = self.watchdog.lock();
        if slot.is_some() {
            return;
        }
        let mut delay =
            futures_timer::Delay::new(self.stalled_turn.0.saturating_sub(since.elapsed()));
        let waker = futures::task::waker(std::sync::Arc::new(Watchdog(std::sync::Arc::downgrade(
            self,
        ))));
        // Registers the waker with the timer thread. `futures-timer` panics here when it could
        // not start that thread; the queue then goes on without a watchdog, as before it had one.
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            std::pin::Pin::new(&mut delay).poll(&mut std::task::Context::from_waker(&waker))
        }));
        match polled {
            Ok(std::task::Poll::Pending) => {
                *slot = Some(Watch {
                    _delay: delay,
                    head,
                    told,
                    since,
                })
            }
            // Only a delay that is already over: looked at again by the next notification.
            Ok(std::task::Poll::Ready(())) => {}
            Err(_) => tracing::warn!("no timer thread: a wait queue cannot pass a stalled turn"),
        }
    }

    /// The watch is due: if the head it watched still has not taken that notification, the
    /// head is taken out of the queue and the turn passes to the next waiter.
    fn check(self: &std::sync::Arc<Self>) {
        let Some(watch) = self.watchdog.lock().take() else {
            return;
        };
        let (wake, again) = {
            let mut waiters = self.waiters.lock();
            let Some(head) = waiters.front().cloned() else {
                return;
            };
            let (told, untaken) = {
                let turn = head.turn.lock();
                (turn.told, turn.untaken)
            };
            if waiters.len() < 2 || !untaken {
                // Nobody behind it, or it took its turn: nothing to watch until the next one.
                (None, None)
            } else if !Arc::ptr_eq(&head, &watch.head) || told != watch.told {
                // Another notification, or another head, since the watch began: watch that.
                (None, Some((head, told, Instant::now())))
            } else if watch.since.elapsed() < self.stalled_turn.0 {
                (None, Some((head, told, watch.since)))
            } else {
                let Some(Entry { rank, .. }) = waiters.entries.pop_front() else {
                    unreachable!("the head is there")
                };
                {
                    let mut turn = head.turn.lock();
                    turn.untaken = false;
                    turn.evicted = Some(rank);
                }
                self.len.store(waiters.len(), Ordering::Release);
                tracing::debug!(
                    stalled_for = ?watch.since.elapsed(),
                    "a wait queue's head did not take its turn: passed to the next waiter"
                );
                match watched(&waiters, true) {
                    Some((next, told)) => (Some(next.clone()), Some((next, told, Instant::now()))),
                    None => (waiters.front().cloned(), None),
                }
            }
        };
        // The delay goes outside the locks (its drop tells the timer thread).
        drop(watch);
        if let Some(next) = wake {
            next.wake();
        }
        if let Some((head, told, since)) = again {
            self.watch(head, told, since);
        }
    }
}

/// The watchdog's waker: the timer thread calls it when a watch is due.
#[cfg(not(loom))]
struct Watchdog(std::sync::Weak<Core>);

#[cfg(not(loom))]
impl futures::task::ArcWake for Watchdog {
    fn wake_by_ref(arc_self: &std::sync::Arc<Self>) {
        if let Some(core) = arc_self.0.upgrade() {
            core.check();
        }
    }
}
