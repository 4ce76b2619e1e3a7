use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::executor::block_on;
use futures::FutureExt;

use crate::test_support::{allocated, device};
use crate::{
    CallbackResource, CudaResource, DeviceBuffer, DevicePtr, DeviceVec, Error, MemoryResource,
    PinnedHostResource, PinnedHostVec, PoolResource, Properties, Stream,
};

#[test]
fn constructors_fill_as_named_and_deref_to_the_elements() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let mr = PinnedHostResource::new(&d).unwrap();
    block_on(async {
        let mut v = PinnedHostVec::<u32>::new(100, &s, mr.clone()).await?;
        assert_eq!((v.len(), v.is_empty()), (100, false));
        v.iter_mut().enumerate().for_each(|(i, x)| *x = i as u32);
        assert_eq!(v[99], 99);
        let z = PinnedHostVec::<f64>::zeroed(7, &s, mr.clone()).await?;
        assert_eq!(&z[..], &[0.0; 7]);
        let f = PinnedHostVec::from_slice(&[3i8, -4], &s, mr.clone()).await?;
        assert_eq!(f.as_slice(), &[3, -4]);
        assert_eq!(f.stream(), &s);
        let empty = PinnedHostVec::<u64>::from_slice(&[], &s, mr).await?;
        assert!(empty.is_empty() && empty.as_slice().is_empty());
        Ok::<_, Error>(())
    })
    .unwrap();
    s.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0, "every PinnedHostVec was freed");
}

#[test]
fn typed_round_trip_through_a_device_buffer() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    block_on(async {
        let mut buf = DeviceVec::<f32>::new(1000, &s, CudaResource::new(&d).unwrap()).await?;
        let sent: Vec<f32> = (0..1000).map(|i| i as f32 / 7.0).collect();
        let host =
            PinnedHostVec::from_slice(&sent, &s, PinnedHostResource::new(&d).unwrap()).await?;
        let host = buf.copy_from_host(host).await?;
        let back =
            PinnedHostVec::<f32>::zeroed(1000, &s, PinnedHostResource::new(&d).unwrap()).await?;
        let back = buf.copy_to_host(back).await?;
        assert_eq!(&back[..], &sent[..]);
        assert_eq!(&host[..], &sent[..]);
        let short =
            PinnedHostVec::<f32>::new(999, &s, PinnedHostResource::new(&d).unwrap()).await?;
        let e = buf.copy_to_host(short).await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::LengthMismatch {
                    device_len: 1000,
                    host_len: 999,
                    unit: "elements",
                    ..
                }
            ),
            "{e}"
        );
        Ok::<_, Error>(())
    })
    .unwrap();
}

#[test]
fn memory_the_host_cannot_access_is_refused_before_allocating() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let device_only = Properties {
        device_accessible: true,
        host_accessible: false,
        device: d.id(),
    };
    // SAFETY: it hands out no pointer: the allocate closure panics.
    let mr = unsafe {
        CallbackResource::new(
            device_only,
            |_, _| panic!("nothing may be allocated"),
            |_, _, _| panic!("nothing may be freed"),
        )
    };
    let e = block_on(PinnedHostVec::<u8>::new(16, &s, mr)).unwrap_err();
    assert_eq!(
        e,
        Error::NotHostAccessible {
            what: "PinnedHostVec",
            host_accessible: false,
            device_accessible: true,
            device: d.id(),
        }
    );
}

#[test]
fn an_overflowing_size_is_an_error_that_allocates_nothing() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let e = block_on(PinnedHostVec::<u64>::new(
        usize::MAX / 4,
        &s,
        PinnedHostResource::new(&d).unwrap(),
    ))
    .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("8 bytes")),
        "{e}"
    );
    assert_eq!(allocated(&d), 0);
}

#[test]
fn a_pool_over_pinned_memory_reuses_one_staging_block_batch_after_batch() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let pool = PoolResource::new(PinnedHostResource::new(&d).unwrap(), 1 << 16, None).unwrap();
    let mut addrs = Vec::new();
    block_on(async {
        let mut buf = DeviceBuffer::new(4096, &s, CudaResource::new(&d).unwrap()).await?;
        for batch in 0..4u8 {
            let mut host = PinnedHostVec::<u8>::new(4096, &s, pool.clone()).await?;
            addrs.push(host.as_ptr() as usize);
            host.fill(batch);
            let host = buf.copy_from_host(host).await?;
            drop(host);
            let back = buf.copy_to_host(vec![0u8; 4096]).await?;
            assert!(back.iter().all(|&x| x == batch), "batch {batch}");
        }
        Ok::<_, Error>(())
    })
    .unwrap();
    assert!(addrs.iter().all(|&a| a == addrs[0]), "{addrs:x?}");
}

/// A copy future dropped while its copy waits behind device work frees its `PinnedHostVec`
/// stream-ordered; a new `PinnedHostVec` handed the same memory must not let host code write
/// it before the copy has read it.
#[test]
fn reused_pinned_memory_is_not_written_under_a_dropped_copy() {
    // The old vector comes from the copy's stream `s` or another stream `t`, and so does the
    // new one: every pair must keep host writes off the block until the copy has read it.
    for (old_on_t, new_on_t) in [(false, false), (false, true), (true, false), (true, true)] {
        let d = device();
        let (s, t) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
        // Room for one vector only: the second must reuse the first one's block.
        let pool =
            PoolResource::new(PinnedHostResource::new(&d).unwrap(), 4096, Some(4096)).unwrap();
        let pick = |on_t: bool| if on_t { &t } else { &s };
        block_on(async {
            let mut buf = DeviceBuffer::new(4096, &s, CudaResource::new(&d).unwrap()).await?;
            let old = PinnedHostVec::from_slice(&[1u8; 4096], pick(old_on_t), pool.clone()).await?;
            let addr = old.as_ptr();
            s.enqueue_delay(Duration::from_millis(100))?;
            drop(buf.copy_from_host(old)); // the copy on `s` still waits behind the delay
            let new = PinnedHostVec::from_slice(&[2u8; 4096], pick(new_on_t), pool.clone()).await?;
            assert_eq!(
                new.as_ptr(),
                addr,
                "the test needs the pool to reuse the block"
            );
            let back = buf.copy_to_host(vec![0u8; 4096]).await?;
            assert!(
                back.iter().all(|&x| x == 1),
                "old on t: {old_on_t}, new on t: {new_on_t}"
            );
            Ok::<_, Error>(())
        })
        .unwrap();
    }
}

#[test]
fn a_dropped_copy_frees_its_pinned_vector_after_the_copy() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let mut buf = DeviceBuffer::try_new(4096, &s, CudaResource::new(&d).unwrap()).unwrap();
    let before = allocated(&d);
    let host = block_on(PinnedHostVec::from_slice(
        &[5u8; 4096],
        &s,
        PinnedHostResource::new(&d).unwrap(),
    ))
    .unwrap();
    s.enqueue_delay(Duration::from_millis(50)).unwrap();
    drop(buf.copy_from_host(host));
    s.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), before, "the pinned vector was freed");
    assert_eq!(
        block_on(buf.copy_to_host(vec![0u8; 4096])).unwrap(),
        [5u8; 4096]
    );
    assert_eq!(d.deferred_error_count(), 0);
}

#[test]
fn a_constructor_dropped_while_it_waits_frees_what_it_allocated() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    s.enqueue_delay(Duration::from_millis(50)).unwrap();
    let pending =
        PinnedHostVec::<u8>::new(4096, &s, PinnedHostResource::new(&d).unwrap()).now_or_never();
    assert!(
        pending.is_none(),
        "it waits for the stream to reach the allocation"
    );
    s.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0);
}

#[test]
fn elements_aligned_beyond_the_resource_are_refused() {
    #[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
    #[repr(C, align(512))]
    struct Wide([u8; 512]);

    let d = device();
    let s = Stream::new(&d).unwrap();
    let upstream = CudaResource::new(&d).unwrap();
    // A resource whose blocks are 256-byte aligned but never 512-byte aligned.
    let bases = Arc::new(Mutex::new(HashMap::new()));
    let shifted = {
        let (upstream, bases) = (upstream.clone(), bases.clone());
        move |bytes, s: &Stream| {
            let base = upstream.try_allocate(bytes + 256, s)?;
            let p = if base.is_aligned(512) {
                base.offset(256)
            } else {
                base
            };
            bases.lock().unwrap().insert(p, base);
            Ok(p)
        }
    };
    let properties = upstream.properties();
    let free = move |p: DevicePtr, bytes, s: &Stream| {
        let base = bases.lock().unwrap().remove(&p).unwrap();
        // SAFETY: `base` is what `upstream` returned for `bytes + 256` in `shifted`.
        unsafe { upstream.deallocate(base, bytes + 256, s) }
    };
    // SAFETY: a pointer is 256 bytes into, or the start of, a block `upstream` returned for
    // `bytes + 256` bytes (256-aligned either way, `bytes` bytes of the block after it), with
    // `upstream`'s properties.
    let mr = unsafe { CallbackResource::new(properties, shifted, free) };
    let e = block_on(PinnedHostVec::<Wide>::new(2, &s, mr)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("512")),
        "{e}"
    );
    s.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0, "the misaligned block was given back");
}

/// Pipelines spawn these futures on multi-thread runtimes.
#[test]
fn constructors_and_copies_are_send() {
    fn send<F: Send>(_: &F) {}
    let d = device();
    let s = Stream::new(&d).unwrap();
    let mr = PinnedHostResource::new(&d).unwrap();
    let new = PinnedHostVec::<f32>::new(4, &s, mr.clone());
    send(&new);
    let zeroed = PinnedHostVec::<f32>::zeroed(4, &s, mr.clone());
    send(&zeroed);
    let from = PinnedHostVec::from_slice(&[1u8], &s, mr.clone());
    send(&from);
    let v = block_on(new).unwrap();
    let mut buf = DeviceVec::<f32>::try_new(4, &s, CudaResource::new(&d).unwrap()).unwrap();
    let to = buf.copy_from_host(v);
    send(&to);
    let v = block_on(to).unwrap();
    let mut out = [0f32; 4];
    let to_slice = buf.copy_to_host_slice(&mut out);
    send(&to_slice);
    block_on(to_slice).unwrap();
    let from_slice = buf.copy_from_host_slice(&v[..]);
    send(&from_slice);
    block_on(from_slice).unwrap();
}
