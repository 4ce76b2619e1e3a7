//! Typed host data on a real backend: `Vec<T>`, `Box<[T]>`, `PinnedHostVec<T>` and borrowed
//! slices copied to and from device vectors (and, as bytes, buffers). On CUDA a `PinnedHostVec` takes the direct
//! `cuMemcpyAsync` path and a `Vec` the staged pageable path, so both are exercised.

use std::time::{Duration, Instant};

use futures::executor::block_on;
use streamalloc::{
    CudaAsyncResource, Device, DeviceBuffer, DeviceVec, Error, PinnedHostResource, PinnedHostVec,
    PoolResource, Stream,
};

const LONG: Duration = Duration::from_millis(100);

fn floats(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.25 - 1000.0).collect()
}

/// `Vec<f32>` and `Box<[u64]>` round trips of several sizes, 0 and a multi-MiB one included,
/// with no byte conversion.
pub fn typed_round_trips(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let s = Stream::new(&device).unwrap();
    for n in [0, 1, 63, 64, 1025, (3 << 20) + 5] {
        let mut buf = DeviceVec::<f32>::try_new(n, &s, mr.clone()).unwrap();
        let sent = block_on(buf.copy_from_host(floats(n))).unwrap();
        let back = block_on(buf.copy_to_host(vec![0f32; n])).unwrap();
        assert_eq!(back, sent, "{n} floats");
        let m = n / 2;
        let mut buf = DeviceVec::<u64>::try_new(m, &s, mr.clone()).unwrap();
        let longs: Box<[u64]> = (0..m as u64).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        let longs = block_on(buf.copy_from_host(longs)).unwrap();
        let back = block_on(buf.copy_to_host(vec![0u64; m].into_boxed_slice())).unwrap();
        assert_eq!(back, longs, "{m} longs");
    }
}

/// Pinned vectors from the leaf resource and from a pool over it carry data both ways.
pub fn pinned_round_trips(device: Device) {
    let s = Stream::new(&device).unwrap();
    let pool = PoolResource::new(PinnedHostResource::new(&device).unwrap(), 1 << 20, None).unwrap();
    block_on(async {
        let n = 1 << 20;
        let mut buf = DeviceVec::<f32>::new(n, &s, CudaAsyncResource::new(&device)?).await?;
        let sent = floats(n);
        let leaf =
            PinnedHostVec::from_slice(&sent, &s, PinnedHostResource::new(&device).unwrap()).await?;
        let leaf = buf.copy_from_host(leaf).await?;
        let back =
            PinnedHostVec::<f32>::zeroed(n, &s, PinnedHostResource::new(&device).unwrap()).await?;
        let back = buf.copy_to_host(back).await?;
        assert_eq!(&back[..], &leaf[..]);
        let mut buf = DeviceVec::<u32>::new(1000, &s, CudaAsyncResource::new(&device)?).await?;
        for batch in 0..4 {
            let mut staging = PinnedHostVec::<u32>::new(1000, &s, pool.clone()).await?;
            staging
                .iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (i * batch) as u32);
            let staging = buf.copy_from_host(staging).await?;
            let out = PinnedHostVec::<u32>::zeroed(1000, &s, pool.clone()).await?;
            let out = buf.copy_to_host(out).await?;
            assert_eq!(&out[..], &staging[..], "batch {batch}");
        }
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// Borrowed slices both ways; the device never writes a slice whose future was forgotten.
pub fn borrowed_slices(device: Device) {
    let s = Stream::new(&device).unwrap();
    let n = 100_000;
    let mut buf =
        DeviceBuffer::try_new(4 * n, &s, CudaAsyncResource::new(&device).unwrap()).unwrap();
    let mut sent = floats(n);
    let copy = buf.copy_from_host_slice(bytemuck::cast_slice(&sent));
    sent[0] = 1.0; // taken at the call
    block_on(copy).unwrap();
    let mut back = vec![0f32; n];
    block_on(buf.copy_to_host_slice(bytemuck::cast_slice_mut(&mut back))).unwrap();
    assert_eq!(back, floats(n));

    let mut untouched = vec![0f32; n];
    s.enqueue_delay(LONG).unwrap();
    std::mem::forget(buf.copy_to_host_slice(bytemuck::cast_slice_mut(&mut untouched)));
    s.synchronize_blocking().unwrap();
    assert!(
        untouched.iter().all(|&x| x == 0.0),
        "the device wrote a forgotten slice"
    );
}

/// Wrong lengths are typed errors with both lengths, in bytes for a `DeviceBuffer`.
pub fn length_mismatches(device: Device) {
    let s = Stream::new(&device).unwrap();
    let mut buf = DeviceBuffer::try_new(64, &s, CudaAsyncResource::new(&device).unwrap()).unwrap();
    let e = block_on(buf.copy_to_host(vec![0u8; 56])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                device_len: 64,
                host_len: 56,
                ..
            }
        ),
        "{e}"
    );
    let e = block_on(buf.copy_from_host_slice(&[0u8; 66])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                device_len: 64,
                host_len: 66,
                ..
            }
        ),
        "{e}"
    );
    let pinned = block_on(PinnedHostVec::<u8>::new(
        65,
        &s,
        PinnedHostResource::new(&device).unwrap(),
    ));
    let e = block_on(buf.copy_from_host(pinned.unwrap())).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                device_len: 64,
                host_len: 65,
                ..
            }
        ),
        "{e}"
    );
}

/// A copy future dropped while its copy waits behind device work frees its pinned vector
/// after the copy: a new vector handed the same pool block is not written under the copy.
pub fn reused_pinned_memory_waits_for_a_dropped_copy(device: Device) {
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    for alloc_on in [&s, &t] {
        let pool = PoolResource::new(
            PinnedHostResource::new(&device).unwrap(),
            1 << 20,
            Some(1 << 20),
        );
        let pool = pool.unwrap();
        block_on(async {
            let mr = CudaAsyncResource::new(&device)?;
            let mut buf = DeviceBuffer::new(1 << 20, &s, mr).await?;
            let (ones, twos) = (vec![1u8; 1 << 20], vec![2u8; 1 << 20]);
            let old = PinnedHostVec::from_slice(&ones, alloc_on, pool.clone()).await?;
            s.enqueue_delay(LONG)?;
            drop(buf.copy_from_host(old));
            let new = PinnedHostVec::from_slice(&twos, alloc_on, pool.clone()).await?;
            let back = buf.copy_to_host(vec![0u8; 1 << 20]).await?;
            assert!(
                back.iter().all(|&x| x == 1),
                "host wrote the block under the copy"
            );
            drop(new);
            Ok::<_, Error>(())
        })
        .unwrap();
    }
    s.synchronize_blocking().unwrap();
    assert!(device.take_deferred_error().is_none());
}

/// `DeviceVec` and its views take the same host data (pinned vectors, `Vec<T>`, borrowed
/// slices), count in elements, and a view copies only its own elements.
pub fn device_vec_host_data(device: Device) {
    let s = Stream::new(&device).unwrap();
    let pool = PoolResource::new(PinnedHostResource::new(&device).unwrap(), 1 << 20, None).unwrap();
    block_on(async {
        let n = 10_000;
        let sent = floats(n);
        let mr = CudaAsyncResource::new(&device)?;
        let pinned = PinnedHostVec::from_slice(&sent, &s, pool.clone()).await?;
        let mut v = DeviceVec::from_host(pinned, &s, mr).await?;
        let back = PinnedHostVec::<f32>::zeroed(n, &s, pool.clone()).await?;
        let back = v.copy_to_host(back).await?;
        assert_eq!(&back[..], &sent[..]);

        let mut window = [0f32; 16];
        v.slice(100..116)?.copy_to_host_slice(&mut window).await?;
        assert_eq!(&window[..], &sent[100..116]);
        let two = PinnedHostVec::from_slice(&[7.0f32, 8.0], &s, pool.clone()).await?;
        let mut head = v.slice_mut(..2)?;
        head.copy_from_host(two).await?;
        let mut out = [0f32; 2];
        head.copy_to_host_slice(&mut out).await?;
        assert_eq!(out, [7.0, 8.0]);
        v.copy_from_host_slice(&sent[..1]).await?;
        assert_eq!(&v.slice(..3)?.to_vec().await?[..], &[sent[0], 8.0, sent[2]]);

        let e = v.copy_to_host(vec![0f32; n - 1]).await.unwrap_err();
        let expected = (n, n - 1);
        assert!(
            matches!(
                e,
                Error::LengthMismatch { device_len, host_len, unit: "elements", .. }
                    if (device_len, host_len) == expected
            ),
            "{e}"
        );
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// Starting a copy to or from a pinned vector never waits for the stream: the call returns
/// while the stream is still busy, and the data arrives after the device work.
pub fn pinned_copies_start_without_waiting(device: Device) {
    let s = Stream::new(&device).unwrap();
    block_on(async {
        let n = 1 << 20;
        let mut buf = DeviceBuffer::new(n, &s, CudaAsyncResource::new(&device)?).await?;
        let pinned = PinnedHostResource::new(&device).unwrap();
        let host = PinnedHostVec::from_slice(&vec![6u8; n], &s, pinned).await?;
        s.enqueue_delay(LONG)?;
        let started = Instant::now();
        let up = buf.copy_from_host(host);
        let down = buf.copy_to_host(vec![0u8; n]);
        let waited = started.elapsed();
        assert!(
            !s.record()?.is_complete()?,
            "the stream finished before the check"
        );
        assert!(waited < LONG / 2, "starting the copies waited {waited:?}");
        up.await?;
        assert!(down.await?.iter().all(|&x| x == 6));
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// Instantiates the typed host data cases for one device.
#[macro_export]
macro_rules! host_data_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::host_data_suite as suite;

            $(#[$attr])* #[test] fn typed_round_trips() { suite::typed_round_trips($device) }
            $(#[$attr])* #[test] fn pinned_round_trips() { suite::pinned_round_trips($device) }
            $(#[$attr])* #[test] fn borrowed_slices() { suite::borrowed_slices($device) }
            $(#[$attr])* #[test] fn length_mismatches() { suite::length_mismatches($device) }
            $(#[$attr])* #[test] fn pinned_copies_start_without_waiting() { suite::pinned_copies_start_without_waiting($device) }
            $(#[$attr])* #[test] fn device_vec_host_data() { suite::device_vec_host_data($device) }
            $(#[$attr])* #[test] fn reused_pinned_memory_waits_for_a_dropped_copy() { suite::reused_pinned_memory_waits_for_a_dropped_copy($device) }
        }
    };
}
