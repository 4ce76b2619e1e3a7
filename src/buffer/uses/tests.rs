use crate::{CudaResource, Device, DeviceBuffer, HostConfig, Stream};

/// The owner a shared borrow of a buffer lends out (what cudarc's `DeviceSlice::stream` returns
/// a reference into) stays valid while `&self` paths change the use state under its lock.
/// Before the owner moved out of the lock this was undefined behaviour under Stacked Borrows
/// (Miri: the lock's `&mut` invalidated the lent reference), though the values matched.
#[test]
fn the_owner_lent_by_a_shared_borrow_outlives_locked_changes() {
    let device = Device::host_with(HostConfig::default());
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let buf = DeviceBuffer::try_new(64, &a, CudaResource::new(&device).unwrap()).unwrap();
    let owner = buf.uses.owner();
    buf.record_read(&b).unwrap(); // locks the use state and adds a reader
    drop(buf.read_on(&b).unwrap());
    assert_eq!(owner, &a);
    assert_eq!(buf.uses.lock().reader_count(), 1);
}

/// A hand-off changes the owner (through `&mut`) and leaves the events for the new owner's
/// first use.
#[test]
fn a_hand_off_moves_the_owner_and_defers_its_waits() {
    let device = Device::host_with(HostConfig::default());
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let mut buf = DeviceBuffer::try_new(64, &a, CudaResource::new(&device).unwrap()).unwrap();
    buf.set_stream(&b).unwrap();
    assert_eq!(buf.uses.owner(), &b);
    assert_eq!(buf.uses.lock().state.handed.len(), 1);
    assert_eq!(buf.uses.lock().ready().unwrap(), &b);
    assert!(buf.uses.lock().state.handed.is_empty());
}
