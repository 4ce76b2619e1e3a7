use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::*;
use crate::test_support::{self, Call, KIB, MIB};
use crate::{CudaResource, Device, Error, HostConfig, LimitingAdaptor};

fn host() -> (Device, Stream) {
    let device = Device::host_with(HostConfig::default());
    let stream = Stream::new(&device).unwrap();
    (device, stream)
}

/// RMM's `CallbackMRTest.TestCallbacksAreInvoked`: one 10 MiB allocate and free reach
/// the closures with the request's size, pointer and stream.
#[test]
fn the_callbacks_are_invoked() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let (mr, calls) =
        unsafe { test_support::recording(&device, |_| Ok(DevicePtr::from_raw(0x1000))) };
    let p = mr.try_allocate(10 * MIB, &s).unwrap();
    assert_eq!(p, DevicePtr::from_raw(0x1000));
    // SAFETY: the recording resource frees nothing; the pointer is its own.
    unsafe { mr.deallocate(p, 10 * MIB, &s) };
    assert_eq!(
        *calls.lock(),
        [
            Call::Allocate(10 * MIB, s.id()),
            Call::Deallocate(p, 10 * MIB, s.id())
        ]
    );
}

/// RMM's `CallbackMRTest.LoggingTest`, with a log in memory instead of stdout.
#[test]
fn closures_can_log() {
    let (device, s) = host();
    let log = Arc::new(Mutex::new(String::new()));
    let upstream = CudaResource::new(&device).unwrap();
    let (up, l1, l2) = (upstream.clone(), log.clone(), log.clone());
    let properties = upstream.properties();
    let free = move |ptr, bytes, stream: &Stream| {
        l2.lock().push_str(&format!("Deallocating {bytes} bytes\n"));
        // SAFETY: called only under `deallocate`'s contract; `ptr` came from a clone
        // of `upstream`.
        unsafe { upstream.deallocate(ptr, bytes, stream) }
    };
    // SAFETY: every pointer is one `upstream` returned for the same request, with its properties:
    // `upstream` keeps the promise.
    let mr = unsafe {
        CallbackResource::new(
            properties,
            move |bytes, stream| {
                l1.lock().push_str(&format!("Allocating {bytes} bytes\n"));
                up.try_allocate(bytes, stream)
            },
            free,
        )
    };
    let p = mr.try_allocate(10 * MIB, &s).unwrap();
    // SAFETY: allocated above with the same size, unused.
    unsafe { mr.deallocate(p, 10 * MIB, &s) };
    assert_eq!(
        *log.lock(),
        format!(
            "Allocating {} bytes\nDeallocating {} bytes\n",
            10 * MIB,
            10 * MIB
        )
    );
}

/// RMM's `CallbackMRAdaptorTest.EqualityAndSharedOwnership`: memory allocated through one
/// handle is freed through a clone, which calls the same closures.
#[test]
fn clones_share_the_closures() {
    let (device, s) = host();
    let frees = Arc::new(AtomicUsize::new(0));
    let f = frees.clone();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let mr = unsafe {
        CallbackResource::new(
            CudaResource::new(&device).unwrap().properties(),
            |_, _| Ok(DevicePtr::from_raw(256)),
            move |_, _, _| {
                f.fetch_add(1, Ordering::SeqCst);
            },
        )
    };
    let copy = mr.clone();
    let p = mr.try_allocate(KIB, &s).unwrap();
    // SAFETY: the closures own no memory.
    unsafe { copy.deallocate(p, KIB, &s) };
    assert_eq!(frees.load(Ordering::SeqCst), 1);
}

#[test]
fn errors_and_properties_are_the_callers() {
    let (device, s) = host();
    let properties = Properties {
        device_accessible: false,
        host_accessible: true,
        device: device.id(),
    };
    // SAFETY: it hands out no pointer: every answer is an error.
    let mr = unsafe {
        CallbackResource::new(
            properties,
            |bytes, stream| {
                Err(Error::OutOfMemory {
                    details: None,
                    requested: bytes,
                    available: Some(7),
                    device: stream.device().id(),
                })
            },
            |_, _, _| {},
        )
    };
    assert_eq!(mr.properties(), properties);
    assert_eq!(mr.capacity_limit(), None);
    assert!(mr.availability().is_none());
    let e = mr.try_allocate(KIB, &s).unwrap_err();
    assert!(matches!(
        e,
        Error::OutOfMemory {
            requested: KIB,
            available: Some(7),
            ..
        }
    ));
    // Without an availability an awaited request fails instead of waiting.
    let e = futures::executor::block_on(mr.allocate(KIB, &s)).unwrap_err();
    assert!(e.is_out_of_memory());
    assert_eq!(mr.with_capacity_limit(MIB).capacity_limit(), Some(MIB));
}

/// With an availability that follows a bounded resource, awaited allocations wait for frees.
#[test]
fn a_waiting_allocation_resumes_after_a_free() {
    test_support::a_waiting_allocation_resumes_after_a_free(4 * KIB, 4 * KIB, KIB, |limited| {
        let availability = Arc::new(Availability::new());
        limited
            .availability()
            .expect("bounded")
            .add_follower(&availability);
        let limit = limited.capacity_limit().expect("bounded");
        let (a, d) = (limited.clone(), limited.clone());
        // SAFETY: called only under `deallocate`'s contract; `ptr` came from `a`, a clone of
        // the same adaptor.
        let free = move |ptr, bytes, stream: &Stream| unsafe { d.deallocate(ptr, bytes, stream) };
        // SAFETY: every pointer is one `limited` returned for the same request, with its
        // properties: `limited` keeps the promise.
        unsafe {
            CallbackResource::new(
                limited.properties(),
                move |bytes, stream| a.try_allocate(bytes, stream),
                free,
            )
        }
        .with_availability(availability)
        .with_capacity_limit(limit)
    });
}

#[test]
fn debug_names_the_settings() {
    let (device, _) = host();
    // SAFETY: it hands out only the null pointer, which is no memory.
    let mr = unsafe {
        CallbackResource::new(
            CudaResource::new(&device).unwrap().properties(),
            |_, _| Ok(DevicePtr::NULL),
            |_, _, _| {},
        )
    }
    .with_capacity_limit(KIB);
    let text = format!("{mr:?}");
    assert!(
        text.contains("CallbackResource") && text.contains("1024"),
        "{text}"
    );
    let _ = LimitingAdaptor::new(mr, KIB); // composes as an upstream
}
