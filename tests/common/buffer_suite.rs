//! Device buffers and streams on a real backend: the same cases on the host backend (CI) and
//! on CUDA device 0 (the GPU bundle). Device work is stood in for by `Stream::enqueue_delay`,
//! which is a worker-thread sleep on the host backend and a spin kernel on CUDA.

use std::time::{Duration, Instant};

use futures::executor::block_on;
use streamalloc::{CompletionStrategy, CudaAsyncResource, Device, DeviceBuffer, Stream};

const LONG: Duration = Duration::from_millis(100);

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// A buffer written on stream A after long device work, handed to stream B and read there,
/// holds A's data: `set_stream` inserted the wait.
pub fn handoff_waits_for_the_old_owner(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let n = 4 << 20;
    let mut buf = DeviceBuffer::try_new(n, &a, mr).unwrap();
    a.enqueue_delay(LONG).unwrap();
    buf.fill(0x5a).unwrap();
    buf.set_stream(&b).unwrap();
    let host = block_on(buf.copy_to_host(vec![0u8; n])).unwrap();
    assert!(
        host.iter().all(|&x| x == 0x5a),
        "stream B read before stream A's writes"
    );
}

pub fn host_round_trip(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let s = Stream::new(&device).unwrap();
    for n in [1, 255, 256, 4097, (9 << 20) + 13] {
        let mut buf = DeviceBuffer::try_new(n, &s, mr.clone()).unwrap();
        let sent = pattern(n);
        let sent = block_on(buf.copy_from_host(sent)).unwrap();
        let back = block_on(buf.copy_to_host(vec![0u8; n].into_boxed_slice())).unwrap();
        assert_eq!(&back[..], &sent[..], "{n} bytes");
    }
}

pub fn resize_and_clone_keep_contents(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let n = 100_000;
    let mut buf = DeviceBuffer::try_new(n, &a, mr).unwrap();
    let sent = block_on(buf.copy_from_host(pattern(n))).unwrap();
    block_on(buf.resize(3 * n)).unwrap();
    assert_eq!(buf.len(), 3 * n);
    let back = block_on(buf.copy_to_host(vec![0u8; 3 * n])).unwrap();
    assert_eq!(&back[..n], &sent[..]);
    block_on(buf.resize(n / 2)).unwrap();
    block_on(buf.shrink_to_fit()).unwrap();
    assert_eq!(buf.capacity(), n / 2);
    let copy = block_on(buf.try_clone_on(&b)).unwrap();
    assert_eq!(copy.stream(), b);
    let back = block_on(copy.copy_to_host(vec![0u8; n / 2])).unwrap();
    assert_eq!(&back[..], &sent[..n / 2]);
}

pub fn copy_between_buffers_orders_both_streams(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let n = 1 << 20;
    let mut src = DeviceBuffer::try_new(n, &a, mr.clone()).unwrap();
    a.enqueue_delay(LONG).unwrap();
    src.fill(9).unwrap();
    let mut dst = DeviceBuffer::try_new(n, &b, mr).unwrap();
    dst.copy_from_device(&src).unwrap();
    drop(src); // freed on A after B's read of it
    let back = block_on(dst.copy_to_host(vec![0u8; n])).unwrap();
    assert!(back.iter().all(|&x| x == 9));
}

/// Events resolve, as futures, only after the device work before them, with either completion
/// strategy, under tokio and under `block_on`.
pub fn events_resolve_after_device_work(device: Device) {
    let before = device.completion_strategy();
    for strategy in [CompletionStrategy::HostFunction, CompletionStrategy::Poller] {
        device.set_completion_strategy(strategy);
        let s = Stream::new(&device).unwrap();
        let start = Instant::now();
        s.enqueue_delay(Duration::from_millis(30)).unwrap();
        let e = s.record().unwrap();
        block_on(e.clone()).unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(25),
            "{strategy:?} resolved early"
        );
        assert!(e.is_complete().unwrap());

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        rt.block_on(async {
            let tasks: Vec<_> = (0..32)
                .map(|i| {
                    let s = s.clone();
                    tokio::spawn(async move {
                        s.enqueue_delay(Duration::from_micros(50 * i)).unwrap();
                        s.record().unwrap().await.unwrap();
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
    }
    device.set_completion_strategy(before);
}

/// Instantiates the buffer and stream cases for one device.
#[macro_export]
macro_rules! buffer_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::buffer_suite as suite;

            $(#[$attr])* #[test] fn handoff_waits_for_the_old_owner() { suite::handoff_waits_for_the_old_owner($device) }
            $(#[$attr])* #[test] fn host_round_trip() { suite::host_round_trip($device) }
            $(#[$attr])* #[test] fn resize_and_clone_keep_contents() { suite::resize_and_clone_keep_contents($device) }
            $(#[$attr])* #[test] fn copy_between_buffers_orders_both_streams() { suite::copy_between_buffers_orders_both_streams($device) }
            $(#[$attr])* #[test] fn events_resolve_after_device_work() { suite::events_resolve_after_device_work($device) }
        }
    };
}
