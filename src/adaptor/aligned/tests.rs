use std::sync::Arc;

use parking_lot::Mutex;

use super::*;
use crate::test_support::{self, free, host, recording, Call, KIB};
use crate::{CallbackResource, CudaResource, Device, LimitingAdaptor};

fn addr(a: u64) -> DevicePtr {
    DevicePtr::from_raw(a)
}

/// An upstream that answers requests with `pointers`, in order, and records the calls.
///
/// # Safety
/// As [`recording`]: the caller uses the pointers as numbers only.
unsafe fn scripted(
    device: &Device,
    pointers: &'static [u64],
) -> (CallbackResource, test_support::Calls) {
    let next = Mutex::new(pointers.iter().copied());
    // SAFETY: the caller's promise.
    unsafe {
        recording(device, move |_| {
            Ok(addr(
                next.lock().next().expect("more requests than scripted"),
            ))
        })
    }
}

/// RMM's `ThrowOnInvalidAllocationAlignment` (255 and 768 fail, 256 works), and smaller
/// powers of two, which RMM rounds up to 256, are refused too.
#[test]
fn invalid_alignments_are_refused() {
    let (device, _) = host();
    for alignment in [0, 1, 32, 64, 128, 255, 768, 4097] {
        let e = AlignedAdaptor::new(CudaResource::new(&device).unwrap(), alignment, 0).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{alignment}: {e}");
    }
    for alignment in [256, 512, 4096, 1 << 21] {
        let mr = AlignedAdaptor::new(CudaResource::new(&device).unwrap(), alignment, 0).unwrap();
        assert_eq!(mr.alignment(), alignment);
    }
}

/// RMM's `DefaultAllocationAlignmentPassthrough`: with 256-byte alignment everything passes
/// through, unpadded, even a pointer the adaptor could not have aligned.
#[test]
fn alignment_256_passes_everything_through() {
    let (device, s) = host();
    // SAFETY: the test uses the scripted pointers as numbers only; nothing touches memory there.
    let (upstream, calls) = unsafe { scripted(&device, &[123]) };
    let mr = AlignedAdaptor::new(upstream, 256, 0).unwrap();
    assert_eq!(mr.try_allocate(5, &s).unwrap(), addr(123));
    free(&mr, addr(123), 5, &s);
    assert_eq!(
        *calls.lock(),
        [
            Call::Allocate(5, s.id()),
            Call::Deallocate(addr(123), 5, s.id())
        ]
    );
}

/// RMM's `BelowAlignmentThresholdPassthrough` (4096 / 65536): 3 and 65528 bytes pass
/// through; and 0 bytes does at any threshold (RMM #2316).
#[test]
fn below_the_threshold_passes_through() {
    let (device, s) = host();
    // SAFETY: the test uses the scripted pointers as numbers only; nothing touches memory there.
    let (upstream, calls) = unsafe { scripted(&device, &[123, 456]) };
    let mr = AlignedAdaptor::new(upstream, 4096, 65536).unwrap();
    assert_eq!(mr.try_allocate(3, &s).unwrap(), addr(123));
    free(&mr, addr(123), 3, &s);
    assert_eq!(mr.try_allocate(65528, &s).unwrap(), addr(456));
    free(&mr, addr(456), 65528, &s);
    let id = s.id();
    assert_eq!(
        *calls.lock(),
        [
            Call::Allocate(3, id),
            Call::Deallocate(addr(123), 3, id),
            Call::Allocate(65528, id),
            Call::Deallocate(addr(456), 65528, id),
        ]
    );

    // SAFETY: it hands out only the null pointer, which is no memory.
    let (upstream, calls) = unsafe { recording(&device, |_| Ok(DevicePtr::NULL)) };
    let mr = AlignedAdaptor::new(upstream, 4096, 0).unwrap();
    assert_eq!(mr.try_allocate(0, &s).unwrap(), DevicePtr::NULL);
    free(&mr, DevicePtr::NULL, 0, &s);
    assert_eq!(
        *calls.lock(),
        [
            Call::Allocate(0, id),
            Call::Deallocate(DevicePtr::NULL, 0, id)
        ]
    );
}

/// RMM's `UpstreamAddressAlreadyAligned`: 65536 bytes ask the upstream for 69376; its
/// pointer 4096 is already aligned and comes back as it is.
#[test]
fn an_aligned_upstream_pointer_comes_back_unchanged() {
    let (device, s) = host();
    // SAFETY: the test uses the scripted pointers as numbers only; nothing touches memory there.
    let (upstream, calls) = unsafe { scripted(&device, &[4096]) };
    let mr = AlignedAdaptor::new(upstream, 4096, 65536).unwrap();
    assert_eq!(mr.try_allocate(65536, &s).unwrap(), addr(4096));
    free(&mr, addr(4096), 65536, &s);
    assert_eq!(
        *calls.lock(),
        [
            Call::Allocate(69376, s.id()),
            Call::Deallocate(addr(4096), 69376, s.id())
        ]
    );
}

/// RMM's `AlignUpstreamAddress`: the upstream's 256 comes back as 4096, and the free
/// returns 256 with the padded size.
#[test]
fn the_upstream_pointer_is_aligned_up_and_found_again() {
    let (device, s) = host();
    // SAFETY: the test uses the scripted pointers as numbers only; nothing touches memory there.
    let (upstream, calls) = unsafe { scripted(&device, &[256]) };
    let mr = AlignedAdaptor::new(upstream, 4096, 65536).unwrap();
    assert_eq!(mr.try_allocate(65536, &s).unwrap(), addr(4096));
    free(&mr, addr(4096), 65536, &s);
    assert_eq!(
        *calls.lock(),
        [
            Call::Allocate(69376, s.id()),
            Call::Deallocate(addr(256), 69376, s.id())
        ]
    );
    assert!(mr.inner.shifted.lock().is_empty());
}

/// RMM's `AlignMultiple`: 65536, 73728 and 77800 bytes ask for 69376, 77568 and 81664;
/// upstream pointers 256, 131584 and 263168 come back as 4096, 135168 and 266240.
#[test]
fn several_live_allocations_each_find_their_own_pointer() {
    let (device, s) = host();
    // SAFETY: the test uses the scripted pointers as numbers only; nothing touches memory there.
    let (upstream, calls) = unsafe { scripted(&device, &[256, 131584, 263168]) };
    let mr = AlignedAdaptor::new(upstream, 4096, 65536).unwrap();
    let sizes = [65536, 73728, 77800];
    let got: Vec<_> = sizes
        .iter()
        .map(|&b| mr.try_allocate(b, &s).unwrap())
        .collect();
    assert_eq!(got, [addr(4096), addr(135168), addr(266240)]);
    for (&p, &b) in got.iter().zip(&sizes) {
        free(&mr, p, b, &s);
    }
    let id = s.id();
    assert_eq!(
        *calls.lock(),
        [
            Call::Allocate(69376, id),
            Call::Allocate(77568, id),
            Call::Allocate(81664, id),
            Call::Deallocate(addr(256), 69376, id),
            Call::Deallocate(addr(131584), 77568, id),
            Call::Deallocate(addr(263168), 81664, id),
        ]
    );
}

/// RMM's `AlignRealPointer` (4096 / 65536), over real (host-backend) memory, with the
/// memory coming back in full.
#[test]
fn real_pointers_are_aligned() {
    let (device, s) = host();
    let mr = AlignedAdaptor::new(CudaResource::new(&device).unwrap(), 4096, 65536).unwrap();
    let live: Vec<_> = (0..16)
        .map(|_| mr.try_allocate(65536, &s).unwrap())
        .collect();
    assert!(live.iter().all(|p| p.is_aligned(4096)), "{live:?}");
    let controls = device.host_controls().unwrap();
    assert_eq!(controls.allocated_bytes(), 16 * 69376);
    for p in live {
        free(&mr, p, 65536, &s);
    }
    s.synchronize_blocking().unwrap();
    assert_eq!(controls.live_allocations(), 0);
    assert!(mr.inner.shifted.lock().is_empty());
}

/// RMM's `MultiThreaded` ABA case, made deterministic: the upstream hands out the address
/// it just took back while the adaptor's free of it is still running. The entry for the
/// old allocation must already be gone, or the new one would collide with it (a panic) or
/// be lost with it (the wrong free later).
#[test]
fn an_address_reused_during_a_free_does_not_collide() {
    let (device, s) = host();
    type Hook = Box<dyn FnOnce() + Send>;
    let hook: Arc<Mutex<Option<Hook>>> = Arc::default();
    let frees = test_support::Calls::default();
    let upstream = {
        let (hook, frees) = (hook.clone(), frees.clone());
        // SAFETY: the test uses the made-up pointer as a number only; nothing touches memory
        // there.
        unsafe {
            CallbackResource::new(
                CudaResource::new(&device).unwrap().properties(),
                |_, _| Ok(addr(256)), // the same address every time, as after a free
                move |p, b, s| {
                    frees.lock().push(Call::Deallocate(p, b, s.id()));
                    let next = hook.lock().take();
                    if let Some(f) = next {
                        f();
                    }
                },
            )
        }
    };
    let mr = AlignedAdaptor::new(upstream, 4096, 0).unwrap();
    let first = mr.try_allocate(8192, &s).unwrap();
    assert_eq!(first, addr(4096));
    let second = Arc::new(Mutex::new(None));
    *hook.lock() = Some(Box::new({
        let (mr, s, second) = (mr.clone(), s.clone(), second.clone());
        move || *second.lock() = Some(mr.try_allocate(8192, &s).unwrap())
    }));
    free(&mr, first, 8192, &s);
    let second = second.lock().take().expect("the hook ran");
    assert_eq!(second, addr(4096));
    free(&mr, second, 8192, &s);
    let id = s.id();
    let padded = 8192 + 3840;
    assert_eq!(
        *frees.lock(),
        [
            Call::Deallocate(addr(256), padded, id),
            Call::Deallocate(addr(256), padded, id)
        ]
    );
    assert!(mr.inner.shifted.lock().is_empty());
}

#[test]
fn an_overflowing_padded_size_is_out_of_memory() {
    let (device, s) = host();
    // SAFETY: it hands out no pointer: the closure is never called.
    let (upstream, calls) = unsafe { recording(&device, |_| unreachable!("never asked")) };
    let mr = AlignedAdaptor::new(upstream, 4096, 0).unwrap();
    let e = mr.try_allocate(usize::MAX - 100, &s).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(calls.lock().is_empty());
}

/// With a 2^63 alignment, an upstream pointer above 2^63 has no aligned address in the
/// 64-bit space: the block goes back and the request is out of memory (before the fix the
/// rounding of the address overflowed).
#[test]
fn an_upstream_pointer_that_cannot_be_aligned_is_given_back() {
    let (device, s) = host();
    // SAFETY: the test uses the scripted pointers as numbers only; nothing touches memory there.
    let (upstream, calls) = unsafe { scripted(&device, &[(1 << 63) + 256]) };
    let mr = AlignedAdaptor::new(upstream, 1 << 63, 0).unwrap();
    let e = mr.try_allocate(256, &s).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let padded = usize::MAX - 255; // 2^63 + 2^63 - 256
    assert_eq!(
        *calls.lock(),
        [
            Call::Allocate(padded, s.id()),
            Call::Deallocate(addr((1 << 63) + 256), padded, s.id())
        ]
    );
    assert!(mr.inner.shifted.lock().is_empty());
}

/// Over an upstream that can make requests wait but has no limit, a request whose padded
/// size overflows can never be served: it fails at once, awaited too, instead of waiting.
#[test]
fn an_overflowing_request_fails_at_once_even_awaited() {
    let (device, s) = host();
    let id = device.id();
    // SAFETY: it hands out no pointer: every answer is an error.
    let up = unsafe {
        CallbackResource::new(
            CudaResource::new(&device).unwrap().properties(),
            move |bytes, _| {
                Err(Error::OutOfMemory {
                    details: None,
                    requested: bytes,
                    available: None,
                    device: id,
                })
            },
            |_, _, _| {},
        )
    }
    .with_availability(Arc::new(crate::Availability::new()));
    let mr = AlignedAdaptor::new(up, 4096, 0).unwrap();
    assert!(mr.capacity_limit().is_some_and(|l| l < usize::MAX - 100));
    // The timeout only turns a hang, which would be the bug, into a failure.
    let r = futures::executor::block_on(
        mr.allocate(usize::MAX - 100, &s)
            .timeout(std::time::Duration::from_secs(5)),
    );
    // Said as what it is: a request that can never fit.
    assert!(matches!(r, Err(Error::TooLarge { .. })), "{r:?}");
}

/// The capacity limit is the largest request whose padded size fits the upstream's.
#[test]
fn the_capacity_limit_accounts_for_padding() {
    let (device, s) = host();
    let limited = |limit| LimitingAdaptor::new(CudaResource::new(&device).unwrap(), limit);
    let no_limit = AlignedAdaptor::new(CudaResource::new(&device).unwrap(), 4096, 0).unwrap();
    let total = device.total_memory().unwrap();
    assert_eq!(
        CudaResource::new(&device).unwrap().capacity_limit(),
        Some(total)
    );
    assert_eq!(
        no_limit.capacity_limit(),
        Some((total - 3840) / 4096 * 4096)
    );
    // 16 KiB, 1 KiB alignment: 15360 + 768 fits; 15361 would need 16384 + 768.
    let mr = AlignedAdaptor::new(limited(16 * KIB), 1024, 0).unwrap();
    assert_eq!(mr.capacity_limit(), Some(15360));
    let p = mr.try_allocate(15360, &s).unwrap();
    free(&mr, p, 15360, &s);
    assert!(mr.try_allocate(15361, &s).unwrap_err().is_out_of_memory());
    // Padded requests can never fit, but those below the threshold pass through.
    let mr = AlignedAdaptor::new(limited(16 * KIB), 8192, 16 * KIB).unwrap();
    assert_eq!(mr.capacity_limit(), Some(16 * KIB - 1));
    let p = mr.try_allocate(16 * KIB - 1, &s).unwrap();
    free(&mr, p, 16 * KIB - 1, &s);
    assert!(mr
        .try_allocate(16 * KIB, &s)
        .unwrap_err()
        .is_out_of_memory());
    // Alignment 256 changes nothing.
    let mr = AlignedAdaptor::new(limited(16 * KIB), 256, 0).unwrap();
    assert_eq!(mr.capacity_limit(), Some(16 * KIB));
    // Nothing fits at all.
    let mr = AlignedAdaptor::new(limited(KIB), 4096, 0).unwrap();
    assert_eq!(mr.capacity_limit(), Some(0));
}

/// Awaiting through the adaptor: 8 KiB (8960 padded) held of 16 KiB, another 8 KiB waits.
#[test]
fn a_waiting_allocation_resumes_after_a_free() {
    test_support::a_waiting_allocation_resumes_after_a_free(16 * KIB, 8 * KIB, 8 * KIB, |l| {
        AlignedAdaptor::new(l, 1024, 0).unwrap()
    });
}

/// RMM's `SharedOwnership`: allocate through one handle, free through a clone.
#[test]
fn clones_share_the_map() {
    let (device, s) = host();
    // SAFETY: the test uses the scripted pointers as numbers only; nothing touches memory there.
    let (upstream, calls) = unsafe { scripted(&device, &[256]) };
    let mr = AlignedAdaptor::new(upstream, 4096, 0).unwrap();
    let copy = mr.clone();
    let p = mr.try_allocate(4096, &s).unwrap();
    free(&copy, p, 4096, &s);
    assert_eq!(
        calls.lock()[1],
        Call::Deallocate(addr(256), 4096 + 3840, s.id())
    );
    assert_eq!(copy.threshold(), 0);
    assert!(format!("{mr:?}").contains("alignment: 4096"));
    let _ = copy.upstream();
}
