//! The queue of waiting allocations behind an [`Availability`](super::Availability): by
//! priority, in arrival order within one; only the head retries.
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
//! next poll puts it back at the front of its priority, where arrival order had it, so every
//! waiter that is polled keeps its place; only one that was not polled for that long lets the
//! next one try first.

use std::collections::VecDeque;
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

/// One waiting allocation.
#[derive(Debug, Default)]
pub(crate) struct Waiter {
    waker: Mutex<Option<Waker>>,
    /// Its place in the queue: behind every waiter of equal or higher priority.
    priority: i32,
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
    /// Taken out of the queue for not taking its turn; its next poll puts it back.
    evicted: bool,
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

/// Queue of waiters by priority (higher first), FIFO within a priority. Only the head retries;
/// it is woken by `notify` and whenever the waiter before it leaves. A waiter of higher
/// priority than the head becomes the head when it is pushed; it retries on its own right after
/// (as every new waiter does), so the old head needs no wake-up. A head that does not take its
/// turn loses it (see the module docs).
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
    /// Sorted by priority, highest first; in arrival order within a priority.
    waiters: Mutex<VecDeque<Arc<Waiter>>>,
    /// The watch on a told head, while one runs (see the module docs).
    #[cfg(not(loom))]
    watchdog: parking_lot::Mutex<Option<Watch>>,
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
        self.core.waiters.lock().iter().map(|w| w.task()).collect()
    }

    /// Queues a new waiter behind every waiter of equal or higher `priority`; calls `first`
    /// (before the fence) if the queue was empty.
    pub(crate) fn push(&self, waker: &Waker, priority: i32, first: impl FnOnce()) -> Arc<Waiter> {
        let waiter = Arc::new(Waiter {
            priority,
            task: tokio::task::try_id(),
            ..Waiter::default()
        });
        waiter.set_waker(waker);
        let mut waiters = self.core.waiters.lock();
        insert(&mut waiters, &waiter, |w| w.priority >= priority);
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
    /// was taken out for not taking one (at the front of its priority, calling `first` if the
    /// queue was empty, then `joined`), and learns whether it is the head, the one allowed to
    /// retry.
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
            std::mem::take(&mut turn.evicted)
        };
        if rejoined {
            // Every waiter of its priority in the queue came after it.
            insert(&mut waiters, waiter, |w| w.priority > waiter.priority);
            self.core.len.store(waiters.len(), Ordering::Release);
        }
        let head = waiters.front().is_some_and(|h| Arc::ptr_eq(h, waiter));
        let was_empty = waiters.len() == 1;
        drop(waiters);
        if rejoined {
            if was_empty {
                first();
            }
            // As in `push`: back in the queue before the caller's retry reads resource state.
            fence(Ordering::SeqCst);
            joined();
        }
        head
    }

    /// Takes `waiter` out of the queue (served, timed out or cancelled); calls `emptied` if
    /// the queue is empty now. If it was the head, the new head is woken to retry: memory it
    /// could use may be there already.
    pub(crate) fn remove(&self, waiter: &Arc<Waiter>, emptied: impl FnOnce()) {
        let mut waiters = self.core.waiters.lock();
        let Some(i) = waiters.iter().position(|w| Arc::ptr_eq(w, waiter)) else {
            return;
        };
        waiters.remove(i);
        self.core.len.store(waiters.len(), Ordering::Release);
        let next = if i == 0 {
            waiters.front().cloned()
        } else {
            None
        };
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

/// Inserts `waiter` before the first queued waiter that `goes_before` does not hold for (the
/// queue is sorted by priority, highest first). Usually every waiter has the default priority:
/// a push at the back, found at once.
fn insert(
    waiters: &mut VecDeque<Arc<Waiter>>,
    waiter: &Arc<Waiter>,
    goes_before: impl Fn(&Waiter) -> bool,
) {
    let at = waiters
        .iter()
        .rposition(|w| goes_before(w))
        .map_or(0, |i| i + 1);
    waiters.insert(at, waiter.clone());
}

/// The head and its notification when someone waits behind it; with `tell`, the head is told
/// to retry first (a notification, or the turn passed on). Called with the queue's lock held.
fn watched(waiters: &VecDeque<Arc<Waiter>>, tell: bool) -> Watched {
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
        let mut delay = futures_timer::Delay::new(STALLED_TURN.saturating_sub(since.elapsed()));
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
            } else if watch.since.elapsed() < STALLED_TURN {
                (None, Some((head, told, watch.since)))
            } else {
                waiters.pop_front();
                {
                    let mut turn = head.turn.lock();
                    turn.untaken = false;
                    turn.evicted = true;
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
