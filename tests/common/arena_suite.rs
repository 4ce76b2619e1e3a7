//! `ArenaResource` on a real backend: RMM's arena test cases, memory crossing streams by each
//! path the arena has (each checked by data: the later stream must see what the earlier one
//! wrote), awaiting a full arena, and many tasks awaiting a small one.

use std::time::Duration;

use streamalloc::{
    percent_of_free_device_memory, ArenaConfig, ArenaDump, ArenaResource, CudaResource, Device,
    DeviceBuffer, DevicePtr, Error, MemoryResource, Stream,
};

use super::stress;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn free(mr: &impl MemoryResource, p: DevicePtr, bytes: usize, s: &Stream) {
    // SAFETY: every caller frees what it allocated from `mr` with the same size, unused.
    unsafe { mr.deallocate(p, bytes, s) }
}

fn arena(device: &Device, size: usize) -> ArenaResource<CudaResource> {
    ArenaResource::new(CudaResource::new(device).unwrap(), Some(size)).unwrap()
}

/// RMM `ArenaTest.SizeSmallerThanSuperblockSize`.
pub fn smaller_than_a_superblock_is_rejected(device: Device) {
    let r = ArenaResource::new(CudaResource::new(&device).unwrap(), Some(256));
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    let r = ArenaResource::new(CudaResource::new(&device).unwrap(), Some(MIB - 256));
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
}

/// RMM `ArenaTest.AllocateNinetyPercent`.
pub fn ninety_percent_arena(device: Device) {
    let size = percent_of_free_device_memory(&device, 90).unwrap();
    let mr = ArenaResource::new(CudaResource::new(&device).unwrap(), Some(size)).unwrap();
    let s = Stream::new(&device).unwrap();
    let p = mr.try_allocate(size / 2, &s).unwrap();
    free(&mr, p, size / 2, &s);
}

/// The default arena takes nothing from the device at construction (RMM's takes half of the
/// free memory) and gives what it grew back on `trim`.
pub fn default_arena_takes_nothing_at_construction(device: Device) {
    let used = || {
        device.synchronize_blocking().unwrap();
        let info = device.memory_info().unwrap();
        info.total - info.free
    };
    let before = used();
    let mr = ArenaResource::new(CudaResource::new(&device).unwrap(), None).unwrap();
    assert_eq!(mr.arena_size(), 0);
    // Nothing allocated (a little slack for the driver's own bookkeeping on a GPU).
    assert!(used() < before + 64 * MIB, "{} -> {}", before, used());
    let s = Stream::new(&device).unwrap();
    let p = mr.try_allocate(100 * MIB, &s).unwrap();
    assert_eq!(mr.arena_size(), 100 * MIB);
    free(&mr, p, 100 * MIB, &s);
    assert_eq!(mr.trim(), 100 * MIB);
    assert!(used() < before + 64 * MIB, "{} -> {}", before, used());
}

/// RMM `ArenaTest.SmallMediumLarge`, with the default arena (RMM's takes half of the free
/// memory; ours grows to a third of it here).
pub fn small_medium_large(device: Device) {
    let free_now = device.memory_info().unwrap().free;
    let mr = ArenaResource::new(CudaResource::new(&device).unwrap(), None).unwrap();
    let s = Stream::new(&device).unwrap();
    let sizes = [256, 64 * MIB, free_now / 3 / 256 * 256];
    let ptrs: Vec<DevicePtr> = sizes
        .iter()
        .map(|&n| mr.try_allocate(n, &s).unwrap())
        .collect();
    for (p, n) in ptrs.into_iter().zip(sizes) {
        free(&mr, p, n, &s);
    }
}

/// RMM `ArenaTest.ArenaAllocate` (1 MiB at the base, then 256 B at base + 1 MiB) and
/// `GlobalArenaAcquire`: superblocks are lent in address order.
pub fn superblocks_come_in_address_order(device: Device) {
    let mr = arena(&device, 4 * MIB);
    let s = Stream::new(&device).unwrap();
    let a = mr.try_allocate(MIB, &s).unwrap();
    let b = mr.try_allocate(256, &s).unwrap();
    assert_eq!(b, a.offset(MIB));
    let c = mr.try_allocate(256, &s).unwrap();
    assert_eq!(c, b.offset(256), "first fit in the arena's own superblock");
    let d = mr.try_allocate(2 * MIB, &s).unwrap();
    assert_eq!(
        d,
        a.offset(2 * MIB),
        "a large block from the global arena's lowest pages"
    );
    for (p, n) in [(a, MIB), (b, 256), (c, 256), (d, 2 * MIB)] {
        free(&mr, p, n, &s);
    }
}

/// RMM `ArenaTest.ArenaDefragment`: after 4 × 1 MiB are freed in a stream's arena, the global
/// arena cannot serve 4 MiB until the superblocks come back, which `defragment` does, and
/// which an allocation that finds the arena exhausted does on its own.
pub fn defragment_gathers_free_superblocks(device: Device) {
    let mr = arena(&device, 4 * MIB);
    let s = Stream::new(&device).unwrap();
    for round in 0..2 {
        let blocks: Vec<DevicePtr> = (0..4).map(|_| mr.try_allocate(MIB, &s).unwrap()).collect();
        for p in blocks {
            free(&mr, p, MIB, &s);
        }
        let stats = mr.statistics();
        assert_eq!((stats.global_free_bytes, stats.superblocks), (0, 4));
        if round == 0 {
            assert_eq!(mr.defragment(), 4 * MIB);
            assert_eq!(mr.statistics().global_free_bytes, 4 * MIB);
        }
        let whole = mr.try_allocate(4 * MIB, &s).unwrap();
        free(&mr, whole, 4 * MIB, &s);
    }
}

/// RMM `ArenaTest.Defragment`: four threads each allocate and free 32 KiB on a stream of their
/// own; then the whole 4 MiB arena can be allocated at once.
pub fn defragment_after_four_threads_free(device: Device) {
    let mr = arena(&device, 4 * MIB);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (mr, device) = (mr.clone(), device.clone());
            std::thread::spawn(move || {
                let s = Stream::new(&device).unwrap();
                let p = mr.try_allocate(32 * KIB, &s).unwrap();
                free(&mr, p, 32 * KIB, &s);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(mr.statistics().superblocks, 4);
    let s = Stream::new(&device).unwrap();
    let p = mr.try_allocate(4 * MIB, &s).unwrap();
    free(&mr, p, 4 * MIB, &s);
    s.synchronize_blocking().unwrap();
}

/// RMM `ArenaTest.PerThreadToStreamDealloc` (#1395): a block freed on another stream than the
/// one whose arena it now sits in. A's superblock goes to B; B allocates in it; A frees that
/// block, which lies in B's arena: it waits there until B has waited for A.
pub fn free_of_a_block_in_another_arena(device: Device) {
    let mr = arena(&device, MIB);
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let p = mr.try_allocate(KIB, &a).unwrap();
    free(&mr, p, KIB, &a);
    let q = mr.try_allocate(KIB, &b).unwrap();
    assert_eq!(q, p, "A's superblock moved to B's arena");
    free(&mr, q, KIB, &a);
    let stats = mr.statistics();
    assert_eq!(
        (stats.pending_bytes, stats.live_allocations),
        (KIB, 0),
        "{stats:?}"
    );
    let r = mr.try_allocate(MIB, &b).unwrap();
    assert_eq!(r, p, "B reclaimed A's free after waiting for A");
    assert_eq!(mr.statistics().pending_bytes, 0);
    free(&mr, r, MIB, &b);
    b.synchronize_blocking().unwrap();
}

/// RMM `ArenaTest.DumpLogOnFailure`: 8 MiB from a 1 MiB arena is out-of-memory, and the dump
/// file describes the arena.
pub fn dump_log_on_failure(device: Device) {
    let path = std::env::temp_dir().join(format!(
        "streamalloc-arena-dump-{}-{}.log",
        std::process::id(),
        device.id()
    ));
    let _ = std::fs::remove_file(&path);
    let config = ArenaConfig::default()
        .arena_size(MIB)
        .dump_on_failure(ArenaDump::File(path.clone()));
    let mr = ArenaResource::with_config(CudaResource::new(&device).unwrap(), config).unwrap();
    let s = Stream::new(&device).unwrap();
    let err = mr.try_allocate(8 * MIB, &s).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let dump = std::fs::read_to_string(&path).expect("the dump file exists");
    assert!(
        dump.contains("arena out of memory: 8388608 bytes"),
        "{dump}"
    );
    std::fs::remove_file(&path).unwrap();
}

/// Asserts that `buf`, read on its stream, holds what another stream wrote before freeing the
/// memory: the arena made the reading stream wait.
fn assert_sees_the_write(buf: &DeviceBuffer, value: u8) {
    let host = futures::executor::block_on(buf.copy_to_host(vec![0u8; buf.len()])).unwrap();
    let stale = host.iter().filter(|&&x| x != value).count();
    assert_eq!(
        stale,
        0,
        "{stale} of {} bytes were read before the other stream's write",
        host.len()
    );
}

/// How long the writing stream is kept busy: long enough that a missing wait shows.
const BUSY: Duration = Duration::from_millis(200);

/// Memory crossing streams through the global arena: S writes after a long delay and frees;
/// T's request takes S's superblock from the global arena and must see the write.
pub fn handoff_through_the_global_arena(device: Device) {
    let mr = arena(&device, MIB);
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let first = {
        let mut buf = DeviceBuffer::try_new(MIB, &s, mr.clone()).unwrap();
        s.enqueue_delay(BUSY).unwrap();
        buf.fill(0xa1).unwrap();
        buf.ptr()
    };
    let buf = DeviceBuffer::try_new(MIB, &t, mr.clone()).unwrap();
    assert_eq!(buf.ptr(), first);
    assert_sees_the_write(&buf, 0xa1);
    assert_eq!(mr.statistics().events_recorded, 1);
}

/// The same with a large block, freed on S straight into the global arena.
pub fn handoff_of_a_large_block(device: Device) {
    let mr = arena(&device, 4 * MIB);
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let first = {
        let mut buf = DeviceBuffer::try_new(3 * MIB, &s, mr.clone()).unwrap();
        s.enqueue_delay(BUSY).unwrap();
        buf.fill(0xa2).unwrap();
        buf.ptr()
    };
    let buf = DeviceBuffer::try_new(3 * MIB, &t, mr.clone()).unwrap();
    assert_eq!(buf.ptr(), first);
    assert_sees_the_write(&buf, 0xa2);
}

/// Through a pending free: A's block is handed to S, written there and freed on S, so it
/// waits in A's arena; A's next request reclaims it after waiting for S.
pub fn handoff_through_pending_frees(device: Device) {
    let mr = arena(&device, MIB);
    let (a, s) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let first = {
        let mut buf = DeviceBuffer::try_new(MIB, &a, mr.clone()).unwrap();
        buf.set_stream(&s).unwrap();
        s.enqueue_delay(BUSY).unwrap();
        buf.fill(0xa3).unwrap();
        buf.ptr()
    };
    assert_eq!(mr.statistics().pending_bytes, MIB);
    let buf = DeviceBuffer::try_new(MIB, &a, mr.clone()).unwrap();
    assert_eq!(buf.ptr(), first);
    assert_sees_the_write(&buf, 0xa3);
}

/// By borrowing: the only superblock is A's and holds a live block, so T's request takes a
/// free block of A's arena after waiting for A.
pub fn handoff_by_borrowing(device: Device) {
    let mr = arena(&device, MIB);
    let (a, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let pin = mr.try_allocate(256, &a).unwrap();
    let first = {
        let mut buf = DeviceBuffer::try_new(512 * KIB, &a, mr.clone()).unwrap();
        a.enqueue_delay(BUSY).unwrap();
        buf.fill(0xa4).unwrap();
        buf.ptr()
    };
    let buf = DeviceBuffer::try_new(512 * KIB, &t, mr.clone()).unwrap();
    assert_eq!(buf.ptr(), first);
    assert_sees_the_write(&buf, 0xa4);
    drop(buf);
    free(&mr, pin, 256, &a);
    a.synchronize_blocking().unwrap();
}

/// A second handoff from the same stream waits for a new event: the one recorded for the first
/// handoff does not cover the frees after it.
pub fn handoff_after_an_earlier_handoff(device: Device) {
    let mr = arena(&device, 2 * MIB);
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let b1 = mr.try_allocate(MIB, &s).unwrap();
    let mut b2 = DeviceBuffer::try_new(MIB, &s, mr.clone()).unwrap();
    free(&mr, b1, MIB, &s);
    // T takes S's first superblock behind a first event.
    let t1 = mr.try_allocate(MIB, &t).unwrap();
    assert_eq!(t1, b1);
    // S writes its second block and frees it; T takes it too.
    s.enqueue_delay(BUSY).unwrap();
    b2.fill(0xa5).unwrap();
    let second = b2.ptr();
    drop(b2);
    let t2 = DeviceBuffer::try_new(MIB, &t, mr.clone()).unwrap();
    assert_eq!(t2.ptr(), second);
    assert_sees_the_write(&t2, 0xa5);
    assert_eq!(mr.statistics().events_recorded, 2);
    free(&mr, t1, MIB, &t);
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Spawns `request` and returns once it waits in `mr`'s queue; fails if it ends instead.
async fn spawn_waiting<T: Send + std::fmt::Debug + 'static>(
    mr: &impl MemoryResource,
    request: impl std::future::Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    let waiter = tokio::spawn(request);
    while !mr.availability().unwrap().has_waiters() {
        assert!(
            !waiter.is_finished(),
            "the request did not wait: {waiter:?}"
        );
        tokio::task::yield_now().await;
    }
    waiter
}

/// An awaited allocation on a full arena waits in the queue until a free, then gets the
/// memory.
pub fn awaited_allocation_waits_for_a_free(device: Device) {
    let mr = arena(&device, MIB);
    let s = Stream::new(&device).unwrap();
    let held = mr.try_allocate(MIB, &s).unwrap();
    current_thread().block_on(async {
        let waiter = spawn_waiting(&mr, {
            let (mr, s) = (mr.clone(), s.clone());
            async move { mr.allocate(256 * KIB, &s).await }
        })
        .await;
        free(&mr, held, MIB, &s);
        let p = waiter.await.unwrap().unwrap();
        assert_eq!(p, held);
        free(&mr, p, 256 * KIB, &s);
    });
    // Beyond the whole arena: out-of-memory at once, even awaited.
    let err = futures::executor::block_on(mr.allocate(2 * MIB, &s)).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    s.synchronize_blocking().unwrap();
}

/// An awaited large request waits while the arena's memory sits in a stream arena, and is
/// served when the last block there is freed: the free wakes it, and its retry gathers the
/// superblocks.
pub fn awaited_large_allocation_gathers_superblocks(device: Device) {
    let mr = arena(&device, 2 * MIB);
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let pin = mr.try_allocate(KIB, &a).unwrap();
    let x = mr.try_allocate(MIB, &a).unwrap();
    free(&mr, x, MIB, &a);
    current_thread().block_on(async {
        let waiter = spawn_waiting(&mr, {
            let (mr, b) = (mr.clone(), b.clone());
            async move { mr.allocate(2 * MIB, &b).await }
        })
        .await;
        free(&mr, pin, KIB, &a);
        let p = waiter.await.unwrap().unwrap();
        assert_eq!(mr.statistics().superblocks, 0);
        free(&mr, p, 2 * MIB, &b);
    });
    b.synchronize_blocking().unwrap();
}

/// 200 tokio tasks on 4 streams draw sizes up to a quarter of a 64 MiB arena (small and large),
/// with total demand 3× the arena, half of them freeing on another stream; 20 % are cancelled
/// at random points and some carry deadlines. Every task is served, times out or is cancelled;
/// nothing stays live; no waiter is left.
pub fn stress_awaiting_tasks(device: Device) {
    const CAPACITY: usize = 64 * MIB;
    const TASKS: usize = 200;
    let mr = arena(&device, CAPACITY);
    let outcome = stress::awaiting_tasks(&device, mr.clone(), CAPACITY, TASKS, 0xa7e4a, true);
    assert!(
        outcome.served >= TASKS / 2,
        "only {} of {TASKS} served",
        outcome.served
    );
    let stats = mr.statistics();
    assert_eq!(stats.live_allocations, 0, "allocations left outstanding");
    assert_eq!(stats.free_bytes + stats.pending_bytes, CAPACITY);
    println!("arena stress: {outcome:?}; {stats:?}");
}

/// Instantiates the arena cases for one device.
#[macro_export]
macro_rules! arena_suite {
    ($name:ident, $device:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::arena_suite as suite;

            $(#[$attr])* #[test] fn smaller_than_a_superblock_is_rejected() { suite::smaller_than_a_superblock_is_rejected($device) }
            $(#[$attr])* #[test] fn ninety_percent_arena() { suite::ninety_percent_arena($device) }
            $(#[$attr])* #[test] fn small_medium_large() { suite::small_medium_large($device) }
            $(#[$attr])* #[test] fn default_arena_takes_nothing_at_construction() { suite::default_arena_takes_nothing_at_construction($device) }
            $(#[$attr])* #[test] fn superblocks_come_in_address_order() { suite::superblocks_come_in_address_order($device) }
            $(#[$attr])* #[test] fn defragment_gathers_free_superblocks() { suite::defragment_gathers_free_superblocks($device) }
            $(#[$attr])* #[test] fn defragment_after_four_threads_free() { suite::defragment_after_four_threads_free($device) }
            $(#[$attr])* #[test] fn free_of_a_block_in_another_arena() { suite::free_of_a_block_in_another_arena($device) }
            $(#[$attr])* #[test] fn dump_log_on_failure() { suite::dump_log_on_failure($device) }
            $(#[$attr])* #[test] fn handoff_through_the_global_arena() { suite::handoff_through_the_global_arena($device) }
            $(#[$attr])* #[test] fn handoff_of_a_large_block() { suite::handoff_of_a_large_block($device) }
            $(#[$attr])* #[test] fn handoff_through_pending_frees() { suite::handoff_through_pending_frees($device) }
            $(#[$attr])* #[test] fn handoff_by_borrowing() { suite::handoff_by_borrowing($device) }
            $(#[$attr])* #[test] fn handoff_after_an_earlier_handoff() { suite::handoff_after_an_earlier_handoff($device) }
            $(#[$attr])* #[test] fn awaited_allocation_waits_for_a_free() { suite::awaited_allocation_waits_for_a_free($device) }
            $(#[$attr])* #[test] fn awaited_large_allocation_gathers_superblocks() { suite::awaited_large_allocation_gathers_superblocks($device) }
            $(#[$attr])* #[test] fn stress_awaiting_tasks() { suite::stress_awaiting_tasks($device) }
        }
    };
}
