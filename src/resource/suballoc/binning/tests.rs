//! `BinningResource` on the host backend.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::BinningResource;
use crate::test_support::{device as host, free};
use crate::{
    CallbackResource, CudaResource, Device, DevicePtr, Error, LimitingAdaptor, MemoryResource,
    PoolResource, Properties, Result, Stream,
};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// A resource that counts the requests it sees (sizes included) and serves them upstream.
#[derive(Debug, Clone)]
struct Counting {
    upstream: CudaResource,
    allocations: Arc<AtomicUsize>,
    zero_byte: Arc<AtomicUsize>,
    frees: Arc<AtomicUsize>,
}

impl Counting {
    fn new(device: &Device) -> Self {
        Counting {
            upstream: CudaResource::new(device).unwrap(),
            allocations: Arc::default(),
            zero_byte: Arc::default(),
            frees: Arc::default(),
        }
    }
}

// SAFETY: every pointer is one `upstream` returned for the same request, with its properties.
unsafe impl MemoryResource for Counting {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        self.allocations.fetch_add(1, Ordering::SeqCst);
        if bytes == 0 {
            self.zero_byte.fetch_add(1, Ordering::SeqCst);
        }
        self.upstream.try_allocate(bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        self.frees.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded from the caller.
        unsafe { self.upstream.deallocate(ptr, bytes, stream) }
    }

    fn properties(&self) -> Properties {
        self.upstream.properties()
    }
}

#[test]
fn the_smallest_bin_that_fits_serves_and_larger_requests_go_upstream() {
    let device = host();
    let s = Stream::new(&device).unwrap();
    let up = Counting::new(&device);
    let mr = BinningResource::with_range(up.clone(), 12, 14).unwrap();
    assert_eq!(mr.bin_sizes(), vec![4 * KIB, 8 * KIB, 16 * KIB]);
    // Each bin took one batch of 128 blocks from the upstream when it was made.
    assert_eq!(up.allocations.load(Ordering::SeqCst), 3);
    let controls = device.host_controls().unwrap();
    let before = controls.allocated_bytes();
    let a = mr.try_allocate(4 * KIB, &s).unwrap();
    let b = mr.try_allocate(4 * KIB + 1, &s).unwrap();
    let c = mr.try_allocate(16 * KIB, &s).unwrap();
    assert_eq!(
        up.allocations.load(Ordering::SeqCst),
        3,
        "bins served these"
    );
    assert_eq!(controls.allocated_bytes(), before);
    let d = mr.try_allocate(16 * KIB + 1, &s).unwrap();
    assert_eq!(
        up.allocations.load(Ordering::SeqCst),
        4,
        "the upstream served this"
    );
    for (p, n) in [
        (a, 4 * KIB),
        (b, 4 * KIB + 1),
        (c, 16 * KIB),
        (d, 16 * KIB + 1),
    ] {
        free(&mr, p, n, &s);
    }
    assert_eq!(
        up.frees.load(Ordering::SeqCst),
        1,
        "only the large one went upstream"
    );
}

/// RMM's `ExplicitBinMR` and `ZeroSizeAllocation`: a bin with a resource of its own serves its
/// sizes, and a 0-byte request goes to the smallest bin.
#[test]
fn an_explicit_bin_resource_serves_its_sizes_and_zero_bytes() {
    let device = host();
    let s = Stream::new(&device).unwrap();
    let up = Counting::new(&device);
    let bin = Counting::new(&device);
    let mut mr = BinningResource::new(up.clone());
    mr.add_bin(KIB, Some(Arc::new(bin.clone()))).unwrap();
    mr.add_bin(64 * KIB, None).unwrap();
    let p = mr.try_allocate(0, &s).unwrap();
    assert_eq!(
        bin.zero_byte.load(Ordering::SeqCst),
        1,
        "0 bytes use the smallest bin"
    );
    free(&mr, p, 0, &s);
    let q = mr.try_allocate(1000, &s).unwrap();
    assert_eq!(bin.allocations.load(Ordering::SeqCst), 2);
    free(&mr, q, 1000, &s);
    assert_eq!(bin.frees.load(Ordering::SeqCst), 2);
    let r = mr.try_allocate(2 * KIB, &s).unwrap(); // the 64 KiB fixed-size bin
    assert_eq!(bin.allocations.load(Ordering::SeqCst), 2);
    free(&mr, r, 2 * KIB, &s);
}

#[test]
fn bins_are_checked() {
    let device = host();
    let up = CudaResource::new(&device).unwrap();
    for (min, max) in [(20, 12), (12, 48)] {
        let r = BinningResource::with_range(up.clone(), min, max);
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{min}..={max}");
    }
    let mut mr = BinningResource::new(up.clone());
    assert!(matches!(
        mr.add_bin(0, None),
        Err(Error::InvalidArgument(_))
    ));
    mr.add_bin(KIB, None).unwrap();
    assert!(matches!(
        mr.add_bin(KIB, None),
        Err(Error::InvalidArgument(_))
    ));
    let other = CudaResource::new(&host()).unwrap();
    let r = mr.add_bin(2 * KIB, Some(Arc::new(other)));
    assert!(matches!(r, Err(Error::DeviceMismatch { .. })), "{r:?}");
    // A bin whose resource can never hold its largest request: awaited requests would wait
    // for ever.
    let small_pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 0, Some(256 * KIB)).unwrap();
    let r = mr.add_bin(MIB, Some(Arc::new(small_pool)));
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    // A bin of memory the host cannot touch, under an upstream (host-backend device memory)
    // that says the host can: the binning resource would hand it out as host-accessible.
    let device_only = Properties {
        host_accessible: false,
        ..up.properties()
    };
    let fail = move |bytes, s: &Stream| Err(Error::out_of_memory(bytes, None, s.device().id()));
    // SAFETY: it hands out no pointer: every answer is an error.
    let device_only = unsafe { CallbackResource::new(device_only, fail, |_, _, _| {}) };
    let r = mr.add_bin(2 * KIB, Some(Arc::new(device_only)));
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("host-accessible: false")),
        "{r:?}"
    );
    let _shared = mr.clone();
    assert!(matches!(
        mr.add_bin(4 * KIB, None),
        Err(Error::InvalidArgument(_))
    ));
}

/// Frees are routed by size, so a bin added while memory is out would get frees of memory it
/// never gave (here a `HostResource` freeing the upstream's pointer): once anything is
/// allocated, bins are fixed.
#[test]
fn no_bin_is_added_after_an_allocation() {
    let device = host();
    let s = Stream::new(&device).unwrap();
    let mut mr = BinningResource::new(CudaResource::new(&device).unwrap());
    mr.add_bin(4 * KIB, None).unwrap();
    let p = mr.try_allocate(5000, &s).unwrap(); // above every bin: the upstream's
    let host_bin = Arc::new(crate::HostResource::new(&device).unwrap());
    let r = mr.add_bin(8 * KIB, Some(host_bin));
    assert!(
        matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("first allocation")),
        "{r:?}"
    );
    assert_eq!(mr.bin_sizes(), [4 * KIB]);
    free(&mr, p, 5000, &s); // back to the upstream, which gave it
    s.synchronize_blocking().unwrap();
    assert!(device.take_deferred_error().is_none());
    assert_eq!(
        device.host_controls().unwrap().allocated_bytes(),
        128 * 4 * KIB
    );
    // Freed again, nothing is out, yet the bins stay as they were: allocated is for ever.
    assert!(mr.add_bin(8 * KIB, None).is_err());
}

/// An awaited request waits for memory wherever its size routes it: here a bin whose upstream
/// budget is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awaited_request_waits_for_its_bin() {
    let device = host();
    let s = Stream::new(&device).unwrap();
    // Room for one batch of the 4 KiB bin (128 blocks) and nothing more.
    let up = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 128 * 4 * KIB);
    let mr = BinningResource::with_range(up, 12, 12).unwrap();
    let held: Vec<_> = (0..128)
        .map(|_| mr.try_allocate(4 * KIB, &s).unwrap())
        .collect();
    assert!(mr.try_allocate(100, &s).unwrap_err().is_out_of_memory());
    let waiter = {
        let (mr, s) = (mr.clone(), s.clone());
        tokio::spawn(async move { mr.allocate(100, &s).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished(), "it must wait, not fail");
    free(&mr, held[5], 4 * KIB, &s);
    let p = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the bin's free")
        .unwrap()
        .unwrap();
    assert_eq!(p, held[5]);
    free(&mr, p, 100, &s);
    for (i, &q) in held.iter().enumerate() {
        if i != 5 {
            free(&mr, q, 4 * KIB, &s);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Random sizes across the bins and the upstream (a pool), on two streams: no overlap,
    /// alignment, and everything back in the pool at the end.
    #[test]
    fn random_operations_never_overlap(
        ops in prop::collection::vec((0..=3 * MIB, any::<usize>(), any::<bool>(), 0..2usize), 1..120)
    ) {
        let device = host();
        let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
        let mr = BinningResource::with_range(pool.clone(), 10, 20).unwrap();
        let streams = [Stream::new(&device).unwrap(), Stream::new(&device).unwrap()];
        let mut live: Vec<(DevicePtr, usize)> = Vec::new();
        for (size, pick, alloc, stream) in ops {
            if alloc || live.is_empty() {
                let p = mr.try_allocate(size, &streams[stream]).unwrap();
                if size == 0 {
                    continue;
                }
                prop_assert!(p.is_aligned(256));
                for &(q, n) in &live {
                    let disjoint = p.addr() + size as u64 <= q.addr() || q.addr() + n as u64 <= p.addr();
                    prop_assert!(disjoint, "{p:?}+{size} overlaps {q:?}+{n}");
                }
                live.push((p, size));
            } else {
                let (p, n) = live.swap_remove(pick % live.len());
                free(&mr, p, n, &streams[stream]);
            }
        }
        for (p, n) in live {
            free(&mr, p, n, &streams[0]);
        }
        prop_assert_eq!(pool.statistics().live_allocations, 11, "one batch per bin stays in the pool");
    }
}

/// Over an upstream that makes nobody wait (plain device memory on a full device), a request
/// routed to the upstream fails at once instead of waiting for a wake-up that the upstream
/// never sends; a request routed to a bin waits for the bin's blocks and a free wakes it.
#[test]
fn over_device_memory_upstream_requests_fail_and_bin_requests_wait() {
    let device = Device::host_with(crate::HostConfig::default().capacity(8 * MIB));
    let s = Stream::new(&device).unwrap();
    let mr = BinningResource::with_range(CudaResource::new(&device).unwrap(), 12, 12).unwrap();
    let mut large = Vec::new();
    while let Ok(p) = mr.try_allocate(MIB, &s) {
        large.push(p);
    }
    let r = futures::executor::block_on(mr.allocate(MIB, &s).timeout(Duration::from_secs(20)));
    assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");

    let mut small = Vec::new();
    while let Ok(p) = mr.try_allocate(4 * KIB, &s) {
        small.push(p);
    }
    assert!(!small.is_empty());
    let waiter = {
        let (mr, s) = (mr.clone(), s.clone());
        std::thread::spawn(move || {
            futures::executor::block_on(mr.allocate(4 * KIB, &s).timeout(Duration::from_secs(20)))
        })
    };
    while !mr.availability().unwrap().has_waiters() {
        assert!(!waiter.is_finished(), "the bin request did not wait");
        std::thread::sleep(Duration::from_millis(1));
    }
    free(&mr, small.pop().unwrap(), 4 * KIB, &s);
    let p = waiter
        .join()
        .unwrap()
        .expect("a bin free wakes the bin's waiter");
    small.push(p);
    for p in small {
        free(&mr, p, 4 * KIB, &s);
    }
    for p in large {
        free(&mr, p, MIB, &s);
    }
    s.synchronize_blocking().unwrap();
}

/// A bin's out-of-memory error reaches the caller with the bin's details.
#[test]
fn a_bins_out_of_memory_keeps_its_details() {
    let device = Device::host_with(crate::HostConfig::default().capacity(40 * MIB));
    let s = Stream::new(&device).unwrap();
    // One bin of 256 KiB blocks, 128 per chunk: one 32 MiB chunk fits, a second does not.
    let mr = BinningResource::with_range(CudaResource::new(&device).unwrap(), 18, 18).unwrap();
    let held: Vec<DevicePtr> = (0..128)
        .map(|_| mr.try_allocate(256 * KIB, &s).unwrap())
        .collect();
    let err = mr.try_allocate(200 * KIB, &s).unwrap_err();
    let Error::OutOfMemory {
        details: Some(d), ..
    } = &err
    else {
        panic!("no details: {err:?}");
    };
    assert_eq!(d.reserved_bytes, Some(32 * MIB));
    assert_eq!(d.free_bytes, Some(0));
    for p in held {
        free(&mr, p, 256 * KIB, &s);
    }
}

/// The bins' segments take the place of the parts of the upstream's live blocks they cover;
/// what they leave stays live, the upstream's segment is cut around them, a bin segment in no
/// live block is added as it is, and no byte is counted twice.
#[test]
fn bin_segments_nest_into_the_upstreams_live_blocks() {
    use crate::{Block, BlockState, MemorySnapshot, Segment, StreamId};
    let at = DevicePtr::from_raw;
    let block = |a: u64, n: usize, state| Block::new(at(a), n, state);
    let mut up = MemorySnapshot::new(host().id(), "pool");
    let mut seg = Segment::new(at(0x10000), 0x10000);
    seg.stream = Some(StreamId(7));
    seg.blocks = vec![
        block(0x10000, 0x1000, BlockState::Free),
        block(0x11000, 0x4000, BlockState::Live).on_stream(StreamId(1)),
        block(0x15000, 0xb000, BlockState::Free),
    ];
    up.segments.push(seg);
    up.capacity = Some(1 << 20);
    let bin = |a: u64, n: usize| {
        let mut s = Segment::new(at(a), n);
        s.coalesces = false;
        s.blocks = vec![block(a, n, BlockState::Live)];
        s
    };
    let bins = vec![
        bin(0x13800, 0x1000),
        bin(0x40000, 0x1000),
        bin(0x11000, 0x2000),
    ];
    let snap = super::snapshot::nest(host().id(), Some(up), bins);
    type Layout = (u64, usize, bool, Vec<(u64, usize, BlockState)>);
    let layout: Vec<Layout> = snap
        .segments
        .iter()
        .map(|s| {
            let blocks = s
                .blocks
                .iter()
                .map(|b| (b.address.addr(), b.bytes, b.state))
                .collect();
            (s.address.addr(), s.bytes, s.coalesces, blocks)
        })
        .collect();
    use BlockState::{Free, Live};
    assert_eq!(
        layout,
        vec![
            (0x10000, 0x1000, true, vec![(0x10000, 0x1000, Free)]),
            (0x11000, 0x2000, false, vec![(0x11000, 0x2000, Live)]),
            (0x13000, 0x800, true, vec![(0x13000, 0x800, Live)]),
            (0x13800, 0x1000, false, vec![(0x13800, 0x1000, Live)]),
            (
                0x14800,
                0xb800,
                true,
                vec![(0x14800, 0x800, Live), (0x15000, 0xb000, Free)]
            ),
            (0x40000, 0x1000, false, vec![(0x40000, 0x1000, Live)]),
        ]
    );
    assert_eq!(snap.reserved_bytes(), 0x11000);
    assert_eq!(
        (snap.resource.as_str(), snap.capacity),
        ("binning", Some(1 << 20))
    );
    // The upstream's pieces keep its stream, the live remainders theirs.
    assert!(snap
        .segments
        .iter()
        .filter(|s| s.coalesces)
        .all(|s| s.stream == Some(StreamId(7))));
    assert_eq!(snap.segments[2].blocks[0].stream, Some(StreamId(1)));
}

/// Binning over an upstream without a snapshot shows the bins alone; with no bins either, it
/// has none.
#[test]
fn binning_over_plain_memory_shows_its_bins() {
    let device = host();
    let up = CudaResource::new(&device).unwrap();
    assert!(BinningResource::new(up.clone()).snapshot().is_none());
    let mr = BinningResource::with_range(up, 10, 11).unwrap();
    let snap = mr.snapshot().unwrap();
    assert_eq!(snap.segments.len(), 2);
    assert_eq!(snap.reserved_bytes(), 128 * (1 + 2) * KIB);
    assert!(snap.segments.iter().all(|s| !s.coalesces));
    assert_eq!(mr.fragmentation().unwrap(), snap.fragmentation());
}

/// A bin served by the upstream itself (`add_bin(size, Some(upstream))`) is the upstream's
/// memory: its snapshot is the upstream's, so the binning snapshot is the upstream's once.
#[test]
fn a_bin_served_by_the_upstream_counts_each_byte_once() {
    let device = host();
    let s = Stream::new(&device).unwrap();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 4 * MIB, None).unwrap();
    let mut mr = BinningResource::new(pool.clone());
    mr.add_bin(KIB, Some(Arc::new(pool.clone()))).unwrap();
    let p = mr.try_allocate(1000, &s).unwrap();
    let snap = mr.snapshot().unwrap();
    let up = pool.snapshot().unwrap();
    assert_eq!((snap.reserved_bytes(), snap.live_bytes()), (4 * MIB, KIB));
    assert_eq!(snap.segments.len(), up.segments.len());
    assert_eq!(mr.fragmentation().unwrap(), up.fragmentation());
    // SAFETY: allocated above with this size.
    unsafe { mr.deallocate(p, 1000, &s) };
}

/// A bin whose segments overlap the upstream's without lying inside one of its live blocks
/// (a bin over a view of the upstream that is not `is_equal` to it: the same memory seen
/// twice) adds nothing: those bytes are the upstream's, counted there.
#[test]
fn bin_segments_overlapping_the_upstream_outside_its_live_blocks_are_dropped() {
    use crate::{Block, BlockState, MemorySnapshot, Segment};
    let at = DevicePtr::from_raw;
    let mut up = MemorySnapshot::new(host().id(), "pool");
    let mut seg = Segment::new(at(0x10000), 0x10000);
    seg.blocks = vec![
        Block::new(at(0x10000), 0x1000, BlockState::Live),
        Block::new(at(0x11000), 0xf000, BlockState::Free),
    ];
    up.segments.push(seg.clone());
    let mut part = Segment::new(at(0x10800), 0x1000); // straddles the live block's end
    part.blocks = vec![Block::new(at(0x10800), 0x1000, BlockState::Live)];
    let mut apart = Segment::new(at(0x40000), 0x1000); // outside: a bin of its own
    apart.blocks = vec![Block::new(at(0x40000), 0x1000, BlockState::Free)];
    let snap = super::snapshot::nest(host().id(), Some(up), vec![seg, part, apart]);
    let layout: Vec<(u64, usize)> = snap
        .segments
        .iter()
        .map(|s| (s.address.addr(), s.bytes))
        .collect();
    assert_eq!(layout, vec![(0x10000, 0x10000), (0x40000, 0x1000)]);
    let free: usize = snap.segments.iter().map(|s| s.free_bytes()).sum();
    assert_eq!((snap.live_bytes(), free), (0x1000, 0xf000 + 0x1000));
}

/// Two bins served by one resource of yours (a pool over the upstream) show its chunk once.
#[test]
fn bins_sharing_a_resource_show_it_once() {
    let device = host();
    let s = Stream::new(&device).unwrap();
    let up = PoolResource::new(CudaResource::new(&device).unwrap(), 4 * MIB, None).unwrap();
    let bins = PoolResource::new(up.clone(), MIB, None).unwrap();
    let mut mr = BinningResource::new(up.clone());
    mr.add_bin(KIB, Some(Arc::new(bins.clone()))).unwrap();
    mr.add_bin(2 * KIB, Some(Arc::new(bins.clone()))).unwrap();
    let p = mr.try_allocate(1500, &s).unwrap();
    let snap = mr.snapshot().unwrap();
    assert_eq!((snap.reserved_bytes(), snap.live_bytes()), (4 * MIB, 1536));
    // SAFETY: allocated above with this size.
    unsafe { mr.deallocate(p, 1500, &s) };
}
