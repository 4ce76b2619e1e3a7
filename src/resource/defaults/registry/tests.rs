//! The per-device registry: any resource is accepted, device agreement is checked, and each
//! device keeps its own current resource.

use std::sync::Arc;

use crate::test_support::device;
use crate::{
    current_device_resource_for, reset_current_device_resource_for,
    set_current_device_resource_for, CudaResource, DeviceBuffer, Error, LimitingAdaptor,
    MemoryResource, PoolResource, SharedResource, Stream,
};

#[test]
fn any_resource_is_accepted_by_value_by_arc_or_shared() {
    let d = device();
    let pool = PoolResource::new(CudaResource::new(&d).unwrap(), 0, None).unwrap();
    set_current_device_resource_for(&d, pool.clone()).unwrap();
    assert!(current_device_resource_for(&d).is_equal(&pool));

    let limited = Arc::new(LimitingAdaptor::new(
        CudaResource::new(&d).unwrap(),
        1 << 20,
    ));
    let previous = set_current_device_resource_for(&d, limited.clone()).unwrap();
    assert!(previous.is_equal(&pool));

    let shared: SharedResource = Arc::new(pool.clone());
    let previous = set_current_device_resource_for(&d, shared.clone()).unwrap();
    assert!(format!("{previous:?}").contains("LimitingAdaptor"));
    // A `SharedResource` is kept as it is, not wrapped again.
    assert!(Arc::ptr_eq(&current_device_resource_for(&d), &shared));
    reset_current_device_resource_for(&d);
}

#[test]
fn a_resource_of_another_device_is_refused_with_both_ids() {
    let (d0, d1) = (device(), device());
    let before = current_device_resource_for(&d1);
    let r = set_current_device_resource_for(&d1, CudaResource::new(&d0).unwrap());
    match r {
        Err(
            e @ Error::DeviceMismatch {
                expected, actual, ..
            },
        ) => {
            assert_eq!((expected, actual), (d1.id(), d0.id()));
            assert!(
                e.to_string()
                    .contains("in set_current_device_resource_for(device, mr)"),
                "{e}"
            );
        }
        other => panic!("expected a device mismatch, got {other:?}"),
    }
    assert!(Arc::ptr_eq(&current_device_resource_for(&d1), &before));
}

#[test]
fn two_devices_keep_their_own_current_resources() {
    let (d0, d1) = (device(), device());
    let p0 = PoolResource::new(CudaResource::new(&d0).unwrap(), 0, None).unwrap();
    let p1 = PoolResource::new(CudaResource::new(&d1).unwrap(), 0, None).unwrap();
    set_current_device_resource_for(&d0, p0.clone()).unwrap();
    set_current_device_resource_for(&d1, p1.clone()).unwrap();
    let (s0, s1) = (Stream::new(&d0).unwrap(), Stream::new(&d1).unwrap());
    futures::executor::block_on(async {
        let b0 = DeviceBuffer::with_current_resource(512, &s0).await.unwrap();
        let b1 = DeviceBuffer::with_current_resource(512, &s1).await.unwrap();
        assert!(b0.can_be_freed_by(&p0) && !b0.can_be_freed_by(&p1));
        assert!(b1.can_be_freed_by(&p1) && !b1.can_be_freed_by(&p0));
        assert_eq!((b0.device(), b1.device()), (&d0, &d1));
    });
    reset_current_device_resource_for(&d0);
    reset_current_device_resource_for(&d1);
}
