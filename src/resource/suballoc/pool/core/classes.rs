//! The pool core's size classes (TLSF, as in `rlsf`): two levels, a power of two and one of
//! its 32 equal parts. Pure arithmetic on sizes, used by the class index and by the blocks.

use super::types::ALIGN_LOG2;

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
#[cfg(test)]
pub(super) fn class_index_of_size(size: u64) -> usize {
    let (fl, sl) = class_of(size >> ALIGN_LOG2);
    class_index(fl, sl)
}

/// Whether blocks of `a` and `b` bytes (non-zero) are of the same class: as
/// `class_index_of_size(a) == class_index_of_size(b)`, in a third of the instructions (the
/// fast path resizes a block on every allocation and free). Below 32 units every size is a
/// class of its own; above, two sizes share a class when they agree on `a`'s top six bits
/// (which also makes their highest bits the same).
#[inline]
pub(super) fn same_class(a: u64, b: u64) -> bool {
    let (ua, ub) = (a >> ALIGN_LOG2, b >> ALIGN_LOG2);
    if ua < SL_COUNT as u64 {
        return ua == ub;
    }
    let shift = u64::BITS - 1 - ua.leading_zeros() - SL_LOG2;
    ua >> shift == ub >> shift
}

#[cfg(test)]
mod tests {
    use super::{class_index_of_size, same_class, ALIGN_LOG2};

    /// `same_class` agrees with comparing class indices: every pair of sizes up to 1 MiB
    /// within 64 units of each other (the exact classes, the first levels and their borders),
    /// and pairs around each power of two up to 2^62 bytes.
    #[test]
    fn same_class_matches_class_indices() {
        let unit = 1u64 << ALIGN_LOG2;
        for a in 1..4096u64 {
            for b in a.saturating_sub(64).max(1)..a + 64 {
                let (a, b) = (a * unit, b * unit);
                assert_eq!(
                    same_class(a, b),
                    class_index_of_size(a) == class_index_of_size(b),
                    "{a} and {b}"
                );
            }
        }
        for log in ALIGN_LOG2..62 {
            let p = 1u64 << log;
            let near = [
                p - unit,
                p,
                p + unit,
                p + (p >> 5),
                p + (p >> 5) - unit,
                2 * p - unit,
            ];
            for &a in near.iter().filter(|&&s| s > 0 && s % unit == 0) {
                for &b in near.iter().filter(|&&s| s > 0 && s % unit == 0) {
                    assert_eq!(
                        same_class(a, b),
                        class_index_of_size(a) == class_index_of_size(b),
                        "{a} and {b}"
                    );
                }
            }
        }
    }
}
