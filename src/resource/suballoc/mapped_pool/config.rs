//! How a mapped pool is set up, and its figures.

/// How a [`MappedPoolResource`](super::MappedPoolResource) is set up: the address range it reserves and how much free
/// memory it keeps mapped.
///
/// ```
/// use streamalloc::MappedPoolConfig;
///
/// let config = MappedPoolConfig::default().reserve(1 << 30).release_threshold(64 << 20);
/// assert_eq!(config.get_reserve(), Some(1 << 30));
/// assert_eq!(config.get_release_threshold(), Some(64 << 20));
/// assert_eq!(MappedPoolConfig::default().get_release_threshold(), None); // up to the peak live
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MappedPoolConfig {
    reserve: Option<usize>,
    release_threshold: Option<usize>,
}

impl MappedPoolConfig {
    crate::builder::option_setters! {
        /// The virtual address range to reserve, in bytes (rounded up to the mapping
        /// granularity): the most the pool can ever hand out at once.
        fn reserve(bytes: usize) => reserve;
    }

    /// The range to reserve; `None` (the default) reserves twice the device's total memory:
    /// address space is cheap, and the slack keeps the holes that long-lived blocks leave in
    /// the range from refusing a request the device's memory could serve.
    pub fn get_reserve(&self) -> Option<usize> {
        self.reserve
    }

    crate::builder::option_setters! {
        /// Free memory the pool keeps mapped, in bytes, instead of the default (what keeps the
        /// mapped bytes within a 32nd, plus a page, of the peak of live bytes). Once wholly
        /// free pages (granules) add up to more, those farthest from the ends of the range
        /// (where blocks are placed) are unmapped and their physical memory released, as soon as the streams
        /// that freed them have passed those frees, down to *half* the threshold: a pair of
        /// allocate and free at the boundary then maps and unmaps once, not at every pair. 0
        /// releases every wholly free page at once, for the smallest footprint at the cost of the
        /// driver calls of mapping the same pages again (tens of microseconds each on a GPU);
        /// `usize::MAX` releases only on [`trim`](super::MappedPoolResource::trim).
        fn release_threshold(bytes: usize) => release_threshold;
    }

    /// The release threshold; `None` (the default) keeps free pages while the mapped bytes
    /// are at most the peak of live bytes (since the pool was made or last trimmed) plus a
    /// 32nd of it and one page, and releases a 32nd of that below: W4's peak footprint within
    /// 5 % of its live bytes with a page mapped per hundred steps, and no driver call in a
    /// steady allocate+free loop.
    pub fn get_release_threshold(&self) -> Option<usize> {
        self.release_threshold
    }
}

/// A snapshot of a mapped pool's accounting ([`MappedPoolResource::statistics`](super::MappedPoolResource::statistics)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MappedPoolStatistics {
    /// The reserved virtual address range, in bytes.
    pub reserved_range: usize,
    /// Bytes of physical memory mapped now: the pool's footprint on the device, its reserved
    /// bytes as [`MemoryStats::reserved_bytes`](crate::MemoryStats::reserved_bytes) spells
    /// them (the address range it holds unmapped is `reserved_range`).
    pub reserved_bytes: usize,
    /// The most `reserved_bytes` has been since the pool was made or its peak reset.
    pub peak_reserved_bytes: usize,
    /// The old spelling of `reserved_bytes`, kept for one release.
    #[deprecated(note = "renamed `reserved_bytes`, as in `MemoryStats`")]
    #[doc(hidden)]
    pub mapped_bytes: usize,
    /// The old spelling of `peak_reserved_bytes`, kept for one release.
    #[deprecated(note = "renamed `peak_reserved_bytes`, as in `MemoryStats`")]
    #[doc(hidden)]
    pub peak_mapped_bytes: usize,
    /// Bytes handed out and not freed, as the pool rounded them (to 256).
    pub allocated_bytes: usize,
    /// Live allocations.
    pub live_allocations: usize,
    /// Free bytes of the range, mapped or not.
    pub free_bytes: usize,
    /// Free blocks of the range.
    pub free_blocks: usize,
    /// The largest free block of the range, mapped or not.
    pub largest_free_block: usize,
    /// Mapped bytes wholly free and waiting for their streams to pass the frees before they
    /// can be released.
    pub pending_release_bytes: usize,
    /// The mapping granularity (2 MiB on an H100 and on the host emulation).
    pub granularity: usize,
}
