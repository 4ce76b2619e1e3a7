use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use rustc_hash::FxHashSet;

use super::*;
use crate::test_support::{
    free, host, recording, Call, SharedWriter as Shared, SplitMix64, KIB, MIB,
};
use crate::{
    CudaResource, DevicePtr, Error, LimitingAdaptor, LoggingAdaptor, MemoryResource, PoolResource,
    SharedResource, StatisticsAdaptor, Stream,
};

/// Replays a parsed log with the default options.
fn replay_events(
    events: &[Event],
    mr: &(impl MemoryResource + ?Sized),
    device: &Device,
) -> ReplayReport {
    replay(events, mr, device, &ReplayOptions::default()).unwrap()
}

/// What a random workload left behind.
#[derive(Debug, Default)]
struct Outcome {
    /// Allocations it never freed: pointer, size, stream index.
    leaked: Vec<(DevicePtr, usize, usize)>,
    /// Allocations that failed.
    failures: usize,
    /// Frees it made.
    frees: usize,
}

/// Random allocations (0 B, small, up to 4 MiB, and now and then 1 PiB, which fails) and frees
/// of random live allocations on random streams; half of what is left at the end is freed, the
/// rest leaked.
fn workload(mr: &impl MemoryResource, streams: &[Stream], seed: u64, ops: usize) -> Outcome {
    let mut rng = SplitMix64(seed);
    let mut live: Vec<(DevicePtr, usize, usize)> = Vec::new();
    let mut outcome = Outcome::default();
    for _ in 0..ops {
        if !live.is_empty() && rng.below(100) < 45 {
            let (p, bytes, _) = live.swap_remove(rng.below(live.len()));
            free(mr, p, bytes, &streams[rng.below(streams.len())]);
            outcome.frees += 1;
            continue;
        }
        let bytes = match rng.below(20) {
            0 => 0,
            1 => 1 << 50,
            2..=4 => 1 + rng.below(4 * MIB),
            _ => 1 + rng.below(4 * KIB),
        };
        let s = rng.below(streams.len());
        match mr.try_allocate(bytes, &streams[s]) {
            Ok(p) => live.push((p, bytes, s)),
            Err(e) => {
                assert!(e.is_out_of_memory(), "{e}");
                outcome.failures += 1;
            }
        }
    }
    let keep = live.len() / 2;
    for (p, bytes, s) in live.drain(keep..) {
        free(mr, p, bytes, &streams[s]);
        outcome.frees += 1;
    }
    outcome.leaked = live;
    outcome
}

/// The round trip: log a random workload, parse the log, replay it against a fresh resource
/// (a pool on another device), and find the same counts and bytes, peaks included.
#[test]
fn a_logged_workload_replays_to_the_same_figures() {
    for seed in [1, 2, 3] {
        let (device, _) = host();
        let streams: Vec<Stream> = (0..3).map(|_| Stream::new(&device).unwrap()).collect();
        let out = Shared::default();
        let recorded = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
        let logged = LoggingAdaptor::to_writer(recorded.clone(), out.clone()).unwrap();
        let outcome = workload(&logged, &streams, seed, 400);
        logged.flush().unwrap();
        assert!(
            outcome.failures > 0 && !outcome.leaked.is_empty(),
            "{outcome:?}"
        );

        let events = parse_log_str(&out.text()).unwrap();
        let (fresh, _) = host();
        let pool = PoolResource::new(CudaResource::new(&fresh).unwrap(), 0, None).unwrap();
        let target = StatisticsAdaptor::new(pool);
        let report = replay_events(&events, &target, &fresh);

        assert!(report.is_clean(), "{report}");
        let made = recorded.allocations_counter();
        assert_eq!(report.events, events.len() as u64);
        assert_eq!(report.allocations as i64, made.total);
        assert_eq!(report.logged_failures, outcome.failures as u64);
        assert_eq!(report.frees, (outcome.frees + outcome.leaked.len()) as u64);
        assert_eq!(report.streams, 3);
        let mut unfreed: Vec<_> = report.unfreed.iter().map(|u| (u.ptr, u.bytes)).collect();
        let mut leaked: Vec<_> = outcome.leaked.iter().map(|&(p, b, _)| (p, b)).collect();
        unfreed.sort_unstable();
        leaked.sort_unstable();
        assert_eq!(unfreed, leaked);

        // Same totals and peaks; the replay freed the leaks at the end.
        let (a, b) = (recorded.counters(), target.counters());
        assert_eq!(
            (b.allocations.total, b.allocations.peak),
            (a.allocations.total, a.allocations.peak)
        );
        assert_eq!((b.bytes.total, b.bytes.peak), (a.bytes.total, a.bytes.peak));
        assert_eq!(b.bytes.value, 0);
        let leaked_bytes: usize = outcome.leaked.iter().map(|l| l.1).sum();
        assert_eq!(a.bytes.value, leaked_bytes as i64);

        for (p, bytes, s) in outcome.leaked {
            free(&logged, p, bytes, &streams[s]);
        }
    }
}

/// Threads allocating and freeing at once, with addresses reused at once by the host
/// allocator: the log's order is still a valid replay order (a free is logged before its
/// address can be handed out again), so the replay goes as logged.
#[test]
fn a_multithreaded_log_replays_cleanly() {
    let (device, _) = host();
    let out = Shared::default();
    let recorded = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let logged = LoggingAdaptor::to_writer(recorded.clone(), out.clone()).unwrap();
    let failures: usize = thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|t| {
                let logged = &logged;
                let device = &device;
                scope.spawn(move || {
                    let stream = Stream::new(device).unwrap();
                    let o = workload(logged, std::slice::from_ref(&stream), 10 + t, 300);
                    for (p, bytes, _) in o.leaked {
                        free(logged, p, bytes, &stream);
                    }
                    stream.synchronize_blocking().unwrap();
                    o.failures
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    logged.flush().unwrap();
    let events = parse_log_str(&out.text()).unwrap();
    let threads: FxHashSet<u64> = events.iter().map(|e| e.thread).collect();
    assert_eq!(threads.len(), 3);

    let (fresh, _) = host();
    let target = StatisticsAdaptor::new(CudaResource::new(&fresh).unwrap());
    let report = replay_events(&events, &target, &fresh);
    assert!(report.is_clean(), "{report}");
    assert!(report.unfreed.is_empty());
    assert_eq!(report.logged_failures, failures as u64);
    assert_eq!(report.streams, 3);
    let (a, b) = (recorded.counters(), target.counters());
    assert_eq!(b.allocations.total, a.allocations.total);
    assert_eq!(b.bytes.total, a.bytes.total);
    assert_eq!((a.bytes.value, b.bytes.value), (0, 0));
}

/// RMM's own log shape replays: default and per-thread-default streams, `(nil)` pointers, a
/// logged failure, addresses reused after a free.
#[test]
fn an_rmm_log_replays() {
    let log = "\
Thread,Time,Action,Pointer,Size,Stream
2310716,16:36:43.474583,allocate,0x7f8a7a000000,1000,0
2310716,16:36:43.474595,allocate,0x7f8a7a000400,2000,0
2310717,16:36:43.474601,allocate failure,(nil),1099511627776,0
2310716,16:36:43.474610,free,0x7f8a7a000000,1000,0
2310717,16:36:43.474613,allocate,0x7f8a7a000000,512,0x2
2310716,16:36:43.474615,allocate,(nil),0,0
2310716,16:36:43.474616,allocate,(nil),0,0
2310716,16:36:43.474618,free,0x7f8a7a000400,2000,0
2310716,16:36:43.474620,free,(nil),0,0
2310716,16:36:43.474621,free,(nil),0,0
2310717,16:36:43.474622,free,0x7f8a7a000000,512,0x2
";
    let (device, _) = host();
    let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let report = replay_events(&parse_log_str(log).unwrap(), &mr, &device);
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        (
            report.allocations,
            report.frees,
            report.logged_failures,
            report.streams
        ),
        (5, 5, 1, 2)
    );
    assert_eq!(mr.bytes_counter().peak, 3000);
    assert_eq!(mr.allocations_counter().peak, 4); // the two 0-byte allocations count
    assert_eq!(mr.counters().bytes.value, 0);
    assert!(device.take_deferred_error().is_none());
}

/// Each event that does not go as logged is reported with its line, and the replay goes on.
#[test]
fn failures_are_reported_with_their_line() {
    let log = "\
Thread,Time,Action,Pointer,Size,Stream
1,00:00:00.000001,allocate,0x1000,256,0
1,00:00:00.000002,allocate,0x1000,512,0
1,00:00:00.000003,free,0x9000,256,0
1,00:00:00.000004,free,0x1000,300,0
1,00:00:00.000005,allocate,0x2000,4096,0
1,00:00:00.000006,free,0x2000,4096,0
1,00:00:00.000007,allocate,0x3000,512,0
";
    let events = parse_log_str(log).unwrap();
    let (device, _) = host();
    // 1 KiB: the 4 KiB allocation is refused.
    let mr = StatisticsAdaptor::new(LimitingAdaptor::new(
        CudaResource::new(&device).unwrap(),
        KIB,
    ));
    let report = replay_events(&events, &mr, &device);
    assert!(!report.is_clean());
    let got: Vec<(usize, &ReplayFailureKind)> =
        report.failures.iter().map(|f| (f.line, &f.kind)).collect();
    assert_eq!(got.len(), 4, "{report}");
    assert_eq!(
        got[0],
        (
            3,
            &ReplayFailureKind::PointerAlreadyLive { allocated_at: 2 }
        )
    );
    assert_eq!(got[1], (4, &ReplayFailureKind::UnknownPointer));
    assert_eq!(
        got[2],
        (5, &ReplayFailureKind::SizeMismatch { allocated: 256 })
    );
    let (line, ReplayFailureKind::AllocationFailed(e)) = got[3] else {
        panic!("{report}")
    };
    assert_eq!(line, 6);
    assert!(e.is_out_of_memory());
    // The refused allocation's free (line 7) is no second failure; line 8 still replays.
    assert_eq!((report.allocations, report.frees), (2, 2));
    assert_eq!(
        report.unfreed,
        [Unfreed {
            line: 8,
            ptr: DevicePtr::from_raw(0x3000),
            bytes: 512
        }]
    );
    // The mismatched free freed the size the replay allocated.
    assert_eq!(mr.bytes_counter().total, 256 + 512);
    assert_eq!(mr.bytes_counter().value, 0);

    let text = report.to_string();
    assert!(
        text.starts_with("7 events on 1 streams: 2 allocations, 2 frees, 0 logged failures, 1 unfreed, 4 failures\n"),
        "{text}"
    );
    assert!(
        text.contains("line 3: allocate of 0x1000 (512 B): the pointer is live already, allocated at line 2\n"),
        "{text}"
    );
    assert!(
        text.contains("line 5: free of 0x1000 (300 B): 256 B were allocated\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "line 6: allocate of 0x2000 (4096 B): the resource refused it: out of memory"
        ),
        "{text}"
    );
}

/// Logged streams map to streams of the device, one each; each free goes on its own logged
/// stream's stream, with the size the replay allocated; the replayed pointers are the
/// resource's.
#[test]
fn streams_and_pointers_are_mapped() {
    let log = "\
Thread,Time,Action,Pointer,Size,Stream
1,00:00:00.000001,allocate,0x7f00,256,0
1,00:00:00.000002,allocate,0x7f01,512,0xa
1,00:00:00.000003,free,0x7f00,256,0xb
1,00:00:00.000004,free,0x7f01,512,0xa
";
    let (device, _) = host();
    let next = AtomicU64::new(1);
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let (mr, calls) = unsafe {
        recording(&device, move |_| {
            Ok(DevicePtr::from_raw(
                next.fetch_add(1, Ordering::Relaxed) << 12,
            ))
        })
    };
    let report = replay_events(&parse_log_str(log).unwrap(), &mr, &device);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.streams, 3);
    let calls = calls.lock().clone();
    let [Call::Allocate(256, s0), Call::Allocate(512, sa), Call::Deallocate(p0, 256, sb), Call::Deallocate(p1, 512, sa2)] =
        calls[..]
    else {
        panic!("{calls:?}")
    };
    assert_eq!((p0.addr(), p1.addr()), (0x1000, 0x2000));
    assert_eq!(sa, sa2);
    assert!(s0 != sa && sa != sb && s0 != sb);
}

#[test]
fn a_resource_of_another_device_is_refused() {
    let (device, _) = host();
    let (other, _) = host();
    let mr: SharedResource = Arc::new(CudaResource::new(&other).unwrap());
    let none: &[Event] = &[];
    let e = replay(none, &*mr, &device, &ReplayOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            ReplayError::Resource {
                line: 0,
                error: Error::DeviceMismatch { .. }
            }
        ),
        "{e:?}"
    );
}

#[test]
fn an_empty_log_replays_to_nothing() {
    let (device, _) = host();
    let events = parse_log_str(&format!("{LOG_HEADER}\n")).unwrap();
    let report = replay_events(&events, &CudaResource::new(&device).unwrap(), &device);
    // Nothing but the thread it ran on.
    let nothing = ReplayReport {
        threads: 1,
        ..ReplayReport::default()
    };
    assert_eq!(format!("{report:?}"), format!("{nothing:?}"));
    assert!(report.is_clean());
    // Per thread: no logged thread, so no thread.
    let options = ReplayOptions {
        mode: ReplayMode::PerThread,
        ..ReplayOptions::default()
    };
    let mr = CudaResource::new(&device).unwrap();
    let report = replay(&events, &mr, &device, &options).unwrap();
    let nothing = ReplayReport {
        mode: ReplayMode::PerThread,
        ..ReplayReport::default()
    };
    assert_eq!(format!("{report:?}"), format!("{nothing:?}"));
}

/// A log with more streams than the cap (one per request, as some services log) gets at most
/// `MAX_STREAMS` streams: on the host backend each is a thread. The rest share one stream,
/// and every event is still replayed.
#[test]
fn a_log_of_more_streams_than_the_cap_makes_at_most_the_cap() {
    let over = 10;
    let mut log = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for i in 0..(MAX_STREAMS + over) as u64 {
        let (ptr, stream) = (0x7f00_0000_0000 + i * 0x1000, 0x1000 + i);
        log += &format!("1,10:00:00.000000,allocate,{ptr:#x},256,{stream:#x}\n");
        log += &format!("1,10:00:00.000001,free,{ptr:#x},256,{stream:#x}\n");
    }
    let (device, _) = host();
    let mr = crate::StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let report = replay_events(&parse_log_str(&log).unwrap(), &mr, &device);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.streams, MAX_STREAMS);
    assert_eq!(report.skipped.streams_over_limit, 2 * over as u64);
    assert_eq!(report.allocations, (MAX_STREAMS + over) as u64);
    assert_eq!(mr.allocations_counter().total, (MAX_STREAMS + over) as i64);
    assert!(report
        .to_string()
        .contains(&format!("{} events of streams past the first", 2 * over)));
}

/// Every pass over a log reads its live set alike: a free of the null pointer with nothing
/// live is a no-op (as `free(nullptr)` is in RMM) for the replay, the what-if replay and the
/// scan, and a free of a pointer never allocated is one skipped event for each.
#[test]
fn every_pass_reads_the_live_set_alike() {
    let log = "\
Thread,Time,Action,Pointer,Size,Stream
1,00:00:00.000001,free,(nil),0,0
1,00:00:00.000002,allocate,(nil),0,0
1,00:00:00.000003,free,(nil),0,0
1,00:00:00.000004,free,(nil),0,0
1,00:00:00.000005,free,0x9000,64,0
";
    let (device, _) = host();
    let mr = CudaResource::new(&device).unwrap();
    let report = replay_events(&parse_log_str(log).unwrap(), &mr, &device);
    let kinds: Vec<_> = report.failures.iter().map(|f| (f.line, &f.kind)).collect();
    assert_eq!(kinds, [(6, &ReplayFailureKind::UnknownPointer)], "{report}");
    assert_eq!((report.allocations, report.frees), (1, 1));

    let reader = || EventReader::new(log.as_bytes()).unwrap();
    let options = ReplayOptions::default();
    let w = replay(reader(), &mr, &device, &options).unwrap();
    let lines: Vec<usize> = w.failures.iter().map(|f| f.line).collect();
    assert_eq!((lines, w.skipped.total()), (vec![6], 1));
    assert_eq!((w.allocations, w.frees), (1, 1));

    let s = scan_log(reader(), &options).unwrap();
    assert_eq!((s.skipped.unknown_pointer, s.skipped.total()), (1, 1));
}
