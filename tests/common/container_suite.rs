//! Typed device containers (`DeviceVec`, its views, `DeviceScalar`) on a real backend: the same
//! cases on the host backend (CI) and on CUDA device 0 (the GPU bundle). Device work is stood in
//! for by `Stream::enqueue_delay` (a worker-thread sleep on the host backend, a spin kernel on
//! CUDA).

use std::time::Duration;

use futures::executor::block_on;
use streamalloc::{
    CudaAsyncResource, CudaResource, Device, DeviceBuffer, DeviceScalar, DeviceVec, Error,
    LimitingAdaptor, PoolResource, Stream,
};

const LONG: Duration = Duration::from_millis(100);

fn pattern(len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect()
}

fn is_invalid(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument(_))
}

/// Host → device → host for several lengths (0 included) and element types, through owned
/// vectors, boxed slices and borrowed slices.
pub fn vec_round_trip(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let s = Stream::new(&device).unwrap();
    for n in [0, 1, 63, 64, 4097, (1 << 20) + 3] {
        let sent = pattern(n);
        let v = block_on(DeviceVec::from_host(sent.clone(), &s, mr.clone())).unwrap();
        assert_eq!(v.len(), n);
        assert_eq!(block_on(v.to_vec()).unwrap(), sent, "{n} u32");
        let boxed = block_on(v.copy_to_host(vec![0u32; n].into_boxed_slice())).unwrap();
        assert_eq!(&boxed[..], &sent[..]);
        let mut out = vec![0u32; n];
        block_on(v.copy_to_host_slice(&mut out)).unwrap();
        assert_eq!(out, sent);
    }
    let floats: Vec<f64> = (0..1000).map(|i| i as f64 * 0.5).collect();
    let v = block_on(DeviceVec::from_host_slice(&floats, &s, mr)).unwrap();
    assert_eq!(block_on(v.to_vec()).unwrap(), floats);
}

/// A view reads and writes only its range: 16 elements of a 5 MiB vector come back into a
/// 16-element host buffer, and a write through a mutable view leaves its neighbours alone.
pub fn views_touch_only_their_range(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let s = Stream::new(&device).unwrap();
    let n = 5 << 18; // 5 MiB of u32
    let sent = pattern(n);
    let mut v = block_on(DeviceVec::from_host(sent.clone(), &s, mr)).unwrap();
    let head = block_on(v.slice(..16).unwrap().copy_to_host(vec![0u32; 16])).unwrap();
    assert_eq!(head, sent[..16]);
    let mid = v.slice(1000..2000).unwrap().slice(10..20).unwrap();
    assert_eq!(mid.ptr(), v.ptr().offset(1010 * 4));
    assert_eq!(block_on(mid.to_vec()).unwrap(), sent[1010..1020]);
    let bytes = block_on(
        v.as_buffer()
            .slice(8..16)
            .unwrap()
            .copy_to_host(vec![0u8; 8]),
    )
    .unwrap();
    assert_eq!(bytes, bytemuck::cast_slice::<u32, u8>(&sent[2..4]));

    block_on(
        v.slice_mut(n - 3..n - 1)
            .unwrap()
            .copy_from_host(vec![7, 8]),
    )
    .unwrap();
    let tail = block_on(v.slice(n - 5..).unwrap().to_vec()).unwrap();
    assert_eq!(tail, [sent[n - 5], sent[n - 4], 7, 8, sent[n - 1]]);
    block_on(v.slice_mut(0..2).unwrap().copy_from_host_slice(&[1, 2])).unwrap();
    assert_eq!(
        block_on(v.slice(..3).unwrap().to_vec()).unwrap(),
        [1, 2, sent[2]]
    );
}

/// Growing keeps the elements, shrinking keeps the capacity, `shrink_to_fit` reallocates.
pub fn resize_keeps_elements(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let s = Stream::new(&device).unwrap();
    let sent = pattern(1000);
    let mut v = block_on(DeviceVec::from_host(sent.clone(), &s, mr)).unwrap();
    block_on(v.resize(3000)).unwrap();
    assert_eq!((v.len(), v.capacity()), (3000, 3000));
    assert_eq!(block_on(v.slice(..1000).unwrap().to_vec()).unwrap(), sent);
    block_on(v.resize(10)).unwrap();
    assert_eq!((v.len(), v.capacity()), (10, 3000));
    block_on(v.reserve(5000)).unwrap();
    assert_eq!((v.len(), v.capacity()), (10, 5000));
    block_on(v.shrink_to_fit()).unwrap();
    assert_eq!((v.len(), v.capacity()), (10, 10));
    assert_eq!(block_on(v.to_vec()).unwrap(), sent[..10]);
    block_on(v.resize(0)).unwrap();
    assert!(v.is_empty());
}

/// `zeroed` gives zeros even in memory a pool hands back after someone wrote it.
pub fn zeroed_is_zero_in_reused_memory(device: Device) {
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 1 << 20, None).unwrap();
    let s = Stream::new(&device).unwrap();
    let dirty = block_on(DeviceVec::from_host(vec![u32::MAX; 4096], &s, pool.clone())).unwrap();
    let p = dirty.ptr();
    drop(dirty);
    let v = block_on(DeviceVec::<u32>::zeroed(4096, &s, pool)).unwrap();
    assert_eq!(
        v.ptr(),
        p,
        "the pool should reuse the block on the same stream"
    );
    assert!(block_on(v.to_vec()).unwrap().iter().all(|&x| x == 0));
}

/// A scalar keeps its value across `set_value` and a hand-off, stream-ordered.
pub fn scalar_values(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let mut x = block_on(DeviceScalar::new(1.25f32, &a, mr)).unwrap();
    assert_eq!(block_on(x.value()).unwrap(), 1.25);
    a.enqueue_delay(LONG).unwrap();
    x.set_value(2.5).unwrap(); // after the long work on `a`, without waiting
    x.set_stream(&b).unwrap();
    assert_eq!(
        block_on(x.value()).unwrap(),
        2.5,
        "`b` read before `a` wrote"
    );
    assert_eq!(x.as_buffer().len(), 4);
}

/// A vector written on A after long device work, handed to B and read there (whole and through
/// a view), holds A's data: `set_stream` inserted the wait.
pub fn vec_handoff_between_streams(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let n = 1 << 20;
    let sent = pattern(n);
    let mut v = DeviceVec::<u32>::try_new(n, &a, mr).unwrap();
    a.enqueue_delay(LONG).unwrap();
    let write = v.copy_from_host(sent.clone());
    v.set_stream(&b).unwrap();
    assert_eq!(v.stream(), b);
    let tail = v.slice(n - 4..).unwrap().to_vec();
    assert_eq!(
        block_on(v.to_vec()).unwrap(),
        sent,
        "B read before A's write"
    );
    assert_eq!(block_on(tail).unwrap(), sent[n - 4..]);
    block_on(write).unwrap();
    // Read on a third stream while B owns it; the drop waits for the read.
    let c = Stream::new(&device).unwrap();
    let guard = v.read_on(&c).unwrap();
    assert_eq!(guard.len(), 4 * n);
    drop(guard);
    drop(v);
    block_on(b.synchronize()).unwrap();
}

/// Bad input: typed errors carrying the numbers, nothing allocated, no panic.
pub fn bad_input_is_a_typed_error(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let s = Stream::new(&device).unwrap();
    let huge = usize::MAX / 2;
    let e = DeviceVec::<u32>::try_new(huge, &s, mr.clone()).unwrap_err();
    assert!(
        is_invalid(&e) && e.to_string().contains(&huge.to_string()),
        "{e}"
    );
    let e = block_on(DeviceVec::<u32>::new(huge, &s, mr.clone())).unwrap_err();
    assert!(is_invalid(&e), "{e}");
    assert!(is_invalid(
        &DeviceVec::<()>::try_new(1, &s, mr.clone()).unwrap_err()
    ));

    let mut v = DeviceVec::<u32>::try_new(10, &s, mr.clone()).unwrap();
    let e = v.slice(5..11).unwrap_err();
    assert!(
        e.to_string().contains("5..11") && e.to_string().contains("10"),
        "{e}"
    );
    #[allow(clippy::reversed_empty_ranges)]
    let e = v.slice(7..3).unwrap_err();
    assert!(e.to_string().contains("7..3"), "{e}");
    assert!(is_invalid(&v.slice_mut(..11).unwrap_err()));
    let e = block_on(v.copy_to_host(vec![0u32; 9])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                device_len: 10,
                host_len: 9,
                unit: "elements",
                ..
            }
        ),
        "{e}"
    );
    let e = block_on(v.copy_from_host(vec![0u32; 11])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                device_len: 10,
                host_len: 11,
                ..
            }
        ),
        "{e}"
    );
    let e = block_on(v.slice_mut(8..).unwrap().copy_from_host(vec![0u32; 3])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                device_len: 2,
                host_len: 3,
                ..
            }
        ),
        "{e}"
    );

    let odd = DeviceBuffer::try_new(7, &s, mr).unwrap();
    let e = DeviceVec::<u16>::from_buffer(odd).unwrap_err();
    assert!(is_invalid(&e) && e.to_string().contains('7'), "{e}");
}

/// A construction that cannot get memory in time fails with a timeout naming size and device.
pub fn new_times_out_with_size_and_device(device: Device) {
    let mr = LimitingAdaptor::new(CudaAsyncResource::new(&device).unwrap(), 1 << 20);
    let s = Stream::new(&device).unwrap();
    let held = block_on(DeviceVec::<u8>::new(1 << 20, &s, mr.clone())).unwrap();
    let e =
        block_on(DeviceVec::<u32>::new(1000, &s, mr.clone()).timeout(Duration::from_millis(20)))
            .unwrap_err();
    assert!(
        matches!(e, Error::Timeout { requested: 4000, device: d, .. } if d == device.id()),
        "{e}"
    );
    let e = block_on(DeviceBuffer::new(512, &s, mr.clone()).timeout(Duration::from_millis(20)))
        .unwrap_err();
    assert!(
        e.to_string().contains("512 bytes") && e.to_string().contains(&device.id().to_string())
    );
    // Once memory comes back, a waiting construction succeeds.
    let waiting = DeviceVec::<u32>::new(1000, &s, mr).timeout(Duration::from_secs(10));
    drop(held);
    assert_eq!(block_on(waiting).unwrap().len(), 1000);
}

#[macro_export]
macro_rules! container_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::container_suite as suite;

            $(#[$attr])* #[test] fn vec_round_trip() { suite::vec_round_trip($device) }
            $(#[$attr])* #[test] fn views_touch_only_their_range() { suite::views_touch_only_their_range($device) }
            $(#[$attr])* #[test] fn resize_keeps_elements() { suite::resize_keeps_elements($device) }
            $(#[$attr])* #[test] fn zeroed_is_zero_in_reused_memory() { suite::zeroed_is_zero_in_reused_memory($device) }
            $(#[$attr])* #[test] fn scalar_values() { suite::scalar_values($device) }
            $(#[$attr])* #[test] fn vec_handoff_between_streams() { suite::vec_handoff_between_streams($device) }
            $(#[$attr])* #[test] fn bad_input_is_a_typed_error() { suite::bad_input_is_a_typed_error($device) }
            $(#[$attr])* #[test] fn new_times_out_with_size_and_device() { suite::new_times_out_with_size_and_device($device) }
        }
    };
}
