use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::*;
use crate::test_support::{self, free, host, recording, Call, KIB, MIB};
use crate::{CudaResource, LimitingAdaptor};

fn oom(bytes: usize, s: &Stream) -> Error {
    Error::OutOfMemory {
        details: None,
        requested: bytes,
        available: Some(0),
        device: s.device().id(),
    }
}

/// RMM's `FailureCallbackTest.RetryAllocationOnce`: over an upstream that always fails, a
/// callback that says "retry" once and then "give up" sees two failures, and the error comes
/// back.
#[test]
fn retries_once_then_returns_the_error() {
    let (device, s) = host();
    let sid = s.id();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let (upstream, calls) = unsafe {
        recording(&device, {
            let device = device.id();
            move |bytes| {
                Err(Error::OutOfMemory {
                    details: None,
                    requested: bytes,
                    available: Some(0),
                    device,
                })
            }
        })
    };
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = attempts.clone();
    let mr = FailureCallbackAdaptor::new(upstream, move |f| {
        seen.lock().push((f.bytes, f.attempt, f.stream.id()));
        assert_eq!(f.error, &oom(f.bytes, f.stream));
        f.attempt == 1
    });
    let e = mr.try_allocate(MIB, &s).unwrap_err();
    assert_eq!(e, oom(MIB, &s));
    assert_eq!(*attempts.lock(), [(MIB, 1, sid), (MIB, 2, sid)]);
    assert_eq!(
        *calls.lock(),
        [Call::Allocate(MIB, sid), Call::Allocate(MIB, sid)]
    );
    // Each call counts its attempts afresh.
    mr.try_allocate(KIB, &s).unwrap_err();
    assert_eq!(attempts.lock()[2..], [(KIB, 1, sid), (KIB, 2, sid)]);
}

/// RMM's `FailureCallbackTest.DifferentExceptionTypes`: only out-of-memory reaches the
/// callback; every other error passes through untouched, after a single attempt.
#[test]
fn other_errors_pass_through_untouched() {
    let (device, s) = host();
    let errors = [
        Error::InvalidArgument("bad size".into()),
        Error::Driver {
            call: "cuMemAlloc",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
            device: device.id(),
        },
        Error::DeviceMismatch {
            expected: device.id(),
            actual: device.id(),
            call: "a test",
        },
    ];
    for error in errors {
        let answer = error.clone();
        // SAFETY: it hands out no pointer: every answer is an error.
        let (upstream, calls) = unsafe { recording(&device, move |_| Err(answer.clone())) };
        let called = Arc::new(AtomicU32::new(0));
        let c = called.clone();
        let mr = FailureCallbackAdaptor::new(upstream, move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            true // would retry forever if it were asked
        });
        assert_eq!(mr.try_allocate(MIB, &s).unwrap_err(), error);
        assert_eq!(called.load(Ordering::SeqCst), 0, "{error}");
        assert_eq!(calls.lock().len(), 1, "{error}");
    }
}

/// RMM's `FailureCallbackTest.ForwardsAlignment`, in our terms: size, pointer and stream go
/// to the upstream unchanged, both ways, and the callback is not involved.
#[test]
fn success_and_frees_are_forwarded() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let (upstream, calls) = unsafe { recording(&device, |_| Ok(DevicePtr::from_raw(0x4_0000))) };
    let mr = FailureCallbackAdaptor::new(upstream, |_| panic!("no failure happened"));
    let p = mr.try_allocate(1024, &s).unwrap();
    assert_eq!(p, DevicePtr::from_raw(0x4_0000));
    free(&mr, p, 1024, &s);
    assert_eq!(
        *calls.lock(),
        [
            Call::Allocate(1024, s.id()),
            Call::Deallocate(p, 1024, s.id())
        ]
    );
}

/// The point of the adaptor: a callback that frees memory turns a failure into a success.
#[test]
fn a_callback_that_frees_memory_makes_the_retry_succeed() {
    let (device, s) = host();
    let limited = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 4 * KIB);
    let spill = Arc::new(Mutex::new(vec![
        limited.try_allocate(2 * KIB, &s).unwrap(),
        limited.try_allocate(2 * KIB, &s).unwrap(),
    ]));
    let (l, sp, st) = (limited.clone(), spill.clone(), s.clone());
    let mr = FailureCallbackAdaptor::new(limited.clone(), move |_| match sp.lock().pop() {
        Some(p) => {
            free(&l, p, 2 * KIB, &st);
            true
        }
        None => false,
    });
    // Needs both spilled blocks: two failures, two spills, then success.
    let p = mr.try_allocate(3 * KIB, &s).unwrap();
    assert!(spill.lock().is_empty());
    assert_eq!(limited.allocated_bytes(), 3 * KIB);
    // Nothing left to spill: the error comes back.
    assert!(mr.try_allocate(2 * KIB, &s).unwrap_err().is_out_of_memory());
    free(&mr, p, 3 * KIB, &s);
    assert_eq!(limited.allocated_bytes(), 0);
}

/// RMM's `SharedOwnership`: allocate through one handle, free through a clone.
#[test]
fn clones_share_the_upstream() {
    let (device, s) = host();
    let limited = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), MIB);
    let mr = FailureCallbackAdaptor::new(limited.clone(), |_| false);
    let copy = mr.clone();
    let p = mr.try_allocate(KIB, &s).unwrap();
    free(&copy, p, KIB, &s);
    assert_eq!(limited.allocated_bytes(), 0);
    assert_eq!(copy.upstream().allocated_bytes(), 0);
    assert_eq!(mr.properties(), limited.properties());
    assert!(format!("{mr:?}").contains("FailureCallbackAdaptor"));
}

/// A callback that says "give up" lets an awaited request wait on the upstream's queue; it
/// is consulted on the request's attempts and not after the free lets it through.
#[test]
fn a_waiting_allocation_resumes_after_a_free() {
    let consulted = Arc::new(AtomicUsize::new(0));
    let c = consulted.clone();
    test_support::a_waiting_allocation_resumes_after_a_free(4 * KIB, 4 * KIB, KIB, |l| {
        FailureCallbackAdaptor::new(l, move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            false
        })
    });
    assert!(consulted.load(Ordering::SeqCst) >= 1);
}
