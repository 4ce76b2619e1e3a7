use std::time::Duration;

use futures::executor::block_on;
use futures::FutureExt;

use crate::test_support::{allocated, device, gate, streams};
use crate::{
    CompletionStrategy, CudaAsyncResource, CudaResource, Device, DeviceBuffer, DevicePtr, Error,
    HostConfig, Stream,
};

const STRATEGIES: [CompletionStrategy; 3] = [
    CompletionStrategy::HostFunction,
    CompletionStrategy::Poller,
    CompletionStrategy::FlagWrite,
];

fn device_with(strategy: CompletionStrategy) -> Device {
    Device::host_with(HostConfig::default().completion_strategy(strategy))
}

/// Enqueues a read of `len` bytes at `src` on `stream` into `out`.
///
/// # Safety
/// `src..src + len` stays valid until `stream` passes this point, `out` holds `len` bytes and
/// is neither accessed nor dropped before then.
unsafe fn raw_read(stream: &Stream, src: DevicePtr, out: &mut [u8]) {
    // SAFETY: forwarded from the caller.
    unsafe {
        stream
            .raw()
            .copy(out.as_mut_ptr() as u64, src.addr(), out.len())
            .unwrap()
    }
}

async fn to_host(buf: &DeviceBuffer) -> Vec<u8> {
    buf.copy_to_host(vec![0u8; buf.len()]).await.unwrap()
}

fn to_host_blocking(buf: &DeviceBuffer) -> Vec<u8> {
    block_on(to_host(buf))
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 + 1).collect()
}

// ---- hand-off -------------------------------------------------------------------------------

#[test]
fn set_stream_makes_new_owner_wait_for_old_owner() {
    for strategy in STRATEGIES {
        let d = device_with(strategy);
        let [a, b] = streams(&d);
        block_on(async {
            let mut buf = DeviceBuffer::new(4096, &a, CudaResource::new(&d).unwrap()).await?;
            a.enqueue_delay(Duration::from_millis(100))?;
            buf.fill(7)?;
            buf.set_stream(&b)?;
            assert_eq!(buf.stream(), b);
            let host = buf.copy_to_host(vec![0u8; 4096]).await?;
            assert!(
                host.iter().all(|&x| x == 7),
                "{strategy:?}: b read before a's fill"
            );
            Ok::<_, Error>(())
        })
        .unwrap();
    }
}

#[test]
fn set_stream_without_waits_reads_stale_data() {
    // Negative control of the test above: the same program without the automatic wait.
    let d = device();
    let [a, b] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(4096, &a, CudaResource::new(&d).unwrap()).await?;
        let open = gate(&a);
        buf.fill(7)?;
        // SAFETY: `a` is blocked by the gate until `b`'s copy below has completed, so the fill
        // and the copy never overlap.
        unsafe { buf.disable_handoff_waits() };
        buf.set_stream(&b)?;
        let host = buf.copy_to_host(vec![1u8; 4096]).await?;
        assert!(
            host.iter().all(|&x| x == 0),
            "without the wait, b should have run before a's fill"
        );
        drop(open);
        a.synchronize().await?;
        assert!(to_host(&buf).await.iter().all(|&x| x == 7));
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn read_on_makes_reader_wait_for_owner() {
    let d = device();
    let [owner, reader] = streams(&d);
    let mut buf = block_on(DeviceBuffer::new(
        4096,
        &owner,
        CudaResource::new(&d).unwrap(),
    ))
    .unwrap();
    owner.enqueue_delay(Duration::from_millis(100)).unwrap();
    buf.fill(7).unwrap();
    let mut seen = vec![0u8; 4096];
    {
        let read = buf.read_on(&reader).unwrap();
        assert_eq!((read.ptr(), read.len()), (buf.ptr(), 4096));
        // SAFETY: `seen` outlives the copy (synchronized below); the buffer lives on and its free
        // would wait for the read recorded by the guard.
        unsafe { raw_read(&reader, read.ptr(), &mut seen) };
    }
    reader.synchronize_blocking().unwrap();
    assert!(
        seen.iter().all(|&x| x == 7),
        "the reader ran before the owner's fill"
    );
}

#[test]
fn read_on_without_waits_reads_stale_data() {
    // Negative control of the test above.
    let d = device();
    let [owner, reader] = streams(&d);
    let mut buf = block_on(DeviceBuffer::new(
        4096,
        &owner,
        CudaResource::new(&d).unwrap(),
    ))
    .unwrap();
    let open = gate(&owner);
    buf.fill(7).unwrap();
    // SAFETY: the owner is blocked by the gate until the reader's copy has completed.
    unsafe { buf.disable_handoff_waits() };
    let mut seen = vec![1u8; 4096];
    {
        let read = buf.read_on(&reader).unwrap();
        // SAFETY: `seen` outlives the copy (synchronized below); the buffer outlives it too.
        unsafe { raw_read(&reader, read.ptr(), &mut seen) };
        read.finish().unwrap();
    }
    reader.synchronize_blocking().unwrap();
    assert!(
        seen.iter().all(|&x| x == 0),
        "without the wait the reader should run first"
    );
    drop(open);
    owner.synchronize_blocking().unwrap();
}

// ---- reads and the free ---------------------------------------------------------------------

#[test]
fn drop_waits_for_every_reader() {
    let d = device();
    let [owner, r1, r2] = streams(&d);
    let buf = block_on(DeviceBuffer::new(
        1 << 16,
        &owner,
        CudaResource::new(&d).unwrap(),
    ))
    .unwrap();
    assert_eq!(allocated(&d), 1 << 16);
    let open1 = {
        let _read = buf.read_on(&r1).unwrap();
        r1.enqueue_delay(Duration::from_millis(20)).unwrap();
        gate(&r1)
    };
    let open2 = {
        let _read = buf.read_on(&r2).unwrap();
        r2.enqueue_delay(Duration::from_millis(20)).unwrap();
        gate(&r2)
    };
    drop(buf); // a drop that blocked on the readers would deadlock here
    std::thread::sleep(Duration::from_millis(50)); // an unordered free would have run by now
    assert_eq!(
        allocated(&d),
        1 << 16,
        "freed while both readers were running"
    );
    drop(open1);
    r1.synchronize_blocking().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        allocated(&d),
        1 << 16,
        "freed while the second reader was running"
    );
    drop(open2);
    r2.synchronize_blocking().unwrap();
    owner.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0);
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn a_forgotten_read_guard_still_orders_the_free() {
    // The read is registered when the guard is made, not when it is dropped: forgetting the
    // guard must not let the free overtake work the reader enqueued meanwhile.
    let d = device();
    let [owner, reader] = streams(&d);
    let buf = block_on(DeviceBuffer::new(
        1 << 16,
        &owner,
        CudaResource::new(&d).unwrap(),
    ))
    .unwrap();
    let read = buf.read_on(&reader).unwrap();
    let open = gate(&reader); // the "kernel" reading the buffer
    std::mem::forget(read);
    drop(buf);
    std::thread::sleep(Duration::from_millis(50)); // an unordered free would have run by now
    assert_eq!(allocated(&d), 1 << 16, "freed while the reader was running");
    drop(open);
    reader.synchronize_blocking().unwrap();
    owner.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0);
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn ending_one_of_two_reads_on_a_stream_keeps_the_other_pending() {
    // Two reads registered on one stream: ending the first must not forget the second, whose
    // work is enqueued after the first one's event.
    let d = device();
    let [owner, reader] = streams(&d);
    let buf = block_on(DeviceBuffer::new(
        1 << 16,
        &owner,
        CudaResource::new(&d).unwrap(),
    ))
    .unwrap();
    let kept = buf.read_on(&reader).unwrap();
    drop(buf.read_on(&reader).unwrap()); // records an event before the kernel below
    let open = gate(&reader); // the kept read's "kernel"
    std::mem::forget(kept);
    drop(buf);
    std::thread::sleep(Duration::from_millis(50)); // an unordered free would have run by now
    assert_eq!(
        allocated(&d),
        1 << 16,
        "freed while the kept read was running"
    );
    drop(open);
    reader.synchronize_blocking().unwrap();
    owner.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0);
}

#[test]
fn drop_without_readers_frees_at_once_on_the_owner() {
    // The control of the test above: the accounting it relies on does drop to zero when there
    // is nothing to wait for.
    let d = device();
    let [owner, other] = streams(&d);
    let buf = block_on(DeviceBuffer::new(
        1 << 16,
        &owner,
        CudaResource::new(&d).unwrap(),
    ))
    .unwrap();
    let _blocked = gate(&other);
    drop(buf);
    owner.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0);
}

#[test]
fn owner_writes_wait_for_readers() {
    let d = device();
    let [owner, reader] = streams(&d);
    let mut buf = block_on(DeviceBuffer::new(
        4096,
        &owner,
        CudaResource::new(&d).unwrap(),
    ))
    .unwrap();
    buf.fill(1).unwrap();
    let mut seen = vec![0u8; 4096];
    let open = {
        let read = buf.read_on(&reader).unwrap();
        let open = gate(&reader);
        // SAFETY: `seen` outlives the copy (synchronized below); the buffer outlives it.
        unsafe { raw_read(&reader, read.ptr(), &mut seen) };
        open
    };
    buf.fill(2).unwrap(); // must wait for the read above
    std::thread::sleep(Duration::from_millis(50));
    drop(open);
    reader.synchronize_blocking().unwrap();
    assert!(
        seen.iter().all(|&x| x == 1),
        "the owner overwrote data still being read"
    );
    assert!(to_host_blocking(&buf).iter().all(|&x| x == 2));
}

#[test]
fn set_stream_waits_for_readers() {
    let d = device();
    let [a, reader, c] = streams(&d);
    let mut buf = block_on(DeviceBuffer::new(4096, &a, CudaResource::new(&d).unwrap())).unwrap();
    buf.fill(1).unwrap();
    let mut seen = vec![0u8; 4096];
    let open = {
        let read = buf.read_on(&reader).unwrap();
        let open = gate(&reader);
        // SAFETY: `seen` outlives the copy (synchronized below); the buffer outlives it.
        unsafe { raw_read(&reader, read.ptr(), &mut seen) };
        open
    };
    buf.set_stream(&c).unwrap();
    buf.fill(2).unwrap(); // on `c`, which must wait for the read
    std::thread::sleep(Duration::from_millis(50));
    drop(open);
    reader.synchronize_blocking().unwrap();
    assert!(
        seen.iter().all(|&x| x == 1),
        "the new owner overwrote data still being read"
    );
    assert!(to_host_blocking(&buf).iter().all(|&x| x == 2));
}

#[test]
fn reader_events_are_one_per_stream() {
    let d = device();
    let [owner, r1, r2] = streams(&d);
    let mut buf = DeviceBuffer::try_new(64, &owner, CudaResource::new(&d).unwrap()).unwrap();
    let readers = |b: &DeviceBuffer| b.uses.lock().reader_count();
    let _g1 = gate(&r1);
    let _g2 = gate(&r2);
    buf.record_read(&r1).unwrap();
    buf.record_read(&r1).unwrap();
    assert_eq!(
        readers(&buf),
        1,
        "a newer event on a stream replaces the older one"
    );
    drop(buf.read_on(&r2).unwrap());
    assert_eq!(readers(&buf), 2);
    buf.record_read(&owner).unwrap();
    drop(buf.read_on(&owner).unwrap());
    assert_eq!(readers(&buf), 2, "the owner's own work is never a reader");
    buf.set_stream(&owner.clone()).unwrap();
    assert_eq!(
        readers(&buf),
        0,
        "the owner is ordered after the readers now"
    );
}

#[test]
fn completed_readers_are_pruned() {
    let d = device();
    let [owner, r1, r2] = streams(&d);
    let buf = DeviceBuffer::try_new(64, &owner, CudaResource::new(&d).unwrap()).unwrap();
    buf.record_read(&r1).unwrap();
    r1.synchronize_blocking().unwrap();
    buf.record_read(&r2).unwrap();
    assert_eq!(buf.uses.lock().reader_count(), 1);
}

// ---- resize, reserve, shrink_to_fit ----------------------------------------------------------

#[test]
fn resize_grow_reallocates_and_keeps_contents() {
    let d = device();
    let [s] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(1000, &s, CudaResource::new(&d).unwrap()).await?;
        buf.copy_from_host(pattern(1000)).await?;
        let old = buf.ptr();
        buf.resize(5000).await?;
        assert_ne!(buf.ptr(), old);
        assert_eq!((buf.len(), buf.capacity()), (5000, 5000));
        assert_eq!(&to_host(&buf).await[..1000], &pattern(1000)[..]);
        s.synchronize().await?;
        assert_eq!(allocated(&d), 5000, "the old block was not freed");
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn resize_within_capacity_keeps_memory() {
    let d = device();
    let [s] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(1000, &s, CudaResource::new(&d).unwrap()).await?;
        buf.copy_from_host(pattern(1000)).await?;
        let ptr = buf.ptr();
        buf.resize(10).await?;
        assert_eq!((buf.ptr(), buf.len(), buf.capacity()), (ptr, 10, 1000));
        assert_eq!(to_host(&buf).await, &pattern(1000)[..10]);
        buf.resize(1000).await?;
        assert_eq!(buf.ptr(), ptr);
        assert_eq!(
            to_host(&buf).await,
            pattern(1000),
            "bytes within the capacity are kept"
        );
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn reserve_keeps_size_and_contents() {
    let d = device();
    let [s] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(300, &s, CudaResource::new(&d).unwrap()).await?;
        buf.copy_from_host(pattern(300)).await?;
        let ptr = buf.ptr();
        buf.reserve(100).await?;
        assert_eq!(
            (buf.ptr(), buf.capacity()),
            (ptr, 300),
            "enough capacity: no change"
        );
        buf.reserve(4096).await?;
        assert_ne!(buf.ptr(), ptr);
        assert_eq!((buf.len(), buf.capacity()), (300, 4096));
        assert_eq!(to_host(&buf).await, pattern(300));
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn shrink_to_fit_keeps_contents() {
    let d = device();
    let [s] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(4096, &s, CudaResource::new(&d).unwrap()).await?;
        buf.copy_from_host(pattern(4096)).await?;
        buf.resize(100).await?;
        buf.shrink_to_fit().await?;
        assert_eq!((buf.len(), buf.capacity()), (100, 100));
        assert_eq!(to_host(&buf).await, &pattern(4096)[..100]);
        let ptr = buf.ptr();
        buf.shrink_to_fit().await?;
        assert_eq!(buf.ptr(), ptr, "already fitting: no change");
        s.synchronize().await?;
        assert_eq!(allocated(&d), 100);
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn reallocation_frees_old_block_after_readers() {
    let d = device();
    let [owner, reader] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(1000, &owner, CudaResource::new(&d).unwrap()).await?;
        buf.copy_from_host(pattern(1000)).await?;
        let open = {
            let _read = buf.read_on(&reader)?;
            gate(&reader)
        };
        buf.resize(2000).await?;
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            allocated(&d),
            3000,
            "the old block was freed under a reader"
        );
        drop(open);
        reader.synchronize().await?;
        owner.synchronize().await?;
        assert_eq!(allocated(&d), 2000);
        assert_eq!(&to_host(&buf).await[..1000], &pattern(1000)[..]);
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn resize_on_a_pool_resource_keeps_contents() {
    let d = device();
    let [s] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(256, &s, CudaAsyncResource::new(&d)?).await?;
        buf.copy_from_host(pattern(256)).await?;
        buf.reserve(1 << 20).await?;
        buf.resize(1 << 19).await?;
        buf.shrink_to_fit().await?;
        assert_eq!(&to_host(&buf).await[..256], &pattern(256)[..]);
        Ok::<_, Error>(())
    })
    .unwrap();
}

// ---- device-to-device copies -----------------------------------------------------------------

#[test]
fn copy_from_device_waits_for_the_source_owner() {
    let d = device();
    let [a, b] = streams(&d);
    block_on(async {
        let mr = CudaResource::new(&d).unwrap();
        let mut src = DeviceBuffer::new(4096, &a, mr.clone()).await?;
        let mut dst = DeviceBuffer::new(8192, &b, mr).await?;
        a.enqueue_delay(Duration::from_millis(100))?;
        src.fill(3)?;
        dst.copy_from_device(&src)?;
        let host = dst.copy_to_host(vec![9u8; 8192]).await?;
        assert!(
            host[..4096].iter().all(|&x| x == 3),
            "b copied before a's fill"
        );
        assert!(host[4096..].iter().all(|&x| x == 0));
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn copy_from_device_records_the_read_of_the_source() {
    let d = device();
    let [a, b] = streams(&d);
    block_on(async {
        let mr = CudaResource::new(&d).unwrap();
        let mut src = DeviceBuffer::new(4096, &a, mr.clone()).await?;
        let mut dst = DeviceBuffer::new(8192, &b, mr).await?;
        src.fill(3)?;
        a.synchronize().await?;
        let open = gate(&b); // holds the copy back
        dst.copy_from_device(&src)?;
        drop(src);
        std::thread::sleep(Duration::from_millis(50)); // `a` is idle: an unordered free runs
        assert_eq!(
            allocated(&d),
            4096 + 8192,
            "src was freed before b copied it"
        );
        drop(open);
        assert!(to_host(&dst).await[..4096].iter().all(|&x| x == 3));
        a.synchronize().await?;
        assert_eq!(allocated(&d), 8192);
        drop(dst);
        b.synchronize().await?;
        assert_eq!(allocated(&d), 0);
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn copy_from_device_rejects_a_longer_source() {
    let d = device();
    let [s] = streams(&d);
    let mr = CudaResource::new(&d).unwrap();
    let src = DeviceBuffer::try_new(10, &s, mr.clone()).unwrap();
    let mut dst = DeviceBuffer::try_new(9, &s, mr).unwrap();
    assert!(matches!(
        dst.copy_from_device(&src),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn try_clone_on_waits_for_the_owner() {
    let d = device();
    let [a, b] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(4096, &a, CudaResource::new(&d).unwrap()).await?;
        a.enqueue_delay(Duration::from_millis(100))?;
        buf.fill(9)?;
        buf.resize(1000).await?; // capacity 4096, size 1000
        let copy = buf.try_clone_on(&b).await?;
        assert_eq!(copy.stream(), b);
        assert_eq!((copy.len(), copy.capacity()), (1000, 1000));
        assert_eq!(
            to_host(&copy).await,
            vec![9u8; 1000],
            "b copied before a's fill"
        );
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn try_clone_on_records_the_read_of_the_original() {
    let d = device();
    let [a, b] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(4096, &a, CudaResource::new(&d).unwrap()).await?;
        buf.fill(9)?;
        a.synchronize().await?;
        let open = gate(&b); // holds the copy back
        let copy = buf.try_clone_on(&b).await?;
        drop(buf);
        std::thread::sleep(Duration::from_millis(50)); // `a` is idle: an unordered free runs
        assert_eq!(allocated(&d), 2 * 4096, "freed before the clone's copy");
        drop(open);
        assert_eq!(to_host(&copy).await, vec![9u8; 4096]);
        a.synchronize().await?;
        assert_eq!(allocated(&d), 4096);
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn try_clone_copies_on_the_owner() {
    let d = device();
    let [s] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(512, &s, CudaResource::new(&d).unwrap()).await?;
        buf.copy_from_host(pattern(512)).await?;
        let mut copy = buf.try_clone().await?;
        assert_eq!(copy.stream(), s);
        assert_ne!(copy.ptr(), buf.ptr());
        copy.fill(0)?; // the copy is independent
        assert_eq!(to_host(&buf).await, pattern(512));
        assert_eq!(buf.uses.lock().reader_count(), 0);
        Ok::<_, Error>(())
    })
    .unwrap();
}

// ---- host copies -----------------------------------------------------------------------------

#[test]
fn host_copies_round_trip_vec_and_box() {
    let d = device();
    let [s] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(1000, &s, CudaResource::new(&d).unwrap()).await?;
        let back = buf.copy_from_host(pattern(1000).into_boxed_slice()).await?;
        assert_eq!(&back[..], &pattern(1000)[..]);
        let host: Box<[u8]> = buf.copy_to_host(vec![0u8; 1000].into_boxed_slice()).await?;
        assert_eq!(&host[..], &pattern(1000)[..]);
        let longer = buf.copy_to_host(vec![0xffu8; 1200]).await?;
        assert_eq!(&longer[..1000], &pattern(1000)[..]);
        assert!(longer[1000..].iter().all(|&x| x == 0xff));
        buf.copy_from_host(vec![0u8; 10]).await?;
        assert_eq!(
            &to_host(&buf).await[..11],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11]
        );
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn host_copy_length_errors() {
    let d = device();
    let [s] = streams(&d);
    let mut buf = DeviceBuffer::try_new(100, &s, CudaResource::new(&d).unwrap()).unwrap();
    let e = block_on(buf.copy_to_host(vec![0u8; 99])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                call: "copy_to_host",
                device_len: 100,
                host_len: 99,
                unit: "bytes",
                ..
            }
        ),
        "{e}"
    );
    let e = block_on(buf.copy_from_host(vec![0u8; 101])).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                call: "copy_from_host",
                device_len: 100,
                host_len: 101,
                unit: "bytes",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn copy_to_host_is_enqueued_at_creation_and_borrows_nothing() {
    let d = device();
    let [a, b] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(256, &a, CudaResource::new(&d).unwrap()).await?;
        buf.fill(1)?;
        let first = buf.copy_to_host(vec![0u8; 256]);
        buf.fill(2)?; // enqueued after the copy above on the same stream
        buf.set_stream(&b)?;
        let second = buf.copy_to_host(vec![0u8; 256]);
        drop(buf); // freed on `b`, after both copies
        assert_eq!(first.await?, vec![1u8; 256]);
        assert_eq!(second.await?, vec![2u8; 256]);
        b.synchronize().await?;
        assert_eq!(allocated(&d), 0);
        Ok::<_, Error>(())
    })
    .unwrap();
}

/// Large enough that the system allocator returns it to the OS on free (a freed block would
/// then fault on access), so a host buffer freed under the copy shows.
const BIG: usize = 8 << 20;

#[test]
fn dropped_copy_from_host_future_keeps_host_buffer_until_the_copy() {
    let d = device();
    let [s] = streams(&d);
    let mut buf = block_on(DeviceBuffer::new(BIG, &s, CudaResource::new(&d).unwrap())).unwrap();
    let data = pattern(BIG);
    let open = gate(&s);
    // Polled once, then dropped while the copy waits behind the gate. (A drop that blocked
    // would deadlock here.)
    assert!(buf.copy_from_host(data).now_or_never().is_none());
    drop(open);
    s.synchronize_blocking().unwrap();
    assert!(
        to_host_blocking(&buf) == pattern(BIG),
        "the device read a freed host buffer"
    );
    drop(buf);
    s.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0);
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn dropped_copy_to_host_future_keeps_host_buffer_until_the_copy() {
    let d = device();
    let [s] = streams(&d);
    let mut buf = block_on(DeviceBuffer::new(BIG, &s, CudaResource::new(&d).unwrap())).unwrap();
    buf.fill(5).unwrap();
    let open = gate(&s);
    // Dropped unpolled, then dropped after one poll: both hand the Vec to the stream.
    drop(buf.copy_to_host(vec![0u8; BIG]));
    assert!(buf.copy_to_host(vec![0u8; BIG]).now_or_never().is_none());
    drop(open);
    s.synchronize_blocking().unwrap();
    // The stream went on past both copies and the host functions that dropped their buffers.
    assert!(to_host_blocking(&buf).iter().all(|&x| x == 5));
    drop(buf);
    s.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0);
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn forgotten_copy_future_leaks_only_the_host_buffer() {
    let d = device();
    let [s] = streams(&d);
    let mut buf = DeviceBuffer::try_new(64, &s, CudaResource::new(&d).unwrap()).unwrap();
    s.enqueue_delay(Duration::from_millis(20)).unwrap();
    std::mem::forget(buf.copy_from_host(vec![4u8; 64]));
    s.synchronize_blocking().unwrap();
    assert_eq!(to_host_blocking(&buf), vec![4u8; 64]);
    drop(buf);
    s.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0);
}

// ---- errors and edge cases -------------------------------------------------------------------

#[test]
fn other_device_is_a_device_mismatch() {
    let (d1, d2) = (device(), device());
    let [s1] = streams(&d1);
    let [s2] = streams(&d2);
    let mismatch = |r: Result<(), Error>| {
        assert!(
            matches!(r, Err(Error::DeviceMismatch { .. })),
            "expected a device mismatch, got {r:?}"
        )
    };
    let mr1 = CudaResource::new(&d1).unwrap();
    mismatch(DeviceBuffer::try_new(64, &s2, mr1.clone()).map(drop));
    mismatch(block_on(DeviceBuffer::new(64, &s2, mr1.clone())).map(drop));
    let mut buf = DeviceBuffer::try_new(64, &s1, mr1).unwrap();
    mismatch(buf.set_stream(&s2));
    assert_eq!(buf.stream(), s1);
    mismatch(buf.read_on(&s2).map(drop));
    mismatch(buf.record_read(&s2));
    mismatch(block_on(buf.try_clone_on(&s2)).map(drop));
    let other = DeviceBuffer::try_new(64, &s2, CudaResource::new(&d2).unwrap()).unwrap();
    mismatch(buf.copy_from_device(&other));
}

#[test]
fn zero_length_buffers() {
    let d = device();
    let [a, b] = streams(&d);
    block_on(async {
        let mr = CudaResource::new(&d).unwrap();
        let mut buf = DeviceBuffer::new(0, &a, mr.clone()).await?;
        assert!(buf.is_empty());
        assert_eq!((buf.len(), buf.capacity()), (0, 0));
        assert!(buf.ptr().is_null());
        buf.fill(1)?;
        assert_eq!(buf.copy_to_host(Vec::<u8>::new()).await?, Vec::<u8>::new());
        assert_eq!(buf.copy_to_host(vec![3u8; 2]).await?, vec![3u8; 2]);
        assert!(buf.copy_from_host(Vec::<u8>::new()).await?.is_empty());
        assert!(buf.read_on(&b)?.is_empty());
        let copy = buf.try_clone_on(&b).await?;
        assert!(copy.is_empty());
        let other = DeviceBuffer::try_new(0, &b, mr)?;
        buf.copy_from_device(&other)?;
        buf.set_stream(&b)?;
        buf.shrink_to_fit().await?;
        buf.resize(16).await?;
        buf.fill(2)?;
        assert_eq!(to_host(&buf).await, vec![2u8; 16]);
        buf.resize(0).await?;
        buf.shrink_to_fit().await?;
        assert_eq!(buf.capacity(), 0);
        drop((buf, copy, other));
        a.synchronize().await?;
        b.synchronize().await?;
        assert_eq!(allocated(&d), 0);
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn allocation_failure_leaves_buffer_unchanged() {
    let d = Device::host_with(HostConfig::default().capacity(4096));
    let [s] = streams(&d);
    block_on(async {
        let mut buf = DeviceBuffer::new(1000, &s, CudaResource::new(&d).unwrap()).await?;
        buf.copy_from_host(pattern(1000)).await?;
        let ptr = buf.ptr();
        let e = buf.resize(1 << 20).await.unwrap_err();
        assert!(e.is_out_of_memory());
        assert_eq!((buf.ptr(), buf.len(), buf.capacity()), (ptr, 1000, 1000));
        d.host_controls().unwrap().fail_next_allocations(1);
        assert!(buf.try_clone().await.unwrap_err().is_out_of_memory());
        assert_eq!(to_host(&buf).await, pattern(1000));
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn with_current_resource_uses_the_device_default() {
    let d = device();
    let [s] = streams(&d);
    let buf = block_on(DeviceBuffer::with_current_resource(300, &s)).unwrap();
    assert_eq!(allocated(&d), 300);
    assert!(format!("{:?}", buf.resource()).contains("CudaResource"));
    assert!(format!("{buf:?}").contains("len: 300"));
}

#[test]
fn buffers_and_their_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    fn sync<T: Sync>() {}
    sync::<DeviceBuffer>();
    let d = device();
    let [s, t] = streams(&d);
    let mut buf = DeviceBuffer::try_new(16, &s, CudaResource::new(&d).unwrap()).unwrap();
    send(&DeviceBuffer::new(16, &s, CudaResource::new(&d).unwrap()));
    send(&DeviceBuffer::with_current_resource(16, &s));
    send(&buf.try_clone_on(&t));
    send(&buf.copy_to_host(vec![0u8; 16]));
    send(&buf.read_on(&t).unwrap());
    send(&buf.resize(32));
    send(&buf.copy_from_host(vec![0u8; 16]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_across_tokio_tasks() {
    let d = device();
    let [a, b] = streams(&d);
    let mut buf = DeviceBuffer::new(1024, &a, CudaResource::new(&d).unwrap())
        .await
        .unwrap();
    a.enqueue_delay(Duration::from_millis(30)).unwrap();
    buf.fill(8).unwrap();
    let consumer = tokio::spawn(async move {
        buf.set_stream(&b)?;
        buf.copy_to_host(vec![0u8; 1024]).await
    });
    assert_eq!(consumer.await.unwrap().unwrap(), vec![8u8; 1024]);
}

#[test]
fn a_default_buffer_is_empty_and_can_grow() {
    let mut buf = DeviceBuffer::default();
    assert_eq!(
        (buf.len(), buf.capacity(), buf.ptr()),
        (0, 0, DevicePtr::NULL)
    );
    assert_eq!(buf.device(), &Device::host());
    assert_eq!(
        buf.stream(),
        Stream::legacy_default(&Device::host()).unwrap()
    );
    // Growing allocates from its resource on its owner, like any buffer's.
    block_on(buf.resize(300)).unwrap();
    buf.fill(9).unwrap();
    assert_eq!(
        block_on(buf.copy_to_host(vec![0u8; 300])).unwrap(),
        vec![9; 300]
    );
    // A buffer of another device refuses it, as for any buffer.
    let other = device();
    let s = Stream::new(&other).unwrap();
    assert!(matches!(
        DeviceBuffer::default().set_stream(&s),
        Err(Error::DeviceMismatch { .. })
    ));
}

#[test]
fn take_leaves_a_default_buffer_and_frees_once() {
    let device = device();
    let [s] = streams::<1>(&device);
    let mut buf = DeviceBuffer::try_new(4096, &s, CudaResource::new(&device).unwrap()).unwrap();
    let taken = std::mem::take(&mut buf);
    assert_eq!((taken.len(), buf.len()), (4096, 0));
    drop(buf);
    s.synchronize_blocking().unwrap();
    assert_eq!(
        allocated(&device),
        4096,
        "dropping the default freed something"
    );
    drop(taken);
    s.synchronize_blocking().unwrap();
    assert_eq!(allocated(&device), 0);
}

#[test]
fn a_prefetch_on_another_stream_delays_the_free() {
    let device = device();
    let [owner, other] = streams::<2>(&device);
    let buf =
        DeviceBuffer::try_new(4096, &owner, crate::ManagedResource::new(&device).unwrap()).unwrap();
    let open = gate(&other);
    assert!(buf.prefetch(&other).unwrap());
    drop(buf);
    std::thread::sleep(Duration::from_millis(20));
    // `other` is still blocked before its recorded prefetch: the free on `owner` waits.
    assert_eq!(allocated(&device), 4096, "freed under a pending prefetch");
    drop(open);
    other.synchronize_blocking().unwrap();
    owner.synchronize_blocking().unwrap();
    assert_eq!(allocated(&device), 0);
}

#[test]
fn default_streams_are_shared_and_outlive_no_one() {
    let (a, b) = (device(), device());
    let la = Stream::legacy_default(&a).unwrap();
    assert_eq!(la, Stream::legacy_default(&a).unwrap());
    assert_ne!(la, Stream::legacy_default(&b).unwrap());
    assert_ne!(la, Stream::per_thread_default(&a).unwrap());
    // An event keeps working after every handle of its stream is gone.
    la.enqueue_delay(Duration::from_millis(10)).unwrap();
    let e = la.record().unwrap();
    drop(la);
    block_on(e).unwrap();
}
