//! [`MemoryStats`]: the numbers users look for (PyTorch's `torch.cuda.memory_stats`), one
//! struct for a whole stack of resources.

use std::fmt;
use std::time::Duration;

/// What a resource (and every resource under it) holds and hands out, and how its wait queue
/// fares: PyTorch's `torch.cuda.memory_stats`, in one struct from one call,
/// [`MemoryResource::memory_stats`](crate::MemoryResource::memory_stats), through every
/// adaptor. `Display` prints a `memory_summary`-like table.
///
/// Each number comes from the layer that knows it, nearest the caller:
/// - *allocated* (bytes handed out and not freed, their peak, live allocations): from the
///   nearest layer that counts allocations — a [`StatisticsAdaptor`](crate::StatisticsAdaptor)
///   or [`LimitingAdaptor`](crate::LimitingAdaptor) (each counting what passes through it), else
///   the sub-allocator (pool, arena, fixed-size, binning; sizes as they rounded them);
/// - *reserved* (bytes held from the upstream, and their peak): from the nearest
///   sub-allocator that holds memory ([`PoolResource`](crate::PoolResource),
///   [`ArenaResource`](crate::ArenaResource), …);
/// - the *wait queue*: the queue that awaited allocations through this resource join.
///
/// A number no layer knows is `None` (a plain [`CudaResource`](crate::CudaResource) counts
/// nothing; wrap it in a `StatisticsAdaptor` to count). Peaks are since the layer was made or
/// since [`reset_peak`](crate::MemoryResource::reset_peak).
///
/// # Examples
///
/// A statistics adaptor over a pool: allocated from the adaptor, reserved from the pool.
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource, StatisticsAdaptor, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = StatisticsAdaptor::new(PoolResource::new(CudaResource::new(&device)?, 1 << 20, None)?);
/// let p = mr.try_allocate(1000, &stream)?;
/// let stats = mr.memory_stats();
/// assert_eq!(stats.allocated_bytes, Some(1000));
/// assert_eq!(stats.reserved_bytes, Some(1 << 20));
/// assert_eq!(stats.allocations, Some(1));
/// println!("{stats}");
/// unsafe { mr.deallocate(p, 1000, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Bytes allocated and not freed yet (PyTorch's `allocated_bytes.all.current`).
    pub allocated_bytes: Option<usize>,
    /// The most `allocated_bytes` has been (`allocated_bytes.all.peak`).
    pub peak_allocated_bytes: Option<usize>,
    /// Allocations not freed yet (`allocation.all.current`).
    pub allocations: Option<usize>,
    /// Bytes held from the upstream (or the device), allocated or free
    /// (`reserved_bytes.all.current`).
    pub reserved_bytes: Option<usize>,
    /// The most `reserved_bytes` has been (`reserved_bytes.all.peak`).
    pub peak_reserved_bytes: Option<usize>,
    /// The wait queue of awaited allocations.
    pub wait_queue: WaitQueueStats,
}

/// How the wait queue of a resource ([`Availability`](crate::Availability)) has fared: part of
/// [`MemoryStats`].
///
/// Every awaited allocation that did not find memory at once and joined the queue counts as
/// one wait; it ends served (or failed), timed out, or cancelled (its future dropped).
///
/// ```
/// use streamalloc::Availability;
///
/// let stats = Availability::new().stats();
/// assert_eq!((stats.waiting, stats.waits, stats.timeouts, stats.cancellations), (0, 0, 0, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WaitQueueStats {
    /// Allocations waiting now.
    pub waiting: usize,
    /// Allocations that ever joined the queue.
    pub waits: u64,
    /// Of those, the ones that gave up at their deadline.
    pub timeouts: u64,
    /// Of those, the ones whose future was dropped while it waited.
    pub cancellations: u64,
    /// How many times a waiter rose one level by ageing: it had been passed over by
    /// [`age_step`](crate::Availability::age_step) serves of higher level.
    pub promotions: u64,
    /// The time the waits that ended spent in the queue, added up.
    pub time_waited: Duration,
}

impl MemoryStats {
    /// The allocated figures (`allocated_bytes`, its peak, `allocations`) of `counted`, a
    /// layer that counts allocations, over the rest of `self`. The peak is the layer's own
    /// (a peak from below is of other bytes); a count of allocations it does not keep stays
    /// the one from below, which counts the same allocations.
    pub(crate) fn with_allocated(mut self, counted: Allocated) -> Self {
        self.allocated_bytes = Some(counted.bytes);
        self.peak_allocated_bytes = counted.peak;
        self.allocations = counted.allocations.or(self.allocations);
        self
    }

    /// The reserved figures of a layer that holds memory, over the rest of `self`.
    pub(crate) fn with_reserved(mut self, reserved: usize, peak: usize) -> Self {
        self.reserved_bytes = Some(reserved);
        self.peak_reserved_bytes = Some(peak.max(reserved));
        self
    }
}

/// What a layer that counts allocations knows of them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Allocated {
    pub(crate) bytes: usize,
    pub(crate) peak: Option<usize>,
    pub(crate) allocations: Option<usize>,
}

/// A byte count for people: `1.5 MiB`, `512 B`.
struct Bytes(usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.1} {}", UNITS[unit])
    }
}

impl fmt::Display for MemoryStats {
    /// A `torch.cuda.memory_summary`-like table; a figure no layer knows shows as `-`.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, LimitingAdaptor, MemoryResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 1 << 20);
    /// let p = mr.try_allocate(1536, &stream)?;
    /// let summary = mr.memory_stats().to_string();
    /// assert!(summary.contains("allocated"), "{summary}");
    /// assert!(summary.contains("1.5 KiB (1536 bytes)"), "{summary}");
    /// unsafe { mr.deallocate(p, 1536, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = |b: Option<usize>| match b {
            Some(b) => format!("{} ({b} bytes)", Bytes(b)),
            None => "-".to_string(),
        };
        let count = |n: Option<usize>| n.map_or_else(|| "-".to_string(), |n| n.to_string());
        let w = &self.wait_queue;
        writeln!(f, "memory stats        current                   peak")?;
        writeln!(
            f,
            "allocated           {:<25} {}",
            bytes(self.allocated_bytes),
            bytes(self.peak_allocated_bytes)
        )?;
        writeln!(
            f,
            "reserved            {:<25} {}",
            bytes(self.reserved_bytes),
            bytes(self.peak_reserved_bytes)
        )?;
        writeln!(f, "allocations         {}", count(self.allocations))?;
        write!(
            f,
            "wait queue          {} waiting; {} waits, {} timed out, {} cancelled, {:?} waited",
            w.waiting, w.waits, w.timeouts, w.cancellations, w.time_waited
        )
    }
}
