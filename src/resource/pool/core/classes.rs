//! The pool core's size classes (TLSF, as in `rlsf`): two levels, a power of two and one of
//! its 32 equal parts. Pure arithmetic on sizes, used by the class index and by the blocks.

use super::ALIGN_LOG2;

/// log2 of the number of second-level classes per power of two.
pub(super) const SL_LOG2: u32 = 5;
/// The number of second-level classes per power of two.
pub(super) const SL_COUNT: usize = 1 << SL_LOG2;
/// The number of first levels: enough for any size below 2^64 bytes (units below 2^56).
pub(super) const FL_COUNT: usize = (u64::BITS - ALIGN_LOG2 - SL_LOG2 + 1) as usize;
/// The number of size classes of one stream's index.
pub(super) const CLASS_COUNT: usize = FL_COUNT * SL_COUNT;

/// The size class `(first level, second level)` of a block of `units` 256-byte units
/// (`units >= 1`). Classes are ordered: a larger size never maps to a smaller class.
pub(super) fn class_of(units: u64) -> (usize, usize) {
    debug_assert!(units > 0);
    if units < SL_COUNT as u64 {
        (0, units as usize)
    } else {
        let msb = u64::BITS - 1 - units.leading_zeros();
        let shift = msb - SL_LOG2;
        ((shift + 1) as usize, (units >> shift) as usize - SL_COUNT)
    }
}

/// The smallest size, in units, of class `(fl, sl)`.
pub(super) fn class_min(fl: usize, sl: usize) -> u64 {
    if fl == 0 {
        sl as u64
    } else {
        ((SL_COUNT + sl) as u64) << (fl - 1)
    }
}

/// The smallest class whose *every* block holds `units`: the class of `units` rounded up to
/// the next class boundary. `None` when that is past the largest class.
pub(super) fn search_class(units: u64) -> Option<(usize, usize)> {
    debug_assert!(units > 0);
    if units < SL_COUNT as u64 {
        return Some((0, units as usize));
    }
    let msb = u64::BITS - 1 - units.leading_zeros();
    let rounded = units.checked_add((1 << (msb - SL_LOG2)) - 1)?;
    let (fl, sl) = class_of(rounded);
    (fl < FL_COUNT).then_some((fl, sl))
}

/// The flat index of class `(fl, sl)` in [`StreamFree::heads`].
pub(super) fn class_index(fl: usize, sl: usize) -> usize {
    fl * SL_COUNT + sl
}

/// The flat class index of a block of `size` bytes.
pub(super) fn class_index_of_size(size: u64) -> usize {
    let (fl, sl) = class_of(size >> ALIGN_LOG2);
    class_index(fl, sl)
}
