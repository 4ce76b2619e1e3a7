//! Faults injected at the host backend's driver calls ([`FaultPoint`]) during pool growth, a
//! buffer's hand-off to another stream, copies, stream-ordered frees and an awaited
//! allocation's wake-up: the error surfaces typed (in the call's `Result` or
//! [`Device::take_deferred_error`]), statistics return to 0 once the buffers drop, nothing
//! leaks once the resources drop, and nothing hangs (every scenario runs under a time limit
//! that fails the test).
//!
//! `fault_suite!` instantiates it for one device expression. Fault injection exists on host
//! devices only ([`Device::host_controls`]), so the GPU binary does not instantiate it.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use streamalloc::{
    CudaResource, Device, DeviceBuffer, Error, FaultPoint, HostControls, MappedPoolConfig,
    MappedPoolResource, MemoryResource, PoolResource, StatisticsAdaptor, Stream,
};

/// A scenario's time limit: far above its run time, so only a hang reaches it.
const LIMIT: Duration = Duration::from_secs(20);

type Pool = StatisticsAdaptor<PoolResource<CudaResource>>;

/// Runs `f` on its own thread and fails the test when it has not finished within [`LIMIT`]
/// (a hang), or panicked.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(LIMIT) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => worker
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p)),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: hung for {LIMIT:?}"),
    }
}

fn controls(device: &Device) -> HostControls {
    device
        .host_controls()
        .expect("the fault suite runs on host devices")
        .clone()
}

/// A pool that starts with `initial` bytes and may grow to `maximum`, counted.
fn counted_pool(device: &Device, initial: usize, maximum: Option<usize>) -> Pool {
    StatisticsAdaptor::new(
        PoolResource::new(CudaResource::new(device).unwrap(), initial, maximum).unwrap(),
    )
}

/// `e` is the injected failure of `point`.
fn assert_injected(e: &Error, point: FaultPoint) {
    match e {
        Error::Driver { call, .. } => assert_eq!(*call, point.driver_call(), "{e}"),
        other => panic!("expected the injected {point:?} failure, got {other:?}"),
    }
}

/// Waits (bounded) until the device has no live allocation: frees are stream-ordered, and a
/// stream may still be running them.
fn assert_no_leak(device: &Device) {
    let c = controls(device);
    let until = Instant::now() + Duration::from_secs(5);
    while c.live_allocations() != 0 && Instant::now() < until {
        thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(c.live_allocations(), 0, "leaked: {c:?}");
}

/// Drains the deferred errors, returning them.
fn deferred(device: &Device) -> Vec<Error> {
    std::iter::from_fn(|| device.take_deferred_error()).collect()
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

/// The upstream allocation of a pool's growth fails: `try_allocate` reports out-of-memory, a
/// buffer constructor that awaits memory is served once the next free wakes it and the pool
/// grows then, statistics return to 0 and every chunk goes back.
pub fn allocation_fault_during_pool_growth(device: Device) {
    within("pool growth", move || {
        let c = controls(&device);
        let s = Stream::new(&device).unwrap();
        let mr = counted_pool(&device, 1 << 20, None);
        let first = block_on(DeviceBuffer::new(512 << 10, &s, mr.clone())).unwrap();

        // The pool halves a refused growth down to the request and retries after giving
        // free chunks back: fail every upstream allocation until disarmed.
        c.fail_next(FaultPoint::Allocation, usize::MAX);
        let e = mr.try_allocate(4 << 20, &s).unwrap_err();
        assert!(e.is_out_of_memory(), "{e:?}");
        assert!(c.faults_injected(FaultPoint::Allocation) >= 1);
        assert_eq!(
            mr.bytes_counter().value,
            512 << 10,
            "the failure was counted"
        );

        // Awaited: the growth fails and the request waits; the fault goes, and the free of
        // `first` wakes the request, which grows the pool then.
        let waiter = {
            let (mr, s) = (mr.clone(), s.clone());
            thread::spawn(move || {
                block_on(DeviceBuffer::new(4 << 20, &s, mr).timeout(Duration::from_secs(10)))
            })
        };
        while !mr.availability().is_some_and(|a| a.has_waiters()) && !waiter.is_finished() {
            thread::sleep(Duration::from_millis(1));
        }
        c.fail_next(FaultPoint::Allocation, 0);
        drop(first);
        let second = waiter.join().unwrap().expect("served after the wake-up");
        assert_eq!(second.len(), 4 << 20);
        drop(second);
        assert_eq!(mr.bytes_counter().value, 0);
        assert_eq!(mr.allocations_counter().value, 0);
        drop(mr);
        s.synchronize_blocking().unwrap();
        assert!(deferred(&device).is_empty());
        assert_no_leak(&device);
    });
}

/// Handing a buffer to another stream records an event on the owner (at `set_stream`) and
/// makes the new owner wait on it (before its first use of the buffer); when either call fails,
/// the call that made it returns the error, the buffer stays usable and can be handed over and
/// used once the fault is gone.
pub fn hand_off_faults(device: Device) {
    within("hand-off", move || {
        let c = controls(&device);
        let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
        let mr = counted_pool(&device, 1 << 20, None);
        for point in [FaultPoint::EventRecord, FaultPoint::StreamWait] {
            let mut buf = block_on(DeviceBuffer::new(4096, &a, mr.clone())).unwrap();
            a.enqueue_delay(Duration::from_millis(5)).unwrap();
            buf.fill(9).unwrap();
            c.fail_next(point, 1);
            match point {
                FaultPoint::EventRecord => {
                    let e = buf.set_stream(&b).unwrap_err();
                    assert_injected(&e, point);
                    buf.set_stream(&b).unwrap();
                }
                _ => {
                    buf.set_stream(&b).unwrap(); // the wait is not enqueued yet
                    let e = block_on(buf.copy_to_host(vec![0u8; 4096])).unwrap_err();
                    assert_injected(&e, point);
                }
            }
            assert_eq!(c.faults_injected(point), 1, "{point:?}");
            assert_eq!(buf.stream().id(), b.id());
            let back = block_on(buf.copy_to_host(vec![0u8; 4096])).unwrap();
            assert!(
                back.iter().all(|&x| x == 9),
                "{point:?}: the data did not survive"
            );
            drop(buf);
        }
        assert_eq!(mr.bytes_counter().value, 0);
        drop(mr);
        a.synchronize_blocking().unwrap();
        b.synchronize_blocking().unwrap();
        assert!(deferred(&device).is_empty());
        assert_no_leak(&device);
    });
}

/// A copy that fails (host to device, device to device, device to host) reports the driver
/// error where the copy is awaited or the stream next synchronizes; the buffers still free
/// their memory on the failed stream.
pub fn copy_faults(device: Device) {
    within("copies", move || {
        let c = controls(&device);
        // Each case on its own pool and stream: a failed stream stays failed, and memory it
        // freed passes the failure on to whoever waits for it (as a sticky error does).
        let case = |f: &dyn Fn(&Stream, &Pool)| {
            let s = Stream::new(&device).unwrap();
            let mr = counted_pool(&device, 1 << 20, None);
            f(&s, &mr);
            assert_eq!(mr.bytes_counter().value, 0);
            assert_eq!(mr.allocations_counter().value, 0);
        };
        // Host to device: the awaited copy fails.
        case(&|s, mr| {
            let mut dst = block_on(DeviceBuffer::new(1024, s, mr.clone())).unwrap();
            c.fail_next(FaultPoint::Copy, 1);
            let e = block_on(dst.copy_from_host(vec![1u8; 1024])).unwrap_err();
            assert_injected(&e, FaultPoint::Copy);
        });
        // Device to device: enqueued fine, reported by the next wait on the stream.
        case(&|s, mr| {
            let src = block_on(DeviceBuffer::new(1024, s, mr.clone())).unwrap();
            let mut dst = block_on(DeviceBuffer::new(1024, s, mr.clone())).unwrap();
            c.fail_next(FaultPoint::Copy, 1);
            dst.copy_from_device(&src).unwrap();
            assert_injected(&s.synchronize_blocking().unwrap_err(), FaultPoint::Copy);
        });
        // Device to host: the awaited copy fails.
        case(&|s, mr| {
            let src = block_on(DeviceBuffer::new(1024, s, mr.clone())).unwrap();
            c.fail_next(FaultPoint::Copy, 1);
            let e = block_on(src.copy_to_host(vec![0u8; 1024])).unwrap_err();
            assert_injected(&e, FaultPoint::Copy);
        });
        // A memset, likewise.
        case(&|s, mr| {
            let mut buf = block_on(DeviceBuffer::new(1024, s, mr.clone())).unwrap();
            c.fail_next(FaultPoint::Memset, 1);
            buf.fill(3).unwrap();
            let e = block_on(buf.copy_to_host(vec![0u8; 1024])).unwrap_err();
            assert_injected(&e, FaultPoint::Memset);
        });
        // Memory freed on a failed stream and taken by another: the taker inherits the
        // failure, typed, and nothing leaks.
        case(&|s, mr| {
            let mut buf = block_on(DeviceBuffer::new(1 << 20, s, mr.clone())).unwrap();
            c.fail_next(FaultPoint::Copy, 1);
            assert!(block_on(buf.copy_from_host(vec![1u8; 1 << 20])).is_err());
            drop(buf);
            let t = Stream::new(&device).unwrap();
            match block_on(DeviceBuffer::new(1 << 20, &t, mr.clone())) {
                Ok(b) => drop(b),
                Err(e) => assert_injected(&e, FaultPoint::Copy),
            }
            let _ = t.synchronize_blocking();
        });
        assert_eq!(c.faults_injected(FaultPoint::Copy), 4);
        assert_eq!(c.faults_injected(FaultPoint::Memset), 1);
        assert_no_leak(&device);
        // The copies' failures were returned, not deferred.
        assert!(deferred(&device).is_empty());
    });
}

/// A stream-ordered free the driver refuses is reported through the deferred errors with the
/// driver call named; the statistics above count the buffer as freed, and the block stays
/// with the driver, as on a GPU (exactly that one block: nothing else leaks).
pub fn free_fault_on_a_stream_ordered_free(device: Device) {
    within("stream-ordered free", move || {
        let c = controls(&device);
        let s = Stream::new(&device).unwrap();
        let mr = StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
        let buf = block_on(DeviceBuffer::new(4096, &s, mr.clone())).unwrap();
        let kept = block_on(DeviceBuffer::new(4096, &s, mr.clone())).unwrap();
        c.fail_next(FaultPoint::Free, 1);
        drop(buf);
        let errors = deferred(&device);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_injected(&errors[0], FaultPoint::Free);
        drop(kept);
        assert_eq!(mr.bytes_counter().value, 0);
        drop(mr);
        s.synchronize_blocking().unwrap();
        assert_eq!(c.live_allocations(), 1, "only the refused block stays");
        assert!(deferred(&device).is_empty());
    });
}

/// A pool's trim gives chunks back with stream-ordered frees; one the driver refuses is
/// deferred and the pool's own accounting still drops the chunk.
pub fn free_fault_during_pool_trim(device: Device) {
    within("pool trim", move || {
        let c = controls(&device);
        let s = Stream::new(&device).unwrap();
        let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 1 << 20, None).unwrap();
        let buf = block_on(DeviceBuffer::new(4096, &s, pool.clone())).unwrap();
        drop(buf);
        s.synchronize_blocking().unwrap();
        c.fail_next(FaultPoint::Free, 1);
        assert!(pool.trim() > 0, "nothing trimmed");
        let errors = deferred(&device);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_injected(&errors[0], FaultPoint::Free);
        assert_eq!(pool.statistics().reserved_bytes, 0);
        drop(pool);
        s.synchronize_blocking().unwrap();
        assert_eq!(c.live_allocations(), 1, "only the refused chunk stays");
    });
}

/// Stream T takes memory another stream S freed: the pool records an event on S and makes T
/// wait. When that record fails, T's request fails with it (nothing is handed over unordered)
/// and the next request, without the fault, is served from the same memory.
pub fn record_fault_when_another_stream_takes_freed_memory(device: Device) {
    within("cross-stream take", move || {
        let c = controls(&device);
        let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
        // Bounded to one chunk: T cannot grow around the fault.
        let mr = counted_pool(&device, 1 << 20, Some(1 << 20));
        let buf = block_on(DeviceBuffer::new(1 << 20, &s, mr.clone())).unwrap();
        drop(buf);
        c.fail_next(FaultPoint::EventRecord, 1);
        // S's memory is free but unordered for T: the pool records on S (lazily) and fails.
        let e = mr.try_allocate(1 << 20, &t).unwrap_err();
        assert_injected(&e, FaultPoint::EventRecord);
        assert_eq!(c.faults_injected(FaultPoint::EventRecord), 1);
        c.fail_next(FaultPoint::EventRecord, 0);
        let again = block_on(DeviceBuffer::new(1 << 20, &t, mr.clone())).unwrap();
        drop(again);
        assert_eq!(mr.bytes_counter().value, 0);
        drop(mr);
        s.synchronize_blocking().unwrap();
        t.synchronize_blocking().unwrap();
        assert_no_leak(&device);
    });
}

/// A task waits for memory of a bounded pool held on stream S; the free on S wakes it, and
/// serving it on T from S's memory needs an event recorded on S and a wait on T. With either
/// call failing, the waiter gets a typed error or is served: it never waits out its deadline
/// for memory that is free.
pub fn faults_during_an_awaited_allocations_wake_up(device: Device) {
    for point in [FaultPoint::EventRecord, FaultPoint::StreamWait] {
        let device = device.clone();
        within("awaited wake-up", move || {
            let c = controls(&device);
            let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
            let mr = counted_pool(&device, 1 << 20, Some(1 << 20));
            let held = block_on(DeviceBuffer::new(1 << 20, &s, mr.clone())).unwrap();
            let waiter = {
                let (mr, t) = (mr.clone(), t.clone());
                thread::spawn(move || {
                    block_on(DeviceBuffer::new(1 << 20, &t, mr).timeout(Duration::from_secs(10)))
                })
            };
            while !mr.availability().is_some_and(|a| a.has_waiters()) && !waiter.is_finished() {
                thread::sleep(Duration::from_millis(1));
            }
            s.enqueue_delay(Duration::from_millis(5)).unwrap();
            c.fail_next(point, 1);
            drop(held);
            let outcome = waiter.join().unwrap();
            assert_eq!(
                c.faults_injected(point),
                1,
                "{point:?} was not met on the wake-up"
            );
            match outcome {
                Ok(buf) => drop(buf),
                Err(e) => {
                    assert!(
                        !matches!(e, Error::Timeout { .. }),
                        "{point:?}: waited out {e:?}"
                    );
                    assert_injected(&e, point);
                }
            }
            c.fail_next(point, 0);
            let _ = deferred(&device);
            assert_eq!(mr.bytes_counter().value, 0, "{point:?}");
            drop(mr);
            let _ = s.synchronize_blocking();
            let _ = t.synchronize_blocking();
            assert_no_leak(&device);
        });
    }
}

/// Awaiting an event: with the host-function completion strategy the completion driver
/// enqueues a notification (`cuLaunchHostFunc`); when that fails the await reports it, typed,
/// instead of waiting for a wake-up that never comes. (The poller makes no such call.)
pub fn host_function_fault_while_awaiting_an_event(device: Device) {
    within("awaited event", move || {
        let c = controls(&device);
        let s = Stream::new(&device).unwrap();
        let mr = counted_pool(&device, 1 << 20, None);
        for round in 0..2 {
            let buf = block_on(DeviceBuffer::new(4096, &s, mr.clone())).unwrap();
            s.enqueue_delay(Duration::from_millis(5)).unwrap();
            c.fail_next(FaultPoint::HostFunction, 1);
            let r = if round == 0 {
                block_on(s.synchronize())
            } else {
                block_on(buf.copy_to_host(vec![0u8; 4096])).map(drop)
            };
            let injected = c.faults_injected(FaultPoint::HostFunction);
            match device.completion_strategy() {
                streamalloc::CompletionStrategy::HostFunction => {
                    assert_eq!(injected, round + 1, "no notification was enqueued");
                    // Typed, or served after all (a fall-back to another wake-up).
                    if let Err(e) = r {
                        assert_injected(&e, FaultPoint::HostFunction);
                    }
                }
                _ => {
                    r.unwrap();
                    c.fail_next(FaultPoint::HostFunction, 0);
                }
            }
            drop(buf);
        }
        assert_eq!(mr.bytes_counter().value, 0);
        drop(mr);
        let _ = s.synchronize_blocking();
        let _ = deferred(&device);
        assert_no_leak(&device);
    });
}

/// A read on another stream ends by recording an event there, and the buffer's free first
/// makes the owner wait for it. When the record fails, the error is deferred and the reader
/// stays pending: the drop records it again and frees normally. When the owner's wait fails
/// at the drop, the error is deferred and the buffer is leaked on purpose (freeing it could
/// free under a pending read): statistics keep exactly its bytes.
pub fn faults_while_a_read_ends_and_the_buffer_drops(device: Device) {
    within("read end and drop", move || {
        let c = controls(&device);
        let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
        let mr = counted_pool(&device, 1 << 20, None);

        let buf = block_on(DeviceBuffer::new(4096, &a, mr.clone())).unwrap();
        let guard = buf.read_on(&b).unwrap();
        b.enqueue_delay(Duration::from_millis(5)).unwrap();
        c.fail_next(FaultPoint::EventRecord, 1);
        drop(guard);
        let errors = deferred(&device);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_injected(&errors[0], FaultPoint::EventRecord);
        drop(buf);
        assert!(deferred(&device).is_empty());
        assert_eq!(mr.bytes_counter().value, 0, "the buffer was not freed");

        let buf = block_on(DeviceBuffer::new(4096, &a, mr.clone())).unwrap();
        let guard = buf.read_on(&b).unwrap();
        b.enqueue_delay(Duration::from_millis(5)).unwrap();
        drop(guard);
        c.fail_next(FaultPoint::StreamWait, 1);
        drop(buf);
        assert_eq!(c.faults_injected(FaultPoint::StreamWait), 1);
        let errors = deferred(&device);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_injected(&errors[0], FaultPoint::StreamWait);
        assert_eq!(mr.bytes_counter().value, 4096, "leaked on purpose, exactly");
        let _ = a.synchronize_blocking();
        let _ = b.synchronize_blocking();
    });
}

/// The mapped pool grows by creating physical memory and mapping it into its range: when
/// either fails, the request fails typed (out-of-memory or the driver error) and the next one
/// is served, statistics go back to 0 and nothing leaks. Trimming unmaps and releases pages:
/// a failure there is deferred, typed; a page that did not unmap stays mapped and is tried
/// again by the next trim, and one whose release was refused stays with the driver (exactly
/// that page).
pub fn mapped_pool_faults(device: Device) {
    within("mapped pool", move || {
        let c = controls(&device);
        let s = Stream::new(&device).unwrap();
        let config = || {
            MappedPoolConfig::default()
                .reserve(64 << 20)
                .release_threshold(usize::MAX)
        };
        for point in [
            FaultPoint::VmmCreate,
            FaultPoint::VmmMap,
            FaultPoint::Allocation,
        ] {
            let mr =
                StatisticsAdaptor::new(MappedPoolResource::with_config(&device, config()).unwrap());
            c.fail_next(point, 1);
            match mr.try_allocate(4 << 20, &s) {
                Err(e) => assert!(
                    e.is_out_of_memory()
                        || matches!(e, Error::Driver { call, .. } if call == point.driver_call()),
                    "{point:?}: {e:?}"
                ),
                // SAFETY: allocated just above with this size; no work uses it.
                Ok(p) => unsafe { mr.deallocate(p, 4 << 20, &s) },
            }
            assert_eq!(c.faults_injected(point), 1, "{point:?} was not met");
            let buf = block_on(DeviceBuffer::new(4 << 20, &s, mr.clone())).unwrap();
            drop(buf);
            assert_eq!(mr.bytes_counter().value, 0);
            drop(mr);
            s.synchronize_blocking().unwrap();
            assert!(deferred(&device).is_empty());
            assert_no_leak(&device);
        }
        for point in [FaultPoint::VmmUnmap, FaultPoint::VmmRelease] {
            let mr = MappedPoolResource::with_config(&device, config()).unwrap();
            let buf = block_on(DeviceBuffer::new(4 << 20, &s, mr.clone())).unwrap();
            drop(buf);
            s.synchronize_blocking().unwrap();
            let g = mr.statistics().granularity;
            let mapped = mr.statistics().reserved_bytes;
            assert!(mapped >= 2 * g, "{mapped} bytes mapped");
            c.fail_next(point, 1);
            // The first page's call fails; the others are released.
            let released = mr.trim_blocking().unwrap();
            assert_eq!(c.faults_injected(point), 1, "{point:?} was not met");
            let errors = deferred(&device);
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert_injected(&errors[0], point);
            let still_mapped = mr.statistics().reserved_bytes;
            // A page that did not unmap is tried again by the next trim.
            let retried = mr.trim();
            assert!(deferred(&device).is_empty());
            let left = mr.statistics().reserved_bytes;
            drop(mr);
            s.synchronize_blocking().unwrap();
            if point == FaultPoint::VmmUnmap {
                assert_eq!((released, still_mapped), (mapped - g, g));
                assert_eq!((retried, left), (g, 0));
                assert_no_leak(&device);
            } else {
                // Unmapped, but its physical memory stays with the driver, as a refused free
                // does: exactly that page.
                assert_eq!((released, still_mapped), (mapped, 0));
                assert_eq!((retried, left), (0, 0));
                assert_eq!(c.live_allocations(), 1);
                assert!(deferred(&device).is_empty());
            }
        }
    });
}

/// Instantiates the fault suite for one host device expression (a fresh device per test).
#[macro_export]
macro_rules! fault_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::fault_suite as suite;

            $(#[$attr])* #[test] fn allocation_fault_during_pool_growth() {
                suite::allocation_fault_during_pool_growth($device)
            }
            $(#[$attr])* #[test] fn hand_off_faults() { suite::hand_off_faults($device) }
            $(#[$attr])* #[test] fn copy_faults() { suite::copy_faults($device) }
            $(#[$attr])* #[test] fn free_fault_on_a_stream_ordered_free() {
                suite::free_fault_on_a_stream_ordered_free($device)
            }
            $(#[$attr])* #[test] fn free_fault_during_pool_trim() {
                suite::free_fault_during_pool_trim($device)
            }
            $(#[$attr])* #[test] fn record_fault_when_another_stream_takes_freed_memory() {
                suite::record_fault_when_another_stream_takes_freed_memory($device)
            }
            $(#[$attr])* #[test] fn host_function_fault_while_awaiting_an_event() {
                suite::host_function_fault_while_awaiting_an_event($device)
            }
            $(#[$attr])* #[test] fn faults_while_a_read_ends_and_the_buffer_drops() {
                suite::faults_while_a_read_ends_and_the_buffer_drops($device)
            }
            $(#[$attr])* #[test] fn mapped_pool_faults() { suite::mapped_pool_faults($device) }
            $(#[$attr])* #[test] fn faults_during_an_awaited_allocations_wake_up() {
                suite::faults_during_an_awaited_allocations_wake_up($device)
            }
        }
    };
}
