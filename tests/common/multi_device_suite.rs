//! Two devices in one process: buffers keep their device, bytes cross only through peer
//! copies ordered on both devices, a stream of the other device is refused with both ids, and
//! each device has its own current resource and scopes. The same cases on two emulated host
//! devices (CI) and on CUDA devices 0 and 1 (the GPU bundle).
//!
//! On CUDA the suite needs two GPUs. With fewer, [`two_cuda_devices`] decides: run by name
//! (the test binary's filter contains `multi_gpu`), each test fails with "needs two CUDA
//! devices, found N"; run as part of everything (`--include-ignored` with no such filter), each
//! prints that it was skipped and returns, so a one-GPU bundle run stays green while a
//! deliberate two-GPU run can never pass without two GPUs.

use std::io::Write;
use std::time::Duration;

use futures::executor::block_on;
use streamalloc::{
    current_device_resource_for, with_resource, CudaAsyncResource, CudaResource, Device,
    DeviceBuffer, DeviceVec, Error, MemoryResource, PoolResource, Stream,
};

const LONG: Duration = Duration::from_millis(100);

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// CUDA devices 0 and 1, or `None` (after saying so on stderr) where there are fewer than two
/// and the multi-GPU tests were not asked for by name; see the module docs.
///
/// # Panics
/// With fewer than two devices when the test filter names `multi_gpu`.
pub fn two_cuda_devices() -> Option<(Device, Device)> {
    let count = Device::cuda_device_count();
    if count >= 2 {
        return Some((Device::cuda(0).unwrap(), Device::cuda(1).unwrap()));
    }
    let asked = std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && a.contains("multi_gpu"));
    let message = format!("needs two CUDA devices, found {count}");
    if asked {
        panic!("{message}: run the multi_gpu tests on a machine with two GPUs");
    }
    // Straight to the process's stderr, past libtest's capture: a skip must show in the log.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED (multi_gpu): {message}; run `<test binary> --include-ignored multi_gpu` on a \
         two-GPU machine"
    );
    None
}

/// Device 1 copies a buffer that device 0 writes after long work: the copy waited for it.
pub fn peer_copy_waits_for_the_source_owner((d0, d1): (Device, Device)) {
    let (s0, s1) = (Stream::new(&d0).unwrap(), Stream::new(&d1).unwrap());
    let n = 4 << 20;
    let mut src = DeviceBuffer::try_new(n, &s0, CudaAsyncResource::new(&d0).unwrap()).unwrap();
    s0.enqueue_delay(LONG).unwrap();
    src.fill(0x5a).unwrap();
    let mut dst = DeviceBuffer::try_new(n, &s1, CudaAsyncResource::new(&d1).unwrap()).unwrap();
    dst.copy_from_peer(&src).unwrap();
    let host = block_on(dst.copy_to_host(vec![0u8; n])).unwrap();
    let stale = host.iter().filter(|&&x| x != 0x5a).count();
    assert_eq!(
        stale, 0,
        "device 1 copied {stale} bytes before device 0 wrote them"
    );

    // And back, from device 1 to device 0, into a longer buffer.
    let sent = block_on(dst.copy_from_host(pattern(n))).unwrap();
    let mut back = DeviceBuffer::try_new(n + 100, &s0, CudaResource::new(&d0).unwrap()).unwrap();
    back.fill(0).unwrap();
    back.copy_from_peer(&dst).unwrap();
    let host = block_on(back.copy_to_host(vec![1u8; n + 100])).unwrap();
    assert_eq!(&host[..n], &sent[..]);
    assert!(host[n..].iter().all(|&x| x == 0));
}

/// The source's free, on its own device, waits for the peer read on the other device: the
/// source owner synchronized after the drop has passed the copy on device 1.
pub fn the_source_free_waits_for_the_peer_read((d0, d1): (Device, Device)) {
    let (s0, s1) = (Stream::new(&d0).unwrap(), Stream::new(&d1).unwrap());
    let n = 1 << 20;
    let src = DeviceBuffer::try_new(n, &s0, CudaAsyncResource::new(&d0).unwrap()).unwrap();
    let mut dst = DeviceBuffer::try_new(n, &s1, CudaResource::new(&d1).unwrap()).unwrap();
    s1.enqueue_delay(LONG).unwrap(); // device 1 is busy before it reads `src`
    dst.copy_from_peer(&src).unwrap();
    let copied = s1.record().unwrap();
    drop(src);
    block_on(s0.synchronize()).unwrap();
    assert!(
        copied.is_complete().unwrap(),
        "device 0 freed the source before device 1 had read it"
    );
}

/// `try_clone_to` makes a copy that lives on the other device, keeps the alignment, and
/// leaves the original as it was.
pub fn clone_to_another_device((d0, d1): (Device, Device)) {
    let (s0, s1) = (Stream::new(&d0).unwrap(), Stream::new(&d1).unwrap());
    let n = 100_000;
    let mr0 = CudaResource::new(&d0).unwrap();
    let mut buf = block_on(DeviceBuffer::with_alignment(n, 4096, &s0, mr0)).unwrap();
    let sent = block_on(buf.copy_from_host(pattern(n))).unwrap();
    let copy = block_on(buf.try_clone_to(&s1, CudaAsyncResource::new(&d1).unwrap())).unwrap();
    assert_eq!((copy.device(), copy.stream()), (&d1, s1.clone()));
    assert_eq!((copy.len(), copy.alignment()), (n, 4096));
    assert!(copy.ptr().is_aligned(4096));
    assert_eq!(block_on(copy.copy_to_host(vec![0u8; n])).unwrap(), sent);
    assert_eq!((buf.device(), buf.stream()), (&d0, s0.clone()));
    assert_eq!(block_on(buf.copy_to_host(vec![0u8; n])).unwrap(), sent);

    let empty = DeviceBuffer::try_new(0, &s0, CudaResource::new(&d0).unwrap()).unwrap();
    let copy = block_on(empty.try_clone_to(&s1, CudaResource::new(&d1).unwrap())).unwrap();
    assert_eq!((copy.len(), copy.device()), (0, &d1));

    let mut short = DeviceBuffer::try_new(10, &s1, CudaResource::new(&d1).unwrap()).unwrap();
    let r = short.copy_from_peer(&buf);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
}

fn assert_mismatch<T: std::fmt::Debug>(
    r: streamalloc::Result<T>,
    expected: &Device,
    actual: &Device,
    what: &str,
) {
    match r {
        Err(Error::DeviceMismatch {
            expected: e,
            actual: a,
            ..
        }) => assert_eq!((e, a), (expected.id(), actual.id()), "{what}"),
        other => panic!("{what}: expected a device mismatch, got {other:?}"),
    }
}

/// A buffer of device 0 used on a stream of device 1 without a copy is refused, with both
/// device ids, and stays on device 0.
pub fn another_devices_stream_is_refused_with_both_ids((d0, d1): (Device, Device)) {
    let (s0, s1) = (Stream::new(&d0).unwrap(), Stream::new(&d1).unwrap());
    let mr0 = CudaResource::new(&d0).unwrap();
    let mut buf = DeviceBuffer::try_new(256, &s0, mr0.clone()).unwrap();
    let other = DeviceBuffer::try_new(256, &s1, CudaResource::new(&d1).unwrap()).unwrap();

    assert_mismatch(buf.set_stream(&s1), &d0, &d1, "set_stream");
    assert_mismatch(buf.read_on(&s1).map(|_| ()), &d0, &d1, "read_on");
    assert_mismatch(buf.record_read(&s1), &d0, &d1, "record_read");
    assert_mismatch(buf.copy_from_device(&other), &d0, &d1, "copy_from_device");
    assert_mismatch(block_on(buf.try_clone_on(&s1)), &d0, &d1, "try_clone_on");
    assert_mismatch(
        block_on(buf.try_clone_to(&s1, mr0.clone())),
        &d0,
        &d1,
        "try_clone_to",
    );
    assert_mismatch(
        DeviceBuffer::try_new(64, &s1, mr0.clone()),
        &d0,
        &d1,
        "try_new",
    );
    assert_mismatch(
        block_on(DeviceBuffer::new(64, &s1, mr0.clone())),
        &d0,
        &d1,
        "new",
    );
    assert_mismatch(mr0.try_allocate(64, &s1), &d0, &d1, "try_allocate");
    assert_eq!((buf.device(), buf.stream()), (&d0, s0.clone()));
    buf.fill(1).unwrap();
    assert_eq!(
        block_on(buf.copy_to_host(vec![0u8; 256])).unwrap(),
        vec![1u8; 256]
    );
}

/// A vector keeps its device: used on a stream of the other device without a copy it is
/// refused with both ids; its elements cross through `try_clone_to` / `copy_from_peer`.
pub fn vectors_keep_their_device((d0, d1): (Device, Device)) {
    let (s0, s1) = (Stream::new(&d0).unwrap(), Stream::new(&d1).unwrap());
    let (mr0, mr1) = (
        CudaAsyncResource::new(&d0).unwrap(),
        CudaResource::new(&d1).unwrap(),
    );
    let data: Vec<f32> = (0..10_000).map(|i| i as f32 * 0.5).collect();
    let mut v = block_on(DeviceVec::from_host(data.clone(), &s0, mr0.clone())).unwrap();

    assert_mismatch(v.set_stream(&s1), &d0, &d1, "DeviceVec::set_stream");
    assert_mismatch(v.read_on(&s1).map(|_| ()), &d0, &d1, "DeviceVec::read_on");
    assert_mismatch(
        block_on(DeviceVec::<f32>::new(4, &s1, mr0.clone())),
        &d0,
        &d1,
        "DeviceVec::new",
    );
    assert_eq!((v.device(), v.stream()), (&d0, s0.clone()));

    s0.enqueue_delay(LONG).unwrap();
    let w = block_on(v.try_clone_to(&s1, mr1.clone())).unwrap();
    assert_eq!(
        (w.device(), w.stream(), w.len()),
        (&d1, s1.clone(), data.len())
    );
    assert_eq!(block_on(w.to_vec()).unwrap(), data);

    let twice: Vec<f32> = data.iter().map(|x| x * 2.0).collect();
    let mut w = block_on(DeviceVec::from_host(twice.clone(), &s1, mr1.clone())).unwrap();
    v.copy_from_peer(&w).unwrap();
    assert_eq!(block_on(v.to_vec()).unwrap(), twice);

    let short = block_on(DeviceVec::<f32>::new(3, &s0, mr0)).unwrap();
    let r = short.try_clone_to(&s1, mr1);
    let short = block_on(r).unwrap();
    assert!(matches!(w.copy_from_peer(&short), Ok(())));
    let mut tiny = block_on(DeviceVec::<f32>::new(
        2,
        &s1,
        CudaResource::new(&d1).unwrap(),
    ))
    .unwrap();
    assert!(matches!(
        tiny.copy_from_peer(&v),
        Err(Error::InvalidArgument(_))
    ));
}

/// Each device has its own current resource and its own scopes: a scope of device 0 does not
/// answer for device 1, and clones to device 1 can take device 1's current resource.
pub fn per_device_current_resources_and_scopes((d0, d1): (Device, Device)) {
    let (s0, s1) = (Stream::new(&d0).unwrap(), Stream::new(&d1).unwrap());
    let p0 = PoolResource::new(CudaResource::new(&d0).unwrap(), 0, None).unwrap();
    let p1 = PoolResource::new(CudaResource::new(&d1).unwrap(), 0, None).unwrap();
    let own1 = current_device_resource_for(&d1);
    block_on(with_resource(p0.clone(), async {
        let b1 = DeviceBuffer::with_current_resource(4096, &s1)
            .await
            .unwrap();
        assert!(
            b1.can_be_freed_by(&*own1),
            "a scope of device 0 answered for device 1"
        );
        with_resource(p1.clone(), async {
            let mut b0 = DeviceBuffer::with_current_resource(4096, &s0)
                .await
                .unwrap();
            assert!(b0.can_be_freed_by(&p0));
            b0.fill(7).unwrap();
            let there = b0
                .try_clone_to(&s1, current_device_resource_for(&d1))
                .await
                .unwrap();
            assert!(there.can_be_freed_by(&p1));
            assert_eq!(
                there.copy_to_host(vec![0u8; 4096]).await.unwrap(),
                vec![7u8; 4096]
            );
        })
        .await;
    }));
    assert!(current_device_resource_for(&d0).is_equal(&*current_device_resource_for(&d0)));
    assert!(!current_device_resource_for(&d0).is_equal(&p0));
}

#[macro_export]
macro_rules! multi_device_suite {
    ($name:ident, $devices:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::multi_device_suite as suite;

            $(#[$attr])* #[test] fn peer_copy_waits_for_the_source_owner() { if let Some(d) = $devices { suite::peer_copy_waits_for_the_source_owner(d) } }
            $(#[$attr])* #[test] fn the_source_free_waits_for_the_peer_read() { if let Some(d) = $devices { suite::the_source_free_waits_for_the_peer_read(d) } }
            $(#[$attr])* #[test] fn clone_to_another_device() { if let Some(d) = $devices { suite::clone_to_another_device(d) } }
            $(#[$attr])* #[test] fn another_devices_stream_is_refused_with_both_ids() { if let Some(d) = $devices { suite::another_devices_stream_is_refused_with_both_ids(d) } }
            $(#[$attr])* #[test] fn vectors_keep_their_device() { if let Some(d) = $devices { suite::vectors_keep_their_device(d) } }
            $(#[$attr])* #[test] fn per_device_current_resources_and_scopes() { if let Some(d) = $devices { suite::per_device_current_resources_and_scopes(d) } }
        }
    };
}
