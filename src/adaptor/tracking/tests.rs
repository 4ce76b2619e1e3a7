use std::backtrace::BacktraceStatus;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;

use super::*;
use crate::test_support::{self, free, host, recording, Call, KIB, MIB};
use crate::{CallbackResource, CudaResource, Device, Error};

/// A recording upstream that hands out 0x1000, 0x2000, ... and releases nothing, so bad frees
/// reach no real allocator.
///
/// # Safety
/// As [`recording`]: the caller uses the pointers as numbers only.
unsafe fn fake(device: &Device) -> (CallbackResource, test_support::Calls) {
    let next = AtomicU64::new(0);
    // SAFETY: the caller's promise.
    unsafe {
        recording(device, move |_| {
            Ok(DevicePtr::from_raw(
                (next.fetch_add(1, Ordering::Relaxed) + 1) * 0x1000,
            ))
        })
    }
}

#[test]
fn empty() {
    let (device, _) = host();
    let mr = TrackingAdaptor::new(CudaResource::new(&device).unwrap());
    assert_eq!(mr.allocated_bytes(), 0);
    assert_eq!(mr.outstanding_count(), 0);
    assert!(mr.leak_report().is_empty());
    assert_eq!(
        mr.leak_report().to_string(),
        "0 outstanding allocations, 0 B\n"
    );
    assert!(mr.issues().is_empty());
    assert!(!mr.captures_backtraces());
}

#[test]
fn all_freed() {
    let (device, s) = host();
    let mr = TrackingAdaptor::new(CudaResource::new(&device).unwrap());
    let ptrs: Vec<_> = (0..10)
        .map(|_| mr.try_allocate(10 * MIB, &s).unwrap())
        .collect();
    assert_eq!(mr.allocated_bytes(), 100 * MIB);
    assert_eq!(mr.outstanding_count(), 10);
    for p in ptrs {
        free(&mr, p, 10 * MIB, &s);
    }
    assert_eq!(mr.allocated_bytes(), 0);
    assert!(mr.leak_report().is_empty());
    assert_eq!(mr.issue_count(), 0);
    assert!(device.take_deferred_error().is_none());
}

#[test]
fn the_leak_report_lists_what_is_outstanding_in_address_order() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let (up, _) = unsafe { fake(&device) };
    let mr = TrackingAdaptor::new(up);
    let a = mr.try_allocate(KIB, &s).unwrap();
    let b = mr.try_allocate(2 * KIB, &s).unwrap();
    let c = mr.try_allocate(3 * KIB, &s).unwrap();
    free(&mr, b, 2 * KIB, &s);
    let report = mr.leak_report();
    assert_eq!(report.bytes(), 4 * KIB);
    let ptrs: Vec<_> = report.allocations().iter().map(|a| a.ptr).collect();
    assert_eq!(ptrs, [a, c]);
    let sid = s.id().0;
    assert_eq!(
        report.to_string(),
        format!(
            "2 outstanding allocations, 4096 B\n0x1000: 1024 B on stream {sid}\n\
             0x3000: 3072 B on stream {sid}\n"
        )
    );
}

/// RMM's `AllocationsLeftWithStacks`.
#[test]
fn allocations_left_with_backtraces() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let (up, _) = unsafe { fake(&device) };
    let mr = TrackingAdaptor::with_backtraces(up);
    assert!(mr.captures_backtraces());
    let p = mr.try_allocate(KIB, &s).unwrap();
    let all = mr.outstanding_allocations();
    let bt = all[0].backtrace.as_ref().expect("a captured backtrace");
    assert_eq!(bt.status(), BacktraceStatus::Captured);
    let text = mr.leak_report().to_string();
    assert!(
        text.starts_with("1 outstanding allocation, 1024 B\n0x1000: 1024 B on stream"),
        "{text}"
    );
    assert!(text.contains(" : callstack:\n"), "{text}");
    free(&mr, p, KIB, &s);
    assert!(mr.leak_report().is_empty());
}

/// RMM's `AllocationsLeftWithoutStacks`.
#[test]
fn allocations_left_without_backtraces() {
    let (device, s) = host();
    let mr = TrackingAdaptor::new(CudaResource::new(&device).unwrap());
    let ptrs: Vec<_> = (0..10)
        .map(|_| mr.try_allocate(10 * MIB, &s).unwrap())
        .collect();
    for &p in ptrs.iter().step_by(2) {
        free(&mr, p, 10 * MIB, &s);
    }
    let left = mr.outstanding_allocations();
    assert_eq!(left.len(), 5);
    assert!(left.iter().all(|a| a.backtrace.is_none()));
    assert_eq!(mr.allocated_bytes(), 50 * MIB);
    assert!(!mr.leak_report().to_string().contains("callstack"));
    for &p in ptrs.iter().skip(1).step_by(2) {
        free(&mr, p, 10 * MIB, &s);
    }
}

/// RMM's `MultiTracking`: a tracking adaptor over another.
#[test]
fn stacked_adaptors_each_track_what_passes_through_them() {
    let (device, s) = host();
    let outer = TrackingAdaptor::new(CudaResource::new(&device).unwrap());
    let mut ptrs: Vec<_> = (0..10)
        .map(|_| (outer.try_allocate(10 * MIB, &s).unwrap(), false))
        .collect();
    let inner = TrackingAdaptor::new(outer.clone());
    ptrs.extend((0..5).map(|_| (inner.try_allocate(10 * MIB, &s).unwrap(), true)));
    assert_eq!(outer.outstanding_count(), 15);
    assert_eq!(inner.outstanding_count(), 5);
    assert_eq!(outer.allocated_bytes(), 150 * MIB);
    assert_eq!(inner.allocated_bytes(), 50 * MIB);
    for (p, through_inner) in ptrs {
        if through_inner {
            free(&inner, p, 10 * MIB, &s);
        } else {
            free(&outer, p, 10 * MIB, &s);
        }
    }
    assert_eq!((outer.allocated_bytes(), inner.allocated_bytes()), (0, 0));
    assert_eq!(outer.issue_count() + inner.issue_count(), 0);
}

/// RMM's `NegativeInnerTracking` and `UntrackedDeallocationDoesNotUnderflowAllocatedBytes`:
/// frees the inner adaptor never saw are reported there and change nothing; the outer adaptor,
/// which allocated everything, ends at zero.
#[test]
fn untracked_frees_are_reported_and_never_underflow() {
    let (device, s) = host();
    let outer = TrackingAdaptor::new(CudaResource::new(&device).unwrap());
    let mut ptrs: Vec<_> = (0..10)
        .map(|_| outer.try_allocate(10 * MIB, &s).unwrap())
        .collect();
    let inner = TrackingAdaptor::new(outer.clone());
    ptrs.extend((0..5).map(|_| inner.try_allocate(10 * MIB, &s).unwrap()));
    for &p in &ptrs {
        free(&inner, p, 10 * MIB, &s);
    }
    assert_eq!(outer.allocated_bytes(), 0);
    assert_eq!(outer.issue_count(), 0);
    assert_eq!(inner.allocated_bytes(), 0);
    assert_eq!(inner.outstanding_count(), 0);
    assert_eq!(inner.issue_count(), 10);
    let issues = inner.issues();
    assert!(issues.iter().zip(&ptrs).all(|(i, &p)| *i
        == TrackingIssue::UnknownPointer {
            ptr: p,
            bytes: 10 * MIB,
            stream: s.id()
        }));
    assert!(issues[0]
        .to_string()
        .contains("not an outstanding allocation"));
}

/// RMM's `DeallocWrongBytes`: a free with the wrong size still untracks the allocation and
/// takes its recorded size off; the free reaches the upstream as given.
#[test]
fn a_wrong_size_free_untracks_with_the_recorded_size() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let (up, calls) = unsafe { fake(&device) };
    let mr = TrackingAdaptor::new(up);
    let p = mr.try_allocate(10 * MIB, &s).unwrap();
    free(&mr, p, 5 * MIB, &s);
    assert_eq!(mr.allocated_bytes(), 0);
    assert_eq!(mr.outstanding_count(), 0);
    assert_eq!(
        mr.issues(),
        [TrackingIssue::WrongSize {
            ptr: p,
            bytes: 5 * MIB,
            allocated: 10 * MIB,
            stream: s.id()
        }]
    );
    assert_eq!(
        calls.lock().last(),
        Some(&Call::Deallocate(p, 5 * MIB, s.id()))
    );
    // A second free of it is unknown now, and still no underflow.
    free(&mr, p, 10 * MIB, &s);
    assert_eq!(mr.allocated_bytes(), 0);
    assert!(matches!(
        mr.issues()[1],
        TrackingIssue::UnknownPointer { .. }
    ));
    assert_eq!(calls.lock().len(), 3, "every free reaches the upstream");
}

#[test]
fn a_pointer_handed_out_twice_is_reported_and_replaced() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let (up, _) = unsafe { recording(&device, |_| Ok(DevicePtr::from_raw(0x4000))) };
    let mr = TrackingAdaptor::new(up);
    let p = mr.try_allocate(KIB, &s).unwrap();
    let q = mr.try_allocate(3 * KIB, &s).unwrap();
    assert_eq!(p, q);
    assert_eq!(mr.allocated_bytes(), 3 * KIB);
    assert_eq!(mr.outstanding_count(), 1);
    assert_eq!(
        mr.issues(),
        [TrackingIssue::PointerReused {
            ptr: p,
            bytes: 3 * KIB,
            previous: KIB,
            stream: s.id()
        }]
    );
    assert!(mr.issues()[0].to_string().contains("freed without"));
}

#[test]
fn zero_byte_allocations_are_not_recorded() {
    let (device, s) = host();
    let mr = TrackingAdaptor::new(CudaResource::new(&device).unwrap());
    let p = mr.try_allocate(0, &s).unwrap();
    assert!(p.is_null());
    assert_eq!(mr.outstanding_count(), 0);
    free(&mr, p, 0, &s);
    assert_eq!(mr.issue_count(), 0);
}

#[test]
fn failed_allocations_are_not_recorded() {
    let (device, s) = host();
    let mr = TrackingAdaptor::new(CudaResource::new(&device).unwrap());
    assert!(mr.try_allocate(1 << 50, &s).unwrap_err().is_out_of_memory());
    // SAFETY: it hands out no pointer: every answer is an error.
    let (broken, _) = unsafe { recording(&device, |_| Err(Error::invalid("nope"))) };
    let broken = TrackingAdaptor::new(broken);
    assert_eq!(
        broken.try_allocate(KIB, &s).unwrap_err(),
        Error::invalid("nope")
    );
    assert_eq!(mr.outstanding_count() + broken.outstanding_count(), 0);
}

/// RMM's `MultiThreaded` ordering test, made deterministic: when the free reaches the
/// upstream, the record is already gone.
#[test]
fn a_record_is_removed_before_the_free_reaches_the_upstream() {
    let (device, s) = host();
    let adaptor: Arc<OnceLock<TrackingAdaptor<CallbackResource>>> = Arc::default();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let (a, seen_d) = (adaptor.clone(), seen.clone());
    let next = AtomicU64::new(1);
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let up = unsafe {
        CallbackResource::new(
            CudaResource::new(&device).unwrap().properties(),
            move |_, _| {
                Ok(DevicePtr::from_raw(
                    next.fetch_add(1, Ordering::Relaxed) * 256,
                ))
            },
            move |_, _, _| {
                let mr = a.get().expect("set below");
                seen_d.lock().push(mr.outstanding_count());
            },
        )
    };
    let mr = TrackingAdaptor::new(up);
    assert!(adaptor.set(mr.clone()).is_ok());
    let p = mr.try_allocate(256, &s).unwrap();
    let q = mr.try_allocate(256, &s).unwrap();
    free(&mr, p, 256, &s);
    free(&mr, q, 256, &s);
    assert_eq!(*seen.lock(), [1, 0]);
}

#[test]
fn issues_beyond_the_cap_are_counted_not_kept() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let (up, _) = unsafe { fake(&device) };
    let mr = TrackingAdaptor::new(up);
    let n = MAX_TRACKING_ISSUES + 5;
    for i in 0..n {
        free(&mr, DevicePtr::from_raw((i as u64 + 1) * 256), 256, &s);
    }
    assert_eq!(mr.issue_count(), n as u64);
    assert_eq!(mr.issues().len(), MAX_TRACKING_ISSUES);
    assert!(format!("{mr:?}").contains(&format!("issues: {n}")));
}

#[test]
fn concurrent_allocations_and_frees_leave_nothing() {
    let (device, s) = host();
    let mr = TrackingAdaptor::new(CudaResource::new(&device).unwrap());
    thread::scope(|scope| {
        for t in 0..4 {
            let (mr, s) = (&mr, &s);
            scope.spawn(move || {
                let mut held = Vec::new();
                for i in 0..100 {
                    let bytes = (t * 100 + i + 1) * 8;
                    held.push((mr.try_allocate(bytes, s).unwrap(), bytes));
                    if i % 3 == 0 {
                        let (p, b) = held.swap_remove(0);
                        free(mr, p, b, s);
                    }
                }
                for (p, b) in held {
                    free(mr, p, b, s);
                }
            });
        }
    });
    assert_eq!(mr.outstanding_count(), 0);
    assert_eq!(mr.allocated_bytes(), 0);
    assert_eq!(mr.issue_count(), 0);
    s.synchronize_blocking().unwrap();
}

/// A `MakeWriter` that appends to a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<parking_lot::Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// RMM's `LogOutstandingAllocations`, and issues logged at ERROR.
#[test]
fn leaks_and_issues_are_logged_through_tracing() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let (up, _) = unsafe { fake(&device) };
    let mr = TrackingAdaptor::new(up);
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let _p = mr.try_allocate(KIB, &s).unwrap();
        mr.log_outstanding_allocations();
        free(&mr, DevicePtr::from_raw(0x9900), 256, &s);
    });
    let text = String::from_utf8(out.0.lock().clone()).unwrap();
    assert!(
        text.contains("Outstanding Allocations: 1 outstanding allocation, 1024 B"),
        "{text}"
    );
    assert!(text.contains("0x1000: 1024 B"), "{text}");
    assert!(text.contains("ERROR"), "{text}");
    assert!(text.contains("free of 0x9900"), "{text}");
}

#[test]
fn clones_share_records_and_forward_the_upstream() {
    let (device, s) = host();
    let mr = TrackingAdaptor::new(crate::LimitingAdaptor::new(
        CudaResource::new(&device).unwrap(),
        MIB,
    ));
    let copy = mr.clone();
    let p = mr.try_allocate(KIB, &s).unwrap();
    assert_eq!(copy.outstanding_count(), 1);
    free(&copy, p, KIB, &s);
    assert_eq!(mr.outstanding_count(), 0);
    assert_eq!(mr.capacity_limit(), Some(MIB));
    assert!(mr.availability().is_some());
    assert_eq!(mr.properties(), mr.upstream().properties());
    assert!(format!("{mr:?}").contains("TrackingAdaptor"));
}

#[test]
fn a_waiting_allocation_resumes_after_a_free() {
    let mut handle = None;
    test_support::a_waiting_allocation_resumes_after_a_free(4 * KIB, 4 * KIB, KIB, |l| {
        let mr = TrackingAdaptor::new(l);
        handle = Some(mr.clone());
        mr
    });
    let mr = handle.unwrap();
    assert_eq!(mr.outstanding_count(), 0);
    assert_eq!(mr.issue_count(), 0);
}

/// Records spread over the table and every overflow shard (a table of 32 slots), allocated on
/// several threads and freed on another: the snapshot, the counts and the bytes are exact.
#[test]
fn records_over_all_shards_stay_exact_with_cross_thread_frees() {
    let (device, s) = host();
    let mr = TrackingAdaptor::with_table_buckets(CudaResource::new(&device).unwrap(), 4);
    let (tx, rx) = std::sync::mpsc::channel::<(DevicePtr, usize)>();
    thread::scope(|scope| {
        for t in 0..4 {
            let (tx, mr, s) = (tx.clone(), &mr, &s);
            scope.spawn(move || {
                for i in 0..200 {
                    let bytes = 256 * (t + 1) + i;
                    tx.send((mr.try_allocate(bytes, s).unwrap(), bytes))
                        .unwrap();
                }
            });
        }
    });
    drop(tx);
    let all: Vec<(DevicePtr, usize)> = rx.into_iter().collect();
    let total: usize = all.iter().map(|&(_, b)| b).sum();
    assert_eq!(mr.outstanding_count(), 800);
    assert_eq!(mr.allocated_bytes(), total);
    let snapshot = mr.outstanding_allocations();
    assert!(
        snapshot.windows(2).all(|w| w[0].ptr < w[1].ptr),
        "address order"
    );
    let mut expected = all.clone();
    expected.sort_unstable();
    let got: Vec<(DevicePtr, usize)> = snapshot.iter().map(|a| (a.ptr, a.bytes)).collect();
    assert_eq!(got, expected);
    // 800 addresses land in more than one shard.
    let used: std::collections::HashSet<usize> = all
        .iter()
        .map(|&(p, _)| mr.inner.shard(p) as *const _ as usize)
        .collect();
    assert!(used.len() > SHARDS / 2, "{} shards used", used.len());

    thread::scope(|scope| {
        scope.spawn(|| {
            for &(p, b) in &all {
                free(&mr, p, b, &s);
            }
        });
    });
    assert_eq!((mr.outstanding_count(), mr.allocated_bytes()), (0, 0));
    assert_eq!(mr.issue_count(), 0);
    s.synchronize_blocking().unwrap();
}

/// An upstream that hands out `(n << 20) | (bytes << 8)` for the n-th allocation (bytes below
/// 4096), never reused: a record's size can be read back from its address.
///
/// # Safety
/// As [`recording`]: the caller uses the pointers as numbers only.
unsafe fn sized(device: &Device) -> CallbackResource {
    let next = AtomicU64::new(1);
    // SAFETY: the caller's promise.
    unsafe {
        CallbackResource::new(
            CudaResource::new(device).unwrap().properties(),
            move |bytes, _| {
                assert!(bytes < 4096);
                let n = next.fetch_add(1, Ordering::Relaxed);
                Ok(DevicePtr::from_raw((n << 20) | ((bytes as u64) << 8)))
            },
            |_, _, _| {},
        )
    }
}

/// The bytes `sized` encoded in `p`.
fn size_of(p: DevicePtr) -> usize {
    ((p.addr() >> 8) & 0xfff) as usize
}

/// Records beyond what the table holds (one bucket here) go to the locked overflow: counts,
/// bytes, snapshot, frees of either kind and bad frees of overflowed records stay exact.
#[test]
fn records_that_overflow_the_table_stay_exact() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let mr = TrackingAdaptor::with_table_buckets(unsafe { sized(&device) }, 1);
    let held: Vec<_> = (1..=40)
        .map(|i| (mr.try_allocate(i * 8, &s).unwrap(), i * 8))
        .collect();
    assert!(mr.inner.overflow_len() >= 40 - table::SLOTS);
    assert_eq!(mr.outstanding_count(), 40);
    assert_eq!(mr.allocated_bytes(), (1..=40).map(|i| i * 8).sum::<usize>());
    let got: Vec<_> = mr
        .outstanding_allocations()
        .iter()
        .map(|a| (a.ptr, a.bytes, a.stream))
        .collect();
    let expected: Vec<_> = held.iter().map(|&(p, b)| (p, b, s.id())).collect();
    assert_eq!(got, expected); // `sized` hands out ascending addresses
                               // The first are in the table, the last in the overflow: free one of each twice, and
                               // one with the wrong size.
    let (first, last) = (held[0], held[39]);
    free(&mr, first.0, first.1, &s);
    free(&mr, last.0, last.1, &s);
    free(&mr, first.0, first.1, &s);
    free(&mr, last.0, last.1, &s);
    free(&mr, held[38].0, 1, &s);
    assert_eq!(
        mr.issues(),
        [
            TrackingIssue::UnknownPointer {
                ptr: first.0,
                bytes: first.1,
                stream: s.id()
            },
            TrackingIssue::UnknownPointer {
                ptr: last.0,
                bytes: last.1,
                stream: s.id()
            },
            TrackingIssue::WrongSize {
                ptr: held[38].0,
                bytes: 1,
                allocated: held[38].1,
                stream: s.id()
            },
        ]
    );
    for &(p, b) in &held[1..38] {
        free(&mr, p, b, &s);
    }
    assert_eq!((mr.outstanding_count(), mr.allocated_bytes()), (0, 0));
    assert_eq!(mr.inner.overflow_len(), 0);
    // The bucket's count is back to 0: its lookups take no lock again.
    assert_eq!(mr.inner.table.overflowed(first.0.addr()).load(Relaxed), 0);
    assert_eq!(mr.issue_count(), 3);
}

/// An upstream that returns `u64::MAX` (one of the table's slot markers): the record lives in
/// the overflow and behaves as any other.
#[test]
fn an_address_the_table_cannot_hold_is_tracked_in_the_overflow() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let up = unsafe {
        CallbackResource::new(
            CudaResource::new(&device).unwrap().properties(),
            |_, _| Ok(DevicePtr::from_raw(u64::MAX)),
            |_, _, _| {},
        )
    };
    let mr = TrackingAdaptor::new(up);
    let p = mr.try_allocate(KIB, &s).unwrap();
    assert_eq!(mr.inner.overflow_len(), 1);
    assert_eq!((mr.outstanding_count(), mr.allocated_bytes()), (1, KIB));
    assert_eq!(mr.outstanding_allocations()[0].ptr, p);
    free(&mr, p, KIB, &s);
    free(&mr, p, KIB, &s);
    assert_eq!((mr.outstanding_count(), mr.allocated_bytes()), (0, 0));
    assert!(matches!(
        mr.issues()[..],
        [TrackingIssue::UnknownPointer { bytes: KIB, .. }]
    ));
}

/// A pointer whose old record overflowed and that comes back while the table has room: the
/// old record is reported and replaced, not kept beside the new one.
#[test]
fn a_reused_pointer_replaces_its_overflowed_record() {
    let (device, s) = host();
    let order =
        parking_lot::Mutex::new((1..=table::SLOTS as u64 + 1).chain([table::SLOTS as u64 + 1]));
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let up = unsafe {
        CallbackResource::new(
            CudaResource::new(&device).unwrap().properties(),
            move |_, _| Ok(DevicePtr::from_raw(order.lock().next().unwrap() * 0x1000)),
            |_, _, _| {},
        )
    };
    let mr = TrackingAdaptor::with_table_buckets(up, 1);
    let held: Vec<_> = (0..=table::SLOTS)
        .map(|_| mr.try_allocate(KIB, &s).unwrap())
        .collect();
    let overflowed = held[table::SLOTS];
    assert_eq!(mr.inner.overflow_len(), 1);
    free(&mr, held[0], KIB, &s); // room in the table
    let again = mr.try_allocate(2 * KIB, &s).unwrap();
    assert_eq!(again, overflowed);
    assert_eq!(
        mr.issues(),
        [TrackingIssue::PointerReused {
            ptr: again,
            bytes: 2 * KIB,
            previous: KIB,
            stream: s.id()
        }]
    );
    assert_eq!(mr.inner.overflow_len(), 0);
    assert_eq!(mr.outstanding_count(), table::SLOTS);
    assert_eq!(mr.allocated_bytes(), (table::SLOTS - 1) * KIB + 2 * KIB);
    free(&mr, again, 2 * KIB, &s);
    assert_eq!(mr.outstanding_count(), table::SLOTS - 1);
}

/// Eight threads allocate, each freeing most of what its neighbour allocated, while another
/// thread takes snapshots: every snapshot record is whole (its size matches its address),
/// and at the end the snapshot is exactly what was kept. Run over a table of 16 slots
/// (records keep moving between slots and overflow) and over the default one.
#[test]
fn many_threads_with_cross_thread_frees_leave_an_exact_snapshot() {
    for buckets in [2, TABLE_BUCKETS] {
        let (device, s) = host();
        // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory
        // there.
        let mr = TrackingAdaptor::with_table_buckets(unsafe { sized(&device) }, buckets);
        const THREADS: usize = 8;
        const EACH: usize = 400;
        let done = std::sync::atomic::AtomicBool::new(false);
        let (mut senders, mut receivers): (Vec<_>, Vec<_>) =
            (0..THREADS).map(|_| std::sync::mpsc::channel()).unzip();
        senders.rotate_left(1); // thread t sends to thread t + 1
        let kept: Vec<(DevicePtr, usize)> = thread::scope(|scope| {
            let snapshots = scope.spawn(|| {
                let mut taken = 0;
                while !done.load(Ordering::Relaxed) {
                    for a in mr.outstanding_allocations() {
                        assert_eq!(a.bytes, size_of(a.ptr), "a torn record: {a}");
                    }
                    taken += 1;
                }
                taken
            });
            let workers: Vec<_> = senders
                .drain(..)
                .zip(receivers.drain(..))
                .enumerate()
                .map(|(t, (tx, rx))| {
                    let (mr, s) = (&mr, &s);
                    scope.spawn(move || {
                        let mut kept = Vec::new();
                        let take = |(p, b): (DevicePtr, usize), kept: &mut Vec<_>| {
                            if (p.addr() >> 20) % 3 == 0 {
                                kept.push((p, b));
                            } else {
                                free(mr, p, b, s);
                            }
                        };
                        for i in 0..EACH {
                            let bytes = 1 + (t * EACH + i) % 4000;
                            tx.send((mr.try_allocate(bytes, s).unwrap(), bytes))
                                .unwrap();
                            while let Ok(r) = rx.try_recv() {
                                take(r, &mut kept);
                            }
                        }
                        drop(tx);
                        for r in rx {
                            take(r, &mut kept);
                        }
                        kept
                    })
                })
                .collect();
            let kept = workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect();
            done.store(true, Ordering::Relaxed);
            assert!(snapshots.join().unwrap() > 0);
            kept
        });
        let mut expected = kept;
        expected.sort_unstable();
        let got: Vec<_> = mr
            .outstanding_allocations()
            .iter()
            .map(|a| (a.ptr, a.bytes))
            .collect();
        assert_eq!(got, expected, "{buckets} buckets");
        assert_eq!(mr.outstanding_count(), expected.len());
        let bytes: usize = expected.iter().map(|&(_, b)| b).sum();
        assert_eq!(mr.allocated_bytes(), bytes);
        assert_eq!(mr.issue_count(), 0);
        for (p, b) in expected {
            free(&mr, p, b, &s);
        }
        assert_eq!((mr.outstanding_count(), mr.allocated_bytes()), (0, 0));
    }
}

/// Snapshots: the tracked request size and site on the upstream's live blocks, or a
/// snapshot of its own over an upstream that keeps none.
mod snapshot;
