//! The arena wrapper on the host backend: lazy cross-stream events, pending frees, borrowing,
//! per-thread arenas, dumps, release to the upstream, and a model-based test of the whole
//! resource across several streams.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex};

use proptest::prelude::*;

use super::*;
use crate::device::Device;
use crate::device::HostConfig;
use crate::resource::inspect::BlockState;
use crate::resource::leaf::cuda::CudaResource;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn device() -> Device {
    Device::host_with(HostConfig::default())
}

fn arena(device: &Device, size: usize) -> ArenaResource<CudaResource> {
    ArenaResource::new(CudaResource::new(device).unwrap(), Some(size)).unwrap()
}

fn free(mr: &impl MemoryResource, p: DevicePtr, bytes: usize, s: &Stream) {
    // SAFETY: every caller frees what it allocated from `mr` with the same size, unused.
    unsafe { mr.deallocate(p, bytes, s) }
}

/// `free + pending + live == arena size`, always.
fn assert_accounted(mr: &ArenaResource<CudaResource>) -> ArenaStatistics {
    let s = mr.statistics();
    assert_eq!(
        s.free_bytes + s.pending_bytes + s.live_bytes,
        s.reserved_bytes,
        "{s:?}"
    );
    s
}

#[test]
fn the_arena_size_is_rounded_down_to_pages_and_at_least_a_superblock() {
    let d = device();
    assert_eq!(arena(&d, MIB + 65 * KIB).arena_size(), MIB + 64 * KIB);
    let err = ArenaResource::new(CudaResource::new(&d).unwrap(), Some(MIB - 1)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

/// Failed before growth: the default took half of the free memory (8 GiB of the 16 GiB
/// emulated) at construction.
#[test]
fn the_default_arena_takes_nothing_at_construction_and_grows_on_demand() {
    let d = device();
    let controls = d.host_controls().unwrap();
    let s = Stream::new(&d).unwrap();
    let mr = ArenaResource::new(CudaResource::new(&d).unwrap(), None).unwrap();
    assert_eq!((mr.arena_size(), controls.allocated_bytes()), (0, 0));
    // It may grow up to the device's memory.
    assert_eq!(mr.maximum_size(), Some(16 << 30));
    assert_eq!(mr.capacity_limit(), Some(16 << 30));
    let small = mr.try_allocate(1000, &s).unwrap();
    // One growth step (two superblocks).
    assert_eq!(mr.arena_size(), 2 * MIB);
    assert_eq!(controls.allocated_bytes(), 2 * MIB);
    let large = mr.try_allocate(8 * MIB + 1, &s).unwrap();
    // A request above the step takes an extent of its own size, in whole pages.
    assert_eq!(mr.arena_size(), 2 * MIB + 8 * MIB + 64 * KIB);
    assert_accounted(&mr);
    free(&mr, small, 1000, &s);
    free(&mr, large, 8 * MIB + 1, &s);
    assert_eq!(mr.trim(), 10 * MIB + 64 * KIB);
    assert_eq!(mr.arena_size(), 0);
    s.synchronize_blocking().unwrap();
    d.synchronize_blocking().unwrap();
    assert_eq!(controls.allocated_bytes(), 0);
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn a_growing_arena_gives_free_extents_back_before_it_grows() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let mr = ArenaResource::new(CudaResource::new(&d).unwrap(), None).unwrap();
    let p = mr.try_allocate(8 * MIB, &s).unwrap();
    free(&mr, p, 8 * MIB, &s);
    // The free 8 MiB extent cannot hold 16 MiB: it goes back before the arena grows.
    let q = mr.try_allocate(16 * MIB, &s).unwrap();
    assert_eq!(mr.arena_size(), 16 * MIB);
    free(&mr, q, 16 * MIB, &s);
    // A smaller request reuses the free extent without growing.
    let r = mr.try_allocate(4 * MIB, &s).unwrap();
    assert_eq!((r, mr.arena_size()), (q, 16 * MIB));
    free(&mr, r, 4 * MIB, &s);
    assert_accounted(&mr);
}

#[test]
fn a_growing_arena_stops_at_its_maximum() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let config = ArenaConfig::default().maximum_size(8 * MIB);
    let mr = ArenaResource::with_config(CudaResource::new(&d).unwrap(), config).unwrap();
    assert_eq!(mr.capacity_limit(), Some(8 * MIB));
    let err = mr.try_allocate(8 * MIB + 1, &s).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let p = mr.try_allocate(7 * MIB, &s).unwrap();
    let q = mr.try_allocate(MIB, &s).unwrap();
    assert_eq!(mr.arena_size(), 8 * MIB);
    let err = mr.try_allocate(1000, &s).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    free(&mr, p, 7 * MIB, &s);
    free(&mr, q, MIB, &s);
    assert_accounted(&mr);
}

#[test]
fn a_growth_step_below_a_superblock_is_refused() {
    let d = device();
    for step in [0, MIB / 2, MIB + 1] {
        let config = ArenaConfig::default().growth_step(step);
        let err = ArenaResource::with_config(CudaResource::new(&d).unwrap(), config).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{step}: {err}");
    }
}

/// An extent grown on one stream and freed there reaches another stream only after that one
/// waits for the first: growth happens on the requesting stream.
#[test]
fn memory_grown_on_one_stream_is_ordered_before_another_stream_uses_it() {
    let d = device();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let mr = ArenaResource::new(CudaResource::new(&d).unwrap(), None).unwrap();
    a.enqueue_delay(std::time::Duration::from_millis(200))
        .unwrap();
    let p = mr.try_allocate(4 * MIB, &a).unwrap();
    free(&mr, p, 4 * MIB, &a);
    let q = mr.try_allocate(4 * MIB, &b).unwrap();
    assert_eq!(q, p);
    let stats = mr.statistics();
    assert_eq!((stats.events_recorded, stats.stream_waits), (1, 1));
    free(&mr, q, 4 * MIB, &b);
}

/// Dropping a growing arena gives every extent back, ordered after the frees, and a device
/// synchronize after the drop sees them back: the arena's own stream, which gives them back
/// and which no one else holds, is busy when the arena drops (its release queued behind that
/// work used to come after the synchronize, which reaches only the streams still held).
#[test]
fn dropping_a_growing_arena_gives_every_extent_back() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    {
        let mr = ArenaResource::new(CudaResource::new(&d).unwrap(), None).unwrap();
        let ptrs: Vec<(DevicePtr, usize)> = [100, 3 * MIB, 70 * KIB, 20 * MIB]
            .into_iter()
            .map(|n| (mr.try_allocate(n, &s).unwrap(), n))
            .collect();
        assert!(mr.arena_size() >= 23 * MIB);
        for (p, n) in ptrs {
            free(&mr, p, n, &s);
        }
        mr.inner
            .home
            .enqueue_delay(std::time::Duration::from_millis(50))
            .unwrap();
    }
    d.synchronize_blocking().unwrap();
    assert_eq!(d.host_controls().unwrap().allocated_bytes(), 0);
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn an_upstream_failure_is_returned() {
    let d = Device::host_with(HostConfig::default().capacity(4 * MIB));
    let err = ArenaResource::new(CudaResource::new(&d).unwrap(), Some(8 * MIB)).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
}

#[test]
fn same_stream_reuse_records_no_event() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let mr = arena(&d, 16 * MIB);
    for i in 0..1000 {
        let bytes = 1 + (i * 7919) % MIB;
        let p = mr.try_allocate(bytes, &s).unwrap();
        free(&mr, p, bytes, &s);
    }
    let big = mr.try_allocate(4 * MIB, &s).unwrap();
    free(&mr, big, 4 * MIB, &s);
    let again = mr.try_allocate(4 * MIB, &s).unwrap();
    assert_eq!(
        again, big,
        "a large block freed on a stream is reused by it at once"
    );
    free(&mr, again, 4 * MIB, &s);
    let stats = assert_accounted(&mr);
    assert_eq!((stats.events_recorded, stats.stream_waits), (0, 0));
    assert_eq!(stats.stream_arenas, 1);
}

#[test]
fn memory_crossing_streams_waits_on_one_event_for_many_frees() {
    let d = device();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let mr = arena(&d, 4 * MIB);
    // A fills the arena with small blocks and frees them all.
    let blocks: Vec<DevicePtr> = (0..64)
        .map(|_| mr.try_allocate(64 * KIB, &a).unwrap())
        .collect();
    assert_eq!(mr.statistics().superblocks, 4);
    for &p in &blocks {
        free(&mr, p, 64 * KIB, &a);
    }
    a.enqueue_delay(std::time::Duration::from_millis(50))
        .unwrap();
    // B needs superblocks: they go back to the global arena and come to B after one event on
    // A, recorded now and reused for every superblock.
    let taken: Vec<DevicePtr> = (0..4).map(|_| mr.try_allocate(MIB, &b).unwrap()).collect();
    let stats = assert_accounted(&mr);
    assert_eq!(stats.events_recorded, 1, "{stats:?}");
    assert_eq!(
        stats.stream_waits, 1,
        "B waits once: the event covers every free"
    );
    for p in taken {
        free(&mr, p, MIB, &b);
    }
}

#[test]
fn frees_on_another_stream_are_pending_until_the_arena_waits() {
    let d = device();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let mr = arena(&d, MIB);
    let p = mr.try_allocate(MIB, &a).unwrap();
    free(&mr, p, MIB, &b);
    let stats = assert_accounted(&mr);
    assert_eq!((stats.pending_bytes, stats.free_bytes), (MIB, 0));
    assert_eq!(stats.events_recorded, 0, "a free records nothing");
    // A takes it back after waiting for B.
    let q = mr.try_allocate(MIB, &a).unwrap();
    assert_eq!(q, p);
    let stats = assert_accounted(&mr);
    assert_eq!((stats.pending_bytes, stats.events_recorded), (0, 1));
    free(&mr, q, MIB, &a);
}

#[test]
fn a_block_borrowed_from_another_arena_is_freed_there() {
    let d = device();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let mr = arena(&d, MIB);
    let pin = mr.try_allocate(256, &a).unwrap();
    // The only superblock is A's and not wholly free: B borrows from it.
    let borrowed = mr.try_allocate(512 * KIB, &b).unwrap();
    assert_eq!(borrowed, pin.offset(256));
    let stats = assert_accounted(&mr);
    assert_eq!((stats.stream_arenas, stats.superblocks), (2, 1));
    assert_eq!(stats.events_recorded, 1, "B waited for A");
    // Freed on B, it is pending in A's arena; A gets it back after a wait.
    free(&mr, borrowed, 512 * KIB, &b);
    assert_eq!(assert_accounted(&mr).pending_bytes, 512 * KIB);
    let again = mr.try_allocate(MIB - 256, &a).unwrap();
    assert_eq!(again, borrowed);
    free(&mr, again, MIB - 256, &a);
    free(&mr, pin, 256, &a);
    assert_eq!(assert_accounted(&mr).free_bytes, MIB);
}

#[test]
fn exhaustion_returns_free_superblocks_and_retires_empty_arenas() {
    let d = device();
    let mr = arena(&d, 4 * MIB);
    {
        let streams: Vec<Stream> = (0..4).map(|_| Stream::new(&d).unwrap()).collect();
        for s in &streams {
            let p = mr.try_allocate(32 * KIB, s).unwrap();
            free(&mr, p, 32 * KIB, s);
        }
        assert_eq!(mr.statistics().stream_arenas, 4);
    }
    // The streams are gone; their superblocks come back for a request of the whole arena.
    let s = Stream::new(&d).unwrap();
    let p = mr.try_allocate(4 * MIB, &s).unwrap();
    let stats = assert_accounted(&mr);
    assert_eq!(
        (stats.stream_arenas, stats.superblocks),
        (0, 0),
        "{stats:?}"
    );
    let registry = mr.inner.registry.read();
    assert_eq!(registry.vacant.len(), 4);
    assert!(registry.arenas.is_empty());
    drop(registry);
    free(&mr, p, 4 * MIB, &s);
    // A retired slot serves a new arena.
    let q = mr.try_allocate(KIB, &s).unwrap();
    assert_eq!(mr.inner.registry.read().vacant.len(), 3);
    free(&mr, q, KIB, &s);
}

#[test]
fn per_thread_arenas_split_one_stream_and_free_locally() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let config = ArenaConfig::default()
        .arena_size(8 * MIB)
        .per_thread_arenas(true);
    let mr = ArenaResource::with_config(CudaResource::new(&d).unwrap(), config).unwrap();
    let here = mr.try_allocate(KIB, &s).unwrap();
    let (mr2, s2) = (mr.clone(), s.clone());
    let there = std::thread::spawn(move || mr2.try_allocate(KIB, &s2).unwrap())
        .join()
        .unwrap();
    let stats = assert_accounted(&mr);
    assert_eq!((stats.stream_arenas, stats.superblocks), (2, 2));
    // Freed here on the same stream: reusable at once by the other thread's arena.
    free(&mr, there, KIB, &s);
    let stats = assert_accounted(&mr);
    assert_eq!((stats.pending_bytes, stats.events_recorded), (0, 0));
    free(&mr, here, KIB, &s);
}

#[test]
fn size_classes_round_requests_and_bound_the_capacity() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let config = ArenaConfig::default()
        .arena_size(5 * MIB + 512 * KIB)
        .size_classes(true);
    let mr = ArenaResource::with_config(CudaResource::new(&d).unwrap(), config).unwrap();
    assert_eq!(mr.capacity_limit(), Some(5 * MIB), "5.5 MiB is not a class");
    let p = mr.try_allocate(17 * KIB, &s).unwrap();
    assert_eq!(mr.statistics().live_bytes, 20 * KIB);
    let q = mr.try_allocate(1, &s).unwrap();
    assert_eq!(q, p.offset(20 * KIB));
    free(&mr, p, 17 * KIB, &s);
    free(&mr, q, 1, &s);
    assert!(mr
        .try_allocate(5 * MIB + 1, &s)
        .unwrap_err()
        .is_out_of_memory());
    let r = mr.try_allocate(5 * MIB, &s).unwrap();
    free(&mr, r, 5 * MIB, &s);
}

#[test]
fn out_of_memory_reports_the_free_bytes() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let mr = arena(&d, 4 * MIB);
    let held = mr.try_allocate(3 * MIB, &s).unwrap();
    let err = mr.try_allocate(2 * MIB, &s).unwrap_err();
    let details = crate::error::OutOfMemoryDetails {
        largest_free_block: Some(MIB),
        free_bytes: Some(MIB),
        reserved_bytes: Some(4 * MIB),
        ..Default::default()
    };
    assert_eq!(err, Error::out_of_memory_with(2 * MIB, d.id(), details));
    let err = mr.try_allocate(1 << 50, &s).unwrap_err();
    assert!(err.is_out_of_memory());
    free(&mr, held, 3 * MIB, &s);
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<StdMutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_failure_is_dumped_to_tracing() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let config = ArenaConfig::default()
        .arena_size(MIB)
        .dump_on_failure(ArenaDump::Tracing);
    let mr = ArenaResource::with_config(CudaResource::new(&d).unwrap(), config).unwrap();
    let held = mr.try_allocate(KIB, &s).unwrap();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        assert!(mr.try_allocate(MIB, &s).unwrap_err().is_out_of_memory());
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("arena out of memory"), "{text}");
    assert!(
        text.contains("1048576 bytes (1048576 as a block)"),
        "{text}"
    );
    assert!(text.contains("live 1024 in 1 blocks"), "{text}");
    free(&mr, held, KIB, &s);
}

#[test]
fn a_failure_is_dumped_to_a_file() {
    let path =
        std::env::temp_dir().join(format!("streamalloc-arena-dump-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let d = device();
    let s = Stream::new(&d).unwrap();
    let config = ArenaConfig::default()
        .arena_size(MIB)
        .dump_on_failure(ArenaDump::File(path.clone()));
    let mr = ArenaResource::with_config(CudaResource::new(&d).unwrap(), config).unwrap();
    assert!(mr.try_allocate(8 * MIB, &s).unwrap_err().is_out_of_memory());
    let text = std::fs::read_to_string(&path).expect("the dump file");
    assert!(text.contains("8388608 bytes"), "{text}");
    assert!(text.contains("global arena: 1 free ranges"), "{text}");
    // Appended, not replaced.
    assert!(mr.try_allocate(8 * MIB, &s).is_err());
    let again = std::fs::read_to_string(&path).unwrap();
    assert_eq!(again.matches("arena out of memory").count(), 2);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn drop_returns_the_arena_to_the_upstream_after_every_free() {
    let d = device();
    let controls = d.host_controls().unwrap().clone();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let mr = arena(&d, 4 * MIB);
    assert_eq!(controls.allocated_bytes(), 4 * MIB);
    let p = mr.try_allocate(KIB, &a).unwrap();
    let q = mr.try_allocate(2 * MIB, &a).unwrap();
    b.enqueue_delay(std::time::Duration::from_millis(20))
        .unwrap();
    free(&mr, p, KIB, &b);
    free(&mr, q, 2 * MIB, &b);
    let home = mr.inner.home.clone();
    drop(mr);
    home.synchronize_blocking().unwrap();
    assert_eq!(controls.allocated_bytes(), 0);
}

#[test]
fn drop_with_live_allocations_leaks_instead_of_freeing() {
    let d = device();
    let controls = d.host_controls().unwrap().clone();
    let s = Stream::new(&d).unwrap();
    let mr = arena(&d, 4 * MIB);
    let _leaked = mr.try_allocate(KIB, &s).unwrap();
    let home = mr.inner.home.clone();
    drop(mr);
    home.synchronize_blocking().unwrap();
    assert_eq!(controls.allocated_bytes(), 4 * MIB);
}

#[test]
fn freeing_a_pointer_outside_the_arena_is_a_deferred_error() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let mr = arena(&d, MIB);
    free(&mr, DevicePtr::from_raw(0x1000), 256, &s);
    let e = d.take_deferred_error().expect("the bad free is reported");
    assert!(e.to_string().contains("0x1000"), "{e}");
    assert_eq!(mr.statistics().live_allocations, 0);
}

#[test]
fn freeing_twice_is_a_deferred_error() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let mr = arena(&d, 4 * MIB);
    // A large block (from the global arena) and a small one (from a stream arena), each freed
    // twice; the second free of each, and a free with the wrong size, are refused.
    let large = mr.try_allocate(2 * MIB, &s).unwrap();
    let small = mr.try_allocate(KIB, &s).unwrap();
    let other = mr.try_allocate(KIB, &s).unwrap();
    free(&mr, large, 2 * MIB, &s);
    free(&mr, large, 2 * MIB, &s);
    free(&mr, small, KIB, &s);
    free(&mr, small, KIB, &s);
    free(&mr, other, 4 * KIB, &s);
    assert_eq!(d.deferred_error_count(), 3);
    for p in [large, small, other] {
        let e = d.take_deferred_error().expect("each bad free is reported");
        assert!(e.to_string().contains(&p.to_string()), "{e}");
    }
    assert_eq!(mr.statistics().live_allocations, 1);
    free(&mr, other, KIB, &s);
    assert_eq!(mr.statistics().live_allocations, 0);
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn slots_are_found_by_index_across_buckets() {
    let slots = Slots::new();
    for index in [0, 31, 32, 95, 96, 1000, 100_000] {
        slots
            .make(index)
            .home
            .store(u64::from(index) + 1, Ordering::Relaxed);
    }
    for index in [0, 31, 32, 95, 96, 1000, 100_000] {
        assert_eq!(
            slots.get(index).home.load(Ordering::Relaxed),
            u64::from(index) + 1
        );
    }
    assert_eq!(Slots::locate(0), (0, 0));
    assert_eq!(Slots::locate(31), (0, 31));
    assert_eq!(Slots::locate(32), (1, 0));
    assert_eq!(Slots::locate(96), (2, 0));
    assert_eq!(Slots::locate(u32::MAX).0, SLOT_BUCKETS - 1);
}

// ---- the whole resource against a model ----

#[derive(Debug, Clone)]
enum Op {
    Allocate { bytes: usize, stream: usize },
    Free { pick: usize, stream: usize },
    Defragment,
}

fn any_op() -> impl Strategy<Value = Op> {
    let bytes = prop_oneof![
        6 => 1..=64 * KIB,
        3 => 1..=MIB,
        2 => MIB + 1..=3 * MIB,
    ];
    prop_oneof![
        10 => (bytes, 0..3usize).prop_map(|(bytes, stream)| Op::Allocate { bytes, stream }),
        8 => (any::<usize>(), 0..3usize).prop_map(|(pick, stream)| Op::Free { pick, stream }),
        1 => Just(Op::Defragment),
    ]
}

/// The block a request takes: 256-byte rounding, whole pages above a superblock.
fn charged(bytes: usize) -> usize {
    let size = align_up(bytes).unwrap();
    if size > SUPERBLOCK_SIZE {
        size.next_multiple_of(PAGE_SIZE)
    } else {
        size
    }
}

fn run_resource_ops(ops: Vec<Op>) {
    const SIZE: usize = 8 * MIB;
    let d = device();
    let streams: Vec<Stream> = (0..3).map(|_| Stream::new(&d).unwrap()).collect();
    let mr = arena(&d, SIZE);
    let base = mr.inner.extents.list()[0].0;
    // Live blocks: start → (bytes requested, charged size).
    let mut live: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Allocate { bytes, stream } => match mr.try_allocate(bytes, &streams[stream]) {
                Ok(p) => {
                    let (start, size) = (p.addr(), charged(bytes));
                    assert!(p.is_aligned(256), "{p:?}");
                    assert!(
                        start >= base && start + size as u64 <= base + SIZE as u64,
                        "{p:?}+{size} outside the arena"
                    );
                    if let Some((&s, &(_, n))) = live.range(..start + size as u64).next_back() {
                        assert!(s + n as u64 <= start, "{p:?}+{size} overlaps {s:#x}+{n}");
                    }
                    live.insert(start, (bytes, size));
                }
                Err(e) => {
                    assert!(e.is_out_of_memory(), "{e}");
                    // After the failed retry nothing the request needs is left: no free range
                    // of the global arena serves it...
                    let size = charged(bytes);
                    let global = mr.inner.global.lock();
                    let pages_needed = if size > SUPERBLOCK_SIZE {
                        (size / PAGE_SIZE) as u64
                    } else {
                        self::core::consts::SUPERBLOCK_PAGES
                    };
                    assert!(
                        global.largest_free_pages() < pages_needed,
                        "{bytes} failed with {} free pages in one range",
                        global.largest_free_pages()
                    );
                    drop(global);
                    // The snapshot agrees: outside the superblocks that hold live blocks
                    // (which serve small requests only), no free extent holds a large one.
                    if size > SUPERBLOCK_SIZE {
                        let mut snap = mr.snapshot().unwrap();
                        snap.segments.retain(|s| s.stream.is_none());
                        let f = snap.fragmentation();
                        assert!(f.largest_free_block < size, "{bytes} failed, but {f}");
                    }
                    // ...and, for a small one, no stream arena has a free block for it.
                    if size <= SUPERBLOCK_SIZE {
                        mr.inner.for_each_arena(|_, core| {
                            assert!(core.largest_free() < size as u64, "{bytes} could borrow");
                        });
                    }
                }
            },
            Op::Free { pick, stream } => {
                if live.is_empty() {
                    continue;
                }
                let (&p, &(bytes, _)) = live.iter().nth(pick % live.len()).unwrap();
                live.remove(&p);
                free(&mr, DevicePtr::from_raw(p), bytes, &streams[stream]);
            }
            Op::Defragment => {
                mr.defragment();
            }
        }
        let stats = assert_accounted(&mr);
        assert_eq!(stats.live_allocations, live.len());
        assert_eq!(
            stats.live_bytes,
            live.values().map(|&(_, n)| n).sum::<usize>()
        );
        mr.inner.for_each_arena(|_, core| core.check_invariants());
        mr.inner.global.lock().check_invariants();
        check_snapshot(&mr, &live, SIZE);
    }
    for (p, (bytes, _)) in live {
        free(&mr, DevicePtr::from_raw(p), bytes, &streams[0]);
    }
    mr.defragment();
    let stats = assert_accounted(&mr);
    assert_eq!(stats.free_bytes + stats.pending_bytes, SIZE);
}

/// The snapshot tiles the arena with blocks, its live blocks are `live` (start → (requested,
/// charged)), and its free bytes are the arena's free and pending ones.
fn check_snapshot(
    mr: &ArenaResource<CudaResource>,
    live: &BTreeMap<u64, (usize, usize)>,
    size: usize,
) {
    let snap = mr.snapshot().unwrap();
    assert_eq!(snap.reserved_bytes(), size);
    let mut at = None;
    for segment in &snap.segments {
        let mut next = segment.address.addr();
        if let Some(end) = at {
            assert_eq!(
                next, end,
                "segments of the one extent do not follow each other"
            );
        }
        for b in &segment.blocks {
            assert_eq!(b.address.addr(), next, "gap or overlap in {segment:?}");
            next = b.end();
        }
        assert_eq!(next, segment.address.addr() + segment.bytes as u64);
        at = Some(next);
    }
    let seen: BTreeMap<u64, usize> = snap
        .blocks()
        .filter(|(_, b)| b.state == BlockState::Live)
        .map(|(_, b)| (b.address.addr(), b.bytes))
        .collect();
    let want: BTreeMap<u64, usize> = live.iter().map(|(&p, &(_, n))| (p, n)).collect();
    assert_eq!(seen, want);
    let stats = mr.statistics();
    let f = snap.fragmentation();
    assert_eq!(f.free_bytes(), stats.free_bytes + stats.pending_bytes);
    assert_eq!(f.live_bytes, stats.live_bytes);
}

/// A block another stream borrowed from an exhausted arena reads as live on the borrower's
/// stream, though it lies in the lender's superblock (failed before borrowed blocks were
/// noted: it read as the lender's).
#[test]
fn a_borrowed_block_reads_as_the_borrowers() {
    let d = device();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let mr = arena(&d, MIB); // one superblock: `a`'s arena takes it
    let p = mr.try_allocate(KIB, &a).unwrap();
    let q = mr.try_allocate(KIB, &b).unwrap(); // borrowed from `a`'s arena
    let snap = mr.snapshot().unwrap();
    let stream_of = |x: DevicePtr| {
        snap.blocks()
            .find(|(_, blk)| blk.address == x)
            .map(|(_, blk)| (blk.state, blk.stream))
            .unwrap()
    };
    assert_eq!(stream_of(p), (BlockState::Live, Some(a.id())));
    assert_eq!(stream_of(q), (BlockState::Live, Some(b.id())));
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].stream, Some(a.id()));
    free(&mr, q, KIB, &b);
    free(&mr, p, KIB, &a);
    let snap = mr.snapshot().unwrap();
    // Both free now, in `a`'s arena (`b`'s free is reclaimed by `a` when it needs it).
    assert!(snap
        .blocks()
        .all(|(_, blk)| blk.state == BlockState::FreeOnStream && blk.stream == Some(a.id())));
    assert_eq!(snap.fragmentation().largest_free_block, MIB);
}

/// A growing arena: one segment per extent taken (none before the first request), and its
/// capacity is its maximum.
#[test]
fn a_growing_arenas_snapshot_follows_its_extents() {
    let d = device();
    let s = Stream::new(&d).unwrap();
    let config = ArenaConfig::default().maximum_size(64 * MIB);
    let mr = ArenaResource::with_config(CudaResource::new(&d).unwrap(), config).unwrap();
    let snap = mr.snapshot().unwrap();
    assert_eq!((snap.segments.len(), snap.capacity), (0, Some(64 * MIB)));
    let small = mr.try_allocate(KIB, &s).unwrap();
    let large = mr.try_allocate(8 * MIB, &s).unwrap();
    let snap = mr.snapshot().unwrap();
    assert_eq!(snap.reserved_bytes(), mr.arena_size());
    let live: Vec<_> = snap
        .blocks()
        .filter(|(_, b)| b.state == BlockState::Live)
        .map(|(_, b)| (b.address, b.bytes))
        .collect();
    assert_eq!(live.len(), 2);
    assert!(live.contains(&(small, KIB)) && live.contains(&(large, 8 * MIB)));
    free(&mr, large, 8 * MIB, &s);
    free(&mr, small, KIB, &s);
    mr.trim();
    assert_eq!(mr.snapshot().unwrap().reserved_bytes(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random allocations and frees on three streams of an 8 MiB arena: no two live blocks
    /// overlap, every block is 256-byte aligned and inside the arena, every byte is accounted
    /// for (free, pending or live, exactly as charged), the cores keep their invariants, and a
    /// request fails only when neither the global arena nor any stream arena could serve it.
    #[test]
    fn the_resource_matches_the_model(ops in prop::collection::vec(any_op(), 1..120)) {
        run_resource_ops(ops);
    }
}

/// Stream-ordering cases a review found: each failed before its fix.
mod ordering {
    use super::*;
    use crate::test_support::{busy, reached, when};

    /// A stream's record is dropped once nothing holds it and made again later; a taker that
    /// waited on the old record's first event must still wait on the new record's.
    #[test]
    fn a_remade_record_is_waited_on_again() {
        let d = device();
        let (t, y) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
        let mr = arena(&d, 3 * MIB);
        let pin = mr.try_allocate(KIB, &y).unwrap(); // Y's arena keeps Y's record alive
        let l = mr.try_allocate(2 * MIB, &t).unwrap();
        free(&mr, l, 2 * MIB, &t);
        let l2 = mr.try_allocate(2 * MIB, &y).unwrap(); // Y waits on T (generation 1)
        assert_eq!(l2, l);
        free(&mr, l2, 2 * MIB, &y);
        let l3 = mr.try_allocate(2 * MIB, &t).unwrap();
        let t_end = busy(&t, 300); // T's kernels on l3
        free(&mr, l3, 2 * MIB, &t);
        let l4 = mr.try_allocate(2 * MIB, &y).unwrap();
        assert_eq!(l4, l3);
        let y_start = reached(&y); // Y's first use of l4
        t.synchronize_blocking().unwrap();
        y.synchronize_blocking().unwrap();
        assert!(
            when(&y_start) >= when(&t_end),
            "Y used memory T freed before T finished with it"
        );
        free(&mr, l4, 2 * MIB, &y);
        free(&mr, pin, KIB, &y);
    }

    /// An arena's stream waits on T when it takes T's pages; a stream that later borrows those
    /// pages from that arena waits on an event recorded after that wait, not an older one.
    #[test]
    fn a_borrower_is_ordered_after_the_arenas_own_waits() {
        let d = device();
        let s = || Stream::new(&d).unwrap();
        let (x, b, t, c) = (s(), s(), s(), s());
        let mr = arena(&d, 4 * MIB);
        let _x0 = mr.try_allocate(MIB, &x).unwrap(); // S0 pages 0..16
        let _b0 = mr.try_allocate(MIB, &b).unwrap(); // S1 pages 16..32
        let lx = mr.try_allocate(2 * MIB, &x).unwrap();
        free(&mr, lx, 2 * MIB, &x);
        let lb = mr.try_allocate(2 * MIB, &b).unwrap(); // records E0 on X
        free(&mr, lb, 2 * MIB, &b);
        let lt = mr.try_allocate(2 * MIB, &t).unwrap();
        let t_end = busy(&t, 300);
        free(&mr, lt, 2 * MIB, &t);
        let _x1 = mr.try_allocate(512 * KIB, &x).unwrap(); // X takes pages 32..48, waits on T
        let _c0 = mr.try_allocate(MIB, &c).unwrap(); // global now empty
        let borrowed = mr.try_allocate(512 * KIB, &b).unwrap(); // from X's arena
        assert!(borrowed.addr() >= lt.addr() && borrowed.addr() < lt.addr() + 2 * MIB as u64);
        let b_start = reached(&b);
        for st in [&x, &b, &t, &c] {
            st.synchronize_blocking().unwrap();
        }
        assert!(
            when(&b_start) >= when(&t_end),
            "B used memory T freed before T finished with it"
        );
    }

    /// Memory freed into an arena from another stream (pending until the arena's stream waits)
    /// is lent to a third stream that needs it, instead of failing it or making it wait for as
    /// long as the arena's own stream does not allocate.
    #[test]
    fn pending_memory_is_lent() {
        let d = device();
        let s = || Stream::new(&d).unwrap();
        let (x, z, y) = (s(), s(), s());
        let mr = arena(&d, MIB);
        let pin = mr.try_allocate(256, &x).unwrap();
        let p = mr.try_allocate(MIB - 256, &x).unwrap();
        free(&mr, p, MIB - 256, &z);
        // Awaited: served at once from the pending memory. (The timeout only turns the hang
        // this was into a failure.)
        let e = futures::executor::block_on(
            mr.allocate(512 * KIB, &y)
                .timeout(std::time::Duration::from_secs(5)),
        );
        assert!(e.is_ok(), "{e:?}");
        // Not awaited: the rest of it.
        let r = mr.try_allocate(256 * KIB, &y);
        assert!(r.is_ok(), "{r:?}");
        free(&mr, r.unwrap(), 256 * KIB, &y);
        free(&mr, e.unwrap(), 512 * KIB, &y);
        free(&mr, pin, 256, &x);
    }
}

/// Failed before: the error had no details.
#[test]
fn out_of_memory_details_name_the_largest_block_what_is_held_and_the_pending_frees() {
    let d = device();
    let (a, b) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let mr = arena(&d, 4 * MIB);
    let large = mr.try_allocate(3 * MIB, &a).unwrap(); // from the global arena
    let q1 = mr.try_allocate(1000, &a).unwrap(); // a's arena takes the last superblock
    let q2 = mr.try_allocate(1000, &a).unwrap();
    b.wait(&a.record().unwrap()).unwrap();
    free(&mr, q2, 1000, &b); // pending in a's arena until a waits for b
    let err = mr.try_allocate(2 * MIB, &a).unwrap_err();
    let Error::OutOfMemory {
        requested,
        details: Some(details),
        ..
    } = &err
    else {
        panic!("no details: {err:?}");
    };
    assert_eq!(*requested, 2 * MIB);
    assert_eq!(details.reserved_bytes, Some(4 * MIB));
    assert_eq!(details.largest_free_block, Some(MIB - 2048));
    assert_eq!(details.free_bytes, Some(MIB - 2048 + 1024));
    assert_eq!(details.pending_frees, vec![(b.id(), 1024)]);
    let text = err.to_string();
    assert!(text.contains("1024 bytes pending on"), "{text}");
    free(&mr, q1, 1000, &a);
    free(&mr, large, 3 * MIB, &a);
}

/// The state and stream of the block at `p` in `mr`'s snapshot.
fn block_state(mr: &impl MemoryResource, p: DevicePtr) -> (BlockState, Option<crate::StreamId>) {
    let snap = mr.snapshot().unwrap();
    let (_, b) = snap
        .blocks()
        .find(|(_, b)| b.address == p)
        .unwrap_or_else(|| panic!("no block at {p}"));
    (b.state, b.stream)
}

/// A global range freed on a stream that has not passed the free reads free on that stream,
/// as the pool's block does: another stream gets it at once, but its work waits (on the
/// device) for the free's event. Once every freeing stream has passed an event recorded after
/// its frees (the arena records one when another stream takes that memory), it reads free for
/// every stream.
#[test]
fn a_global_range_is_free_for_all_only_once_its_frees_have_passed() {
    let d = device();
    let [s, t] = crate::test_support::streams::<2>(&d);
    let mr = arena(&d, 4 * MIB);
    let pool =
        crate::PoolResource::new(CudaResource::new(&d).unwrap(), 4 * MIB, Some(4 * MIB)).unwrap();
    let gate = crate::test_support::gate(&s); // `s` is busy until the gate is dropped
    let p = mr.try_allocate(3 * MIB, &s).unwrap();
    let q = pool.try_allocate(3 * MIB, &s).unwrap();
    free(&mr, p, 3 * MIB, &s);
    free(&pool, q, 3 * MIB, &s);
    assert_eq!(
        block_state(&pool, q),
        (BlockState::FreeOnStream, Some(s.id()))
    );
    assert_eq!(
        block_state(&mr, p),
        (BlockState::FreeOnStream, Some(s.id()))
    );
    let f = mr.fragmentation().unwrap();
    assert_eq!(
        (f.largest_free_now, f.largest_free_block),
        (0, 4 * MIB),
        "{f}"
    );

    // `t` takes the whole arena (the freed range joined with the fresh rest) at once, its
    // stream waiting for `s`'s free.
    let all = mr.try_allocate(4 * MIB, &t).unwrap();
    let after = t.record().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(!after.is_complete().unwrap(), "t waits for s's free");
    drop(gate);
    after.synchronize_blocking().unwrap();

    // Freed on `t`, which no one waited for yet: free on `t`. `s` takes a superblock of it
    // (recording an event on `t`); once `t` passes it, the rest is free for every stream.
    free(&mr, all, 4 * MIB, &t);
    assert_eq!(
        block_state(&mr, all),
        (BlockState::FreeOnStream, Some(t.id()))
    );
    let small = mr.try_allocate(KIB, &s).unwrap();
    let rest = DevicePtr::from_raw(all.addr() + MIB as u64);
    assert!(small < rest, "the superblock is the range's first MiB");
    t.synchronize_blocking().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while block_state(&mr, rest) != (BlockState::Free, None) {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            block_state(&mr, rest)
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(mr.fragmentation().unwrap().largest_free_now, 3 * MIB);
    free(&mr, small, KIB, &s);
}

/// The shared suite's `four_threads` flake, made deterministic: the superblock a request grows
/// the arena by is its own. Here a request on `a` grows the arena while another stream takes
/// every free superblock before `a` looks again (the test holds `a`'s arena). It failed before
/// (out of memory with the arena just grown): `grow` left the new extent in the global arena
/// for anyone, and `a` found it empty.
#[test]
fn a_request_keeps_the_superblock_it_grew_the_arena_by() {
    use std::sync::mpsc;
    type Hook = Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>;
    let d = device();
    let (a, c) = (Stream::new(&d).unwrap(), Stream::new(&d).unwrap());
    let cuda = CudaResource::new(&d).unwrap();
    let hook: Arc<StdMutex<Hook>> = Arc::default();
    let (up_cuda, up_hook) = (cuda.clone(), hook.clone());
    let properties = cuda.properties();
    // SAFETY: frees what the allocate closure got from `cuda`, as the arena gives it back.
    let give_back = move |p, bytes, s: &Stream| unsafe { cuda.deallocate(p, bytes, s) };
    // SAFETY: every pointer is one `cuda` returned for the same request, with its properties:
    // `cuda` keeps the promise.
    let up = unsafe {
        crate::resource::CallbackResource::new(
            properties,
            move |bytes, s| {
                // The armed growth stops here until the test holds `a`'s arena.
                if let Some((growing, go)) = up_hook.lock().unwrap().take() {
                    growing.send(()).unwrap();
                    go.recv().unwrap();
                }
                up_cuda.try_allocate(bytes, s)
            },
            give_back,
        )
    };
    let mr = ArenaResource::new(up, None).unwrap();
    let big = MIB - 4 * KIB;
    // `a`'s arena (slot 0) holds both superblocks of the first growth step, each nearly full.
    let mut mine = vec![
        mr.try_allocate(big, &a).unwrap(),
        mr.try_allocate(big, &a).unwrap(),
    ];
    assert_eq!(mr.arena_size(), 2 * MIB);
    let (growing_tx, growing_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    *hook.lock().unwrap() = Some((growing_tx, go_rx));
    let mut thief = Vec::new();
    let got = std::thread::scope(|scope| {
        let victim = scope.spawn(|| mr.try_allocate(big, &a));
        growing_rx.recv().unwrap();
        let slot = mr.inner.slots.get(0).state.lock();
        go_tx.send(()).unwrap();
        while mr.arena_size() == 2 * MIB {
            std::thread::yield_now();
        }
        // Another stream takes every superblock free in the global arena.
        while mr
            .inner
            .global
            .lock()
            .find_below(super::core::Use::Superblock, 0, super::extents::LARGE_AREA)
            .is_some()
        {
            thief.push(mr.try_allocate(big, &c).unwrap());
        }
        drop(slot);
        victim.join().unwrap()
    });
    mine.push(got.expect("the request that grew the arena is served"));
    for p in mine {
        free(&mr, p, big, &a);
    }
    for q in thief {
        free(&mr, q, big, &c);
    }
    let s = mr.statistics();
    assert_eq!(
        s.free_bytes + s.pending_bytes + s.live_bytes,
        s.reserved_bytes,
        "{s:?}"
    );
    a.synchronize_blocking().unwrap();
    c.synchronize_blocking().unwrap();
    assert!(d.take_deferred_error().is_none());
}
