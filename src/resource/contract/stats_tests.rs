//! `memory_stats`: one picture of a stack of resources, its peaks and its wait queue.

use std::future::Future;
use std::pin::pin;
use std::task::Context;
use std::time::Duration;

use crate::test_support::free;
use crate::{
    ArenaResource, BinningResource, CudaResource, Device, FixedSizeResource, HostConfig,
    LimitingAdaptor, MemoryResource, PoolResource, StatisticsAdaptor, Stream,
};

const KIB: usize = 1024;
const MIB: usize = 1 << 20;

fn device() -> (Device, Stream) {
    let device = Device::host_with(HostConfig::default());
    let stream = Stream::new(&device).unwrap();
    (device, stream)
}

#[test]
fn a_statistics_adaptor_over_a_pool_reports_allocated_and_reserved_together() {
    let (device, s) = device();
    let mr = StatisticsAdaptor::new(
        PoolResource::new(CudaResource::new(&device).unwrap(), MIB, None).unwrap(),
    );
    let a = mr.try_allocate(1000, &s).unwrap();
    let b = mr.try_allocate(3000, &s).unwrap();
    free(&mr, a, 1000, &s);
    let stats = mr.memory_stats();
    // Allocated from the adaptor (requested bytes), reserved from the pool (upstream bytes).
    assert_eq!(stats.allocated_bytes, Some(3000));
    assert_eq!(stats.peak_allocated_bytes, Some(4000));
    assert_eq!(stats.allocations, Some(1));
    assert_eq!(stats.reserved_bytes, Some(MIB));
    assert_eq!(stats.peak_reserved_bytes, Some(MIB));
    free(&mr, b, 3000, &s);
}

#[test]
fn a_pool_reports_its_reserved_peak_after_trim_until_reset() {
    let (device, s) = device();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
    let p = pool.try_allocate(MIB, &s).unwrap();
    let grown = pool.pool_size();
    let stats = pool.memory_stats();
    assert_eq!(stats.allocated_bytes, Some(MIB));
    assert_eq!(stats.allocations, Some(1));
    assert_eq!(stats.reserved_bytes, Some(grown));
    free(&pool, p, MIB, &s);
    pool.trim();
    let stats = pool.memory_stats();
    assert_eq!(
        (stats.allocated_bytes, stats.reserved_bytes),
        (Some(0), Some(0))
    );
    assert_eq!(stats.peak_reserved_bytes, Some(grown));
    pool.reset_peak();
    assert_eq!(pool.memory_stats().peak_reserved_bytes, Some(0));
}

#[test]
fn reset_peak_reaches_every_layer() {
    let (device, s) = device();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
    let mr = StatisticsAdaptor::new(LimitingAdaptor::new(pool.clone(), 4 * MIB));
    let p = mr.try_allocate(MIB, &s).unwrap();
    free(&mr, p, MIB, &s);
    pool.trim();
    let before = mr.memory_stats();
    assert_eq!(before.peak_allocated_bytes, Some(MIB));
    assert!(before.peak_reserved_bytes.unwrap() >= MIB);
    mr.reset_peak();
    let after = mr.memory_stats();
    assert_eq!(after.peak_allocated_bytes, Some(0));
    assert_eq!(after.peak_reserved_bytes, Some(0));
}

#[test]
fn a_limiting_adaptor_reports_what_it_charged_and_its_peak() {
    let (device, s) = device();
    let mr = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), MIB);
    let a = mr.try_allocate(1000, &s).unwrap();
    let b = mr.try_allocate(KIB, &s).unwrap();
    free(&mr, b, KIB, &s);
    let stats = mr.memory_stats();
    assert_eq!(stats.allocated_bytes, Some(1024));
    assert_eq!(stats.peak_allocated_bytes, Some(2048));
    mr.reset_peak();
    assert_eq!(mr.memory_stats().peak_allocated_bytes, Some(1024));
    free(&mr, a, 1000, &s);
}

#[test]
fn arena_fixed_size_and_binning_report_allocated_and_reserved() {
    let (device, s) = device();
    let arena = ArenaResource::new(CudaResource::new(&device).unwrap(), Some(4 * MIB)).unwrap();
    let p = arena.try_allocate(1000, &s).unwrap();
    let stats = arena.memory_stats();
    assert_eq!(stats.reserved_bytes, Some(4 * MIB));
    assert_eq!(stats.allocations, Some(1));
    assert!(stats.allocated_bytes.unwrap() >= 1000);
    free(&arena, p, 1000, &s);

    let fixed = FixedSizeResource::new(CudaResource::new(&device).unwrap(), KIB, 8).unwrap();
    let p = fixed.try_allocate(100, &s).unwrap();
    let stats = fixed.memory_stats();
    assert_eq!(
        (
            stats.allocated_bytes,
            stats.allocations,
            stats.reserved_bytes
        ),
        (Some(KIB), Some(1), Some(8 * KIB))
    );
    free(&fixed, p, 100, &s);

    // Binning over a pool: the bins' free blocks are reserved, not allocated.
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
    let mut binning = BinningResource::new(pool.clone());
    binning.add_bin(KIB, None).unwrap();
    let p = binning.try_allocate(100, &s).unwrap();
    let q = binning.try_allocate(2 * MIB, &s).unwrap();
    let stats = binning.memory_stats();
    assert_eq!(stats.allocated_bytes, Some(KIB + 2 * MIB));
    assert_eq!(stats.allocations, Some(2));
    assert_eq!(stats.reserved_bytes, Some(pool.pool_size()));
    free(&binning, p, 100, &s);
    free(&binning, q, 2 * MIB, &s);
}

#[test]
fn a_plain_leaf_counts_nothing_and_says_so() {
    let (device, _s) = device();
    let stats = CudaResource::new(&device).unwrap().memory_stats();
    assert_eq!(stats.allocated_bytes, None);
    assert_eq!(stats.reserved_bytes, None);
    let text = stats.to_string();
    assert!(text.contains("allocated") && text.contains('-'), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_queue_counts_waits_timeouts_and_cancellations_through_adaptors() {
    let (device, s) = device();
    let limited = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 4 * KIB);
    let mr = StatisticsAdaptor::new(limited.clone());
    let held = mr.allocate(4 * KIB, &s).await.unwrap();

    // A timeout.
    let late = mr
        .allocate(KIB, &s)
        .timeout(Duration::from_millis(20))
        .await;
    assert!(late.is_err());
    // A cancellation: polled once (it queues), then dropped.
    {
        let mut f = pin!(mr.allocate(KIB, &s));
        let waker = futures::task::noop_waker();
        assert!(f
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        assert_eq!(mr.memory_stats().wait_queue.waiting, 1);
    }
    // A served wait.
    let waiter = {
        let (mr, s) = (mr.clone(), s.clone());
        tokio::spawn(async move { mr.allocate(KIB, &s).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(mr.memory_stats().wait_queue.waiting, 1);
    free(&mr, held, 4 * KIB, &s);
    let p = waiter.await.unwrap().unwrap();

    let w = mr.memory_stats().wait_queue;
    assert_eq!(
        (w.waiting, w.waits, w.timeouts, w.cancellations),
        (0, 3, 1, 1)
    );
    // The timed-out wait (about 20 ms) and the served one (20 ms or more).
    assert!(w.time_waited >= Duration::from_millis(30), "{w:?}");
    // The adaptor reports the queue of the resource it waits on.
    assert_eq!(limited.memory_stats().wait_queue, w);
    let text = mr.memory_stats().to_string();
    assert!(text.contains("3 waits"), "{text}");
    free(&mr, p, KIB, &s);
}

#[test]
fn memory_stats_of_a_device_reads_its_current_resource() {
    let (device, s) = device();
    let mr = std::sync::Arc::new(StatisticsAdaptor::new(CudaResource::new(&device).unwrap()));
    crate::set_current_device_resource_for(&device, mr.clone()).unwrap();
    let p = mr.try_allocate(512, &s).unwrap();
    assert_eq!(crate::memory_stats(&device).allocated_bytes, Some(512));
    free(&mr, p, 512, &s);
    crate::reset_current_device_resource_for(&device);
}

#[test]
fn the_summary_shows_the_figures() {
    let (device, s) = device();
    let mr = StatisticsAdaptor::new(
        PoolResource::new(CudaResource::new(&device).unwrap(), MIB, None).unwrap(),
    );
    let p = mr.try_allocate(1536, &s).unwrap();
    let text = mr.memory_stats().to_string();
    assert!(text.contains("1.5 KiB (1536 bytes)"), "{text}");
    assert!(text.contains("1.0 MiB (1048576 bytes)"), "{text}");
    free(&mr, p, 1536, &s);
}

#[test]
fn every_adaptor_passes_the_figures_up() {
    use crate::{
        AlignedAdaptor, FailureCallbackAdaptor, LoggingAdaptor, PrefetchAdaptor, TracingAdaptor,
        TrackingAdaptor,
    };
    let (device, s) = device();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), MIB, None).unwrap();
    let counted = StatisticsAdaptor::new(pool);
    let stack = TracingAdaptor::new(TrackingAdaptor::new(
        LoggingAdaptor::to_writer(
            AlignedAdaptor::new(
                FailureCallbackAdaptor::new(PrefetchAdaptor::new(counted.clone()), |_| false),
                256,
                0,
            )
            .unwrap(),
            std::io::sink(),
        )
        .unwrap(),
    ));
    let p = stack.try_allocate(1000, &s).unwrap();
    let stats = stack.memory_stats();
    assert_eq!(stats, counted.memory_stats());
    assert_eq!(
        (stats.allocated_bytes, stats.reserved_bytes),
        (Some(1000), Some(MIB))
    );
    free(&stack, p, 1000, &s);
    stack.reset_peak();
    assert_eq!(counted.memory_stats().peak_allocated_bytes, Some(0));
}
