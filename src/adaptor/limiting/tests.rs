use proptest::prelude::*;

use super::charge;
use crate::{LimitingAdaptor, MemoryResource};

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

/// A double free through the adaptor does not wrap its budget (which would refuse every later
/// request, or with a wrapped count accept any): a free of more than is charged returns
/// nothing and is a deferred error. (A plain count cannot tell a double free while other
/// allocations are charged; the resource below reports that one.)
#[test]
fn a_double_free_leaves_the_budget_whole() {
    let device = crate::Device::host_with(crate::HostConfig::default());
    let s = crate::Stream::new(&device).unwrap();
    let mr = LimitingAdaptor::new(crate::CudaResource::new(&device).unwrap(), 4096);
    let p = mr.try_allocate(1024, &s).unwrap();
    // SAFETY: `p` came from `mr`; the second free is the mistake under test, which neither
    // the adaptor nor the host backend below it lets through.
    unsafe {
        mr.deallocate(p, 1024, &s);
        mr.deallocate(p, 1024, &s);
    }
    assert_eq!(mr.allocated_bytes(), 0);
    let errors: Vec<_> = std::iter::from_fn(|| device.take_deferred_error()).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.to_string().contains("limiting adaptor")),
        "{errors:?}"
    );
    assert!(mr
        .try_allocate(4096 + 256, &s)
        .unwrap_err()
        .is_out_of_memory());
    let r = mr
        .try_allocate(4096, &s)
        .expect("the whole budget is there");
    // SAFETY: `r` came from `mr` with this size.
    unsafe { mr.deallocate(r, 4096, &s) };
    assert_eq!(mr.allocated_bytes(), 0);
}
