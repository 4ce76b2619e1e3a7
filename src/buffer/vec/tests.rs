use std::time::Duration;

use futures::executor::block_on;

use crate::test_support::{allocated, device, gate};
use crate::{
    CudaResource, Device, DeviceBuffer, DeviceVec, Error, HostConfig, LimitingAdaptor,
    MemoryResource, Stream,
};

fn invalid(e: &Error) -> String {
    match e {
        Error::InvalidArgument(msg) => msg.clone(),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn len_and_bytes_agree() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let v = DeviceVec::<f32>::try_new(10, &s, CudaResource::new(&device).unwrap()).unwrap();
    assert_eq!((v.len(), v.capacity(), v.as_buffer().len()), (10, 10, 40));
    assert_eq!(allocated(&device), 40);
    drop(v);
    block_on(s.synchronize()).unwrap();
    assert_eq!(allocated(&device), 0);
}

#[test]
fn byte_size_overflow_is_an_error_with_the_numbers_and_allocates_nothing() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mr = CudaResource::new(&device).unwrap();
    let n = usize::MAX / 8 + 1;
    let e = DeviceVec::<u64>::try_new(n, &s, mr.clone()).unwrap_err();
    let msg = invalid(&e);
    assert!(
        msg.contains(&n.to_string()) && msg.contains("8 bytes"),
        "{msg}"
    );
    let e = block_on(DeviceVec::<u64>::new(n, &s, mr.clone())).unwrap_err();
    assert!(invalid(&e).contains(&n.to_string()));
    let e = block_on(DeviceVec::<u64>::zeroed(n, &s, mr)).unwrap_err();
    invalid(&e);
    assert_eq!(allocated(&device), 0);
}

#[test]
fn zero_sized_elements_are_an_error() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mr = CudaResource::new(&device).unwrap();
    invalid(&DeviceVec::<()>::try_new(0, &s, mr.clone()).unwrap_err());
    invalid(&block_on(DeviceVec::<()>::new(3, &s, mr.clone())).unwrap_err());
    let buf = DeviceBuffer::try_new(8, &s, mr).unwrap();
    invalid(&DeviceVec::<()>::from_buffer(buf).unwrap_err());
}

#[test]
fn zero_length_works() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mr = CudaResource::new(&device).unwrap();
    let mut v = block_on(DeviceVec::<u32>::zeroed(0, &s, mr.clone())).unwrap();
    assert!(v.is_empty());
    assert_eq!(block_on(v.to_vec()).unwrap(), Vec::<u32>::new());
    assert!(v.slice(..).unwrap().is_empty());
    assert!(v.slice(0..0).unwrap().is_empty());
    block_on(v.slice_mut(..).unwrap().copy_from_host(vec![])).unwrap();
    let w = block_on(DeviceVec::<u32>::from_host(vec![], &s, mr)).unwrap();
    assert!(w.is_empty());
}

#[test]
fn bad_ranges_are_errors_with_the_numbers() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mut v = DeviceVec::<u16>::try_new(10, &s, CudaResource::new(&device).unwrap()).unwrap();
    let msg = invalid(&v.slice(4..11).unwrap_err());
    assert!(msg.contains("4..11") && msg.contains("10"), "{msg}");
    #[allow(clippy::reversed_empty_ranges)]
    let msg = invalid(&v.slice(6..2).unwrap_err());
    assert!(msg.contains("6..2") && msg.contains("reversed"), "{msg}");
    invalid(&v.slice(..=usize::MAX).unwrap_err());
    invalid(&v.slice_mut(11..).unwrap_err());
    invalid(&v.slice(2..8).unwrap().slice(0..7).unwrap_err());
    invalid(&v.as_buffer().slice(0..21).unwrap_err());
    assert_eq!(v.slice(2..=3).unwrap().len(), 2);
    assert_eq!(v.slice(10..).unwrap().len(), 0);
}

#[test]
fn from_buffer_checks_the_length() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mr = CudaResource::new(&device).unwrap();
    let e = DeviceVec::<u32>::from_buffer(DeviceBuffer::try_new(6, &s, mr.clone()).unwrap())
        .unwrap_err();
    let msg = invalid(&e);
    assert!(msg.contains('6') && msg.contains('4'), "{msg}");
    // The refused buffer was freed, not leaked.
    block_on(s.synchronize()).unwrap();
    assert_eq!(allocated(&device), 0);
    let v = DeviceVec::<u32>::from_buffer(DeviceBuffer::try_new(8, &s, mr).unwrap()).unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(v.into_buffer().len(), 8);
}

#[test]
fn round_trip_and_views_copy_only_their_range() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mr = CudaResource::new(&device).unwrap();
    let data: Vec<u32> = (0..1000).collect();
    let mut v = block_on(DeviceVec::from_host(data.clone(), &s, mr)).unwrap();
    assert_eq!(block_on(v.to_vec()).unwrap(), data);
    assert_eq!(
        block_on(v.slice(998..).unwrap().to_vec()).unwrap(),
        [998, 999]
    );
    // A host buffer just as long as the view suffices: only the view is copied.
    let got = block_on(v.slice(10..12).unwrap().copy_to_host(vec![0; 2])).unwrap();
    assert_eq!(got, [10, 11]);
    block_on(v.slice_mut(500..502).unwrap().copy_from_host(vec![7, 7])).unwrap();
    let all = block_on(v.to_vec()).unwrap();
    assert_eq!(&all[498..504], &[498, 499, 7, 7, 502, 503]);
}

#[test]
fn new_times_out_naming_the_size_and_device() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mr = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 1024);
    let _held = DeviceVec::<u8>::try_new(1024, &s, mr.clone()).unwrap();
    let e = block_on(DeviceVec::<f64>::new(8, &s, mr.clone()).timeout(Duration::from_millis(20)))
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { requested: 64, device: d, .. } if d == device.id()));
    let e =
        block_on(DeviceBuffer::new(100, &s, mr).timeout(Duration::from_millis(20))).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("100 bytes") && msg.contains(&device.id().to_string()),
        "{msg}"
    );
}

#[test]
fn handoff_orders_the_new_owner_after_the_old_one() {
    let device = device();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let mut v = block_on(DeviceVec::<u64>::zeroed(
        4,
        &a,
        CudaResource::new(&device).unwrap(),
    ))
    .unwrap();
    let open = gate(&a);
    let write = v.copy_from_host(vec![1, 2, 3, 4]); // queued behind the gate on `a`
    v.set_stream(&b).unwrap();
    let read = v.to_vec(); // on `b`: must wait for the write
    std::thread::sleep(Duration::from_millis(20));
    drop(open);
    block_on(write).unwrap();
    assert_eq!(block_on(read).unwrap(), [1, 2, 3, 4]);
}

#[test]
fn another_devices_stream_is_a_device_mismatch() {
    let (d0, d1) = (device(), device());
    let (s0, s1) = (Stream::new(&d0).unwrap(), Stream::new(&d1).unwrap());
    let mut v = DeviceVec::<u32>::try_new(4, &s0, CudaResource::new(&d0).unwrap()).unwrap();
    let e = v.set_stream(&s1).unwrap_err();
    assert!(
        matches!(e, Error::DeviceMismatch { expected, actual, call: "DeviceBuffer::set_stream(stream)" } if expected == d0.id() && actual == d1.id()),
        "{e:?}"
    );
    assert_eq!(v.stream(), s0, "a refused hand-off keeps the owner");
    assert!(matches!(v.read_on(&s1), Err(Error::DeviceMismatch { .. })));
    let e = block_on(DeviceVec::<u32>::new(
        4,
        &s1,
        CudaResource::new(&d0).unwrap(),
    ))
    .unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e:?}");
    assert!(DeviceVec::<u32>::try_new(4, &s1, CudaResource::new(&d0).unwrap()).is_err());
    assert_eq!(allocated(&d1), 0);
}

#[test]
fn forgotten_view_copies_free_nothing_under_the_device() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mut v = block_on(DeviceVec::from_host(
        vec![5u8; 4096],
        &s,
        CudaResource::new(&device).unwrap(),
    ))
    .unwrap();
    let open = gate(&s);
    std::mem::forget(v.slice(..100).unwrap().copy_to_host(vec![0u8; 100]));
    std::mem::forget(v.slice_mut(100..).unwrap().copy_from_host(vec![1u8; 3996]));
    drop(v.slice(..10).unwrap().to_vec()); // dropped in flight: the stream frees its host side
    drop(v);
    drop(open);
    block_on(s.synchronize()).unwrap();
    assert_eq!(allocated(&device), 0);
}

#[test]
fn over_aligned_elements_get_their_alignment() {
    #[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
    #[repr(C, align(1024))]
    struct Wide([u8; 1024]);
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mr = CudaResource::new(&device).unwrap();
    let v = DeviceVec::<Wide>::try_new(3, &s, mr.clone()).unwrap();
    assert!(v.ptr().is_aligned(1024));
    let mut w = block_on(DeviceVec::<Wide>::new(3, &s, mr)).unwrap();
    assert!(w.ptr().is_aligned(1024));
    block_on(w.resize(50)).unwrap();
    assert!(w.ptr().is_aligned(1024));
    assert!(w.slice(1..).unwrap().ptr().is_aligned(1024));
}

#[test]
fn containers_and_their_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mr = CudaResource::new(&device).unwrap();
    let mut v = DeviceVec::<f32>::try_new(4, &s, mr.clone()).unwrap();
    send(&DeviceVec::<f32>::new(4, &s, mr.clone()));
    send(&DeviceBuffer::new(4, &s, mr.clone()));
    send(&v.to_vec());
    send(&v.slice(..).unwrap());
    send(&v.resize(2));
    send(&v.slice_mut(..).unwrap());
    send(&crate::DeviceScalar::new(1u8, &s, mr.clone()));
    let x = block_on(crate::DeviceScalar::new(1u8, &s, mr)).unwrap();
    send(&x.value());
    send(&x);
}

#[test]
fn new_above_the_capacity_limit_is_too_large_at_once() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mr = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 1024);
    let e = block_on(DeviceBuffer::new(4096, &s, mr.clone())).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TooLarge {
                requested: 4096,
                maximum: 1024,
                ..
            }
        ),
        "{e:?}"
    );
    let e = block_on(DeviceVec::<u32>::new(1024, &s, mr)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TooLarge {
                requested: 4096,
                maximum: 1024,
                ..
            }
        ),
        "{e:?}"
    );
    // A resource whose own refusal is a plain out-of-memory error.
    let small = Device::host_with(HostConfig::default().capacity(1 << 16));
    let s = Stream::new(&small).unwrap();
    for mr in [
        crate::resource::into_shared(CudaResource::new(&small).unwrap()),
        crate::resource::into_shared(
            crate::PoolResource::new(CudaResource::new(&small).unwrap(), 1 << 12, Some(1 << 14))
                .unwrap(),
        ),
        // Refuses with a plain out-of-memory error, but knows its limit.
        crate::resource::into_shared(
            // SAFETY: it hands out no pointer: every answer is an error.
            unsafe {
                crate::CallbackResource::new(
                    CudaResource::new(&small).unwrap().properties(),
                    |bytes, s: &Stream| Err(Error::out_of_memory(bytes, Some(0), s.device().id())),
                    |_, _, _| {},
                )
            }
            .with_capacity_limit(1 << 10),
        ),
    ] {
        let limit = mr.capacity_limit();
        let direct = block_on(mr.allocate(1 << 20, &s)).unwrap_err();
        let e = block_on(DeviceBuffer::new(1 << 20, &s, mr.clone())).unwrap_err();
        assert_eq!(e, direct, "limit {limit:?}");
        let e = block_on(DeviceVec::<u8>::new(1 << 20, &s, mr)).unwrap_err();
        assert_eq!(e, direct, "limit {limit:?}");
    }
}

/// An element type aligned above the allocation alignment.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(512))]
struct Wide([u8; 512]);

#[test]
fn an_over_aligned_element_keeps_its_alignment_across_reallocation() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let mut v = DeviceVec::<Wide>::default();
    block_on(v.resize(4)).unwrap();
    assert!(
        v.ptr().is_aligned(512),
        "{:?} after resize of a default vector",
        v.ptr()
    );
    // A pool hands out 256-byte-aligned pieces; a 256-byte buffer first shifts the rest.
    let pool = crate::PoolResource::new(CudaResource::new(&d).unwrap(), 1 << 20, None).unwrap();
    let _shift = DeviceBuffer::try_new(256, &s, pool.clone()).unwrap();
    let wrapped = DeviceBuffer::try_with_alignment(512, 512, &s, pool).unwrap();
    let mut w = DeviceVec::<Wide>::from_buffer(wrapped).unwrap();
    for n in [3, 7, 2] {
        block_on(w.resize(n)).unwrap();
        block_on(w.shrink_to_fit()).unwrap();
        assert!(w.ptr().is_aligned(512), "{:?} after resize to {n}", w.ptr());
    }
}

#[test]
fn zero_sized_elements_are_errors_or_empty_never_a_panic() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let mr = CudaResource::new(&d).unwrap();
    let e = block_on(DeviceVec::<()>::from_host(vec![(); 3], &s, mr.clone())).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(DeviceVec::<()>::try_new(2, &s, mr).is_err());
    let v = DeviceVec::<()>::default();
    assert_eq!((v.len(), v.capacity(), v.is_empty()), (0, 0, true));
}
