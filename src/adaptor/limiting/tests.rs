use proptest::prelude::*;

use super::charge;

/// The charge is the size rounded up to 256 while that fits a `usize`, and `None` (out of
/// memory) past it; before the fix the rounding overflowed (a panic in debug, a charge of 0
/// in release).
#[test]
fn charges_round_up_to_256_until_they_overflow() {
    assert_eq!(charge(0), Some(0));
    assert_eq!(charge(1), Some(256));
    assert_eq!(charge(256), Some(256));
    assert_eq!(charge(257), Some(512));
    let last = usize::MAX - 255; // the largest multiple of 256
    assert_eq!(charge(last), Some(last));
    for bytes in [last + 1, usize::MAX - 1, usize::MAX] {
        assert_eq!(charge(bytes), None, "{bytes}");
    }
}

proptest! {
    #[test]
    fn a_charge_covers_its_request_by_less_than_256(bytes in any::<usize>()) {
        match charge(bytes) {
            Some(c) => prop_assert!(c >= bytes && c - bytes < 256 && c % 256 == 0),
            None => prop_assert!(bytes > usize::MAX - 255),
        }
    }
}
