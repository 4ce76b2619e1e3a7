use std::sync::{Arc, OnceLock};
use std::thread;

use super::*;
use crate::test_support::{self, free, host, recording, KIB, MIB};
use crate::{CallbackResource, CudaResource, LimitingAdaptor};

const TEN_MIB: usize = 10 * MIB;
const TEN_MIB_I: i64 = TEN_MIB as i64;

fn counter(value: i64, peak: i64, total: i64) -> Counter {
    Counter { value, peak, total }
}

#[test]
fn empty() {
    let (device, _) = host();
    let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    assert_eq!(mr.counters(), Counters::default());
    assert_eq!(mr.scope_depth(), 1);
}

#[test]
fn all_freed() {
    let (device, s) = host();
    let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let ptrs: Vec<_> = (0..10)
        .map(|_| mr.try_allocate(TEN_MIB, &s).unwrap())
        .collect();
    for p in ptrs {
        free(&mr, p, TEN_MIB, &s);
    }
    assert_eq!(mr.bytes_counter().value, 0);
    assert_eq!(mr.allocations_counter().value, 0);
}

/// RMM's `StatisticsTest.PeakAllocations`, figure for figure.
#[test]
fn peak_allocations_match_rmm() {
    let (device, s) = host();
    let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let mut ptrs: Vec<_> = (0..10)
        .map(|_| mr.try_allocate(TEN_MIB, &s).unwrap())
        .collect();
    // Free every other allocation, as RMM's erase loop does: the 1st, 3rd, ...
    let mut i = 0;
    ptrs.retain(|&p| {
        i += 1;
        let keep = i % 2 == 0;
        if !keep {
            free(&mr, p, TEN_MIB, &s);
        }
        keep
    });
    assert_eq!(ptrs.len(), 5);
    assert_eq!(mr.bytes_counter(), counter(50 << 20, 100 << 20, 100 << 20));
    assert_eq!(mr.allocations_counter(), counter(5, 10, 10));

    // Ten more raise the peak.
    ptrs.extend((0..10).map(|_| mr.try_allocate(TEN_MIB, &s).unwrap()));
    for p in ptrs.drain(..) {
        free(&mr, p, TEN_MIB, &s);
    }
    assert_eq!(mr.bytes_counter(), counter(0, 150 << 20, 200 << 20));
    assert_eq!(mr.allocations_counter(), counter(0, 15, 20));
}

/// RMM's `StatisticsTest.MultiTracking`: a statistics adaptor over another.
#[test]
fn stacked_adaptors_each_count_what_passes_through_them() {
    let (device, s) = host();
    let outer = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let mut ptrs: Vec<_> = (0..10)
        .map(|_| (outer.try_allocate(TEN_MIB, &s).unwrap(), false))
        .collect();
    assert_eq!(outer.allocations_counter().value, 10);
    let inner = StatisticsAdaptor::new(outer.clone());
    ptrs.extend((0..5).map(|_| (inner.try_allocate(TEN_MIB, &s).unwrap(), true)));
    assert_eq!(outer.allocations_counter().value, 15);
    assert_eq!(inner.allocations_counter().value, 5);
    assert_eq!(outer.bytes_counter().value, 150 << 20);
    assert_eq!(inner.bytes_counter().value, 50 << 20);

    for (p, through_inner) in ptrs {
        if through_inner {
            free(&inner, p, TEN_MIB, &s);
        } else {
            free(&outer, p, TEN_MIB, &s);
        }
    }
    assert_eq!(outer.bytes_counter(), counter(0, 150 << 20, 150 << 20));
    assert_eq!(inner.bytes_counter(), counter(0, 50 << 20, 50 << 20));
    assert_eq!(outer.allocations_counter(), counter(0, 15, 15));
    assert_eq!(inner.allocations_counter(), counter(0, 5, 5));
}

/// RMM's `StatisticsTest.NegativeInnerTracking`: freeing through the inner adaptor what the
/// outer one allocated takes the inner value below zero; peaks and totals stay.
#[test]
fn freeing_through_an_inner_adaptor_goes_negative_there() {
    let (device, s) = host();
    let outer = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let mut ptrs: Vec<_> = (0..10)
        .map(|_| outer.try_allocate(TEN_MIB, &s).unwrap())
        .collect();
    let inner = StatisticsAdaptor::new(outer.clone());
    ptrs.extend((0..5).map(|_| inner.try_allocate(TEN_MIB, &s).unwrap()));
    assert_eq!(outer.allocations_counter().value, 15);
    assert_eq!(inner.allocations_counter().value, 5);
    for p in ptrs {
        free(&inner, p, TEN_MIB, &s);
    }
    assert_eq!(outer.bytes_counter(), counter(0, 150 << 20, 150 << 20));
    assert_eq!(outer.allocations_counter(), counter(0, 15, 15));
    assert_eq!(
        inner.bytes_counter(),
        counter(-100 << 20, 50 << 20, 50 << 20)
    );
    assert_eq!(inner.allocations_counter(), counter(-10, 5, 5));
}

/// RMM's `StatisticsTest.Nested`: push and pop, figure for figure.
#[test]
fn nested_scopes_match_rmm() {
    let (device, s) = host();
    let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let a0 = mr.try_allocate(TEN_MIB, &s).unwrap();
    assert_eq!(mr.bytes_counter().value, TEN_MIB_I);
    assert_eq!(mr.allocations_counter().value, 1);

    let covered = mr.push_counters();
    assert_eq!(covered.bytes.value, TEN_MIB_I);
    assert_eq!(covered.allocations.value, 1);
    assert_eq!(mr.bytes_counter().value, 0);
    assert_eq!(mr.allocations_counter().value, 0);

    let a1 = mr.try_allocate(TEN_MIB, &s).unwrap();
    mr.push_counters();
    assert_eq!(mr.scope_depth(), 3);
    assert_eq!(mr.bytes_counter().value, 0);
    assert_eq!(mr.allocations_counter().value, 0);
    let a2 = mr.try_allocate(TEN_MIB, &s).unwrap();
    free(&mr, a2, TEN_MIB, &s);
    assert_eq!(mr.bytes_counter().value, 0);
    assert_eq!(mr.bytes_counter().peak, TEN_MIB_I);
    assert_eq!(mr.allocations_counter().value, 0);
    assert_eq!(mr.allocations_counter().peak, 1);

    let popped = mr.pop_counters().unwrap();
    assert_eq!((popped.bytes.value, popped.bytes.peak), (0, TEN_MIB_I));
    assert_eq!((popped.allocations.value, popped.allocations.peak), (0, 1));

    free(&mr, a0, TEN_MIB, &s);
    let popped = mr.pop_counters().unwrap();
    assert_eq!((popped.bytes.value, popped.bytes.peak), (0, 2 * TEN_MIB_I));
    assert_eq!((popped.allocations.value, popped.allocations.peak), (0, 2));

    free(&mr, a1, TEN_MIB, &s);
    assert_eq!(mr.scope_depth(), 1);
    let before = mr.counters();
    let e = mr.pop_counters().unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("outermost")),
        "{e}"
    );
    assert_eq!(mr.counters(), before, "a refused pop changes nothing");
    assert_eq!(mr.scope_depth(), 1);
}

/// The fold rule on figures that tell its parts apart: the outer scope's value and total grow
/// by the inner scope's, and its peak is max(own peak, value at the push + inner peak).
#[test]
fn popping_folds_value_total_and_peak_into_the_outer_scope() {
    let (device, s) = host();
    let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    // Outer scope: peak 3 KiB, then down to 1 KiB.
    let a = mr.try_allocate(KIB, &s).unwrap();
    let b = mr.try_allocate(2 * KIB, &s).unwrap();
    free(&mr, b, 2 * KIB, &s);
    assert_eq!(mr.bytes_counter(), counter(1024, 3072, 3072));

    // Inner scope below the outer peak: the outer peak stays.
    mr.push_counters();
    let c = mr.try_allocate(KIB, &s).unwrap();
    assert_eq!(mr.bytes_counter(), counter(1024, 1024, 1024));
    let inner = mr.pop_counters().unwrap();
    assert_eq!(inner.bytes, counter(1024, 1024, 1024));
    assert_eq!(mr.bytes_counter(), counter(2048, 3072, 4096));

    // Inner scope above it: outer peak = 2 KiB at the push + the inner peak of 4 KiB.
    mr.push_counters();
    let d = mr.try_allocate(4 * KIB, &s).unwrap();
    free(&mr, d, 4 * KIB, &s);
    free(&mr, c, KIB, &s); // allocated in the outer scope: the inner value goes negative
    let inner = mr.pop_counters().unwrap();
    assert_eq!(inner.bytes, counter(-1024, 4096, 4096));
    assert_eq!(inner.allocations, counter(-1, 1, 1));
    assert_eq!(mr.bytes_counter(), counter(1024, 6144, 8192));
    assert_eq!(mr.allocations_counter(), counter(1, 3, 4));
    free(&mr, a, KIB, &s);
}

#[test]
fn zero_byte_allocations_count_as_allocations() {
    let (device, s) = host();
    let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let p = mr.try_allocate(0, &s).unwrap();
    assert_eq!(mr.allocations_counter(), counter(1, 1, 1));
    assert_eq!(mr.bytes_counter(), counter(0, 0, 0));
    free(&mr, p, 0, &s);
    assert_eq!(mr.allocations_counter(), counter(0, 1, 1));
}

#[test]
fn failed_allocations_count_nothing() {
    let (device, s) = host();
    let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    assert!(mr.try_allocate(1 << 50, &s).unwrap_err().is_out_of_memory());
    assert_eq!(mr.counters(), Counters::default());
}

#[test]
fn clones_share_counters_and_scopes() {
    let (device, s) = host();
    let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let copy = mr.clone();
    let p = copy.try_allocate(KIB, &s).unwrap();
    mr.push_counters();
    assert_eq!(copy.scope_depth(), 2);
    free(&mr, p, KIB, &s);
    assert_eq!(copy.bytes_counter().value, -1024);
    copy.pop_counters().unwrap();
    assert_eq!(mr.bytes_counter(), counter(0, 1024, 1024));
    assert_eq!(mr.upstream().properties(), mr.properties());
    assert!(format!("{mr:?}").contains("scope_depth"));
}

/// RMM's `MultiThreaded` ordering test, made deterministic: the upstream's free looks at the
/// counters and must find the allocation already taken off, so a thread that gets the same
/// address back at once can never see it counted twice.
#[test]
fn a_free_is_counted_before_it_reaches_the_upstream() {
    let (device, s) = host();
    let seen: Arc<OnceLock<StatisticsAdaptor<CallbackResource>>> = Arc::default();
    let upstream = CudaResource::new(&device).unwrap();
    let (up_a, up_d, seen_d) = (upstream.clone(), upstream.clone(), seen.clone());
    let observed = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let observed_d = observed.clone();
    let observe_free = move |ptr, bytes, stream: &Stream| {
        let c = seen_d.get().expect("set below").counters();
        observed_d.lock().push((c.bytes.value, c.allocations.value));
        // SAFETY: the pointer came from `up_a`, a clone of `up_d`, with this size.
        unsafe { up_d.deallocate(ptr, bytes, stream) };
    };
    // SAFETY: every pointer is one `upstream` returned for the same request, with its properties:
    // `upstream` keeps the promise.
    let mr = StatisticsAdaptor::new(unsafe {
        CallbackResource::new(
            upstream.properties(),
            move |bytes, stream| up_a.try_allocate(bytes, stream),
            observe_free,
        )
    });
    assert!(seen.set(mr.clone()).is_ok());
    let p = mr.try_allocate(256, &s).unwrap();
    let q = mr.try_allocate(256, &s).unwrap();
    free(&mr, p, 256, &s);
    free(&mr, q, 256, &s);
    assert_eq!(*observed.lock(), [(256, 1), (0, 0)]);
}

/// RMM's `MultiThreaded` end state, with many threads: every update lands, and the peak is
/// one the counters really reached.
#[test]
fn concurrent_allocations_and_frees_all_land() {
    for bytes in [0, 256] {
        let (device, s) = host();
        let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
        let threads = 4;
        let rounds = 200;
        thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    for _ in 0..rounds {
                        let p = mr.try_allocate(bytes, &s).unwrap();
                        free(&mr, p, bytes, &s);
                    }
                });
            }
        });
        let n = (threads * rounds) as i64;
        let a = mr.allocations_counter();
        assert_eq!((a.value, a.total), (0, n));
        assert!((1..=threads as i64).contains(&a.peak), "{a:?}");
        let b = mr.bytes_counter();
        assert_eq!((b.value, b.total), (0, n * bytes as i64));
        // Bytes and counts are separate counters, so their peaks may be reached at different
        // moments; each is a value the counters really reached.
        assert!(b.peak % bytes.max(1) as i64 == 0, "{b:?}");
        assert!(
            (bytes as i64..=(threads * bytes) as i64).contains(&b.peak),
            "{b:?}"
        );
        s.synchronize_blocking().unwrap();
    }
}

/// Scopes pushed and popped while other threads allocate: nothing is lost, and after the last
/// pop the outermost scope holds every update.
#[test]
fn scopes_under_concurrent_traffic_lose_nothing() {
    let (device, s) = host();
    let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let held = mr.try_allocate(KIB, &s).unwrap();
    thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    for _ in 0..300 {
                        let p = mr.try_allocate(512, &s).unwrap();
                        free(&mr, p, 512, &s);
                    }
                })
            })
            .collect();
        for _ in 0..100 {
            mr.push_counters();
            mr.push_counters();
            mr.pop_counters().unwrap();
            let inner = mr.pop_counters().unwrap();
            assert!(inner.bytes.peak >= inner.bytes.value);
        }
        for w in workers {
            w.join().unwrap();
        }
    });
    assert_eq!(mr.scope_depth(), 1);
    assert_eq!(mr.bytes_counter().value, 1024);
    assert_eq!(mr.bytes_counter().total, 1024 + 600 * 512);
    assert_eq!(mr.allocations_counter().total, 601);
    assert!(mr.bytes_counter().peak >= 1024 + 512);
    free(&mr, held, KIB, &s);
}

#[test]
fn upstream_errors_pass_through_uncounted() {
    let (device, s) = host();
    // SAFETY: it hands out no pointer: every answer is an error.
    let (broken, calls) = unsafe { recording(&device, |_| Err(Error::invalid("nope"))) };
    let mr = StatisticsAdaptor::new(broken);
    assert_eq!(
        mr.try_allocate(KIB, &s).unwrap_err(),
        Error::invalid("nope")
    );
    assert_eq!(calls.lock().len(), 1);
    assert_eq!(mr.counters(), Counters::default());
}

#[test]
fn forwards_capacity_limit() {
    let (device, _) = host();
    let mr = StatisticsAdaptor::new(LimitingAdaptor::new(
        CudaResource::new(&device).unwrap(),
        MIB,
    ));
    assert_eq!(mr.capacity_limit(), Some(MIB));
    assert!(mr.availability().is_some());
    let plain = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    assert_eq!(plain.capacity_limit(), plain.upstream().capacity_limit());
}

/// Awaiting through the adaptor: only the attempt that succeeds is counted.
#[test]
fn a_waiting_allocation_resumes_after_a_free() {
    let mut handle = None;
    test_support::a_waiting_allocation_resumes_after_a_free(4 * KIB, 4 * KIB, KIB, |l| {
        let mr = StatisticsAdaptor::new(l);
        handle = Some(mr.clone());
        mr
    });
    let mr = handle.unwrap();
    assert_eq!(mr.allocations_counter(), counter(0, 1, 2));
    assert_eq!(mr.bytes_counter(), counter(0, 4096, 5120));
}

/// Per-thread shards: allocations on many threads, freed on other threads (the value moves
/// between shards), more threads at once than there are shards (the rest share one), and
/// threads that end and give their shard to the next: every value and total is exact.
#[test]
fn counts_are_exact_across_many_threads_and_cross_thread_frees() {
    let (device, s) = host();
    let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let threads = SHARDS + 6;
    let rounds = 50;
    let (tx, rx) = std::sync::mpsc::channel::<(DevicePtr, usize)>();
    let start = std::sync::Barrier::new(threads);
    thread::scope(|scope| {
        for t in 0..threads {
            let (tx, mr, s, start) = (tx.clone(), &mr, &s, &start);
            scope.spawn(move || {
                start.wait(); // all alive at once: some find no shard of their own
                for i in 0..rounds {
                    let bytes = 256 * (t % 5 + 1) + i;
                    tx.send((mr.try_allocate(bytes, s).unwrap(), bytes))
                        .unwrap();
                }
            });
        }
        drop(tx);
        // Freed here, on another thread than the one that allocated.
        for (p, bytes) in rx {
            free(&mr, p, bytes, &s);
        }
    });
    let n = (threads * rounds) as i64;
    let bytes_total: i64 = (0..threads)
        .flat_map(|t| (0..rounds).map(move |i| (256 * (t % 5 + 1) + i) as i64))
        .sum();
    assert_eq!(
        mr.allocations_counter(),
        Counter {
            value: 0,
            peak: mr.allocations_counter().peak,
            total: n
        }
    );
    assert_eq!(
        (mr.bytes_counter().value, mr.bytes_counter().total),
        (0, bytes_total)
    );
    assert!(mr.allocations_counter().peak >= 1);

    // Threads one after another, each leaving its allocation outstanding: ordered calls, so the
    // peaks are exact although each thread counts in its own shard (or one a finished thread
    // gave back).
    mr.reset_peak();
    let kept: Vec<DevicePtr> = (0..100)
        .map(|_| {
            thread::scope(|scope| {
                scope
                    .spawn(|| mr.try_allocate(KIB, &s).unwrap())
                    .join()
                    .unwrap()
            })
        })
        .collect();
    assert_eq!(
        mr.bytes_counter(),
        Counter {
            value: 100 * KIB as i64,
            peak: 100 * KIB as i64,
            total: bytes_total + 100 * KIB as i64
        }
    );
    assert_eq!(
        (
            mr.allocations_counter().value,
            mr.allocations_counter().peak
        ),
        (100, 100)
    );
    for p in kept {
        free(&mr, p, KIB, &s);
    }
    let stats = mr.memory_stats();
    assert_eq!(
        (
            stats.allocated_bytes,
            stats.peak_allocated_bytes,
            stats.allocations
        ),
        (Some(0), Some(100 * KIB), Some(0))
    );
    s.synchronize_blocking().unwrap();
}
