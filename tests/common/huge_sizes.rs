//! Requests near `usize::MAX`: every resource and adaptor answers them with a typed
//! out-of-memory error (a size too large to represent is one no resource can serve), never a
//! panic or a wrapped size, and keeps nothing for them.
//!
//! `huge_requests_fail_cleanly` runs for every resource through `resource_suite!`;
//! `huge_sizes_suite!` adds the cases that look inside one adaptor (its own counters) and
//! replay.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use streamalloc::replay::{parse_log_str, replay, ReplayFailureKind, ReplayOptions};
use streamalloc::{
    AlignedAdaptor, ArenaConfig, ArenaResource, BinningResource, CallbackResource, Counters,
    CudaResource, Device, DeviceBuffer, DevicePtr, FixedSizeResource, LimitingAdaptor,
    MemoryResource, SharedResource, StatisticsAdaptor, Stream, TrackingAdaptor,
};

pub type Make = fn(&Device) -> SharedResource;

/// How long an awaited huge request may take to fail: it must fail at once, so this only
/// turns a wrongful wait into a failure instead of a hang.
const AWAIT_LIMIT: Duration = Duration::from_secs(10);

/// The sizes every test tries first: `usize::MAX - k`, `isize::MAX ± k`, `2^63 ± k` and
/// `2^k ± 1` for large `k`, the edges where rounding up to 256 (or to a larger alignment, a
/// size class, a chunk) overflows or just does not.
pub fn edge_sizes() -> Vec<usize> {
    let mut sizes = Vec::new();
    for k in [0, 1, 2, 127, 128, 255, 256, 257, 4095, 4096, 65535, 1 << 20] {
        sizes.push(usize::MAX - k);
        sizes.push(isize::MAX as usize - k);
        sizes.push((isize::MAX as usize).wrapping_add(k));
        sizes.push((1usize << 63) - k);
        sizes.push((1usize << 63) + k);
    }
    for k in [48, 56, 60, 62, 63] {
        sizes.push((1usize << k) - 1);
        sizes.push(1usize << k);
        sizes.push((1usize << k) + 1);
    }
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// Random sizes around the same edges, for the property tests.
pub fn huge_size() -> impl Strategy<Value = usize> {
    let k = 0usize..(1 << 16);
    prop_oneof![
        k.clone().prop_map(|k| usize::MAX - k),
        k.clone().prop_map(|k| isize::MAX as usize - k),
        k.clone().prop_map(|k| isize::MAX as usize + 1 + k),
        (48u32..64, any::<bool>()).prop_map(|(k, up)| if up {
            (1usize << k) + 1
        } else {
            (1usize << k) - 1
        }),
        (1usize << 62)..=usize::MAX,
    ]
}

fn device_bytes(device: &Device) -> Option<usize> {
    device.host_controls().map(|c| c.allocated_bytes())
}

/// One huge request through `try_allocate`, `allocate().await` and `DeviceBuffer::try_new`:
/// each fails with out-of-memory naming the request.
fn refuse(mr: &SharedResource, bytes: usize, s: &Stream) -> Result<(), TestCaseError> {
    let expect_oom = |how: &str, r: streamalloc::Result<()>| -> Result<(), TestCaseError> {
        match r {
            Ok(()) => Err(TestCaseError::fail(format!("{how}({bytes}) succeeded"))),
            Err(
                streamalloc::Error::OutOfMemory { requested, .. }
                | streamalloc::Error::TooLarge { requested, .. },
            ) => {
                prop_assert!(requested >= bytes, "{how}({bytes}) names {requested} bytes");
                Ok(())
            }
            Err(e) => Err(TestCaseError::fail(format!(
                "{how}({bytes}): {e}, not out-of-memory"
            ))),
        }
    };
    expect_oom("try_allocate", mr.try_allocate(bytes, s).map(drop))?;
    let awaited = block_on(mr.allocate(bytes, s).timeout(AWAIT_LIMIT));
    expect_oom("allocate().await", awaited.map(drop))?;
    expect_oom(
        "DeviceBuffer::try_new",
        DeviceBuffer::try_new(bytes, s, mr.clone()).map(drop),
    )?;
    Ok(())
}

/// After huge requests the resource holds nothing more and still serves a normal request.
fn still_works(device: &Device, mr: &SharedResource, s: &Stream, before: Option<usize>) {
    s.synchronize_blocking().unwrap();
    assert_eq!(
        device_bytes(device),
        before,
        "huge requests left memory held"
    );
    let p = mr
        .try_allocate(4096, s)
        .expect("a normal request after huge ones");
    assert!(p.is_aligned(256));
    // SAFETY: allocated just above with this size, used by nothing.
    unsafe { mr.deallocate(p, 4096, s) };
    s.synchronize_blocking().unwrap();
}

/// The edge sizes, then random ones near them: out-of-memory each time, nothing held after.
pub fn huge_requests_fail_cleanly(device: Device, make: Make) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    // Warm up: pools and arenas keep what they got, and that is not a leak.
    let p = mr.try_allocate(4096, &s).unwrap();
    // SAFETY: allocated just above with this size, used by nothing.
    unsafe { mr.deallocate(p, 4096, &s) };
    s.synchronize_blocking().unwrap();
    let before = device_bytes(&device);
    for bytes in edge_sizes() {
        refuse(&mr, bytes, &s).unwrap_or_else(|e| panic!("{e}"));
    }
    still_works(&device, &mr, &s, before);
    let mut runner = TestRunner::new(Config::with_cases(32));
    runner
        .run(&huge_size(), |bytes| refuse(&mr, bytes, &s))
        .unwrap();
    still_works(&device, &mr, &s, before);
}

/// A limiting adaptor charges nothing for a refused huge request: before the fix the charge
/// wrapped to 0 (release) or the rounding panicked (debug).
pub fn limiting_charges_nothing(device: Device) {
    let mr = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 1 << 30);
    let s = Stream::new(&device).unwrap();
    let held = mr.try_allocate(1000, &s).unwrap();
    assert_eq!(mr.allocated_bytes(), 1024);
    let mut runner = TestRunner::new(Config::with_cases(64));
    let sizes = proptest::sample::select(edge_sizes()).boxed();
    runner
        .run(&prop_oneof![sizes, huge_size().boxed()], |bytes| {
            let e = mr.try_allocate(bytes, &s).unwrap_err();
            prop_assert!(
                matches!(e, streamalloc::Error::OutOfMemory { requested, available: Some(a), .. }
                    if requested == bytes && a == (1 << 30) - 1024)
                    || matches!(e, streamalloc::Error::TooLarge { requested, maximum, .. }
                    if requested == bytes && maximum == 1 << 30),
                "{bytes}: {e:?}"
            );
            let e = block_on(mr.allocate(bytes, &s).timeout(AWAIT_LIMIT)).unwrap_err();
            prop_assert!(e.is_out_of_memory(), "{bytes}: {e:?}");
            prop_assert_eq!(mr.allocated_bytes(), 1024);
            Ok(())
        })
        .unwrap();
    // SAFETY: allocated above with this size, used by nothing.
    unsafe { mr.deallocate(held, 1000, &s) };
    assert_eq!(mr.allocated_bytes(), 0);
    // The whole budget is still there.
    let all = mr.try_allocate(1 << 30, &s).unwrap();
    // SAFETY: allocated just above with this size, used by nothing.
    unsafe { mr.deallocate(all, 1 << 30, &s) };
    assert_eq!(mr.allocated_bytes(), 0);
    s.synchronize_blocking().unwrap();

    // Over an upstream that would serve anything (it hands out addresses, never memory), only
    // the budget refuses: a rounding that wrapped to a charge of 0 would let the request in.
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    // SAFETY: no pointer leaves the adaptor over it: the budget refuses every size the test asks
    // for (checked below).
    let generous = unsafe {
        CallbackResource::new(
            CudaResource::new(&device).unwrap().properties(),
            move |_, _| {
                counted.fetch_add(1, Ordering::Relaxed);
                Ok(DevicePtr::from_raw(1 << 40))
            },
            |_, _, _| {},
        )
    };
    let mr = LimitingAdaptor::new(generous, 1 << 30);
    for bytes in edge_sizes() {
        let e = mr.try_allocate(bytes, &s).unwrap_err();
        assert!(e.is_out_of_memory(), "{bytes}: {e}");
        assert_eq!(mr.allocated_bytes(), 0);
    }
    assert_eq!(asked.load(Ordering::Relaxed), 0, "the upstream was asked");
}

/// Statistics and tracking count nothing for refused huge requests, over a limiting adaptor
/// (whose rounding is where sizes overflowed) and directly over a leaf.
pub fn counters_unchanged(device: Device) {
    let s = Stream::new(&device).unwrap();
    let limited = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 1 << 30);
    let stats = StatisticsAdaptor::new(limited.clone());
    let tracked = TrackingAdaptor::new(stats.clone());
    for bytes in edge_sizes() {
        assert!(tracked
            .try_allocate(bytes, &s)
            .unwrap_err()
            .is_out_of_memory());
        let e = block_on(tracked.allocate(bytes, &s).timeout(AWAIT_LIMIT)).unwrap_err();
        assert!(e.is_out_of_memory(), "{bytes}: {e}");
    }
    assert_eq!(stats.counters(), Counters::default());
    assert_eq!(tracked.allocated_bytes(), 0);
    assert_eq!(limited.allocated_bytes(), 0);
    let p = tracked.try_allocate(4096, &s).unwrap();
    assert_eq!(stats.counters().bytes.value, 4096);
    // SAFETY: allocated just above with this size, used by nothing.
    unsafe { tracked.deallocate(p, 4096, &s) };
    s.synchronize_blocking().unwrap();
}

/// Replaying a log with a huge allocation reports it as refused (out of memory), frees what
/// the log allocated, and does not panic.
pub fn replay_of_huge_sizes(device: Device) {
    let mut log = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    log.push_str("1,10:00:00.000000,allocate,0x7f0000000000,4096,0\n");
    let sizes = edge_sizes();
    for (i, bytes) in sizes.iter().enumerate() {
        let ptr = 0x7f00_0001_0000u64 + (i as u64) * 0x1000;
        log.push_str(&format!("1,10:00:00.000001,allocate,{ptr:#x},{bytes},0\n"));
        log.push_str(&format!("1,10:00:00.000002,free,{ptr:#x},{bytes},0\n"));
    }
    log.push_str("1,10:00:00.000003,free,0x7f0000000000,4096,0\n");
    let events = parse_log_str(&log).unwrap();
    let mr = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 1 << 30);
    let report = replay(&events, &mr, &device, &ReplayOptions::default()).unwrap();
    assert_eq!(report.allocations, 1, "{report}");
    assert_eq!(report.frees, 1, "{report}");
    assert_eq!(report.failures.len(), sizes.len(), "{report}");
    for (failure, &bytes) in report.failures.iter().zip(&sizes) {
        assert_eq!(failure.bytes, bytes);
        assert!(
            matches!(&failure.kind, ReplayFailureKind::AllocationFailed(e) if e.is_out_of_memory()),
            "{failure}"
        );
    }
    assert_eq!(mr.allocated_bytes(), 0);
}

/// Resources whose configuration itself sits at an edge of the size math: size-class
/// rounding, huge alignments (the padded size is what overflows), a bin whose size is
/// `usize::MAX` (routing), a fixed-size resource of the largest block. Huge requests are out of
/// memory and hold nothing; a normal request after them is served or out of memory (a 2^62
/// alignment pads 4 KiB to more than any device has), never anything else.
pub fn edge_configurations(device: Device) {
    let leaf = || CudaResource::new(&device).unwrap();
    let mut binning = BinningResource::new(leaf());
    binning.add_bin(4096, None).unwrap();
    // The leaf behind a callback, which claims no capacity limit, so that the bin is allowed.
    let (up, freeing) = (leaf(), leaf());
    // SAFETY: called only under `deallocate`'s contract; the pointer came from `up`, whose
    // clone `freeing` shares its device's memory.
    let free = move |ptr, bytes, stream: &Stream| unsafe { freeing.deallocate(ptr, bytes, stream) };
    // SAFETY: every pointer is one `up` returned for the same request, with its properties: `up`
    // keeps the promise.
    let unbounded = unsafe {
        CallbackResource::new(
            up.properties(),
            move |bytes, stream| up.try_allocate(bytes, stream),
            free,
        )
    };
    binning
        .add_bin(usize::MAX, Some(Arc::new(unbounded)))
        .unwrap();
    let resources: Vec<(&str, SharedResource)> = vec![
        (
            "arena with size classes",
            Arc::new(
                ArenaResource::with_config(
                    leaf(),
                    ArenaConfig::default()
                        .arena_size(64 << 20)
                        .size_classes(true),
                )
                .unwrap(),
            ),
        ),
        ("binning with a usize::MAX bin", Arc::new(binning)),
        (
            "aligned to 2^62",
            Arc::new(AlignedAdaptor::new(leaf(), 1 << 62, 0).unwrap()),
        ),
        (
            "aligned to 2^63 above 2^40",
            Arc::new(AlignedAdaptor::new(leaf(), 1 << 63, 1 << 40).unwrap()),
        ),
        (
            "limiting to usize::MAX",
            Arc::new(LimitingAdaptor::new(leaf(), usize::MAX)),
        ),
        (
            "limiting to usize::MAX over aligned to 2^20",
            Arc::new(LimitingAdaptor::new(
                AlignedAdaptor::new(leaf(), 1 << 20, 0).unwrap(),
                usize::MAX,
            )),
        ),
    ];
    let s = Stream::new(&device).unwrap();
    // Each resource is kept until the end: an arena dropped gives its memory back on a stream
    // of its own, which would change the device's count under the next resource's check.
    let mut checked = Vec::new();
    for (name, mr) in resources {
        let before = device_bytes(&device);
        for bytes in edge_sizes() {
            refuse(&mr, bytes, &s).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        TestRunner::new(Config::with_cases(16))
            .run(&huge_size(), |bytes| refuse(&mr, bytes, &s))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        s.synchronize_blocking().unwrap();
        assert_eq!(device_bytes(&device), before, "{name} kept memory");
        match mr.try_allocate(4096, &s) {
            // SAFETY: allocated just above with this size, used by nothing.
            Ok(p) => unsafe { mr.deallocate(p, 4096, &s) },
            Err(e) => assert!(e.is_out_of_memory(), "{name}: {e}"),
        }
        s.synchronize_blocking().unwrap();
        checked.push(mr);
    }
    drop(checked);
    // A fixed-size resource of the largest block that rounds to 256 asks its upstream for it
    // at once, and is refused with out-of-memory; one past it does not round at all.
    let e = FixedSizeResource::new(leaf(), usize::MAX - 255, 1).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let e = FixedSizeResource::new(leaf(), usize::MAX - 254, 1).unwrap_err();
    assert!(matches!(e, streamalloc::Error::InvalidArgument(_)), "{e}");
    s.synchronize_blocking().unwrap();
}

/// Instantiates the adaptor-specific huge-size cases on one device kind.
#[macro_export]
macro_rules! huge_sizes_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::huge_sizes;

            $(#[$attr])* #[test] fn limiting_charges_nothing() { huge_sizes::limiting_charges_nothing($device) }
            $(#[$attr])* #[test] fn counters_unchanged() { huge_sizes::counters_unchanged($device) }
            $(#[$attr])* #[test] fn replay_of_huge_sizes() { huge_sizes::replay_of_huge_sizes($device) }
            $(#[$attr])* #[test] fn edge_configurations() { huge_sizes::edge_configurations($device) }
        }
    };
}
