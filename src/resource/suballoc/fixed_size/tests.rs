//! `FixedSizeResource` on the host backend.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::FixedSizeResource;
use crate::test_support::{device as host, free, reached, when};
use crate::{BlockState, CudaResource, DevicePtr, Error, LimitingAdaptor, MemoryResource, Stream};

const KIB: usize = 1 << 10;

#[test]
fn sizes_are_checked_and_rounded() {
    let up = CudaResource::new(&host()).unwrap();
    assert_eq!(
        FixedSizeResource::new(up.clone(), 1, 2)
            .unwrap()
            .block_size(),
        256
    );
    for (size, count) in [(0, 4), (KIB, 0), (usize::MAX - 10, 1), (1 << 40, 1 << 40)] {
        let r = FixedSizeResource::new(up.clone(), size, count);
        assert!(
            matches!(r, Err(Error::InvalidArgument(_))),
            "{size} x {count}: {r:?}"
        );
    }
    let d = FixedSizeResource::with_defaults(up).unwrap();
    assert_eq!((d.block_size(), d.blocks_to_preallocate()), (1 << 20, 128));
}

#[test]
fn requests_up_to_the_block_get_a_block_larger_ones_fail_at_once() {
    let device = host();
    let s = Stream::new(&device).unwrap();
    let mr = FixedSizeResource::new(CudaResource::new(&device).unwrap(), 4 * KIB, 4).unwrap();
    assert_eq!(mr.try_allocate(0, &s).unwrap(), DevicePtr::NULL);
    let err = mr.try_allocate(4 * KIB + 1, &s).unwrap_err();
    assert!(
        matches!(err, Error::TooLarge { requested, maximum, .. }
            if requested == 4 * KIB + 1 && maximum == 4 * KIB),
        "{err}"
    );
    // Awaited too: it could never fit, so it does not wait.
    let err = futures::executor::block_on(mr.allocate(8 * KIB, &s)).unwrap_err();
    assert!(err.is_out_of_memory());
    let blocks: Vec<_> = (0..4).map(|_| mr.try_allocate(1, &s).unwrap()).collect();
    let distinct: BTreeSet<_> = blocks.iter().map(|p| p.addr()).collect();
    assert_eq!(distinct.len(), 4);
    for w in distinct.iter().collect::<Vec<_>>().windows(2) {
        assert!(w[1] - w[0] >= 4 * KIB as u64, "blocks overlap");
    }
    assert!(blocks.iter().all(|p| p.is_aligned(256)));
    for p in blocks {
        free(&mr, p, 1, &s);
    }
}

#[test]
fn an_empty_resource_grows_by_the_same_count() {
    let device = host();
    let s = Stream::new(&device).unwrap();
    let mr = FixedSizeResource::new(CudaResource::new(&device).unwrap(), 64 * KIB, 8).unwrap();
    let controls = device.host_controls().unwrap();
    assert_eq!((mr.total_blocks(), mr.free_blocks()), (8, 8));
    assert_eq!(controls.allocated_bytes(), 8 * 64 * KIB);
    let blocks: Vec<_> = (0..9)
        .map(|_| mr.try_allocate(64 * KIB, &s).unwrap())
        .collect();
    assert_eq!((mr.total_blocks(), mr.free_blocks()), (16, 7));
    assert_eq!(controls.allocated_bytes(), 16 * 64 * KIB);
    for p in blocks {
        free(&mr, p, 64 * KIB, &s);
    }
    assert_eq!(mr.free_blocks(), 16);
    drop(mr);
    s.synchronize_blocking().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while controls.allocated_bytes() != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        controls.allocated_bytes(),
        0,
        "chunks not given back on drop"
    );
}

#[test]
fn a_double_free_is_a_deferred_error() {
    let device = host();
    let s = Stream::new(&device).unwrap();
    let mr = FixedSizeResource::new(CudaResource::new(&device).unwrap(), KIB, 2).unwrap();
    let p = mr.try_allocate(KIB, &s).unwrap();
    free(&mr, p, KIB, &s);
    free(&mr, p, KIB, &s);
    let e = device
        .take_deferred_error()
        .expect("the double free is reported");
    assert!(e.to_string().contains("double free"), "{e}");
    assert!(e.to_string().contains(&p.to_string()), "{e}");
    // The block was freed once: both blocks can be handed out again, and no third.
    let a = mr.try_allocate(KIB, &s).unwrap();
    let b = mr.try_allocate(KIB, &s).unwrap();
    assert_ne!(a, b);
    free(&mr, a, KIB, &s);
    free(&mr, b, KIB, &s);
    assert!(device.take_deferred_error().is_none());
}

/// Blocks freed on S and taken by T: T's later work runs after S's work before the frees, and
/// T takes half of S's free blocks, leaving S the rest.
#[test]
fn blocks_taken_from_another_stream_are_ordered_after_its_work() {
    let device = host();
    let mr = FixedSizeResource::new(CudaResource::new(&device).unwrap(), KIB, 8).unwrap();
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let blocks: Vec<_> = (0..8).map(|_| mr.try_allocate(KIB, &s).unwrap()).collect();
    s.enqueue_delay(Duration::from_millis(100)).unwrap();
    let s_done = reached(&s);
    for &p in &blocks {
        free(&mr, p, KIB, &s);
    }
    let q = mr.try_allocate(KIB, &t).unwrap();
    assert!(blocks.contains(&q), "served from S's frees, not by growing");
    assert_eq!(mr.total_blocks(), 8);
    let t_uses = reached(&t);
    // S kept half of its blocks, so it serves four without growing or waiting.
    let mine: Vec<_> = (0..4).map(|_| mr.try_allocate(KIB, &s).unwrap()).collect();
    assert_eq!(mr.total_blocks(), 8);
    t.synchronize_blocking().unwrap();
    s.synchronize_blocking().unwrap();
    assert!(
        when(&t_uses) >= when(&s_done),
        "T used S's block before S was done"
    );
    free(&mr, q, KIB, &t);
    for p in mine {
        free(&mr, p, KIB, &s);
    }
}

/// Blocks that moved from S to T and then to U: U waits for an event of T recorded after T's
/// wait for S.
#[test]
fn blocks_passed_on_stay_ordered() {
    let device = host();
    let mr = FixedSizeResource::new(CudaResource::new(&device).unwrap(), KIB, 4).unwrap();
    let [s, t, u] = std::array::from_fn(|_| Stream::new(&device).unwrap());
    let blocks: Vec<_> = (0..4).map(|_| mr.try_allocate(KIB, &s).unwrap()).collect();
    // T gets an event of its own first, so a stale one would be there to misuse.
    let first = mr.try_allocate(KIB, &t);
    assert!(first.is_ok(), "grows: {first:?}");
    let first = first.unwrap();
    free(&mr, first, KIB, &t);
    let w = mr.try_allocate(KIB, &u).unwrap(); // takes from T: T records an event
    s.enqueue_delay(Duration::from_millis(100)).unwrap();
    let s_done = reached(&s);
    for &p in &blocks {
        free(&mr, p, KIB, &s);
    }
    // T drains its own list, then takes two of S's four blocks (after waiting for S).
    let mut on_t = Vec::new();
    while mr.free_blocks() > 0 && on_t.len() < 16 {
        on_t.push(mr.try_allocate(KIB, &t).unwrap());
        if on_t.iter().any(|p| blocks.contains(p)) {
            break;
        }
    }
    assert!(
        on_t.iter().any(|p| blocks.contains(p)),
        "T never took S's blocks"
    );
    // U now takes what T holds of S's blocks.
    let mut on_u = Vec::new();
    loop {
        let p = mr.try_allocate(KIB, &u).unwrap();
        on_u.push(p);
        if blocks.contains(&p) {
            break;
        }
        assert!(on_u.len() < 16, "U never reached S's blocks");
    }
    let u_uses = reached(&u);
    for st in [&s, &t, &u] {
        st.synchronize_blocking().unwrap();
    }
    assert!(
        when(&u_uses) >= when(&s_done),
        "U used S's block before S was done"
    );
    free(&mr, w, KIB, &u);
    for p in on_t {
        free(&mr, p, KIB, &t);
    }
    for p in on_u {
        free(&mr, p, KIB, &u);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_resource_makes_an_awaited_allocation_wait_for_a_free() {
    let device = host();
    let s = Stream::new(&device).unwrap();
    // The upstream allows one batch of four blocks: the resource cannot grow.
    let up = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 4 * KIB);
    let mr = FixedSizeResource::new(up, KIB, 4).unwrap();
    let held: Vec<_> = (0..4).map(|_| mr.try_allocate(KIB, &s).unwrap()).collect();
    assert!(mr.try_allocate(KIB, &s).unwrap_err().is_out_of_memory());
    let waiter = {
        let (mr, s) = (mr.clone(), s.clone());
        tokio::spawn(async move { mr.allocate(KIB, &s).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished(), "it must wait, not fail");
    free(&mr, held[2], KIB, &s);
    let p = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the free")
        .unwrap()
        .unwrap();
    assert_eq!(p, held[2]);
    free(&mr, p, KIB, &s);
    for &q in [held[0], held[1], held[3]].iter() {
        free(&mr, q, KIB, &s);
    }
}

/// A free that skips the notify (nobody counted under the lock) racing with a waiter on
/// another stream joining: the join barrier takes the lock, so the waiter is always served.
#[test]
fn a_free_racing_a_joining_waiter_never_loses_it() {
    let device = host();
    let (freer, waiter) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let up = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 64 * KIB);
    let mr = FixedSizeResource::new(up, KIB, 64).unwrap();
    let mut held: Vec<_> = (0..64)
        .map(|_| mr.try_allocate(KIB, &freer).unwrap())
        .collect();
    crate::test_support::race(&mr, &mr, &mut held, KIB, &freer, &waiter, 64);
}

#[derive(Debug, Clone)]
enum Op {
    Allocate { size: usize, stream: usize },
    Free { pick: usize, stream: usize },
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..=2 * KIB, 0..3usize).prop_map(|(size, stream)| Op::Allocate { size, stream }),
        2 => (any::<usize>(), 0..3usize).prop_map(|(pick, stream)| Op::Free { pick, stream }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random allocations and frees on three streams against a model: live blocks never
    /// overlap, are aligned and within a chunk's block grid, oversized requests fail, and the
    /// block accounting is exact.
    #[test]
    fn random_operations_match_the_model(ops in prop::collection::vec(any_op(), 1..150)) {
        let device = host();
        let mr = FixedSizeResource::new(CudaResource::new(&device).unwrap(), KIB, 4).unwrap();
        let streams: Vec<Stream> = (0..3).map(|_| Stream::new(&device).unwrap()).collect();
        let mut live: Vec<(DevicePtr, usize)> = Vec::new();
        for op in ops {
            match op {
                Op::Allocate { size, stream } => match mr.try_allocate(size, &streams[stream]) {
                    Ok(p) if size == 0 => prop_assert!(p.is_null()),
                    Ok(p) => {
                        prop_assert!(size <= KIB);
                        prop_assert!(p.is_aligned(256));
                        for &(q, _) in &live {
                            prop_assert!(p.addr().abs_diff(q.addr()) >= KIB as u64, "{p:?} overlaps {q:?}");
                        }
                        live.push((p, size));
                    }
                    Err(e) => prop_assert!(e.is_out_of_memory() && size > KIB, "{e}"),
                },
                Op::Free { pick, stream } => {
                    if !live.is_empty() {
                        let (p, size) = live.swap_remove(pick % live.len());
                        free(&mr, p, size, &streams[stream]);
                    }
                }
            }
            prop_assert_eq!(mr.free_blocks() + live.len(), mr.total_blocks());
            // The snapshot: its live blocks are the model's, and the figures read from the
            // counts are the snapshot's.
            let snap = mr.snapshot().unwrap();
            let mut seen: Vec<u64> = snap
                .blocks()
                .filter(|(_, b)| b.state == BlockState::Live)
                .map(|(_, b)| b.address.addr())
                .collect();
            let mut want: Vec<u64> = live.iter().filter(|(p, _)| !p.is_null()).map(|(p, _)| p.addr()).collect();
            seen.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(seen, want);
            prop_assert_eq!(snap.reserved_bytes(), mr.total_blocks() * KIB);
            prop_assert_eq!(mr.fragmentation().unwrap(), snap.fragmentation());
        }
        for (p, size) in live {
            free(&mr, p, size, &streams[0]);
        }
        prop_assert_eq!(mr.free_blocks(), mr.total_blocks());
    }
}

/// Failed before: the error had no details.
#[test]
fn out_of_memory_says_nothing_is_free_and_what_is_held() {
    let device = crate::Device::host_with(crate::HostConfig::default().capacity(64 * KIB));
    let s = Stream::new(&device).unwrap();
    let mr = FixedSizeResource::new(CudaResource::new(&device).unwrap(), 4 * KIB, 4).unwrap();
    let mut held = Vec::new();
    let err = loop {
        match mr.try_allocate(4 * KIB, &s) {
            Ok(p) => held.push(p),
            Err(e) => break e,
        }
    };
    let Error::OutOfMemory {
        requested,
        available,
        details: Some(d),
        ..
    } = &err
    else {
        panic!("no details: {err:?}");
    };
    assert_eq!((*requested, *available), (4 * KIB, Some(0)));
    assert_eq!(d.largest_free_block, Some(0));
    assert_eq!(d.reserved_bytes, Some(held.len() * 4 * KIB));
    assert!(d.pending_frees.is_empty());
    for p in held {
        free(&mr, p, 4 * KIB, &s);
    }
}

/// A free list's blocks read free on its stream until that stream has passed an event
/// recorded after its frees (recorded when another stream takes from the list), then free for
/// every stream: another stream's request then gets them without waiting for anything left.
/// The count-based fragmentation agrees with the snapshot's.
#[test]
fn free_blocks_are_free_for_all_once_their_streams_frees_have_passed() {
    let device = host();
    let [s, t] = crate::test_support::streams::<2>(&device);
    let mr = FixedSizeResource::new(CudaResource::new(&device).unwrap(), 64 << 10, 4).unwrap();
    let gate = crate::test_support::gate(&s);
    let blocks: Vec<DevicePtr> = (0..4).map(|_| mr.try_allocate(1, &s).unwrap()).collect();
    for &p in &blocks[..2] {
        free(&mr, p, 1, &s);
    }
    let state_of = |p: DevicePtr| {
        let snap = mr.snapshot().unwrap();
        let (_, b) = snap.blocks().find(|(_, b)| b.address == p).unwrap();
        (b.state, b.stream)
    };
    assert_eq!(
        state_of(blocks[0]),
        (BlockState::FreeOnStream, Some(s.id()))
    );
    assert_eq!(
        mr.fragmentation().unwrap(),
        mr.snapshot().unwrap().fragmentation()
    );
    // `t` takes half of `s`'s list (one block), after an event of `s`; `s` then passes it.
    let taken = mr.try_allocate(1, &t).unwrap();
    drop(gate);
    s.synchronize_blocking().unwrap();
    let left = if taken == blocks[0] {
        blocks[1]
    } else {
        blocks[0]
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while state_of(left) != (BlockState::Free, None) {
        assert!(Instant::now() < deadline, "{:?}", state_of(left));
        std::thread::sleep(Duration::from_millis(1));
    }
    let f = mr.fragmentation().unwrap();
    assert_eq!(f, mr.snapshot().unwrap().fragmentation());
    assert_eq!(
        (f.free_now_bytes, f.largest_free_now),
        (64 << 10, 64 << 10),
        "{f}"
    );
    free(&mr, taken, 1, &t);
    for &p in &blocks[2..] {
        free(&mr, p, 1, &s);
    }
}
