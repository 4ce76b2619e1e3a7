use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::resource::forward::{memory_resource, Forward};
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
/// Lock-free: an allocation is four relaxed atomic additions and two loads (plus a
/// `fetch_max` when it sets a new peak), a free two atomic subtractions. Only
/// [`push_counters`](Self::push_counters), [`pop_counters`](Self::pop_counters) and reading the
/// counters take a lock. The figures are exact whenever no push or pop runs at the same time
/// as allocations; an allocation that races a push or pop may have its value counted in one
/// scope and its total in the other, and a peak it reaches may be credited to both.
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
    live: Live,
    /// The scopes outside the innermost one, innermost last. Its lock serialises pushes, pops
    /// and reads; the hot path never takes it.
    outer: Mutex<Vec<Saved>>,
}

/// The running counters, in absolute terms since the adaptor was made: scopes are bases
/// subtracted from them, so opening or closing a scope never loses a concurrent update.
///
/// Invariants: `*_total` only grow; `*_peak` is at least the value at the innermost scope's
/// push and at least every value an allocation produced since.
#[repr(align(64))] // one cache line of its own: the counters are written together
#[derive(Default)]
struct Live {
    bytes: AtomicI64,
    bytes_total: AtomicI64,
    bytes_peak: AtomicI64,
    allocations: AtomicI64,
    allocations_total: AtomicI64,
    allocations_peak: AtomicI64,
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

fn add(value: &AtomicI64, total: &AtomicI64, peak: &AtomicI64, n: i64) {
    total.fetch_add(n, Relaxed);
    let now = value.fetch_add(n, Relaxed).saturating_add(n);
    // Most allocations do not set a new peak: read before writing.
    if now > peak.load(Relaxed) {
        peak.fetch_max(now, Relaxed);
    }
}

impl<R: MemoryResource> StatisticsAdaptor<R> {
    /// Counts what passes through to `upstream`, from zero.
    pub fn new(upstream: R) -> Self {
        StatisticsAdaptor {
            inner: Arc::new(Inner {
                upstream,
                live: Live::default(),
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
        let bytes = live.bytes.load(Relaxed);
        let allocations = live.allocations.load(Relaxed);
        outer.push(Saved {
            bytes: Base {
                value: bytes,
                total: live.bytes_total.load(Relaxed),
            },
            bytes_peak: live.bytes_peak.swap(bytes, Relaxed),
            allocations: Base {
                value: allocations,
                total: live.allocations_total.load(Relaxed),
            },
            allocations_peak: live.allocations_peak.swap(allocations, Relaxed),
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
    let counter = |value: &AtomicI64, total: &AtomicI64, peak: &AtomicI64, base: Base| {
        let value = value.load(Relaxed) - base.value;
        Counter {
            value,
            // A concurrent allocation may have raised the value before the peak: a peak is
            // never below the value it covers.
            peak: (peak.load(Relaxed) - base.value).max(value),
            total: total.load(Relaxed) - base.total,
        }
    };
    Counters {
        bytes: counter(&live.bytes, &live.bytes_total, &live.bytes_peak, bytes),
        allocations: counter(
            &live.allocations,
            &live.allocations_total,
            &live.allocations_peak,
            allocations,
        ),
    }
}

memory_resource!(shared [R: MemoryResource] StatisticsAdaptor<R>);

impl<R: MemoryResource> Forward for Inner<R> {
    #[inline]
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let ptr = self.upstream.try_allocate(bytes, stream)?;
        let live = &self.live;
        add(
            &live.bytes,
            &live.bytes_total,
            &live.bytes_peak,
            bytes_i64(bytes),
        );
        add(
            &live.allocations,
            &live.allocations_total,
            &live.allocations_peak,
            1,
        );
        Ok(ptr)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // Counted first: once the upstream has the memory back it may hand it out again.
        let live = &self.live;
        live.bytes.fetch_sub(bytes_i64(bytes), Relaxed);
        live.allocations.fetch_sub(1, Relaxed);
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
            live.bytes_peak.store(live.bytes.load(Relaxed), Relaxed);
            live.allocations_peak
                .store(live.allocations.load(Relaxed), Relaxed);
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
