//! Device buffers and streams on a real backend: the same cases on the host backend (CI) and
//! on CUDA device 0 (the GPU bundle). Device work is stood in for by `Stream::enqueue_delay`,
//! which is a worker-thread sleep on the host backend and a spin kernel on CUDA, or, where a
//! test needs it pending only while it asserts, by a [`hold`] it opens then.

use std::time::{Duration, Instant};

use super::hold::hold;
use futures::executor::block_on;
use streamalloc::{
    CompletionStrategy, CudaAsyncManagedResource, CudaAsyncResource, CudaResource, Device,
    DeviceBuffer, Error, ManagedResource, MemoryResource, PrefetchTarget, Stream, TrackingAdaptor,
};

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
    for strategy in [
        CompletionStrategy::HostFunction,
        CompletionStrategy::Poller,
        CompletionStrategy::FlagWrite,
    ] {
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

/// The legacy and per-thread default streams work like owned ones: allocation and free,
/// hand-offs both ways with the waits inserted, events recorded and awaited under both
/// completion strategies; repeated calls give the same stream, and dropping every handle
/// destroys nothing (the stream is usable again afterwards).
pub fn default_streams_work_like_owned_streams(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let owned = Stream::new(&device).unwrap();
    let n = 1 << 20;
    let before = device.completion_strategy();
    for make in [Stream::legacy_default, Stream::per_thread_default] {
        let default = make(&device).unwrap();
        assert_eq!(
            default,
            make(&device).unwrap(),
            "a second handle is another stream"
        );
        assert_ne!(default, owned);

        // Default stream -> owned stream: the owned stream waits for the default one.
        let mut buf = DeviceBuffer::try_new(n, &default, mr.clone()).unwrap();
        default.enqueue_delay(LONG).unwrap();
        buf.fill(0x11).unwrap();
        buf.set_stream(&owned).unwrap();
        let host = block_on(buf.copy_to_host(vec![0u8; n])).unwrap();
        assert!(
            host.iter().all(|&x| x == 0x11),
            "owned stream ran before the default one"
        );

        // Owned stream -> default stream.
        owned.enqueue_delay(LONG).unwrap();
        buf.fill(0x22).unwrap();
        buf.set_stream(&default).unwrap();
        let host = block_on(buf.copy_to_host(vec![0u8; n])).unwrap();
        assert!(
            host.iter().all(|&x| x == 0x22),
            "default stream ran before the owned one"
        );
        drop(buf); // freed on the default stream

        // Raw allocate/free on it, and events with either completion strategy.
        let p = mr.try_allocate(4096, &default).unwrap();
        // SAFETY: allocated just above on `default`, used by nothing.
        unsafe { mr.deallocate(p, 4096, &default) };
        for strategy in [
            CompletionStrategy::HostFunction,
            CompletionStrategy::Poller,
            CompletionStrategy::FlagWrite,
        ] {
            device.set_completion_strategy(strategy);
            let start = Instant::now();
            default.enqueue_delay(Duration::from_millis(30)).unwrap();
            let e = default.record().unwrap();
            owned.wait(&e).unwrap();
            block_on(owned.record().unwrap()).unwrap();
            assert!(
                start.elapsed() >= Duration::from_millis(25),
                "{strategy:?}: early"
            );
            assert!(e.is_complete().unwrap());
            block_on(default.synchronize()).unwrap();
        }
        let raw = default.raw_handle();
        drop(default);
        // Every handle is gone: a new one still works (on CUDA it is the same driver handle).
        let again = make(&device).unwrap();
        block_on(again.synchronize()).unwrap();
        if device.backend() == streamalloc::BackendKind::Cuda {
            assert_eq!(again.raw_handle(), raw);
        }
    }
    device.set_completion_strategy(before);
    owned.synchronize_blocking().unwrap();
}

/// Per-thread default streams are per thread: two threads get two streams, each usable on
/// its own thread.
pub fn per_thread_default_streams_differ_between_threads(device: Device) {
    let mine = Stream::per_thread_default(&device).unwrap();
    let d = device.clone();
    let theirs = std::thread::spawn(move || {
        let s = Stream::per_thread_default(&d).unwrap();
        block_on(s.synchronize()).unwrap();
        s.id()
    })
    .join()
    .unwrap();
    assert_ne!(mine.id(), theirs);
    block_on(mine.synchronize()).unwrap();
}

/// Buffers with an alignment above 256 start at an aligned address, hold their data across
/// resizes (which keep the alignment), and free exactly what they allocated.
pub fn aligned_buffers(device: Device) {
    let mr = TrackingAdaptor::new(CudaAsyncResource::new(&device).unwrap());
    let s = Stream::new(&device).unwrap();
    for alignment in [1, 64, 256, 512, 4096, 1 << 16, 1 << 21] {
        for n in [0, 1, 1000, (1 << 20) + 3] {
            let mut buf = DeviceBuffer::try_with_alignment(n, alignment, &s, mr.clone()).unwrap();
            assert!(buf.ptr().is_aligned(alignment), "{n} bytes at {alignment}");
            assert_eq!(buf.alignment(), alignment.max(256));
            assert_eq!(buf.len(), n);
            if n > 0 {
                let sent = block_on(buf.copy_from_host(pattern(n))).unwrap();
                block_on(buf.resize(3 * n + 7)).unwrap();
                assert!(
                    buf.ptr().is_aligned(alignment),
                    "resized {n} at {alignment}"
                );
                let back = block_on(buf.copy_to_host(vec![0u8; 3 * n + 7])).unwrap();
                assert_eq!(&back[..n], &sent[..]);
                let copy = block_on(buf.try_clone()).unwrap();
                assert!(copy.ptr().is_aligned(alignment), "clone at {alignment}");
            }
            let awaited = block_on(DeviceBuffer::with_alignment(n, alignment, &s, mr.clone()));
            assert!(awaited.unwrap().ptr().is_aligned(alignment));
        }
    }
    s.synchronize_blocking().unwrap();
    assert_eq!(mr.outstanding_count(), 0, "{}", mr.leak_report());
    assert_eq!(mr.issue_count(), 0, "bad frees: {:?}", mr.issues());

    let bad = DeviceBuffer::try_with_alignment(64, 768, &s, mr.clone());
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    let bad = block_on(DeviceBuffer::with_alignment(64, 0, &s, mr.clone()));
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    let huge = DeviceBuffer::try_with_alignment(usize::MAX - 100, 4096, &s, mr.clone());
    assert!(huge.unwrap_err().is_out_of_memory());
    assert_eq!(mr.outstanding_count(), 0);
}

/// Adopted memory is the buffer's: it is used and then freed through the given resource, on
/// the buffer's owner, once.
pub fn adopted_memory_is_freed_by_the_buffer(device: Device) {
    let mr = TrackingAdaptor::new(CudaAsyncResource::new(&device).unwrap());
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let n = 10_000;
    let p = mr.try_allocate(n, &a).unwrap();
    // SAFETY: `p` holds `n` bytes from `mr`, nothing uses it, nobody else frees it.
    let mut buf = unsafe { DeviceBuffer::from_raw_parts(p, n, &a, mr.clone()) }.unwrap();
    assert_eq!((buf.ptr(), buf.len(), buf.stream()), (p, n, a.clone()));
    let sent = block_on(buf.copy_from_host(pattern(n))).unwrap();
    buf.set_stream(&b).unwrap();
    assert_eq!(block_on(buf.copy_to_host(vec![0u8; n])).unwrap(), sent);
    assert_eq!(mr.outstanding_count(), 1);
    drop(buf);
    b.synchronize_blocking().unwrap();
    assert_eq!(mr.outstanding_count(), 0, "{}", mr.leak_report());
    assert_eq!(mr.issue_count(), 0, "{:?}", mr.issues());

    // A stream of another device is refused, and the memory stays the caller's.
    let other = Device::host_with(Default::default());
    let q = mr.try_allocate(64, &a).unwrap();
    let s_other = Stream::new(&other).unwrap();
    // SAFETY: as above; on failure nothing is adopted and `q` is freed below.
    let refused = unsafe { DeviceBuffer::from_raw_parts(q, 64, &s_other, mr.clone()) };
    assert!(
        matches!(refused, Err(Error::DeviceMismatch { .. })),
        "{refused:?}"
    );
    // SAFETY: `q` came from `mr` with 64 bytes on `a` and was not adopted.
    unsafe { mr.deallocate(q, 64, &a) };
}

/// Prefetching: managed memory (leaf or stream-ordered pool) keeps its contents when moved to
/// the host and back; device memory and empty buffers are a no-op that says so.
pub fn prefetch_buffers(device: Device) {
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let n = 1 << 20;
    let plain = DeviceBuffer::try_new(n, &s, CudaResource::new(&device).unwrap()).unwrap();
    assert!(!plain.prefetch(&s).unwrap(), "device memory is not managed");
    assert!(!plain.prefetch_to(PrefetchTarget::Host, &t).unwrap());
    assert!(
        !DeviceBuffer::try_new(0, &s, ManagedResource::new(&device).unwrap())
            .unwrap()
            .prefetch(&s)
            .unwrap()
    );

    let mut pools: Vec<streamalloc::SharedResource> =
        vec![std::sync::Arc::new(ManagedResource::new(&device).unwrap())];
    match CudaAsyncManagedResource::new(&device) {
        Ok(mr) => pools.push(std::sync::Arc::new(mr)),
        Err(Error::Unsupported { .. }) => {}
        Err(e) => panic!("{e}"),
    }
    let counted = device.host_controls().map(|c| c.prefetches());
    for mr in pools {
        let mut buf = DeviceBuffer::try_new(n, &s, mr).unwrap();
        let sent = block_on(buf.copy_from_host(pattern(n))).unwrap();
        let to_host = buf.prefetch_to(PrefetchTarget::Host, &t).unwrap();
        let to_device = buf.prefetch(&s).unwrap();
        assert_eq!(to_host, to_device, "one device, one answer");
        if counted.is_some() {
            assert!(
                to_host && to_device,
                "the host backend prefetches managed memory"
            );
        }
        assert_eq!(block_on(buf.copy_to_host(vec![0u8; n])).unwrap(), sent);
        drop(buf); // freed on `s` after `t`'s prefetch (recorded as a read)
    }
    if let (Some(before), Some(c)) = (counted, device.host_controls()) {
        assert_eq!(c.prefetches(), before + 4);
    }
    s.synchronize_blocking().unwrap();
}

/// Device work that outlasts everything a hand-off test waits for: a stage whose wait would
/// show if it were queued where it does not belong.
const STALL: Duration = Duration::from_secs(3);

/// Polls `event` until it completes; whether `other` had completed by then.
fn other_done_when_complete(event: &streamalloc::Event, other: &streamalloc::Event) -> bool {
    let deadline = Instant::now() + 2 * STALL;
    while !event.is_complete().unwrap() {
        assert!(Instant::now() < deadline, "the event never completed");
        std::thread::sleep(Duration::from_millis(1));
    }
    other.is_complete().unwrap()
}

/// Waits for `event`, then for `other` for at most [`GRACE`]: true when `other` completed by
/// then. For work that must run after `other`'s stream reached it: a stream that waited for
/// work just before `other` may finish a moment before that stream's worker marks `other`
/// complete, while one that did not wait finishes [`RAW_DELAY`] before it.
fn other_done_soon_after(event: &streamalloc::Event, other: &streamalloc::Event) -> bool {
    other_done_when_complete(event, other) || {
        let deadline = Instant::now() + GRACE;
        while !other.is_complete().unwrap() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        other.is_complete().unwrap()
    }
}

/// The old owner's stall before its write in the raw-pointer hand-off tests.
const RAW_DELAY: Duration = Duration::from_millis(500);
/// How late the old owner may mark its write's event after the new owner's waited work ran.
const GRACE: Duration = Duration::from_millis(100);

/// The producer runs ahead, as a pipeline's upload task does: it hands batch 0 and then batch
/// 1 (queued behind a long stage) to the kernel stream before the kernel stream uses batch 0.
/// The kernel stream's work on batch 0 waits only for batch 0's upload: a hand-off's wait is
/// queued before the new owner's first use of the buffer, not when `set_stream` is called
/// (where it would sit ahead of batch 0's kernel and make it wait for batch 1's upload).
pub fn handoff_waits_at_the_new_owners_first_use(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (up, k) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let n = 1 << 20;
    let mut x0 = DeviceBuffer::try_new(n, &up, mr.clone()).unwrap();
    let mut x1 = DeviceBuffer::try_new(n, &up, mr).unwrap();
    x0.fill(1).unwrap();
    x0.set_stream(&k).unwrap();
    // Batch 1's upload takes long: held until batch 0's kernel is known to be done (at most
    // `STALL`, which ends a kernel that waited for it well before the poll's deadline).
    let upload_stage = hold(&up, STALL);
    x1.fill(2).unwrap();
    x1.set_stream(&k).unwrap();
    let upload1 = up.record().unwrap();

    x0.fill(3).unwrap(); // batch 0's "kernel", on `k`
    let kernel0 = k.record().unwrap();
    assert!(
        !other_done_when_complete(&kernel0, &upload1),
        "batch 0's kernel waited for batch 1's upload: the hand-off's wait was queued early"
    );
    drop(upload_stage); // before the copies: on CUDA a pageable copy needs host functions
    assert_eq!(block_on(x0.copy_to_host(vec![0u8; n])).unwrap(), vec![3; n]);
    assert_eq!(block_on(x1.copy_to_host(vec![0u8; n])).unwrap(), vec![2; n]);
}

/// A buffer handed on twice before the middle owner used it: the last owner waits for the
/// producer only, not for unrelated work the middle owner queued meanwhile.
pub fn handoff_carried_on_skips_the_unused_owner(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let streams: Vec<Stream> = (0..3).map(|_| Stream::new(&device).unwrap()).collect();
    let (up, k, down) = (&streams[0], &streams[1], &streams[2]);
    let n = 1 << 16;
    let mut x = DeviceBuffer::try_new(n, up, mr).unwrap();
    x.fill(9).unwrap();
    x.set_stream(k).unwrap();
    k.enqueue_delay(STALL).unwrap(); // `k` busy with other batches
    let busy = k.record().unwrap();
    x.set_stream(down).unwrap();
    let copy = x.copy_to_host(vec![0u8; n]);
    let done = down.record().unwrap();
    assert!(
        !other_done_when_complete(&done, &busy),
        "the download waited for work queued on a stream that never used the buffer"
    );
    assert_eq!(block_on(copy).unwrap(), vec![9; n]);
}

/// A hand-off made late (by the consumer, when it receives the batch) orders the new owner
/// after the buffer's last use on the old owner, not after what the old owner queued since for
/// other buffers: batch 0's upload, then a long stage on the upload stream (batch 1's), then
/// the kernel stream takes batch 0 and reads it without waiting for that stage.
pub fn late_handoff_waits_for_the_last_use_only(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (up, k) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let n = 1 << 20;
    let mut x0 = DeviceBuffer::try_new(n, &up, mr).unwrap();
    let upload = x0.copy_from_host(vec![4u8; n]);
    up.enqueue_delay(STALL).unwrap(); // the next batch's upload
    let next_upload = up.record().unwrap();
    x0.set_stream(&k).unwrap(); // the consumer takes batch 0 now
    let read = x0.copy_to_host(vec![0u8; n]);
    let kernel0 = k.record().unwrap();
    assert!(
        !other_done_when_complete(&kernel0, &next_upload),
        "the late hand-off waited for work queued on the old owner after the buffer's last use"
    );
    block_on(upload).unwrap();
    assert_eq!(block_on(read).unwrap(), vec![4u8; n]);
}

/// Work enqueued through the raw pointer after a hand-off is ordered after the old owner:
/// asking for `ptr()` makes the new owner take over at once.
pub fn handoff_then_ptr_orders_raw_work(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let mut buf = DeviceBuffer::try_new(4096, &a, mr).unwrap();
    a.enqueue_delay(RAW_DELAY).unwrap();
    buf.fill(1).unwrap();
    let written = a.record().unwrap();
    buf.set_stream(&b).unwrap();
    let _raw = buf.ptr(); // ... a kernel of the user's on `b` would use it here
    let raw_work = b.record().unwrap();
    assert!(
        other_done_soon_after(&raw_work, &written),
        "work on the new owner through ptr() ran before the old owner's write"
    );
}

/// As [`handoff_then_ptr_orders_raw_work`], for the typed vector's and scalar's `ptr()`.
pub fn handoff_then_typed_ptr_orders_raw_work(device: Device) {
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let mut v = streamalloc::DeviceVec::<u32>::try_new(1024, &a, mr.clone()).unwrap();
    let mut x = block_on(streamalloc::DeviceScalar::new(0u32, &a, mr)).unwrap();
    a.enqueue_delay(RAW_DELAY).unwrap();
    let upload = v.copy_from_host(vec![1u32; 1024]); // enqueued now
    x.set_value(2).unwrap();
    let written = a.record().unwrap();
    v.set_stream(&b).unwrap();
    x.set_stream(&b).unwrap();
    let _raw = (v.ptr(), x.ptr()); // ... a kernel of the user's on `b` would use them here
    let raw_work = b.record().unwrap();
    assert!(
        other_done_soon_after(&raw_work, &written),
        "work on the new owner through a typed ptr() ran before the old owner's write"
    );
    block_on(upload).unwrap();
}

/// Dropping a pinned vector of the leaf resource never blocks the thread, even while its stream
/// is busy (`cuMemFreeHost` needs the stream idle: it runs on a driver thread afterwards).
pub fn pinned_drop_does_not_block(device: Device) {
    let s = Stream::new(&device).unwrap();
    let pinned = streamalloc::PinnedHostResource::new(&device).unwrap();
    for _ in 0..3 {
        let v = block_on(streamalloc::PinnedHostVec::<u8>::zeroed(
            1 << 20,
            &s,
            pinned.clone(),
        ))
        .unwrap();
        // The stream is busy until the drop is known not to have waited (at most `STALL`,
        // which ends a drop that waits for the stream).
        let work = hold(&s, STALL);
        let busy = s.record().unwrap();
        drop(v);
        assert!(
            !busy.is_complete().unwrap(),
            "dropping a pinned vector waited for its stream"
        );
        drop(work);
    }
    s.synchronize_blocking().unwrap();
    // Freed meanwhile: a fresh vector of the same kind is served.
    let again = block_on(streamalloc::PinnedHostVec::<u8>::zeroed(
        1 << 20,
        &s,
        pinned,
    ))
    .unwrap();
    assert_eq!(again.len(), 1 << 20);
    if let Some(c) = device.host_controls() {
        s.synchronize_blocking().unwrap();
        assert_eq!(c.live_allocations(), 1, "the dropped vectors were freed");
    }
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
            $(#[$attr])* #[test] fn default_streams_work_like_owned_streams() { suite::default_streams_work_like_owned_streams($device) }
            $(#[$attr])* #[test] fn per_thread_default_streams_differ_between_threads() { suite::per_thread_default_streams_differ_between_threads($device) }
            $(#[$attr])* #[test] fn aligned_buffers() { suite::aligned_buffers($device) }
            $(#[$attr])* #[test] fn adopted_memory_is_freed_by_the_buffer() { suite::adopted_memory_is_freed_by_the_buffer($device) }
            $(#[$attr])* #[test] fn prefetch_buffers() { suite::prefetch_buffers($device) }
            $(#[$attr])* #[test] fn handoff_waits_at_the_new_owners_first_use() { suite::handoff_waits_at_the_new_owners_first_use($device) }
            $(#[$attr])* #[test] fn handoff_carried_on_skips_the_unused_owner() { suite::handoff_carried_on_skips_the_unused_owner($device) }
            $(#[$attr])* #[test] fn handoff_then_ptr_orders_raw_work() { suite::handoff_then_ptr_orders_raw_work($device) }
            $(#[$attr])* #[test] fn handoff_then_typed_ptr_orders_raw_work() { suite::handoff_then_typed_ptr_orders_raw_work($device) }
            $(#[$attr])* #[test] fn late_handoff_waits_for_the_last_use_only() { suite::late_handoff_waits_for_the_last_use_only($device) }
            $(#[$attr])* #[test] fn pinned_drop_does_not_block() { suite::pinned_drop_does_not_block($device) }
        }
    };
}
