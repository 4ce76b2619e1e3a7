use std::time::{Duration, Instant};

use futures::executor::block_on;

use crate::{
    CompletionStrategy, CudaResource, Device, DeviceBuffer, DeviceVec, Error, HostConfig, Stream,
};

const STRATEGIES: [CompletionStrategy; 3] = [
    CompletionStrategy::HostFunction,
    CompletionStrategy::Poller,
    CompletionStrategy::FlagWrite,
];

fn setup(strategy: CompletionStrategy) -> (Device, Stream, DeviceBuffer) {
    let device = Device::host_with(HostConfig::default().completion_strategy(strategy));
    let stream = Stream::new(&device).unwrap();
    let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device).unwrap()).unwrap();
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

fn buffer_64(device: &Device, stream: &Stream) -> DeviceBuffer {
    DeviceBuffer::try_new(64, stream, CudaResource::new(device).unwrap()).unwrap()
}

#[test]
fn typed_vectors_and_boxes_copy_with_no_byte_conversion() {
    let (_device, _stream, buf) = setup(CompletionStrategy::Poller);
    // A buffer's copies are bytes: typed host memory goes through a vector of its type, and
    // retyping the vector reads the same bytes as another type.
    let mut floats = DeviceVec::<f32>::from_buffer(buf).unwrap();
    let sent: Vec<f32> = (0..16).map(|i| i as f32 * 0.5 - 3.0).collect();
    let sent = block_on(floats.copy_from_host(sent)).unwrap();
    assert_eq!(block_on(floats.copy_to_host(vec![0f32; 16])).unwrap(), sent);
    let words = DeviceVec::<u32>::from_buffer(floats.into_buffer()).unwrap();
    let words_back = block_on(words.copy_to_host(vec![0u32; 16].into_boxed_slice())).unwrap();
    let expected: Vec<u32> = sent.iter().map(|x| x.to_bits()).collect();
    assert_eq!(&words_back[..], &expected[..]);
    let mut longs = DeviceVec::<u64>::from_buffer(words.into_buffer()).unwrap();
    let sent: Box<[u64]> = (0..8u64).map(|i| i << 40 | i).collect();
    let sent = block_on(longs.copy_from_host(sent)).unwrap();
    assert_eq!(
        block_on(longs.copy_to_host(vec![0u64; 8])).unwrap(),
        &sent[..]
    );
}

#[test]
fn raw_parts_keep_element_length_and_capacity() {
    let (_device, _stream, buf) = setup(CompletionStrategy::Poller);
    let mut longs = DeviceVec::<u64>::from_buffer(buf).unwrap();
    let mut sent: Vec<u64> = Vec::with_capacity(100);
    sent.extend(0..8u64); // 64 bytes
    let cap = sent.capacity();
    let mut sent = block_on(longs.copy_from_host(sent)).unwrap();
    assert_eq!((sent.len(), sent.capacity()), (8, cap));
    sent.extend(8..100u64); // within the capacity: wrong parts would corrupt the heap here
    let words = DeviceVec::<u32>::from_buffer(longs.into_buffer()).unwrap();
    let mut back: Vec<u32> = Vec::with_capacity(40);
    back.resize(16, 0);
    let cap = back.capacity();
    let mut back = block_on(words.copy_to_host(back)).unwrap();
    assert_eq!((back.len(), back.capacity()), (16, cap));
    assert_eq!(&back[..4], &[0, 0, 1, 0]);
    back.resize(40, 9);
}

/// Issue 22: an untyped literal given to a buffer's copies is bytes, so `vec![0; n]` fits an
/// n-byte buffer (it used to infer `Vec<i32>`, four times too long, and fail at run time).
#[test]
fn an_untyped_literal_copies_as_bytes() {
    let (_device, _stream, mut buf) = setup(CompletionStrategy::Poller);
    let n = buf.len();
    let sent = block_on(buf.copy_from_host(vec![0; n])).unwrap();
    let _: &Vec<u8> = &sent;
    block_on(buf.copy_from_host_slice(&[0; 64])).unwrap();
    let back = block_on(buf.copy_to_host(vec![1; n])).unwrap();
    assert_eq!(back, vec![0u8; n]);
    let mut out = [1; 64];
    block_on(buf.copy_to_host_slice(&mut out)).unwrap();
    assert_eq!(out, [0u8; 64]);
}

#[test]
fn length_mismatches_name_both_lengths_in_bytes() {
    let (_device, _stream, mut buf) = setup(CompletionStrategy::Poller);
    let e = block_on(buf.copy_to_host(vec![0u8; 60])).unwrap_err();
    assert_eq!(
        e,
        Error::LengthMismatch {
            call: "copy_to_host",
            element: "u8",
            device_len: 64,
            host_len: 60,
            unit: "bytes"
        }
    );
    assert_eq!(
        e.to_string(),
        "copy_to_host of u8: the device side holds 64 bytes, the host side 60 bytes"
    );
    let e = block_on(buf.copy_from_host(vec![0u8; 68])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                call: "copy_from_host",
                device_len: 64,
                host_len: 68,
                ..
            }
        ),
        "{e}"
    );
    let e = block_on(buf.copy_to_host_slice(&mut [0u8; 62])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                call: "copy_to_host_slice",
                device_len: 64,
                host_len: 62,
                ..
            }
        ),
        "{e}"
    );
    let e = block_on(buf.copy_from_host_slice(&[0u8; 72])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                call: "copy_from_host_slice",
                device_len: 64,
                host_len: 72,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("64 bytes") && e.to_string().contains("72 bytes"),
        "{e}"
    );
}

#[test]
fn borrowed_slices_round_trip() {
    let device = Device::host_with(HostConfig::default());
    let stream = Stream::new(&device).unwrap();
    let mut buf = buffer_64(&device, &stream);
    let sent: Vec<i16> = (0..32).map(|i| i * 1000 - 16000).collect();
    block_on(buf.copy_from_host_slice(bytemuck::cast_slice(&sent))).unwrap();
    let mut back = [0i16; 32];
    block_on(buf.copy_to_host_slice(bytemuck::cast_slice_mut(&mut back))).unwrap();
    assert_eq!(&back[..], &sent[..]);
    // A longer slice gets the buffer's bytes at its start; the rest is untouched.
    let mut longer = [7i16; 40];
    block_on(buf.copy_to_host_slice(bytemuck::cast_slice_mut(&mut longer))).unwrap();
    assert_eq!(&longer[..32], &sent[..]);
    assert_eq!(&longer[32..], &[7; 8]);
    // A shorter source fills the buffer's start.
    block_on(buf.copy_from_host_slice(&[1u8, 2])).unwrap();
    let bytes = block_on(buf.copy_to_host(vec![0u8; 64])).unwrap();
    assert_eq!(
        &bytes[..4],
        &[1, 2, sent[1].to_le_bytes()[0], sent[1].to_le_bytes()[1]]
    );
}

#[test]
fn copy_from_host_slice_takes_the_bytes_at_the_call() {
    let device = Device::host_with(HostConfig::default());
    let stream = Stream::new(&device).unwrap();
    let mut buf = buffer_64(&device, &stream);
    stream.enqueue_delay(Duration::from_millis(50)).unwrap();
    let mut src = vec![1u8; 64];
    let copy = buf.copy_from_host_slice(&src);
    src.fill(2); // the stream has not reached the copy yet
    drop(src);
    block_on(copy).unwrap();
    assert_eq!(
        block_on(buf.copy_to_host(vec![0u8; 64])).unwrap(),
        [1u8; 64]
    );
}

#[test]
fn a_forgotten_copy_to_host_slice_never_writes_the_slice() {
    let device = Device::host_with(HostConfig::default());
    let stream = Stream::new(&device).unwrap();
    let mut buf = buffer_64(&device, &stream);
    buf.fill(9).unwrap();
    stream.enqueue_delay(Duration::from_millis(30)).unwrap();
    let mut dst = vec![0u8; 64];
    std::mem::forget(buf.copy_to_host_slice(&mut dst));
    // The borrow has ended: the memory is the caller's again, and the device must not write it.
    stream.synchronize_blocking().unwrap();
    assert_eq!(dst, [0u8; 64]);
    // A dropped one neither, and its copy still runs to the end.
    drop(buf.copy_to_host_slice(&mut dst));
    stream.synchronize_blocking().unwrap();
    assert_eq!(dst, [0u8; 64]);
    assert_eq!(device.deferred_error_count(), 0);
}

#[test]
fn an_awaited_copy_to_host_slice_fills_it_after_the_device_work() {
    for strategy in STRATEGIES {
        let (_device, stream, mut buf) = setup(strategy);
        stream.enqueue_delay(Duration::from_millis(20)).unwrap();
        buf.fill(5).unwrap();
        let mut dst = [0u8; 64];
        block_on(buf.copy_to_host_slice(&mut dst)).unwrap();
        assert_eq!(dst, [5u8; 64], "{strategy:?}");
    }
}

#[test]
fn a_failed_copy_to_host_slice_leaves_the_slice_alone() {
    let (device, _stream, buf) = setup(CompletionStrategy::Poller);
    device.host_controls().unwrap().fail_next_copies(1);
    let mut dst = [3u8; 64];
    assert_injected_copy_failure(block_on(buf.copy_to_host_slice(&mut dst)).err());
    assert_eq!(dst, [3u8; 64]);
}

/// The typed starts that containers use: lengths and errors in elements.
#[test]
fn typed_starts_count_elements() {
    use super::{CopyFromHost, CopyFromSlice, CopyToHost, CopyToSlice, Unit};

    let (_device, stream, buf) = setup(CompletionStrategy::Poller);
    // 16 f32 in 64 bytes. Every start below is sound: `buf` holds 64 bytes at `ptr`, is
    // owned by `stream`, and outlives the copies, which are all awaited.
    let (ptr, n) = (buf.ptr(), 16);
    let sent: Vec<f32> = (0..n).map(|i| i as f32).collect();
    // SAFETY: as above.
    let copy = unsafe { CopyFromHost::start(Unit::Elements, &stream, ptr, n, sent) };
    let sent = block_on(copy).unwrap();
    // SAFETY: as above.
    let copy = unsafe { CopyToHost::start(Unit::Elements, &stream, ptr, n, vec![0f32; n]) };
    assert_eq!(block_on(copy).unwrap(), sent);
    let mut out = [0f32; 16];
    // SAFETY: as above.
    let copy = unsafe { CopyToSlice::start(Unit::Elements, &stream, ptr, n, &mut out) };
    block_on(copy).unwrap();
    assert_eq!(&out[..], &sent[..]);
    // SAFETY: as above.
    let copy = unsafe { CopyFromSlice::start(Unit::Elements, &stream, ptr, n, &[9f32]) };
    block_on(copy).unwrap();

    let mismatch = |call, device_len, host_len| Error::LengthMismatch {
        call,
        element: "f32",
        device_len,
        host_len,
        unit: "elements",
    };
    // SAFETY: as above.
    let copy = unsafe { CopyToHost::start(Unit::Elements, &stream, ptr, n, vec![0f32; 15]) };
    assert_eq!(
        block_on(copy).unwrap_err(),
        mismatch("copy_to_host", 16, 15)
    );
    // SAFETY: as above.
    let copy = unsafe { CopyFromHost::start(Unit::Elements, &stream, ptr, n, vec![0f32; 17]) };
    assert_eq!(
        block_on(copy).unwrap_err(),
        mismatch("copy_from_host", 16, 17)
    );
    let mut short = [0f32; 3];
    // SAFETY: as above.
    let copy = unsafe { CopyToSlice::start(Unit::Elements, &stream, ptr, n, &mut short) };
    assert_eq!(
        block_on(copy).unwrap_err(),
        mismatch("copy_to_host_slice", 16, 3)
    );
    // SAFETY: as above.
    let copy = unsafe { CopyFromSlice::start(Unit::Elements, &stream, ptr, 2, &[0f32; 3]) };
    assert_eq!(
        block_on(copy).unwrap_err(),
        mismatch("copy_from_host_slice", 2, 3)
    );
    let floats = DeviceVec::<f32>::from_buffer(buf).unwrap();
    assert_eq!(block_on(floats.to_vec()).unwrap()[..2], [9.0, 1.0]);
}

#[test]
fn views_copy_only_their_range_into_borrowed_slices() {
    let (_device, stream, mut buf) = setup(CompletionStrategy::Poller);
    let bytes: Vec<u8> = (0..64).collect();
    block_on(buf.copy_from_host_slice(&bytes)).unwrap();
    let mut words = [0u16; 3];
    let view = buf.slice(10..16).unwrap();
    block_on(view.copy_to_host_slice(bytemuck::cast_slice_mut(&mut words))).unwrap();
    assert_eq!(
        words,
        [
            u16::from_le_bytes([10, 11]),
            u16::from_le_bytes([12, 13]),
            u16::from_le_bytes([14, 15])
        ]
    );
    let mut short = [0u8; 5];
    let e = block_on(buf.slice(10..16).unwrap().copy_to_host_slice(&mut short)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                device_len: 6,
                host_len: 5,
                ..
            }
        ),
        "{e}"
    );

    let mut v = crate::DeviceVec::<u32>::try_new(
        8,
        &stream,
        CudaResource::new(&stream.device().clone()).unwrap(),
    )
    .unwrap();
    block_on(v.copy_from_host_slice(&[1, 2, 3, 4, 5, 6, 7, 8])).unwrap();
    let view = v.slice_mut(2..5).unwrap();
    let mut out = [0u32; 4];
    block_on(view.copy_to_host_slice(&mut out)).unwrap();
    assert_eq!(out, [3, 4, 5, 0]);
    let mut short = [0u32; 2];
    let e = block_on(view.copy_to_host_slice(&mut short)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                device_len: 3,
                host_len: 2,
                unit: "elements",
                element: "u32",
                ..
            }
        ),
        "{e}"
    );
}
