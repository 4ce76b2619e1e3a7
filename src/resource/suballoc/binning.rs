//! `BinningResource`: requests routed by size to bins, the rest to an upstream resource.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::resource::contract::availability::Availability;
use crate::resource::contract::forward::memory_resource;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::shared::SharedResource;
use crate::resource::contract::stats::{Allocated, MemoryStats};
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::MemorySnapshot;
use crate::resource::suballoc::fixed_size::FixedSizeResource;
use crate::stream::Stream;

/// How many blocks each fixed-size bin takes from the upstream at a time (RMM's default).
const BIN_BLOCKS: usize = 128;

/// Routes each request by size (RMM's `binning_memory_resource`): the smallest bin whose size
/// holds it serves it, and requests larger than every bin go to the upstream resource.
///
/// Bins are usually [`FixedSizeResource`]s over the same upstream, one per power of two
/// ([`with_range`](BinningResource::with_range)), which serve small requests with a list pop
/// instead of a search; [`add_bin`](BinningResource::add_bin) adds a bin of any size, served by
/// a new fixed-size resource or by a resource of your choice. A 0-byte request goes to the
/// smallest bin.
///
/// # Stream ordering
/// As the resource that serves each request: the bins and the upstream each keep their own
/// stream order. `deallocate` must be given the size the memory was allocated with, which
/// routes it back to the same resource.
///
/// # Awaiting memory
/// The resource has one wait queue ([`Availability`]) that every bin and the upstream wake,
/// so an awaited allocation waits for memory wherever its request is routed, first come,
/// first served across all sizes; a free wakes the oldest waiter through the bin or upstream
/// that takes the memory back (this resource follows each of their queues).
/// [`capacity_limit`](MemoryResource::capacity_limit) is the upstream's: a request larger than
/// every bin and than the upstream could ever hold fails at once. A request waits only where
/// memory can come back for it ([`may_regain_memory`](MemoryResource::may_regain_memory)): one
/// routed to a bin while the bin has blocks in use, one routed to the upstream as the upstream
/// would let it wait. Over plain device memory (which makes nobody wait) a refused large
/// request fails at once, as it would on the upstream itself.
///
/// # Snapshots
/// [`snapshot`](MemoryResource::snapshot) is the upstream's snapshot with the bins' in it,
/// each byte once: a bin's chunk is a live block of the upstream (when the bin takes its
/// memory there), so the bin's segment (blocks that never join) takes the place of that
/// block, and the upstream's segment is cut around it. Bins over another resource show their
/// own segments beside the upstream's. A bin served by the upstream itself (or by the same
/// resource as another bin) adds nothing: its memory is already there; likewise a bin
/// segment that overlaps the upstream's memory outside its live blocks (a view of the
/// upstream). Over an upstream without a snapshot (plain device memory) it shows the bins
/// alone: the large requests served there are not in it.
///
/// ```
/// use streamalloc::{ArenaResource, BinningResource, CudaResource, Device, MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let arena = ArenaResource::new(CudaResource::new(&device)?, Some(16 << 20))?;
/// let mr = BinningResource::with_range(arena.clone(), 12, 14)?; // 4, 8 and 16 KiB bins
/// let p = mr.try_allocate(3000, &stream)?;
/// let snap = mr.snapshot().unwrap();
/// assert_eq!(snap.reserved_bytes(), 16 << 20); // the arena's memory, each byte once
/// assert_eq!(snap.segments.iter().filter(|s| !s.coalesces).count(), 3); // the bins' chunks
/// assert_eq!(snap.live_bytes(), 4096); // the request's block, not the chunks
/// unsafe { mr.deallocate(p, 3000, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
///
/// # Examples
///
/// ```
/// use streamalloc::{BinningResource, CudaResource, Device, MemoryResource, PoolResource, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let pool = PoolResource::new(CudaResource::new(&device)?, 64 << 20, None)?;
/// // Bins of 4 KiB, 8 KiB, ..., 1 MiB over the pool; larger requests go to the pool itself.
/// let mr = BinningResource::with_range(pool, 12, 20)?;
/// let small = mr.allocate(3000, &stream).await?;        // the 4 KiB bin
/// let large = mr.allocate(8 << 20, &stream).await?;     // the pool
/// unsafe {
///     mr.deallocate(small, 3000, &stream);
///     mr.deallocate(large, 8 << 20, &stream);
/// }
/// assert_eq!(mr.bin_sizes(), (12..=20).map(|e| 1 << e).collect::<Vec<usize>>());
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub struct BinningResource<R: MemoryResource + Clone = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R: MemoryResource + Clone> {
    upstream: R,
    /// Sorted by size, sizes distinct. Fixed once anything is allocated (`allocated`): a free
    /// is routed by its size, so a bin added later would take frees of memory it never gave.
    bins: Vec<Bin<R>>,
    availability: Arc<Availability>,
    /// Set by the first successful allocation, never cleared; read by `add_bin`, which has
    /// the resource to itself (`&mut`, unshared), so relaxed suffices. Written once: the
    /// hot path then only reads it.
    allocated: AtomicBool,
}

struct Bin<R: MemoryResource + Clone> {
    /// The largest request the bin serves.
    size: usize,
    resource: BinResource<R>,
}

/// A bin's resource: a fixed-size resource made for it (statically dispatched), or one given.
enum BinResource<R: MemoryResource + Clone> {
    Fixed(FixedSizeResource<R>),
    Given(SharedResource),
}

impl<R: MemoryResource + Clone> BinResource<R> {
    fn resource(&self) -> &dyn MemoryResource {
        match self {
            BinResource::Fixed(r) => r,
            BinResource::Given(r) => r,
        }
    }
}

impl<R: MemoryResource + Clone> BinningResource<R> {
    /// A binning resource with no bins yet: every request goes to `upstream` until bins are
    /// added with [`add_bin`](BinningResource::add_bin).
    pub fn new(upstream: R) -> Self {
        let availability = Availability::following(upstream.availability());
        BinningResource {
            inner: Arc::new(Inner {
                upstream,
                bins: Vec::new(),
                availability,
                allocated: AtomicBool::new(false),
            }),
        }
    }

    /// A binning resource with a fixed-size bin (of 128 blocks at a time) for every power of
    /// two from `2^min_exp` to `2^max_exp` bytes, over `upstream`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `min_exp > max_exp` or `max_exp` is 48 or more (a bin's
    /// batch would not be allocatable); the upstream's error when a bin's first batch cannot be
    /// allocated.
    pub fn with_range(upstream: R, min_exp: u32, max_exp: u32) -> Result<Self> {
        if min_exp > max_exp || max_exp >= 48 {
            return Err(Error::invalid(format!(
                "bin exponents {min_exp}..={max_exp}: the minimum must not exceed the maximum, \
                 which must be below 48"
            )));
        }
        let mut mr = Self::new(upstream);
        for exp in min_exp..=max_exp {
            mr.add_bin(1 << exp, None)?;
        }
        Ok(mr)
    }

    /// Adds a bin for requests of up to `size` bytes (and above the next smaller bin's size),
    /// served by `resource`, or by a new [`FixedSizeResource`] of `size`-byte blocks over the
    /// upstream when `resource` is `None`.
    ///
    /// Bins can be added only while this handle is the only one (before the resource is
    /// cloned, or after every clone is dropped), so that routing never takes a lock, and only
    /// before its first allocation: frees are routed by size, so a new bin would be handed
    /// frees of memory that another bin or the upstream allocated.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `size` is 0, a bin of that size exists, the resource
    /// is shared or has allocated already, `resource`'s capacity limit is below `size`, or its memory lacks an access
    /// the upstream's [`properties`](MemoryResource::properties) claim (the binning resource
    /// reports those for every request); [`Error::DeviceMismatch`] when `resource` is of
    /// another device than the upstream; the upstream's error when a new fixed-size bin's first batch cannot be
    /// allocated.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use streamalloc::{BinningResource, CudaResource, Device, Error, HostResource};
    ///
    /// let device = Device::host();
    /// let mut mr = BinningResource::new(CudaResource::new(&device)?);
    /// mr.add_bin(4096, None)?;                                       // fixed-size blocks
    /// mr.add_bin(1 << 20, Some(Arc::new(HostResource::new(&device)?)))?; // a resource of yours
    /// assert_eq!(mr.bin_sizes(), vec![4096, 1 << 20]);
    /// let shared = mr.clone();
    /// assert!(matches!(mr.add_bin(64, None), Err(Error::InvalidArgument(_))));
    /// # drop(shared);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn add_bin(&mut self, size: usize, resource: Option<SharedResource>) -> Result<()> {
        if size == 0 {
            return Err(Error::invalid("a bin of 0 bytes"));
        }
        let inner = Arc::get_mut(&mut self.inner).ok_or_else(|| {
            Error::invalid("bins can only be added before the binning resource is shared")
        })?;
        if inner.allocated.load(Relaxed) {
            return Err(Error::invalid(format!(
                "a bin of {size} bytes cannot be added after the binning resource's first \
                 allocation ({} bins now): frees are routed by size, and it would get frees of \
                 memory out from another bin or the upstream",
                inner.bins.len()
            )));
        }
        let at = match inner.bins.binary_search_by_key(&size, |b| b.size) {
            Ok(_) => return Err(Error::invalid(format!("a bin of {size} bytes exists"))),
            Err(at) => at,
        };
        let resource = match resource {
            Some(r) => {
                let (wanted, given) = (inner.upstream.properties(), r.properties());
                if wanted.device != given.device {
                    return Err(Error::DeviceMismatch {
                        expected: wanted.device,
                        actual: given.device,
                        call: "BinningResource::add_bin(resource)",
                    });
                }
                // This resource reports the upstream's properties for every request, so a bin
                // must offer each access they claim.
                if (wanted.host_accessible && !given.host_accessible)
                    || (wanted.device_accessible && !given.device_accessible)
                {
                    return Err(Error::invalid(format!(
                        "a bin of {size} bytes served by memory that is host-accessible: {}, \
                         device-accessible: {}, under an upstream whose memory is \
                         host-accessible: {}, device-accessible: {}",
                        given.host_accessible,
                        given.device_accessible,
                        wanted.host_accessible,
                        wanted.device_accessible
                    )));
                }
                // The bin's requests could never succeed there, and awaited ones would wait
                // for ever (the binning resource's limit is the upstream's).
                if let Some(limit) = r.capacity_limit().filter(|&l| l < size) {
                    return Err(Error::invalid(format!(
                        "a bin of {size} bytes served by a resource that holds at most {limit}"
                    )));
                }
                BinResource::Given(r)
            }
            None => BinResource::Fixed(FixedSizeResource::new(
                inner.upstream.clone(),
                size,
                BIN_BLOCKS,
            )?),
        };
        if let Some(a) = resource.resource().availability() {
            a.add_follower(&inner.availability);
        }
        inner.bins.insert(at, Bin { size, resource });
        Ok(())
    }

    /// The bins' sizes, ascending.
    pub fn bin_sizes(&self) -> Vec<usize> {
        self.inner.bins.iter().map(|b| b.size).collect()
    }
}

impl<R: MemoryResource + Clone> Inner<R> {
    /// The bin that serves `bytes`, if any: the smallest that holds it.
    #[inline]
    fn bin(&self, bytes: usize) -> Option<&BinResource<R>> {
        let i = self.bins.partition_point(|b| b.size < bytes);
        self.bins.get(i).map(|b| &b.resource)
    }
}

memory_resource!(shared [R: MemoryResource + Clone] BinningResource<R>);

// SAFETY: a pointer it hands out is one that the bin serving its size, or the upstream,
// returned for the same request: each keeps the promise, is of the upstream's device and
// offers every access the upstream's properties (which this resource reports) claim
// (`add_bin` checks both). Frees route by size back to the resource that allocated.
unsafe impl<R: MemoryResource + Clone> crate::resource::suballoc::base::SubAllocator for Inner<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let done = match self.bin(bytes) {
            Some(BinResource::Fixed(r)) => r.try_allocate(bytes, stream),
            Some(BinResource::Given(r)) => r.try_allocate(bytes, stream),
            None => self.upstream.try_allocate(bytes, stream),
        };
        // A load of a word written once: no store, so no cache line bounces between threads.
        if done.is_ok() && !self.allocated.load(Relaxed) {
            self.allocated.store(true, Relaxed);
        }
        done
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract; `bytes` routes the memory back to the
        // resource that allocated it (the bins are fixed once anything is allocated).
        unsafe {
            match self.bin(bytes) {
                Some(BinResource::Fixed(r)) => r.deallocate(ptr, bytes, stream),
                Some(BinResource::Given(r)) => r.deallocate(ptr, bytes, stream),
                None => self.upstream.deallocate(ptr, bytes, stream),
            }
        }
    }

    /// Its own: the bins' queues and the upstream's follow it (`add_bin`).
    fn wait_queue(&self) -> &Availability {
        &self.availability
    }

    /// The upstream's figures, with the free blocks of the fixed-size bins taken out of
    /// allocated: a bin's chunk is one allocation of the upstream, its blocks in use are the
    /// allocations made here. (A bin's resource of yours reports in its own `memory_stats`.)
    /// Allocated is `None` when the upstream does not count (a plain
    /// [`CudaResource`](crate::CudaResource)): the large requests it serves are not counted here.
    fn memory_stats(&self) -> MemoryStats {
        let stats = self.upstream.memory_stats();
        let Some(mut bytes) = stats.allocated_bytes else {
            return stats;
        };
        let mut allocations = stats.allocations;
        for bin in &self.bins {
            if let BinResource::Fixed(r) = &bin.resource {
                let b = r.memory_stats();
                let chunk = r.block_size() * r.blocks_to_preallocate();
                let reserved = b.reserved_bytes.unwrap_or(0);
                // Saturating: an upstream that counts less than the bins hold (one shared
                // with a reset counter, say) must not make this panic.
                bytes = bytes.saturating_sub(reserved) + b.allocated_bytes.unwrap_or(0);
                allocations = allocations
                    .map(|n| n.saturating_sub(reserved / chunk) + b.allocations.unwrap_or(0));
            }
        }
        stats.with_allocated(Allocated {
            bytes,
            peak: None,
            allocations,
        })
    }

    /// See [`BinningResource`]'s section on snapshots. The bins are read before the upstream,
    /// so that every bin chunk they show is already in the upstream's picture (chunks go back
    /// only when a bin is dropped).
    fn snapshot(&self) -> Option<MemorySnapshot> {
        // A bin served by the upstream itself, or by the resource of an earlier bin, would
        // show the same memory again.
        let mut seen: Vec<&dyn MemoryResource> = vec![&self.upstream];
        let mut bins = Vec::new();
        for bin in &self.bins {
            let r = bin.resource.resource();
            if seen.iter().any(|s| s.is_equal(r)) {
                continue;
            }
            seen.push(r);
            bins.extend(r.snapshot());
        }
        let upstream = self.upstream.snapshot();
        if bins.is_empty() && upstream.is_none() {
            return None;
        }
        let device = self.upstream.properties().device;
        let segments = bins.into_iter().flat_map(|s| s.segments).collect();
        Some(snapshot::nest(device, upstream, segments))
    }

    /// As the bin or the upstream that serves `bytes`.
    fn may_regain_memory(&self, bytes: usize) -> bool {
        match self.bin(bytes) {
            Some(bin) => bin.resource().may_regain_memory(bytes),
            None => self.upstream.may_regain_memory(bytes),
        }
    }
}

impl<R: MemoryResource + Clone> fmt::Debug for BinningResource<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BinningResource")
            .field("bins", &self.bin_sizes())
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

mod snapshot;
#[cfg(test)]
mod tests;
