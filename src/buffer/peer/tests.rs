//! Peer copies on one device (the two-device cases are the shared `multi_device_suite`).

use futures::executor::block_on;

use crate::test_support::device;
use crate::{CudaResource, DeviceBuffer, Error, Stream};

#[test]
fn a_peer_copy_within_one_device_is_an_ordinary_copy() {
    let d = device();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let mr = CudaResource::new(&d).unwrap();
    let mut src = DeviceBuffer::try_new(8, &a, mr.clone()).unwrap();
    a.enqueue_delay(std::time::Duration::from_millis(50))
        .unwrap();
    src.fill(4).unwrap();
    let mut dst = DeviceBuffer::try_new(8, &b, mr.clone()).unwrap();
    dst.copy_from_peer(&src).unwrap();
    assert_eq!(
        block_on(dst.copy_to_host(vec![0u8; 8])).unwrap(),
        vec![4; 8]
    );
    let copy = block_on(src.try_clone_to(&b, mr.clone())).unwrap();
    assert_eq!(
        block_on(copy.copy_to_host(vec![0u8; 8])).unwrap(),
        vec![4; 8]
    );

    let empty = DeviceBuffer::try_new(0, &a, mr.clone()).unwrap();
    dst.copy_from_peer(&empty).unwrap();
    let mut short = DeviceBuffer::try_new(4, &b, mr).unwrap();
    match short.copy_from_peer(&src) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("8 bytes") && m.contains("only 4")),
        other => panic!("{other:?}"),
    }
}
