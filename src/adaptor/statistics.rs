use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::resource::contract::forward::{memory_resource, Forward};
use crate::resource::{Allocated, DevicePtr, MemoryResource, MemoryStats, SharedResource};
use crate::stream::Stream;

/// One statistic of a [`StatisticsAdaptor`] scope: RMM's `statistics_resource_adaptor::counter`.
///
/// # Examples
///
/// ```
/// use streamalloc::Counter;
///
/// let c = Counter { value: 512, peak: 1024, total: 2048 };
/// assert!(c.peak >= c.value);
/// assert_eq!(Counter::default(), Counter { value: 0, peak: 0, total: 0 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Counter {
    /// Outstanding now: added by allocations, taken away by frees. Negative when the scope has
    /// freed more than it allocated (memory allocated before the scope, or through another
    /// path).
    pub value: i64,
    /// The highest `value` reached since the scope began.
    pub peak: i64,
    /// Everything ever added since the scope began; frees do not take it away.
    pub total: i64,
}

/// The two counters of a [`StatisticsAdaptor`] scope.
///
/// # Examples
///
/// ```
/// use streamalloc::{Counters, CudaResource, Device, MemoryResource, StatisticsAdaptor, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = StatisticsAdaptor::new(CudaResource::new(&device)?);
/// let p = mr.try_allocate(1000, &stream)?;
/// let Counters { bytes, allocations } = mr.counters();
/// assert_eq!((bytes.value, allocations.value), (1000, 1));
/// unsafe { mr.deallocate(p, 1000, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Counters {
    /// Requested bytes (not rounded up to the 256-byte alignment).
    pub bytes: Counter,
    /// Allocations, 0-byte ones included.
    pub allocations: Counter,
}

/// Counts the bytes and allocations that pass through it, outstanding, peak and total (RMM's
/// `statistics_resource_adaptor`), in nested scopes.
///
/// The counters belong to the innermost *scope*. [`push_counters`](Self::push_counters) opens a
/// new scope whose counters start at zero; [`pop_counters`](Self::pop_counters) closes it and
/// folds it into the scope around it, whose value and total grow by the inner scope's, and whose
/// peak becomes the highest of its own and its value at the push plus the inner peak. The
/// outermost scope lives as long as the adaptor and cannot be popped. A clone shares the
/// counters and the scopes.
///
/// Bytes are the requested sizes, not rounded up. A failed allocation counts nothing. A free is
/// counted before it reaches the upstream, so an upstream that hands the same memory out again
/// at once never shows it twice.
///
/// # Frees the adaptor did not see allocated
/// The adaptor keeps no record of individual allocations (that is
/// [`TrackingAdaptor`](crate::TrackingAdaptor)'s job), so it cannot tell a bad free from a good
/// one: every free takes its `bytes` and one allocation off the innermost scope's value, which
/// goes negative when more is freed than was allocated there, as in RMM (freeing memory
/// allocated outside the adaptor, or before the scope was pushed). The counters are signed
/// 64-bit numbers, so this never wraps; totals and peaks are never lowered by a free.
///
/// # Cost
/// No read-modify-write on the hot path. Each thread that uses the adaptor gets a shard of its
/// own (one cache line, up to 64 threads at a time; a thread gives its shard back when
/// it ends), which only it writes, with plain loads and stores; the figures are the sums over
/// the shards. An allocation then adds up the shards' values (one word per thread that holds a
/// shard) to see whether it sets a new peak, and only a new peak writes a shared word. Threads
/// beyond 64 share one more shard, with atomic additions. Only
/// [`push_counters`](Self::push_counters), [`pop_counters`](Self::pop_counters) and reading the
/// counters take a lock.
///
/// # Exactness
/// Values and totals are exact whenever they are read after the calls they count (every update
/// lands in its thread's shard). Peaks are exact whenever the allocations and frees are ordered
/// one after another (one thread, or threads that hand the work over through a lock, a channel,
/// an executor), wherever they run: each allocation then sees every earlier update. Under
/// truly concurrent calls from several threads, an allocation reads the other shards one by
/// one while they change, so the peak is the highest sum an allocation saw: every term of it a
/// value its shard really held during that allocation, but not necessarily all at one instant
/// (RMM takes a lock on every call to make it exact). An allocation that races a push or pop
/// may have its value counted in one scope and its total in the other, and a peak it reaches
/// may be credited to both.
///
/// # Awaiting memory
/// The adaptor forwards the upstream's [`availability`](MemoryResource::availability) and
/// [`capacity_limit`](MemoryResource::capacity_limit), so awaited allocations wait through it as
/// on the upstream; only the attempt that succeeds is counted.
///
/// # Stream ordering
/// The counters follow the host's calls: an allocation counts from `try_allocate`'s return
/// and stops counting when `deallocate` is called, whatever the device has reached by then.
///
/// # Examples
///
/// RMM's `PeakAllocations` figures:
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, StatisticsAdaptor, Stream};
///
/// const MIB: usize = 1 << 20;
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = StatisticsAdaptor::new(CudaResource::new(&device)?);
///
/// let ptrs: Vec<_> = (0..10).map(|_| mr.try_allocate(10 * MIB, &stream)).collect::<Result<_, _>>()?;
/// for &p in ptrs.iter().step_by(2) {
///     unsafe { mr.deallocate(p, 10 * MIB, &stream) };
/// }
/// let bytes = mr.bytes_counter();
/// assert_eq!((bytes.value, bytes.peak, bytes.total), (50 << 20, 100 << 20, 100 << 20));
/// let allocations = mr.allocations_counter();
/// assert_eq!((allocations.value, allocations.peak, allocations.total), (5, 10, 10));
/// # for &p in ptrs.iter().skip(1).step_by(2) { unsafe { mr.deallocate(p, 10 * MIB, &stream) }; }
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub struct StatisticsAdaptor<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R> {
    upstream: R,
    live: Arc<Live>,
    /// The scopes outside the innermost one, innermost last. Its lock serialises pushes, pops
    /// and reads; the hot path never takes it.
    outer: Mutex<Vec<Saved>>,
}

/// How many threads at a time get a shard of their own; later ones share one more.
const SHARDS: usize = 64;

/// The running counters, in absolute terms since the adaptor was made, as per-thread shards
/// (their sums are the figures): scopes are bases subtracted from them, so opening or closing
/// a scope never loses a concurrent update.
///
/// Invariants: the shards' totals only grow; each peak is at least the value at the innermost
/// scope's push and at least every sum an allocation saw since.
struct Live {
    /// Unique in the process: the key of this adaptor's entry in a thread's claims.
    id: u64,
    shards: Box<[Shard]>,
    /// One past the highest shard ever claimed: the sums read `shards[..used]`.
    used: AtomicUsize,
    /// The shard of the threads that found none free (or whose claims are gone, at thread
    /// exit): updated with atomic additions.
    shared: Shard,
    bytes_peak: AtomicI64,
    allocations_peak: AtomicI64,
}

/// One thread's counters. Only the thread that claimed it writes it (plain load + store), so
/// its updates cost no more than ordinary memory writes.
#[repr(align(128))] // a line (and its adjacent-line prefetch pair) of its own
#[derive(Default)]
struct Shard {
    claimed: AtomicBool,
    bytes: AtomicI64,
    bytes_total: AtomicI64,
    allocations: AtomicI64,
    allocations_total: AtomicI64,
}

/// The four sums over the shards.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    bytes: i64,
    bytes_total: i64,
    allocations: i64,
    allocations_total: i64,
}

/// Adds `n` to a counter only this thread writes: no read-modify-write instruction. Wrapping,
/// as `fetch_add` would.
#[inline]
fn bump(counter: &AtomicI64, n: i64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

/// A thread's claimed shards, one per adaptor it used; given back when the thread ends.
struct Claims(Vec<Claim>);

struct Claim {
    live: Weak<Live>,
    id: u64,
    /// The index of the shard, or `None`: the shared one.
    shard: Option<usize>,
}

impl Drop for Claims {
    fn drop(&mut self) {
        // Calls from later thread-local destructors must not write the shards given back.
        LAST.with(|last| last.set(NO_CLAIM));
        for claim in &self.0 {
            if let (Some(live), Some(i)) = (claim.live.upgrade(), claim.shard) {
                // Release: the next thread to claim it sees this one's last counts.
                live.shards[i].claimed.store(false, Release);
            }
        }
    }
}

thread_local! {
    static CLAIMS: RefCell<Claims> = const { RefCell::new(Claims(Vec::new())) };
    /// The adaptor id and shard index of this thread's last own shard: the hot path's one
    /// look-up (a plain thread-local load; no destructor, so usable to the thread's end).
    static LAST: Cell<(u64, usize)> = const { Cell::new(NO_CLAIM) };
}

/// `LAST` when it names no shard: no adaptor has this id.
const NO_CLAIM: (u64, usize) = (u64::MAX, 0);

impl Live {
    fn new() -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Live {
            id: NEXT_ID.fetch_add(1, Relaxed),
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            used: AtomicUsize::new(0),
            shared: Shard::default(),
            bytes_peak: AtomicI64::new(0),
            allocations_peak: AtomicI64::new(0),
        }
    }

    /// Runs `f` on this thread's shard (`true`: its own, written with plain stores; `false`:
    /// the shared one).
    #[inline]
    fn with_shard<T>(self: &Arc<Self>, f: impl FnOnce(&Shard, bool) -> T) -> T {
        let (id, i) = LAST.with(Cell::get);
        if id == self.id {
            return f(&self.shards[i], true);
        }
        self.with_shard_slow(f)
    }

    /// `with_shard` when the thread's last shard is another adaptor's (or none).
    #[cold]
    fn with_shard_slow<T>(self: &Arc<Self>, f: impl FnOnce(&Shard, bool) -> T) -> T {
        let found = CLAIMS
            .try_with(|claims| {
                let claims = claims.try_borrow().ok()?;
                claims.0.iter().find(|c| c.id == self.id).map(|c| c.shard)
            })
            .ok()
            .flatten();
        let shard = match found {
            Some(shard) => shard,
            None => self.claim(),
        };
        match shard {
            Some(i) => {
                // Unless the thread is ending (its claims gone: then it never comes here).
                if CLAIMS.try_with(|_| ()).is_ok() {
                    LAST.with(|last| last.set((self.id, i)));
                }
                f(&self.shards[i], true)
            }
            None => f(&self.shared, false),
        }
    }

    /// This thread's first call: claims a free shard (or settles for the shared one) and
    /// remembers it; claims of adaptors dropped since are forgotten.
    #[cold]
    fn claim(self: &Arc<Self>) -> Option<usize> {
        let Ok(Some(shard)) = CLAIMS.try_with(|claims| {
            let mut claims = claims.try_borrow_mut().ok()?;
            let free = self.shards.iter().position(|s| {
                s.claimed
                    .compare_exchange(false, true, Acquire, Relaxed)
                    .is_ok()
            });
            if let Some(i) = free {
                self.used.fetch_max(i + 1, Release);
            }
            claims.0.retain(|c| c.live.strong_count() > 0);
            claims.0.push(Claim {
                live: Arc::downgrade(self),
                id: self.id,
                shard: free,
            });
            Some(free)
        }) else {
            // The thread is ending (its claims are gone): the shared shard.
            return None;
        };
        shard
    }

    fn add(self: &Arc<Self>, bytes: i64) {
        self.with_shard(|shard, own| {
            if own {
                bump(&shard.bytes_total, bytes);
                bump(&shard.bytes, bytes);
                bump(&shard.allocations_total, 1);
                bump(&shard.allocations, 1);
            } else {
                shard.bytes_total.fetch_add(bytes, Relaxed);
                shard.bytes.fetch_add(bytes, Relaxed);
                shard.allocations_total.fetch_add(1, Relaxed);
                shard.allocations.fetch_add(1, Relaxed);
            }
        });
        // A new peak? Most allocations do not set one: read before writing.
        let (bytes_now, allocations_now) = self.values();
        if bytes_now > self.bytes_peak.load(Relaxed) {
            self.bytes_peak.fetch_max(bytes_now, Relaxed);
        }
        if allocations_now > self.allocations_peak.load(Relaxed) {
            self.allocations_peak.fetch_max(allocations_now, Relaxed);
        }
    }

    fn sub(self: &Arc<Self>, bytes: i64) {
        self.with_shard(|shard, own| {
            if own {
                bump(&shard.bytes, bytes.wrapping_neg());
                bump(&shard.allocations, -1);
            } else {
                shard.bytes.fetch_sub(bytes, Relaxed);
                shard.allocations.fetch_sub(1, Relaxed);
            }
        });
    }

    /// The shards in use, the shared one included.
    fn in_use(&self) -> impl Iterator<Item = &Shard> {
        let used = self.used.load(Acquire);
        self.shards[..used].iter().chain([&self.shared])
    }

    /// The summed values (bytes, allocations).
    #[inline]
    fn values(&self) -> (i64, i64) {
        let used = self.used.load(Acquire);
        let (mut bytes, mut allocations) = (
            self.shared.bytes.load(Relaxed),
            self.shared.allocations.load(Relaxed),
        );
        for shard in &self.shards[..used] {
            bytes = bytes.wrapping_add(shard.bytes.load(Relaxed));
            allocations = allocations.wrapping_add(shard.allocations.load(Relaxed));
        }
        (bytes, allocations)
    }

    fn sums(&self) -> Sums {
        self.in_use().fold(Sums::default(), |sum, s| Sums {
            bytes: sum.bytes.wrapping_add(s.bytes.load(Relaxed)),
            bytes_total: sum.bytes_total.wrapping_add(s.bytes_total.load(Relaxed)),
            allocations: sum.allocations.wrapping_add(s.allocations.load(Relaxed)),
            allocations_total: sum
                .allocations_total
                .wrapping_add(s.allocations_total.load(Relaxed)),
        })
    }
}

/// A scope's bases: the absolute figures when it was pushed (or zero for the outermost).
#[derive(Debug, Clone, Copy, Default)]
struct Base {
    value: i64,
    total: i64,
}

/// What a push sets aside: the bases of the scope it covers and that scope's peak so far (in
/// absolute terms), plus the bases of the new scope.
#[derive(Debug, Clone, Copy)]
struct Saved {
    bytes: Base,
    bytes_peak: i64,
    allocations: Base,
    allocations_peak: i64,
}

fn bytes_i64(bytes: usize) -> i64 {
    // No allocation exceeds i64::MAX bytes; saturate rather than wrap if one claims to.
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl<R: MemoryResource> StatisticsAdaptor<R> {
    /// Counts what passes through to `upstream`, from zero.
    pub fn new(upstream: R) -> Self {
        StatisticsAdaptor {
            inner: Arc::new(Inner {
                upstream,
                live: Arc::new(Live::new()),
                outer: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The innermost scope's bytes: RMM's `get_bytes_counter`.
    pub fn bytes_counter(&self) -> Counter {
        self.counters().bytes
    }

    /// The innermost scope's allocations: RMM's `get_allocations_counter`.
    pub fn allocations_counter(&self) -> Counter {
        self.counters().allocations
    }

    /// Both counters of the innermost scope.
    pub fn counters(&self) -> Counters {
        let outer = self.inner.outer.lock();
        self.top(outer.last())
    }

    /// How many scopes are open: 1 (the outermost) plus one per push not yet popped.
    pub fn scope_depth(&self) -> usize {
        self.inner.outer.lock().len() + 1
    }

    /// Opens a new innermost scope whose counters start at zero, and returns the counters of the
    /// scope it covers, as they were at the push: RMM's `push_counters`.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, MemoryResource, StatisticsAdaptor, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = StatisticsAdaptor::new(CudaResource::new(&device)?);
    /// let a = mr.try_allocate(100, &stream)?;
    ///
    /// let before = mr.push_counters();
    /// assert_eq!(before.bytes.value, 100);
    /// let b = mr.try_allocate(50, &stream)?;
    /// assert_eq!(mr.bytes_counter().value, 50);       // only the new scope's
    ///
    /// let inner = mr.pop_counters()?;
    /// assert_eq!(inner.bytes.total, 50);
    /// assert_eq!(mr.bytes_counter().value, 150);      // folded into the outer scope
    /// assert!(mr.pop_counters().is_err());            // the outermost scope stays
    /// # unsafe { mr.deallocate(a, 100, &stream); mr.deallocate(b, 50, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn push_counters(&self) -> Counters {
        let mut outer = self.inner.outer.lock();
        let live = &self.inner.live;
        let covered = self.top(outer.last());
        // The new scope starts at the current values; its peak starts there too, and the
        // covered scope's peak so far is set aside until the pop.
        let now = live.sums();
        outer.push(Saved {
            bytes: Base {
                value: now.bytes,
                total: now.bytes_total,
            },
            bytes_peak: live.bytes_peak.swap(now.bytes, Relaxed),
            allocations: Base {
                value: now.allocations,
                total: now.allocations_total,
            },
            allocations_peak: live.allocations_peak.swap(now.allocations, Relaxed),
        });
        covered
    }

    /// Closes the innermost scope, folds it into the one around it, and returns its counters:
    /// RMM's `pop_counters`.
    ///
    /// The outer scope's value and total grow by the popped scope's; its peak becomes the
    /// higher of its own and (its value at the push + the popped peak).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when only the outermost scope is open (RMM throws
    /// `std::out_of_range`); nothing changes then.
    pub fn pop_counters(&self) -> Result<Counters> {
        let mut outer = self.inner.outer.lock();
        let Some(&saved) = outer.last() else {
            return Err(Error::invalid(
                "pop_counters: only the outermost statistics scope is open, and it cannot be \
                 popped (call push_counters first)",
            ));
        };
        let popped = self.top(Some(&saved));
        outer.pop();
        // In absolute terms the fold is a max of peaks: values and totals carry on as they are.
        let live = &self.inner.live;
        live.bytes_peak.fetch_max(saved.bytes_peak, Relaxed);
        live.allocations_peak
            .fetch_max(saved.allocations_peak, Relaxed);
        Ok(popped)
    }

    /// The counters of the innermost scope, whose push set aside `saved` (`None`: the
    /// outermost). Called with the scope lock held.
    fn top(&self, saved: Option<&Saved>) -> Counters {
        top(&self.inner.live, saved)
    }
}

/// The counters of the innermost scope over `live`, whose push set aside `saved` (`None`: the
/// outermost). Called with the scope lock held.
fn top(live: &Live, saved: Option<&Saved>) -> Counters {
    let (bytes, allocations) = saved.map_or((Base::default(), Base::default()), |s| {
        (s.bytes, s.allocations)
    });
    let now = live.sums();
    let counter = |value: i64, total: i64, peak: &AtomicI64, base: Base| {
        let value = value - base.value;
        Counter {
            value,
            // A concurrent allocation may have raised the value before the peak: a peak is
            // never below the value it covers.
            peak: (peak.load(Relaxed) - base.value).max(value),
            total: total - base.total,
        }
    };
    Counters {
        bytes: counter(now.bytes, now.bytes_total, &live.bytes_peak, bytes),
        allocations: counter(
            now.allocations,
            now.allocations_total,
            &live.allocations_peak,
            allocations,
        ),
    }
}

memory_resource!(shared [R: MemoryResource] StatisticsAdaptor<R>);

// SAFETY: every pointer it hands out is one the upstream returned for the same request (it
// only observes the call), and its properties are the upstream's: the upstream's promise holds.
unsafe impl<R: MemoryResource> Forward for Inner<R> {
    #[inline]
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let ptr = self.upstream.try_allocate(bytes, stream)?;
        self.live.add(bytes_i64(bytes));
        Ok(ptr)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // Counted first: once the upstream has the memory back it may hand it out again.
        self.live.sub(bytes_i64(bytes));
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.upstream.deallocate(ptr, bytes, stream) };
    }

    /// The innermost scope's bytes and allocations over the upstream's figures (its reserved
    /// memory, say). A negative value (more freed than allocated in the scope) shows as 0.
    fn memory_stats(&self) -> MemoryStats {
        let counters = {
            let outer = self.outer.lock();
            top(&self.live, outer.last())
        };
        let count = |n: i64| usize::try_from(n).unwrap_or(0);
        self.upstream.memory_stats().with_allocated(Allocated {
            bytes: count(counters.bytes.value),
            peak: Some(count(counters.bytes.peak)),
            allocations: Some(count(counters.allocations.value)),
        })
    }

    /// The innermost scope's peaks become its current values; then the upstream's reset.
    fn reset_peak(&self) {
        {
            // Under the scope lock, so that no push or pop moves the peaks meanwhile.
            let _outer = self.outer.lock();
            let live = &self.live;
            let (bytes, allocations) = live.values();
            live.bytes_peak.store(bytes, Relaxed);
            live.allocations_peak.store(allocations, Relaxed);
        }
        self.upstream.reset_peak();
    }
}

impl<R: MemoryResource> fmt::Debug for StatisticsAdaptor<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counters = self.counters();
        f.debug_struct("StatisticsAdaptor")
            .field("bytes", &counters.bytes)
            .field("allocations", &counters.allocations)
            .field("scope_depth", &self.scope_depth())
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

#[cfg(test)]
mod tests;
