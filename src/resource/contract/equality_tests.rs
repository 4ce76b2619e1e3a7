//! Resource equality (RMM's `is_equal`): handles of one resource are equal, distinct
//! resources are not, stateless resources of one kind and device are.

use std::sync::Arc;

use crate::{
    BinningResource, CudaAsyncResource, CudaAsyncViewResource, CudaResource, Device, HostConfig,
    HostResource, LimitingAdaptor, ManagedResource, MemoryResource, PoolResource, SharedResource,
    StatisticsAdaptor,
};

fn device() -> Device {
    Device::host_with(HostConfig::default())
}

#[test]
fn clones_of_a_resource_are_equal_and_distinct_resources_are_not() {
    let d = device();
    let pool = PoolResource::new(CudaResource::new(&d).unwrap(), 1 << 20, None).unwrap();
    let other = PoolResource::new(CudaResource::new(&d).unwrap(), 1 << 20, None).unwrap();
    assert!(pool.is_equal(&pool.clone()));
    assert!(!pool.is_equal(&other));

    let stats = StatisticsAdaptor::new(pool.clone());
    assert!(stats.is_equal(&stats.clone()));
    // An adaptor is not its upstream: memory it hands out goes back through it.
    assert!(!stats.is_equal(&pool));
    assert!(!pool.is_equal(&stats));

    let limited = LimitingAdaptor::new(pool.clone(), 1 << 20);
    assert!(!limited.is_equal(&LimitingAdaptor::new(pool.clone(), 1 << 20)));

    let binning = BinningResource::with_range(pool.clone(), 10, 12).unwrap();
    assert!(binning.is_equal(&binning.clone()));
}

#[test]
fn type_erasure_keeps_identity() {
    let d = device();
    let pool = PoolResource::new(CudaResource::new(&d).unwrap(), 1 << 20, None).unwrap();
    let shared: SharedResource = Arc::new(pool.clone());
    assert!(shared.is_equal(&pool));
    assert!(pool.is_equal(&*shared));
    assert!(shared.is_equal(&shared.clone()));
}

#[test]
fn stateless_resources_are_equal_by_kind_and_device() {
    let (a, b) = (device(), device());
    assert!(CudaResource::new(&a)
        .unwrap()
        .is_equal(&CudaResource::new(&a).unwrap()));
    assert!(!CudaResource::new(&a)
        .unwrap()
        .is_equal(&CudaResource::new(&b).unwrap()));
    assert!(!CudaResource::new(&a)
        .unwrap()
        .is_equal(&ManagedResource::new(&a).unwrap()));
    assert!(HostResource::new(&a)
        .unwrap()
        .is_equal(&HostResource::new(&a).unwrap()));
}

#[test]
fn a_view_is_equal_to_the_pool_it_views() {
    let d = device();
    let owner = CudaAsyncResource::new(&d).unwrap();
    let view = CudaAsyncViewResource::of(&owner);
    assert!(view.is_equal(&owner));
    assert!(owner.is_equal(&view));
    assert!(!owner.is_equal(&CudaAsyncResource::new(&d).unwrap()));
}
