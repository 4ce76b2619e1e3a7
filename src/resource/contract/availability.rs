//! The wait queue of a resource: how an awaited allocation that found no memory waits for some,
//! highest level first (a priority that rises as the waiter is passed over), first come, first
//! served within a level.
//!
//! # Why not `event-listener`
//!
//! The design names `event-listener` (smol's `Event`) for this queue: it wakes listeners in
//! arrival order and, when a notified listener is dropped, passes the notification on. It was
//! read against what this queue must do, and cannot serve:
//!
//! - **A waiter keeps its place across failed retries.** Only the head retries, and a retry
//!   may fail (the memory that came back is too small for it). An `EventListener` completes
//!   once notified; to wait again the waiter must call `Event::listen` anew, which puts it at
//!   the *back* of the list. A large request would lose its place to every newer waiter on
//!   every free too small for it: exactly the starvation the queue exists to prevent.
//!   (`Event::notify(1)` not re-notifying an already-notified listener does not help: the
//!   head must stay the head after its notification is spent.)
//! - **Priorities.** Listeners are kept in one list in arrival order; there is no insertion by
//!   priority. One `Event` per priority level would need a protocol on top to say which level
//!   holds the turn, its own hand-on when a level empties, and a map of levels: the queue
//!   again, written around the crate.
//! - **Head-only retry and its identity.** The queue tells a waiter whether it is the head
//!   (`is_head`), and deadlock detection walks the waiters to see which tasks wait. An
//!   `Event` exposes neither its order nor its listeners.
//! - **The followers chain and the cheap empty check.** A free must cost a fence and a few
//!   loads when nobody waits here *or at any resource stacked on this one* (the `Waiting`
//!   counts below); `Event::notify` on an empty event is cheap, but the count of waiters at
//!   followers is ours either way.
//!
//! What `event-listener` does give — a notification passed on by a dropped listener — is
//! `WaitQueue::remove` waking the new head, checked by the loom models in `loom_tests`.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{OnceLock, Weak};
use std::task::Waker;
use std::time::Duration;

use crate::resource::contract::stats::WaitQueueStats;

pub(crate) mod pending_frees;
mod queue;
use crate::sync::{Arc, AtomicUsize, Mutex};
pub(crate) use queue::{WaitQueue, Waiter};
#[cfg(all(test, not(loom)))]
pub(crate) use queue::{STALLED_TURN, TEST_STALLED_TURN};

/// The signal a resource fires when memory may have become available (a free, growth, a
/// stream-ordered free becoming reusable), with the FIFO queue of allocations waiting for it.
///
/// # Fairness
/// Waiting allocations are ordered by *level* (higher first), and in arrival order within a
/// level; a waiter's level starts at its [priority](crate::Allocate::priority) (default 0).
/// Only the head of the queue retries when memory comes back; when it succeeds (or gives up)
/// the next one retries at once. A new [`allocate`](crate::MemoryResource::allocate) that finds
/// waiters queues behind every waiter of equal or higher level instead of taking the fast
/// path, so a large request is never starved by a stream of small ones of its own priority,
/// and passes waiters of lower level. ([`try_allocate`](crate::MemoryResource::try_allocate)
/// never waits and does not queue.)
///
/// **Ageing.** When a waiter is *served* (gets its memory from the queue), every waiter left of
/// a lower level than the served one's was *passed over* by it. A waiter passed over
/// [`age_step`](Availability::age_step) times (`K`, default
/// [128](Availability::DEFAULT_AGE_STEP)) since it last rose rises one level, and then queues
/// by its arrival among the waiters of that level. Levels rise only to the level of a waiter
/// that was served, so never above the highest priority waiting. The rule counts serves, not
/// time: it is deterministic, costs nothing while nobody waits, one comparison per serve while
/// every waiter has one level, and an in-place re-sort (no allocation) when one rises.
///
/// **The bound.** A waiter `W` of priority `p` that keeps polling, and meanwhile sees no
/// request of priority above `P`, is served after at most `K · (P − p) + N` other requests are
/// served from this queue, where `N` is the number of waiters already queued when `W` joined.
/// Every serve before `W`'s is of a waiter of higher level than `W` (it passes `W` over; after
/// `K · (P − p)` of them `W` is at level `P` and nobody is above it) or of one that arrived
/// before `W` (arrival order holds within a level; at most `N`). Timeouts and cancellations
/// only shorten the queue. So while memory keeps being freed and the head keeps being served,
/// no waiter of any priority waits for more than that many serves; with
/// [`set_age_step(None)`](Availability::set_age_step) priorities are strict and a waiter of
/// lower priority waits for as long as waiters of higher priority keep coming. With at most
/// `K` serves per level of difference, strict priority is still what a short queue sees: a
/// waiter of higher priority goes first unless one below it has been passed over `K` times.
/// A [deadline](crate::Allocate::deadline) bounds any wait in time.
///
/// A head that is told to retry and is not polled for a second (its future forgotten with
/// `mem::forget`, or its task no longer polling it) loses its turn to the next waiter, so one
/// such future cannot hold the queue for ever; when it is polled again it goes back where
/// its level and arrival put it. Every waiter that is polled keeps its place.
///
/// A resource that makes allocations wait implements
/// [`MemoryResource::availability`](crate::MemoryResource::availability) and calls
/// [`notify`](Availability::notify) whenever memory may have come back.
///
/// # Examples
///
/// ```
/// use streamalloc::Availability;
///
/// let a = Availability::new();
/// assert!(!a.has_waiters());
/// a.notify(); // nobody waits: a single atomic load
/// ```
#[derive(Default)]
pub struct Availability {
    queue: WaitQueue,
    /// Availabilities of resources stacked on this one (adaptors with limits of their own):
    /// memory coming back here may let their waiters proceed too.
    followers: parking_lot::Mutex<Vec<Weak<Availability>>>,
    /// Whether anyone waits here or at a follower, so that a notify with nobody waiting reads
    /// one counter instead of locking and walking the followers.
    waiting: Arc<Waiting>,
    /// How the queue has fared ([`Availability::stats`]); touched only when a request waits.
    counts: WaitCounts,
    /// What each task holds, for deadlock detection.
    holders: Holders,
    /// Whether deadlock detection is on ([`Availability::set_deadlock_detection`]). Off by
    /// default: the counts cannot see memory a task hands to another.
    detect_deadlocks: std::sync::atomic::AtomicBool,
    /// How many serves of higher level raise a waiter one level ([`Availability::age_step`]).
    age_step: AgeStep,
}

/// [`Availability::age_step`], 0 for none. Read once per serve from the queue, never on the
/// fast path.
#[derive(Debug)]
struct AgeStep(AtomicU32);

impl Default for AgeStep {
    fn default() -> Self {
        AgeStep(AtomicU32::new(Availability::DEFAULT_AGE_STEP.get()))
    }
}

/// Bytes held per tokio task, counted for the allocations awaited through
/// [`allocate`](crate::MemoryResource::allocate) (and the buffer builders) since the last time
/// memory came back ([`Availability::notify`]): a free may have returned any of them, so every
/// notify that follows a record forgets them all. What is left is a lower bound, per task, of
/// what it holds now, which is what makes deadlock detection conservative (see
/// [`Allocate`](crate::Allocate)).
///
/// Every awaited allocation records and every free notifies, from any worker thread, so neither
/// may take a shared lock: the counts live in per-thread shards (one cache line each, a lock of
/// their own that only the threads sharing a shard take), stamped with the epoch they count in.
/// The one shared word, `state`, holds the epoch and a "recorded since" bit: a record sets the
/// bit (only when it is clear: a plain load first), a notify that finds it set starts the next
/// epoch and clears it in one compare-exchange, and a notify with nothing recorded since is one
/// load. Only a deadlock check (a waiter whose retry failed: rare) sums the shards.
///
/// Plain std atomics and parking_lot locks, also under loom: the wait queue's own protocol
/// does not depend on them.
#[derive(Debug, Default)]
struct Holders {
    /// `epoch << 1 | RECORDED`. Every change is a read-modify-write, and the value only grows:
    /// a record turns `RECORDED` on (same epoch), a notify turns it off and adds one epoch.
    ///
    /// Relaxed everywhere, because the word orders no other memory: the shards are guarded by
    /// their locks, and what must hold follows from the coherence of this one word:
    /// - *A freed allocation is forgotten by the notify after its free.* Its record ends
    ///   with `RECORDED` on (its load or its `fetch_or` saw it on) and happens before the free
    ///   (the pointer is handed out after it), so the free's notify reads that value or a later
    ///   one: still on in the record's epoch (it bumps), or a later epoch.
    /// - *A waiter's holdings are seen by the check.* A task records before it queues, and the
    ///   check reads the queue under its lock before reading this word and the shards (under
    ///   theirs), so it sees the record's epoch or a later one, and the record in its shard.
    ///
    /// A record racing with a notify is ordered by this word alone: it counts in the epoch it
    /// read, and is forgotten with it when a notify bumps it (as if it came first). A check
    /// racing with a notify may miss counts of the old epoch in shards a newer record has
    /// already restamped: a lower count, so no false report, and that notify wakes the head,
    /// which retries and checks again.
    state: AtomicU64,
    /// One per thread (threads beyond `SHARDS` share them), made at the first record.
    shards: OnceLock<Box<[Shard]>>,
}

/// The bit of [`Holders::state`] that says something was recorded in its epoch.
const RECORDED: u64 = 1;

/// How many shards an availability's ledger has; threads share them round robin beyond that.
const SHARDS: usize = 32;

/// A thread's counts, in a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(parking_lot::Mutex<Ledger>);

#[derive(Debug, Default)]
struct Ledger {
    /// The epoch the counts are in; counts of an older one are forgotten at the next record.
    counted_in: u64,
    /// The first `FEW` tasks counted, searched in order: between two frees a thread usually
    /// runs few allocating tasks, and a scan of a few words is cheaper than hashing.
    few: Vec<(tokio::task::Id, usize)>,
    /// The tasks beyond those.
    many: HashMap<tokio::task::Id, usize, BuildHasherDefault<IdHasher>>,
}

/// How many tasks a shard counts in `Ledger::few`.
const FEW: usize = 8;

impl Ledger {
    fn clear(&mut self) {
        self.few.clear();
        if !self.many.is_empty() {
            self.many.clear();
        }
    }

    fn add(&mut self, task: tokio::task::Id, bytes: usize) {
        // A task is in `few` or in `many`, never both: `many` takes only tasks `few` lacks
        // once it is full, and `few` loses none until both are cleared.
        if let Some((_, held)) = self.few.iter_mut().find(|(t, _)| *t == task) {
            *held += bytes;
        } else if self.few.len() < FEW {
            self.few.push((task, bytes));
        } else {
            *self.many.entry(task).or_default() += bytes;
        }
    }

    fn held(&self, task: &tokio::task::Id) -> usize {
        let few = self.few.iter().find(|(t, _)| t == task).map(|(_, b)| *b);
        few.or_else(|| self.many.get(task).copied()).unwrap_or(0)
    }
}

/// A multiplicative hash for task ids (one `u64` each): SipHash would cost more than the
/// rest of a record.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// This thread's shard index, handed out round robin at its first record.
fn shard_index() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    INDEX.try_with(|i| *i).unwrap_or(0)
}

impl Holders {
    fn record(&self, bytes: usize) {
        let Some(task) = tokio::task::try_id() else {
            return;
        };
        // The record takes effect here, in the epoch this reads (see `state`).
        let mut state = self.state.load(Ordering::Relaxed);
        if state & RECORDED == 0 {
            state = self.state.fetch_or(RECORDED, Ordering::Relaxed) | RECORDED;
        }
        let epoch = state >> 1;
        let shards = self
            .shards
            .get_or_init(|| (0..SHARDS).map(|_| Shard::default()).collect());
        let mut ledger = shards[shard_index()].0.lock();
        if ledger.counted_in < epoch {
            ledger.clear();
            ledger.counted_in = epoch;
        } else if ledger.counted_in > epoch {
            // A notify came after this record took effect: it is forgotten already.
            return;
        }
        ledger.add(task, bytes);
    }

    /// Memory may have come back: the counts may name freed memory.
    fn forget(&self) {
        // The common case, nothing recorded since the last notify, is one load.
        let state = self.state.load(Ordering::Relaxed);
        if state & RECORDED != 0 {
            // `state + 1`: the next epoch, nothing recorded in it. A failure means the word
            // changed, and from a value with `RECORDED` on only a notify changes it: another
            // notify started the next epoch already, which is all this one needs.
            let _ =
                self.state
                    .compare_exchange(state, state + 1, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// What `tasks` hold, counted since the last notify (summed over every thread's shard: a
    /// task may have run on several).
    fn held_by(&self, tasks: &[tokio::task::Id]) -> usize {
        let epoch = self.state.load(Ordering::Relaxed) >> 1;
        let Some(shards) = self.shards.get() else {
            return 0;
        };
        shards
            .iter()
            .map(|shard| {
                let ledger = shard.0.lock();
                if ledger.counted_in != epoch {
                    return 0;
                }
                tasks.iter().map(|t| ledger.held(t)).sum::<usize>()
            })
            .sum()
    }
}

/// What [`Availability::held_by_waiters`] found: the waiting tasks and what they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldByWaiters {
    pub(crate) bytes: usize,
    pub(crate) tasks: usize,
}

/// The counters behind [`WaitQueueStats`]. Plain std atomics, also under loom: they order
/// nothing, they only count.
#[derive(Debug, Default)]
struct WaitCounts {
    waits: AtomicU64,
    promotions: AtomicU64,
    timeouts: AtomicU64,
    cancellations: AtomicU64,
    waited_nanos: AtomicU64,
}

/// How a wait in the queue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    /// The request got its memory: the waiters of lower level it passed over age.
    Served,
    /// The request failed for good (an error other than a timeout).
    Failed,
    /// Its deadline passed.
    TimedOut,
    /// Its future was dropped.
    Cancelled,
}

/// How many wait queues at or below an availability have waiters: its own queue (while it has
/// any) and each follower whose own count is above 0. Shared with the availabilities it follows,
/// which it tells when its count leaves 0 or returns to it.
#[derive(Debug, Default)]
struct Waiting {
    count: AtomicUsize,
    /// The counts of the availabilities this one follows. Its lock is held while `count`
    /// changes, so a follower added meanwhile is counted exactly once.
    leaders: Mutex<Vec<Arc<Waiting>>>,
    /// The resource's join barrier, if it set one ([`Availability::set_join_barrier`]).
    barrier: OnceLock<JoinBarrier>,
}

/// What a waiter joining a queue runs, for the resource whose availability this is and for
/// every one it follows, once it is counted and before its retry: it takes and lets go every
/// lock under which that resource's frees call [`Availability::nobody_to_notify`].
struct JoinBarrier(Box<dyn Fn() + Send + Sync>);

impl fmt::Debug for JoinBarrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JoinBarrier")
    }
}

impl Waiting {
    fn up(&self) {
        let leaders = self.leaders.lock();
        if self.count.fetch_add(1, Ordering::SeqCst) == 0 {
            for l in leaders.iter() {
                l.up();
            }
        }
    }

    fn down(&self) {
        let leaders = self.leaders.lock();
        if self.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            for l in leaders.iter() {
                l.down();
            }
        }
    }

    fn any(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    /// Runs the join barriers of this availability and of every one it follows.
    fn join_barrier(&self) {
        if let Some(barrier) = self.barrier.get() {
            (barrier.0)();
        }
        // Run outside the lock: a barrier takes the resource's locks.
        let leaders = self.leaders.lock().clone();
        for leader in &leaders {
            leader.join_barrier();
        }
    }
}

impl Availability {
    /// A signal with no waiters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes the oldest waiting allocation (and those of resources following this one) so it
    /// retries. Cheap when nobody waits: a fence and two loads.
    pub fn notify(&self) {
        // The fence in `queue.notify` also orders the caller's state change before the load of
        // `waiting` (see `WaitQueue`): a waiter at a follower counts itself before its retry.
        self.queue.notify();
        self.holders.forget();
        if self.waiting.any() {
            let mut followers = self.followers.lock();
            followers.retain(|f| match f.upgrade() {
                Some(f) => {
                    f.notify();
                    true
                }
                None => false,
            });
        }
    }

    /// Whether a free may skip [`notify`](Self::notify): nobody waits here or at a follower, and
    /// no task's holdings are counted (their bytes must be forgotten by the next notify). Three
    /// relaxed loads, no fence: sound only when read under a lock that the caller held while it
    /// changed the resource's state, and that the resource's
    /// [join barrier](Self::set_join_barrier) takes.
    ///
    /// Why no wake-up is lost (the free side: change state, then read the counts, both under
    /// lock `L`; a joining waiter: count itself (`len` under the queue's lock, then `count`),
    /// then the barrier, which takes `L`, then its retry). `L`'s critical sections are in one
    /// order: if the free's comes first, the barrier's acquire of `L` synchronizes with the
    /// free's release, so the retry sees the new state; if the barrier's comes first, the
    /// waiter's count happens before the free's read, which sees it or a later value, and a
    /// later value is 0 only once every waiter counted has left. A waiter at a follower runs
    /// the barrier of every availability it follows, and its count reaches theirs (`up`)
    /// before that. Holdings: a record happens before the free of the memory it counts (the
    /// pointer is handed out after it), so the free reads `RECORDED` or a later value.
    #[inline]
    pub(crate) fn nobody_to_notify(&self) -> bool {
        self.queue.len_relaxed() == 0
            && self.waiting.count.load(Ordering::Relaxed) == 0
            && self.holders.state.load(Ordering::Relaxed) & RECORDED == 0
    }

    /// Makes every waiter that joins the queue here, or at an availability that follows this
    /// one, call `barrier` once it is counted and before it retries. A resource whose frees
    /// skip [`notify`](Self::notify) when [`nobody_to_notify`](Self::nobody_to_notify) says so
    /// passes a barrier that takes and lets go every lock it reads that under. Set once.
    pub(crate) fn set_join_barrier(&self, barrier: impl Fn() + Send + Sync + 'static) {
        let set = self.waiting.barrier.set(JoinBarrier(Box::new(barrier)));
        assert!(set.is_ok(), "an availability's join barrier is set once");
    }

    /// Counts `bytes` as held by the current tokio task (nothing outside a task): an awaited
    /// allocation got them.
    #[inline]
    pub(crate) fn record_held(&self, bytes: usize) {
        if self.deadlock_detection() {
            self.holders.record(bytes);
        }
    }

    /// Turns deadlock detection on or off for the allocations that wait here (off by
    /// default). With it on, a waiting allocation gets [`Error::WouldDeadlock`] when every byte
    /// of this resource is held by tokio tasks that are themselves waiting on it, as far as
    /// the resource can tell: it counts what each task got through an awaited allocation, and
    /// cannot see memory that a task hands to another task or thread (a producer sending
    /// buffers to a consumer). So turn it on only where the tasks that allocate also free what
    /// they allocated, and never where a waiting task's memory may be freed by someone else:
    /// there, a wait that would have ended is reported as a deadlock. Off, detection costs
    /// nothing: an awaited allocation records nothing.
    ///
    /// [`Error::WouldDeadlock`]: crate::Error::WouldDeadlock
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, LimitingAdaptor, MemoryResource};
    ///
    /// let device = Device::host();
    /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 1 << 20);
    /// let queue = mr.availability().expect("a limit makes requests wait");
    /// assert!(!queue.deadlock_detection());
    /// queue.set_deadlock_detection(true);
    /// assert!(queue.deadlock_detection());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn set_deadlock_detection(&self, on: bool) {
        self.detect_deadlocks
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether deadlock detection is on ([`set_deadlock_detection`](Self::set_deadlock_detection)).
    #[inline]
    pub fn deadlock_detection(&self) -> bool {
        self.detect_deadlocks
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The default [`age_step`](Self::age_step): a waiter rises one level per 128 serves of
    /// higher level that passed it over. In a short queue (the common case) priorities are
    /// then strict; under sustained pressure, with a queue of some hundred waiters, a higher
    /// priority still waits markedly less, while a waiter three levels below the top is
    /// passed over at most 384 times. (The soak's figures: a step of 16 made every priority
    /// wait alike there, 256 let the lowest wait 14 times the top's p99.)
    pub const DEFAULT_AGE_STEP: NonZeroU32 = NonZeroU32::new(128).unwrap();

    /// How many serves of higher level pass a waiter over before it rises one level (see
    /// "Fairness" on [`Availability`] for the rule and the bound it gives); `None` when
    /// priorities are strict. [`DEFAULT_AGE_STEP`](Self::DEFAULT_AGE_STEP) unless set.
    pub fn age_step(&self) -> Option<NonZeroU32> {
        NonZeroU32::new(self.age_step.0.load(Ordering::Relaxed))
    }

    /// Sets how many serves of higher level pass a waiter over before it rises one level;
    /// `None` makes priorities strict (no ageing: a waiter of lower priority waits for as long
    /// as waiters of higher priority keep coming). Takes effect from the next serve; the
    /// levels waiters have reached are kept.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use streamalloc::{Availability, CudaResource, Device, LimitingAdaptor, MemoryResource};
    ///
    /// let device = Device::host();
    /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 1 << 20);
    /// let queue = mr.availability().expect("a limit makes requests wait");
    /// assert_eq!(queue.age_step(), Some(Availability::DEFAULT_AGE_STEP));
    /// queue.set_age_step(NonZeroU32::new(4)); // lower priorities catch up sooner
    /// assert_eq!(queue.age_step(), NonZeroU32::new(4));
    /// queue.set_age_step(None); // strict priorities
    /// assert_eq!(queue.age_step(), None);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn set_age_step(&self, step: Option<NonZeroU32>) {
        self.age_step
            .0
            .store(step.map_or(0, NonZeroU32::get), Ordering::Relaxed);
    }

    /// The tasks waiting here and what they hold, as far as the counts since the last notify
    /// tell (a lower bound). Every waiter outside a tokio task makes it `None`: its holdings
    /// are unknown.
    pub(crate) fn held_by_waiters(&self) -> Option<HeldByWaiters> {
        if !self.deadlock_detection() {
            return None;
        }
        let mut tasks = Vec::new();
        for task in self.queue.tasks() {
            let task = task?;
            if !tasks.contains(&task) {
                tasks.push(task);
            }
        }
        Some(HeldByWaiters {
            bytes: self.holders.held_by(&tasks),
            tasks: tasks.len(),
        })
    }

    /// Whether any allocation waits here or at a resource following this one.
    pub(crate) fn anyone_waiting(&self) -> bool {
        self.waiting.any()
    }

    /// Whether any allocation is waiting.
    #[inline]
    pub fn has_waiters(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Makes every [`notify`](Availability::notify) of `self` also notify `follower`, for as
    /// long as `follower` lives. An adaptor with a limit of its own calls this on its upstream's
    /// availability.
    pub fn add_follower(&self, follower: &std::sync::Arc<Availability>) {
        self.followers
            .lock()
            .push(std::sync::Arc::downgrade(follower));
        let mut leaders = follower.waiting.leaders.lock();
        leaders.push(self.waiting.clone());
        if follower.waiting.count.load(Ordering::SeqCst) > 0 {
            self.waiting.up();
        }
    }

    /// A new signal that every notification of `leader` (an upstream's availability, if it
    /// has one) reaches too: what a resource with waiters of its own over an upstream holds.
    pub(crate) fn following(leader: Option<&Availability>) -> std::sync::Arc<Availability> {
        let follower = std::sync::Arc::new(Availability::new());
        if let Some(leader) = leader {
            leader.add_follower(&follower);
        }
        follower
    }

    /// How the queue has fared: waiters now, and the waits, timeouts, cancellations and time
    /// waited since the resource was made. What [`MemoryStats::wait_queue`] reports.
    ///
    /// [`MemoryStats::wait_queue`]: crate::MemoryStats::wait_queue
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{CudaResource, Device, LimitingAdaptor, MemoryResource, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 1024);
    /// let held = mr.allocate(1024, &stream).await?;
    /// let late = mr.allocate(256, &stream).timeout(Duration::from_millis(5)).await;
    /// assert!(late.is_err());
    /// let stats = mr.availability().unwrap().stats();
    /// assert_eq!((stats.waiting, stats.waits, stats.timeouts), (0, 1, 1));
    /// assert!(stats.time_waited > Duration::ZERO); // about the 5 ms it waited
    /// unsafe { mr.deallocate(held, 1024, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn stats(&self) -> WaitQueueStats {
        let c = &self.counts;
        WaitQueueStats {
            waiting: self.queue.len(),
            waits: c.waits.load(Ordering::Relaxed),
            timeouts: c.timeouts.load(Ordering::Relaxed),
            cancellations: c.cancellations.load(Ordering::Relaxed),
            promotions: c.promotions.load(Ordering::Relaxed),
            time_waited: Duration::from_nanos(c.waited_nanos.load(Ordering::Relaxed)),
        }
    }

    /// Queues a new waiter of `priority` behind every waiter of equal or higher level.
    pub(crate) fn push(&self, waker: &Waker, priority: i32) -> Arc<Waiter> {
        self.counts.waits.fetch_add(1, Ordering::Relaxed);
        let waiter = self.queue.push(waker, priority, || self.waiting.up());
        // Counted now; the caller's retry comes next (see `nobody_to_notify`).
        self.waiting.join_barrier();
        waiter
    }

    /// Takes `waiter` out of the queue as [`remove`](Availability::remove) does, and counts
    /// how its wait ended and how long it took.
    pub(crate) fn finish(&self, waiter: &Arc<Waiter>, end: WaitEnd, waited: Duration) {
        let c = &self.counts;
        if end == WaitEnd::Served {
            let rose = self
                .queue
                .serve(waiter, self.age_step(), || self.waiting.down());
            if rose > 0 {
                c.promotions.fetch_add(u64::from(rose), Ordering::Relaxed);
            }
        } else {
            self.remove(waiter);
        }
        match end {
            WaitEnd::Served | WaitEnd::Failed => {}
            WaitEnd::TimedOut => {
                c.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            WaitEnd::Cancelled => {
                c.cancellations.fetch_add(1, Ordering::Relaxed);
            }
        }
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        c.waited_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Whether `waiter` is the head of the queue (the one allowed to retry): the oldest of
    /// the highest level.
    #[cfg(loom)]
    pub(crate) fn is_head(&self, waiter: &Arc<Waiter>) -> bool {
        self.queue.is_head(waiter)
    }

    /// `waiter` is being polled: it takes the turn it was told of, if any (a waiter that was
    /// told to retry and does not poll for a second loses its place to the next one; see
    /// [`WaitQueue`]), goes back in the queue if it lost its place so (where its level and
    /// arrival put it), and learns whether it is the head, the one allowed to retry.
    pub(crate) fn take_turn(&self, waiter: &Arc<Waiter>) -> bool {
        self.queue
            .take_turn(waiter, || self.waiting.up(), || self.waiting.join_barrier())
    }

    /// Takes `waiter` out of the queue (served, timed out or cancelled), waking the next one if
    /// it was the head.
    pub(crate) fn remove(&self, waiter: &Arc<Waiter>) {
        self.queue.remove(waiter, || self.waiting.down());
    }
}

impl fmt::Debug for Availability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Availability")
            .field("waiters", &self.queue.len())
            .finish()
    }
}

#[cfg(all(test, loom))]
mod loom_tests;

#[cfg(all(test, not(loom)))]
mod ledger_tests;
