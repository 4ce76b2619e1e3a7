use std::time::Duration;

use futures::executor::block_on;

use crate::test_support::{device, gate};
use crate::{CudaResource, DeviceScalar, Stream};

#[test]
fn set_value_is_stream_ordered_and_returns_without_waiting() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mut x = block_on(DeviceScalar::new(
        1u32,
        &s,
        CudaResource::new(&device).unwrap(),
    ))
    .unwrap();
    let open = gate(&s);
    // Returns while the stream is blocked: the staged value lives in memory the copy owns.
    x.set_value(2).unwrap();
    x.set_value(3).unwrap();
    let read = x.value();
    std::thread::sleep(Duration::from_millis(10));
    drop(open);
    assert_eq!(block_on(read).unwrap(), 3);
}

#[test]
fn handed_off_scalar_reads_the_old_owners_value() {
    let device = device();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let mut x = block_on(DeviceScalar::new(
        0i64,
        &a,
        CudaResource::new(&device).unwrap(),
    ))
    .unwrap();
    let open = gate(&a);
    x.set_value(-7).unwrap();
    x.set_stream(&b).unwrap();
    let read = x.value(); // on `b`, after `a`'s write
    std::thread::sleep(Duration::from_millis(10));
    drop(open);
    assert_eq!(block_on(read).unwrap(), -7);
    drop(x);
    block_on(b.synchronize()).unwrap();
    assert_eq!(device.host_controls().unwrap().allocated_bytes(), 0);
}
