use std::time::{Duration, Instant};

use futures::executor::block_on;

use crate::{CompletionStrategy, CudaResource, Device, DeviceBuffer, Error, HostConfig, Stream};

const STRATEGIES: [CompletionStrategy; 2] =
    [CompletionStrategy::HostFunction, CompletionStrategy::Poller];

fn setup(strategy: CompletionStrategy) -> (Device, Stream, DeviceBuffer) {
    let device = Device::host_with(HostConfig::default().completion_strategy(strategy));
    let stream = Stream::new(&device).unwrap();
    let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)).unwrap();
    (device, stream, buf)
}

/// Waits (never forever) until the device has deferred `n` errors: the completion driver
/// delivers a dropped copy's outcome on its own thread, after the stream has passed the copy.
fn wait_for_deferred(device: &Device, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while device.deferred_error_count() < n {
        assert!(Instant::now() < deadline, "no deferred error after 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn assert_injected_copy_failure(error: Option<Error>) {
    match error {
        Some(Error::Driver { call, .. }) => assert_eq!(call, "cuMemcpyAsync"),
        other => panic!("expected the injected copy failure, got {other:?}"),
    }
}

#[test]
fn a_copy_from_host_dropped_before_it_fails_is_a_deferred_error() {
    for strategy in STRATEGIES {
        let (device, stream, mut buf) = setup(strategy);
        stream.enqueue_delay(Duration::from_millis(30)).unwrap();
        device.host_controls().unwrap().fail_next_copies(1);
        drop(buf.copy_from_host(vec![7u8; 64]));
        assert!(stream.synchronize_blocking().is_err(), "{strategy:?}");
        wait_for_deferred(&device, 1);
        assert_injected_copy_failure(device.take_deferred_error());
        assert_eq!(device.deferred_error_count(), 1, "{strategy:?}");
    }
}

#[test]
fn a_copy_to_host_dropped_before_it_fails_is_a_deferred_error() {
    for strategy in STRATEGIES {
        let (device, stream, buf) = setup(strategy);
        stream.enqueue_delay(Duration::from_millis(30)).unwrap();
        device.host_controls().unwrap().fail_next_copies(1);
        drop(buf.copy_to_host(vec![0u8; 64]));
        wait_for_deferred(&device, 1);
        assert_injected_copy_failure(device.take_deferred_error());
        assert_eq!(device.deferred_error_count(), 1, "{strategy:?}");
    }
}

#[test]
fn a_copy_dropped_after_it_failed_is_a_deferred_error_at_once() {
    let (device, stream, mut buf) = setup(CompletionStrategy::Poller);
    device.host_controls().unwrap().fail_next_copies(1);
    let copy = buf.copy_from_host(vec![7u8; 64]);
    assert!(stream.synchronize_blocking().is_err());
    drop(copy);
    assert_injected_copy_failure(device.take_deferred_error());
    assert_eq!(device.deferred_error_count(), 1);
}

#[test]
fn an_awaited_copy_returns_its_failure_and_defers_nothing() {
    for strategy in STRATEGIES {
        let (device, stream, mut buf) = setup(strategy);
        stream.enqueue_delay(Duration::from_millis(10)).unwrap();
        device.host_controls().unwrap().fail_next_copies(1);
        assert_injected_copy_failure(block_on(buf.copy_from_host(vec![7u8; 64])).err());
        assert_eq!(device.deferred_error_count(), 0, "{strategy:?}");
    }
}

#[test]
fn a_dropped_copy_that_succeeds_defers_nothing() {
    for strategy in STRATEGIES {
        let (device, stream, mut buf) = setup(strategy);
        stream.enqueue_delay(Duration::from_millis(10)).unwrap();
        drop(buf.copy_from_host(vec![7u8; 64]));
        block_on(stream.record().unwrap()).unwrap();
        assert_eq!(
            block_on(buf.copy_to_host(vec![0u8; 64])).unwrap(),
            [7u8; 64]
        );
        assert_eq!(device.deferred_error_count(), 0, "{strategy:?}");
    }
}
