//! The size math: RMM's size classes, checked against RMM's table and for their invariants.

use proptest::prelude::*;

use super::*;

/// RMM's `ArenaTest.AlignToSizeClass`.
#[test]
fn size_classes_match_rmm() {
    let cases: [(usize, Option<usize>); 9] = [
        (8, Some(256)),
        (256, Some(256)),
        (264, Some(512)),
        (512, Some(512)),
        (17 << 10, Some(20 << 10)),
        (13 << 20, Some(14 << 20)),
        (2500 << 20, Some(2560 << 20)),
        (128 << 30, Some(128 << 30)),
        (1 << 50, None), // RMM: SIZE_MAX, which no allocation can have
    ];
    for (bytes, class) in cases {
        assert_eq!(align_to_size_class(bytes), class, "class of {bytes}");
    }
    assert_eq!(align_to_size_class(0), None);
    assert_eq!(align_to_size_class(2049), Some(2560));
    assert_eq!(align_to_size_class(50 << 10), Some(56 << 10));
    assert_eq!(align_to_size_class(256 << 30), Some(256 << 30));
    assert_eq!(align_to_size_class((256 << 30) + 1), None);
    assert_eq!(align_to_size_class(usize::MAX), None);
}

proptest! {
    #[test]
    fn size_classes_are_aligned_monotonic_and_fixed_points(
        a in 1..(300usize << 30),
        b in 1..(300usize << 30),
    ) {
        let (lo, hi) = (a.min(b), a.max(b));
        match (align_to_size_class(lo), align_to_size_class(hi)) {
            (Some(cl), Some(ch)) => {
                prop_assert!(cl >= lo && cl % ALIGN == 0);
                prop_assert!(cl <= ch);
                prop_assert_eq!(align_to_size_class(cl), Some(cl));
                // At most four classes per doubling above 2 KiB: the rounding is below 25 %.
                prop_assert!(cl <= 2048 || (cl - lo) * 4 < lo);
            }
            (None, Some(_)) => prop_assert!(false, "{} has no class but {} does", lo, hi),
            (_, None) => prop_assert!(hi > LARGEST_SIZE_CLASS),
        }
    }
}

proptest! {
    #[test]
    fn the_largest_class_within_a_size_is_a_class_and_the_next_one_is_not(
        bytes in 256..(300usize << 30)
    ) {
        let c = largest_size_class_within(bytes);
        prop_assert!(c <= bytes);
        prop_assert_eq!(align_to_size_class(c), Some(c));
        prop_assert!(align_to_size_class(c + 1).is_none_or(|next| next > bytes));
    }
}
