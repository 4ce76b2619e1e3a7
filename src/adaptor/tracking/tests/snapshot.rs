//! Snapshots: the tracked request size and site on the upstream's live blocks, or a
//! snapshot of its own over an upstream that keeps none.

use std::collections::BTreeMap;

use super::*;
use crate::resource::{Block, BlockState, Properties, Segment};
use crate::MemorySnapshot;

const SLOTS: u64 = 8;

/// An upstream that carves 4 KiB blocks out of one segment of its own and answers
/// `snapshot`.
#[derive(Debug)]
struct Carving {
    upstream: CudaResource,
    stream: Stream,
    /// The segment: `SLOTS` blocks of 4 KiB from `upstream`, freed on drop.
    base: u64,
    live: Mutex<BTreeMap<u64, StreamId>>,
}

impl Carving {
    fn new(device: &Device) -> Self {
        let upstream = CudaResource::new(device).unwrap();
        let stream = Stream::new(device).unwrap();
        let base = upstream
            .try_allocate((SLOTS * 4096) as usize, &stream)
            .unwrap()
            .addr();
        Carving {
            upstream,
            stream,
            base,
            live: Mutex::default(),
        }
    }
}

impl Drop for Carving {
    fn drop(&mut self) {
        let base = DevicePtr::from_raw(self.base);
        // SAFETY: the segment came from `upstream` with this size on `stream`; nothing
        // touched it, and its blocks die with the resource.
        unsafe {
            self.upstream
                .deallocate(base, (SLOTS * 4096) as usize, &self.stream)
        };
    }
}

// SAFETY: each pointer is a 4 KiB block (256-aligned) of the segment `upstream` gave it,
// handed out once until it is freed, with `upstream`'s properties.
unsafe impl MemoryResource for Carving {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        assert!(bytes <= 4096);
        let mut live = self.live.lock();
        let slot = (0..SLOTS)
            .map(|k| self.base + k * 4096)
            .find(|a| !live.contains_key(a))
            .expect("a free slot");
        live.insert(slot, stream.id());
        Ok(DevicePtr::from_raw(slot))
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, _bytes: usize, _stream: &Stream) {
        self.live.lock().remove(&ptr.addr());
    }

    fn properties(&self) -> Properties {
        self.upstream.properties()
    }

    fn snapshot(&self) -> Option<MemorySnapshot> {
        let mut snap = MemorySnapshot::new(self.properties().device, "carving");
        let mut seg = Segment::new(DevicePtr::from_raw(self.base), (SLOTS * 4096) as usize);
        let live = self.live.lock();
        for k in 0..SLOTS {
            let a = self.base + k * 4096;
            let block = match live.get(&a) {
                Some(&s) => Block::new(DevicePtr::from_raw(a), 4096, BlockState::Live).on_stream(s),
                None => Block::new(DevicePtr::from_raw(a), 4096, BlockState::Free),
            };
            seg.blocks.push(block);
        }
        snap.segments.push(seg);
        Some(snap)
    }
}

fn live_blocks(snap: &MemorySnapshot) -> Vec<&Block> {
    snap.blocks()
        .map(|(_, b)| b)
        .filter(|b| b.state == BlockState::Live)
        .collect()
}

#[test]
fn live_blocks_of_the_upstream_get_the_tracked_size_and_site() {
    let (device, s) = host();
    let mr = TrackingAdaptor::with_backtraces(Carving::new(&device));
    let a = mr.try_allocate(1000, &s).unwrap();
    let b = mr.try_allocate(4096, &s).unwrap();
    // Allocated behind the adaptor's back: live upstream, but nothing to add.
    let c = mr.upstream().try_allocate(100, &s).unwrap();
    let snap = mr.snapshot().expect("the upstream's snapshot");
    assert_eq!(snap.resource, "carving");
    assert_eq!(snap.reserved_bytes(), (SLOTS * 4096) as usize);
    let live = live_blocks(&snap);
    let got: Vec<_> = live
        .iter()
        .map(|b| (b.address, b.bytes, b.requested, b.site.is_some()))
        .collect();
    assert_eq!(
        got,
        [
            (a, 4096, Some(1000), true),
            (b, 4096, Some(4096), true),
            (c, 4096, None, false),
        ]
    );
    let site = live[0].site.as_ref().unwrap().to_string();
    assert!(
        site.contains("live_blocks_of_the_upstream_get_the_tracked_size_and_site")
            || !crate::test_support::backtraces_have_symbols(),
        "{site}"
    );
    // Free blocks are the upstream's, untouched.
    assert!(snap
        .blocks()
        .filter(|(_, b)| b.state == BlockState::Free)
        .all(|(_, b)| b.requested.is_none() && b.site.is_none()));
    free(&mr, a, 1000, &s);
    free(&mr, b, 4096, &s);
    free(mr.upstream(), c, 100, &s);
    assert!(live_blocks(&mr.snapshot().unwrap()).is_empty());
}

#[test]
fn over_an_upstream_without_snapshots_each_allocation_is_a_segment() {
    let (device, s) = host();
    let [t] = test_support::streams(&device);
    let cuda = CudaResource::new(&device).unwrap();
    assert!(cuda.snapshot().is_none());
    let mr = TrackingAdaptor::with_backtraces(cuda);
    assert_eq!(mr.snapshot().map(|s| s.segments.len()), Some(0));
    let a = mr.try_allocate(3 * KIB, &s).unwrap();
    let b = mr.try_allocate(MIB, &t).unwrap();
    let snap = mr.snapshot().expect("one built from the records");
    assert_eq!(
        (snap.resource.as_str(), snap.device),
        ("tracking", device.id())
    );
    let mut expected = vec![(a, 3 * KIB, s.id()), (b, MIB, t.id())];
    expected.sort_unstable_by_key(|e| e.0);
    let got: Vec<_> = snap
        .segments
        .iter()
        .map(|seg| {
            assert_eq!(seg.blocks.len(), 1);
            let block = &seg.blocks[0];
            assert_eq!((block.address, block.bytes), (seg.address, seg.bytes));
            assert_eq!(block.state, BlockState::Live);
            assert_eq!(block.requested, Some(block.bytes));
            assert!(block.site.is_some());
            (block.address, block.bytes, block.stream.unwrap())
        })
        .collect();
    assert_eq!(got, expected);
    assert_eq!(snap.live_bytes(), 3 * KIB + MIB);
    let f = mr.fragmentation().expect("figures of that snapshot");
    assert_eq!(f.largest_free_block, 0);
    free(&mr, a, 3 * KIB, &s);
    free(&mr, b, MIB, &t);
    assert!(mr.snapshot().unwrap().segments.is_empty());
}

#[test]
fn without_backtraces_snapshots_leave_the_fast_path_as_it_was() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory
    // there.
    let (up, _) = unsafe { fake(&device) };
    let mr = TrackingAdaptor::new(up);
    let ptrs: Vec<_> = (0..100)
        .map(|_| mr.try_allocate(KIB, &s).unwrap())
        .collect();
    let snap = mr.snapshot().unwrap();
    assert_eq!(snap.segments.len(), 100);
    assert!(snap
        .blocks()
        .all(|(_, b)| b.site.is_none() && b.requested == Some(KIB)));
    // Taking it moved no record out of the lock-free table, and the records still count.
    assert_eq!(mr.inner.overflow_len(), 0);
    assert_eq!(
        (mr.outstanding_count(), mr.allocated_bytes()),
        (100, 100 * KIB)
    );
    for p in ptrs {
        free(&mr, p, KIB, &s);
    }
    assert_eq!(mr.issue_count(), 0);
    assert_eq!(mr.inner.overflow_len(), 0);
}
