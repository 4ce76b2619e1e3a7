//! Size math shared by every resource and sub-allocator: the allocation granularity, checked
//! rounding to it, and RMM's arena size classes. One place, so that the pool, the arena, the
//! fixed-size resource and the adaptors round alike.

/// The alignment of every pointer a resource returns, as `cuMemAlloc` guarantees.
pub const ALLOCATION_ALIGNMENT: usize = 256;

/// [`ALLOCATION_ALIGNMENT`] under the short name the allocator cores use: the granularity of
/// every address and size they hand out.
pub(crate) const ALIGN: usize = ALLOCATION_ALIGNMENT;

/// The largest size class; RMM's table ends here (larger requests cannot be served).
const LARGEST_SIZE_CLASS: usize = 256 << 30;

/// `bytes` rounded up to a multiple of [`ALLOCATION_ALIGNMENT`]; `None` when that does not fit
/// a `usize`. Every size rounding goes through here: a request too large to round is one no
/// resource can serve, so callers answer `None` with [`Error::OutOfMemory`].
///
/// [`Error::OutOfMemory`]: crate::Error::OutOfMemory
#[inline]
pub(crate) const fn align_up(bytes: usize) -> Option<usize> {
    match bytes.checked_add(ALLOCATION_ALIGNMENT - 1) {
        Some(padded) => Some(padded & !(ALLOCATION_ALIGNMENT - 1)),
        None => None,
    }
}

/// RMM's jemalloc-style size classes (`align_to_size_class`, used when RMM is built with
/// `RMM_ARENA_USE_SIZE_CLASSES`): multiples of 256 up to 2 KiB, then four classes per doubling
/// (2.5, 3, 3.5, 4 KiB; 5, 6, 7, 8 KiB; ...) up to 256 GiB. `None` above that, or for 0.
///
/// RMM's table lists 54 KiB where the progression (and jemalloc) has 56 KiB; this follows the
/// progression.
pub(crate) fn align_to_size_class(bytes: usize) -> Option<usize> {
    if bytes == 0 {
        return None;
    }
    if bytes <= 2048 {
        return align_up(bytes);
    }
    // bytes lies in (2^k, 2^(k+1)]; classes there are 2^(k-2) apart.
    let k = usize::BITS - 1 - (bytes - 1).leading_zeros();
    let spacing = 1usize << (k - 2);
    let class = bytes.checked_next_multiple_of(spacing)?;
    (class <= LARGEST_SIZE_CLASS).then_some(class)
}

/// The largest size class not above `bytes` (at least 256): the largest request an arena of
/// `bytes` can serve with size classes.
pub(crate) fn largest_size_class_within(bytes: usize) -> usize {
    let bytes = bytes.min(LARGEST_SIZE_CLASS);
    if bytes <= 2048 {
        return (bytes / ALIGN * ALIGN).max(ALIGN);
    }
    // bytes lies in [2^k, 2^(k+1)); the classes there are 2^k and multiples of 2^(k-2).
    let k = usize::BITS - 1 - bytes.leading_zeros();
    let spacing = 1usize << (k - 2);
    bytes / spacing * spacing
}

#[cfg(test)]
mod tests;
