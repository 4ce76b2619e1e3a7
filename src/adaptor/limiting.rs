use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::resource::contract::forward::{memory_resource, Forward};
use crate::resource::{
    align_up, Allocated, Availability, DevicePtr, MemoryResource, MemoryStats, SharedResource,
    ALLOCATION_ALIGNMENT,
};
use crate::stream::Stream;

/// A byte budget over any upstream resource (RMM's `limiting_resource_adaptor`), which is itself
/// awaitable: a request over the remaining budget *waits* for frees when awaited
/// ([`MemoryResource::allocate`]), and a request over the whole limit fails at once.
///
/// Each allocation is charged its size rounded up to 256 bytes. A clone shares the budget.
///
/// # Errors
/// [`Error::OutOfMemory`] with the requested bytes and what is left of the budget from
/// [`try_allocate`](MemoryResource::try_allocate); [`Error::TooLarge`] for a request above the
/// whole budget; the upstream's errors pass through.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamalloc::{CudaResource, Device, LimitingAdaptor, MemoryResource, Stream};
///
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// # rt.block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 1 << 20);
///
/// let first = mr.allocate(1 << 20, &stream).await?;       // the whole budget
/// assert!(mr.try_allocate(256, &stream).unwrap_err().is_out_of_memory());
///
/// let waiter = {
///     let (mr, stream) = (mr.clone(), stream.clone());
///     tokio::spawn(async move { mr.allocate(4096, &stream).await })
/// };
/// tokio::time::sleep(Duration::from_millis(10)).await;
/// assert!(!waiter.is_finished());                          // it waits instead of failing
/// unsafe { mr.deallocate(first, 1 << 20, &stream) };       // ...until memory comes back
/// let second = waiter.await.unwrap()?;
/// unsafe { mr.deallocate(second, 4096, &stream) };
///
/// // Beyond the whole limit: out-of-memory at once, even awaited.
/// assert!(mr.allocate(2 << 20, &stream).await.unwrap_err().is_out_of_memory());
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub struct LimitingAdaptor<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R> {
    upstream: R,
    limit: usize,
    /// Bytes charged against the budget (sizes rounded up to 256).
    used: AtomicUsize,
    /// The most `used` has been since the adaptor was made or its peak reset.
    peak: AtomicUsize,
    availability: Arc<Availability>,
}

/// What a request of `bytes` is charged; `None` when its rounding overflows (no budget holds
/// it).
fn charge(bytes: usize) -> Option<usize> {
    align_up(bytes)
}

impl<R: MemoryResource> LimitingAdaptor<R> {
    /// Limits `upstream` to `limit` bytes outstanding.
    pub fn new(upstream: R, limit: usize) -> Self {
        // Memory the upstream gets back may let a waiter here proceed too.
        let availability = Availability::following(upstream.availability());
        LimitingAdaptor {
            inner: Arc::new(Inner {
                upstream,
                limit,
                used: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                availability,
            }),
        }
    }

    /// The budget in bytes.
    pub fn allocation_limit(&self) -> usize {
        self.inner.limit
    }

    /// Bytes charged now (each allocation rounded up to 256).
    pub fn allocated_bytes(&self) -> usize {
        self.inner.used.load(Ordering::Acquire)
    }
}

impl<R: MemoryResource> Inner<R> {
    fn reserve(&self, requested: usize, stream: &Stream) -> Result<usize> {
        let limit = self.limit;
        let out_of_memory = |used: usize| Error::OutOfMemory {
            details: None,
            requested,
            available: Some(limit.saturating_sub(used)),
            device: stream.device().id(),
        };
        let Some(charged) = charge(requested) else {
            return Err(out_of_memory(self.used.load(Ordering::Acquire))
                .never_fitting(Forward::capacity_limit(self)));
        };
        if charged > limit {
            return Err(out_of_memory(0).never_fitting(Forward::capacity_limit(self)));
        }
        let before = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(charged).filter(|&total| total <= limit)
            })
            .map_err(out_of_memory)?;
        // Most allocations set no new peak: read before writing.
        let now = before + charged;
        if now > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
        Ok(charged)
    }

    /// Returns the charge of a request the upstream refused. It frees nothing, so it wakes
    /// nobody: that would wake the failing head waiter itself, over and over.
    fn release_unused(&self, charged: usize) {
        self.used.fetch_sub(charged, Ordering::AcqRel);
    }
}

memory_resource!(shared [R: MemoryResource] LimitingAdaptor<R>);

// SAFETY: every pointer it hands out is one the upstream returned for the same request (the
// budget only refuses requests), and its properties are the upstream's: its promise holds.
unsafe impl<R: MemoryResource> Forward for Inner<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let charged = self.reserve(bytes, stream)?;
        self.upstream
            .try_allocate(bytes, stream)
            .inspect_err(|_| self.release_unused(charged))
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.upstream.deallocate(ptr, bytes, stream) };
        // A free of more than is charged (a double free, a wrong size) must not wrap the
        // budget and refuse every request after it: it returns nothing and is reported.
        let returned = charge(bytes).and_then(|charged| {
            self.used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    used.checked_sub(charged)
                })
                .ok()
        });
        match returned {
            Some(_) => self.availability.notify(),
            None => stream.device().defer_error(Error::invalid(format!(
                "{ptr} ({bytes} bytes) freed through a limiting adaptor that has less charged \
                 (double free?)"
            ))),
        }
    }

    fn availability(&self) -> Option<&Availability> {
        Some(&self.availability)
    }

    /// A request over what is left of the budget waits while something is charged; one
    /// within it was refused by the upstream, and waits as the upstream would.
    fn may_regain_memory(&self, bytes: usize) -> bool {
        let used = self.used.load(Ordering::Acquire);
        let within_budget = charge(bytes)
            .and_then(|charged| used.checked_add(charged))
            .is_some_and(|total| total <= self.limit);
        if within_budget {
            self.upstream.may_regain_memory(bytes)
        } else {
            used > 0
        }
    }

    /// What is charged (sizes rounded up to 256) and its peak, over the upstream's figures.
    fn memory_stats(&self) -> MemoryStats {
        let used = self.used.load(Ordering::Acquire);
        self.upstream.memory_stats().with_allocated(Allocated {
            bytes: used,
            peak: Some(self.peak.load(Ordering::Relaxed).max(used)),
            allocations: None,
        })
    }

    fn reset_peak(&self) {
        self.peak
            .store(self.used.load(Ordering::Acquire), Ordering::Relaxed);
        self.upstream.reset_peak();
    }

    fn capacity_limit(&self) -> Option<usize> {
        // Requests are charged in 256-byte units: with a limit that is not a multiple of 256,
        // the largest request that can ever fit is the limit rounded down.
        let limit = self.limit / ALLOCATION_ALIGNMENT * ALLOCATION_ALIGNMENT;
        Some(
            self.upstream
                .capacity_limit()
                .map_or(limit, |up| up.min(limit)),
        )
    }
}

impl<R: MemoryResource> fmt::Debug for LimitingAdaptor<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitingAdaptor")
            .field("limit", &self.inner.limit)
            .field("allocated", &self.allocated_bytes())
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

#[cfg(test)]
mod tests;
