use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::error::{Error, Result};
use crate::resource::contract::forward::{memory_resource, Forward};
use crate::resource::{DevicePtr, MemoryResource, SharedResource, ALLOCATION_ALIGNMENT};
use crate::stream::Stream;

/// Alignment larger than 256 bytes, by over-allocation (RMM's `aligned_resource_adaptor`).
///
/// A request of at least `threshold` bytes asks the upstream for
/// `round_up(bytes, alignment) + alignment - 256` bytes and returns the upstream's pointer
/// rounded up to `alignment`; the free finds the upstream's own pointer again (a map from
/// aligned to original pointers, as in RMM) and returns the same padded size. Smaller requests,
/// 0 bytes, and every request when `alignment` is 256, pass straight through, 256-byte
/// aligned as every resource's are. A clone shares the upstream and the map.
///
/// With an alignment of 4 KiB and a threshold of 64 KiB, a 64 KiB request costs the upstream
/// 69,376 bytes; an upstream pointer of 256 comes back as 4096 (RMM's figures).
///
/// # Awaiting memory
/// The adaptor forwards the upstream's [`availability`](MemoryResource::availability), and its
/// [`capacity_limit`](MemoryResource::capacity_limit) is the largest request whose padded size
/// fits the upstream's, so awaited requests wait through it as on the upstream.
///
/// # Errors
/// [`AlignedAdaptor::new`]: [`Error::InvalidArgument`] for an alignment that is not a power of
/// two of at least 256. Allocation: the upstream's errors (an out-of-memory error names the
/// padded size the upstream was asked for); [`Error::OutOfMemory`] when the padded size
/// overflows, or when the upstream's pointer has no aligned address above it in the 64-bit
/// space (its block is given back).
///
/// # Panics
/// Allocation panics if the upstream hands out memory overlapping a live allocation (two live
/// allocations rounding up to one address), which is a bug of the upstream.
///
/// # Examples
///
/// ```
/// use streamalloc::{AlignedAdaptor, CudaResource, Device, MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = AlignedAdaptor::new(CudaResource::new(&device)?, 4096, 64 << 10)?;
///
/// let big = mr.try_allocate(64 << 10, &stream)?;   // at the threshold: 4 KiB aligned
/// assert!(big.is_aligned(4096));
/// let small = mr.try_allocate(100, &stream)?;      // below it: passed through
/// assert!(small.is_aligned(256));
/// unsafe {
///     mr.deallocate(big, 64 << 10, &stream);
///     mr.deallocate(small, 100, &stream);
/// }
///
/// assert!(AlignedAdaptor::new(CudaResource::new(&device)?, 768, 0).is_err());
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub struct AlignedAdaptor<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R> {
    upstream: R,
    /// A power of two, at least 256.
    alignment: usize,
    /// Requests below this size pass through.
    threshold: usize,
    /// Aligned pointer → the upstream's pointer, for live padded allocations whose upstream
    /// pointer was not aligned already. An entry is removed *before* its memory goes back to
    /// the upstream, so an upstream that hands the same address out again at once never finds
    /// it taken (RMM's ABA case).
    shifted: Mutex<FxHashMap<u64, u64>>,
}

impl<R: MemoryResource> AlignedAdaptor<R> {
    /// Aligns requests of at least `threshold` bytes (0: all of them) to `alignment` bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `alignment` is a power of two of at least 256. (RMM
    /// rounds smaller powers of two up to 256, which every resource's pointers have anyway;
    /// here they are refused as a likely mistake.)
    pub fn new(upstream: R, alignment: usize, threshold: usize) -> Result<Self> {
        if !alignment.is_power_of_two() || alignment < ALLOCATION_ALIGNMENT {
            return Err(Error::invalid(format!(
                "alignment {alignment} is not a power of two of at least {ALLOCATION_ALIGNMENT}"
            )));
        }
        Ok(AlignedAdaptor {
            inner: Arc::new(Inner {
                upstream,
                alignment,
                threshold,
                shifted: Mutex::default(),
            }),
        })
    }

    /// The alignment of requests at or above the threshold.
    pub fn alignment(&self) -> usize {
        self.inner.alignment
    }

    /// Requests below this many bytes pass through.
    pub fn threshold(&self) -> usize {
        self.inner.threshold
    }
}

impl<R: MemoryResource> Inner<R> {
    fn passes_through(&self, bytes: usize) -> bool {
        bytes == 0 || self.alignment == ALLOCATION_ALIGNMENT || bytes < self.threshold
    }

    /// What the upstream is asked for when `bytes` is aligned; `None` on overflow.
    fn padded(&self, bytes: usize) -> Option<usize> {
        let alignment = self.alignment;
        bytes
            .checked_next_multiple_of(alignment)?
            .checked_add(alignment - ALLOCATION_ALIGNMENT)
    }
}

memory_resource!(shared [R: MemoryResource] AlignedAdaptor<R>);

// SAFETY: a pointer it hands out is the upstream's for the same request (passed through), or
// the first multiple of `alignment` (a multiple of 256) in a block of `padded(bytes)` bytes the
// upstream returned: it lies at most `alignment - 256` bytes into the block, so `bytes` bytes
// from it stay inside, and the whole block is this allocation's until it is freed. The
// properties are the upstream's.
unsafe impl<R: MemoryResource> Forward for Inner<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let upstream = &self.upstream;
        if self.passes_through(bytes) {
            return upstream.try_allocate(bytes, stream);
        }
        let size = self.padded(bytes).ok_or_else(|| {
            Error::out_of_memory(bytes, None, stream.device().id())
                .never_fitting(Forward::capacity_limit(self))
        })?;
        // An upstream that says the padded size can never fit is told in this adaptor's
        // terms: the request as made, and the largest one whose padded size fits.
        let original = upstream.try_allocate(size, stream).map_err(|e| match e {
            Error::TooLarge { device, .. } => {
                Error::too_large(bytes, Forward::capacity_limit(self).unwrap_or(0), device)
            }
            e => e,
        })?;
        let Some(aligned) = original
            .addr()
            .checked_next_multiple_of(self.alignment as u64)
        else {
            // No aligned address follows it (a 2^63 alignment, a pointer above 2^63): the
            // block cannot serve the request, so it goes back.
            // SAFETY: `original` came from the upstream's `try_allocate(size)` just now and
            // nothing has used it.
            unsafe { upstream.deallocate(original, size, stream) };
            return Err(Error::OutOfMemory {
                details: None,
                requested: size,
                available: None,
                device: stream.device().id(),
            });
        };
        if aligned != original.addr() {
            let taken = self.shifted.lock().insert(aligned, original.addr());
            assert!(
                taken.is_none(),
                "aligned pointer {aligned:#x} is already live: the upstream handed out \
                 overlapping memory"
            );
        }
        Ok(DevicePtr::from_raw(aligned))
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        let upstream = &self.upstream;
        if self.passes_through(bytes) {
            // SAFETY: forwarded from the caller's contract; the pointer is the upstream's own.
            return unsafe { upstream.deallocate(ptr, bytes, stream) };
        }
        // Out of the map before the memory goes back (see `shifted`).
        let original = self.shifted.lock().remove(&ptr.addr());
        let original = original.map_or(ptr, DevicePtr::from_raw);
        let size = self
            .padded(bytes)
            .expect("the allocation of this size succeeded, so its padded size fits");
        // SAFETY: by the caller's contract `ptr` came from `try_allocate(bytes)` here, which
        // got `original` from the upstream's `try_allocate(size)`; work on it is ordered before
        // this point of `stream`.
        unsafe { upstream.deallocate(original, size, stream) }
    }

    fn capacity_limit(&self) -> Option<usize> {
        let (alignment, threshold) = (self.alignment, self.threshold);
        if alignment == ALLOCATION_ALIGNMENT {
            return self.upstream.capacity_limit();
        }
        // Even without an upstream limit, a request whose padded size overflows can never be
        // served: the limit must say so, or an awaited one would wait for ever.
        let up = self.upstream.capacity_limit().unwrap_or(usize::MAX);
        // The largest padded request whose padded size fits, if it is padded at all...
        let padded = up
            .checked_sub(alignment - ALLOCATION_ALIGNMENT)
            .map(|room| room / alignment * alignment)
            .filter(|&b| b >= threshold.max(1));
        // ...else the largest request below the threshold, which passes through.
        let passed = threshold.checked_sub(1).map(|below| below.min(up));
        Some(padded.or(passed).unwrap_or(0))
    }
}

impl<R: MemoryResource> fmt::Debug for AlignedAdaptor<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedAdaptor")
            .field("alignment", &self.inner.alignment)
            .field("threshold", &self.inner.threshold)
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

#[cfg(test)]
mod tests;
