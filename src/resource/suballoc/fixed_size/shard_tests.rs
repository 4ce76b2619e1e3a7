//! `FixedSizeResource` with its free lists split over stream shards: blocks crossing shards
//! keep stream order, bad frees are caught whichever shard they land in, and many threads on
//! many streams never get one block twice.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use super::FixedSizeResource;
use crate::test_support::{device as host, free, reached, when};
use crate::{BlockState, CudaResource, DevicePtr, MemoryResource, Stream};

const KIB: usize = 1 << 10;

/// Streams until one is in another shard than `of` (shards: the resource's count).
fn stream_in_another_shard(of: &Stream, shards: u64) -> Stream {
    loop {
        let s = Stream::new(of.device()).unwrap();
        if s.id().0 % shards != of.id().0 % shards {
            return s;
        }
    }
}

/// Blocks freed on S, taken by T of another shard: T's use waits for S's work before the
/// frees, T gets half of them, S keeps the rest, and nothing grows.
#[test]
fn blocks_taken_across_shards_are_ordered_after_the_freeing_stream() {
    let device = host();
    let mr =
        FixedSizeResource::with_shards(CudaResource::new(&device).unwrap(), KIB, 8, 4).unwrap();
    let s = Stream::new(&device).unwrap();
    let t = stream_in_another_shard(&s, 4);
    let blocks: Vec<_> = (0..8).map(|_| mr.try_allocate(KIB, &s).unwrap()).collect();
    s.enqueue_delay(Duration::from_millis(100)).unwrap();
    let s_done = reached(&s);
    for &p in &blocks {
        free(&mr, p, KIB, &s);
    }
    let taken: Vec<_> = (0..4).map(|_| mr.try_allocate(KIB, &t).unwrap()).collect();
    assert!(
        taken.iter().all(|p| blocks.contains(p)),
        "served by growing"
    );
    let t_uses = reached(&t);
    let kept: Vec<_> = (0..4).map(|_| mr.try_allocate(KIB, &s).unwrap()).collect();
    assert_eq!((mr.total_blocks(), mr.free_blocks()), (8, 0));
    t.synchronize_blocking().unwrap();
    s.synchronize_blocking().unwrap();
    assert!(
        when(&t_uses) >= when(&s_done),
        "T used S's block before S was done"
    );
    // Frees on the other shard's stream land on its list (snapshot and counts agree).
    for &p in &kept {
        free(&mr, p, KIB, &t);
    }
    let snap = mr.snapshot().unwrap();
    let on_t = snap
        .blocks()
        .filter(|(_, b)| b.state != BlockState::Live && kept.contains(&b.address))
        .count();
    assert_eq!(on_t, 4);
    assert_eq!(mr.memory_stats().allocations, Some(4));
    for p in taken {
        free(&mr, p, KIB, &s);
    }
    assert_eq!(mr.free_blocks(), 8);
    assert!(device.take_deferred_error().is_none());
}

/// A block freed into another shard than the one that handed it out, then freed again into
/// its own: the second free is refused and reported, and the block is handed out once.
#[test]
fn a_double_free_across_shards_is_a_deferred_error() {
    let device = host();
    let mr =
        FixedSizeResource::with_shards(CudaResource::new(&device).unwrap(), KIB, 2, 4).unwrap();
    let s = Stream::new(&device).unwrap();
    let t = stream_in_another_shard(&s, 4);
    let p = mr.try_allocate(KIB, &s).unwrap();
    free(&mr, p, KIB, &t);
    free(&mr, p, KIB, &s);
    let e = device
        .take_deferred_error()
        .expect("the double free is reported");
    assert!(e.to_string().contains("double free"), "{e}");
    // A pointer of no chunk, and one inside a block, are refused too.
    free(&mr, DevicePtr::from_raw(p.addr() + 256), KIB, &t);
    assert!(device.take_deferred_error().is_some());
    assert_eq!(mr.memory_stats().allocations, Some(0));
    // Both blocks come back once each, and a third needs a new chunk.
    let a = mr.try_allocate(KIB, &s).unwrap();
    let b = mr.try_allocate(KIB, &s).unwrap();
    assert_ne!(a, b);
    assert_eq!(mr.total_blocks(), 2);
    free(&mr, a, KIB, &s);
    free(&mr, b, KIB, &s);
    assert!(device.take_deferred_error().is_none());
}

/// Many threads, each on its own stream over few shards and small chunks (so lists run dry,
/// blocks cross shards and the resource grows under contention), some blocks freed on the next
/// thread's stream (into its shard, while that thread works there): no block is ever held by
/// two, every free is accepted, growth stays near what is held, and at the end every block is
/// free.
#[test]
fn threads_on_many_streams_never_share_a_block() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 400;
    let device = host();
    let mr =
        FixedSizeResource::with_shards(CudaResource::new(&device).unwrap(), 256, 4, 4).unwrap();
    let streams: Vec<Stream> = (0..THREADS)
        .map(|_| Stream::new(&device).unwrap())
        .collect();
    let held = Mutex::new(HashSet::new());
    std::thread::scope(|scope| {
        for (i, stream) in streams.iter().enumerate() {
            let (mr, held, next) = (&mr, &held, &streams[(i + 1) % THREADS]);
            scope.spawn(move || {
                let mut mine = Vec::new();
                for round in 0..ROUNDS {
                    for _ in 0..1 + (round + i) % 5 {
                        let p = mr.try_allocate(200, stream).unwrap();
                        assert!(
                            held.lock().unwrap().insert(p.addr()),
                            "{p} handed out twice"
                        );
                        mine.push(p);
                    }
                    let keep = (round * 7 + i) % 4;
                    while mine.len() > keep {
                        let p = mine.pop().unwrap();
                        assert!(held.lock().unwrap().remove(&p.addr()));
                        free(mr, p, 200, if round % 3 == 0 { next } else { stream });
                    }
                }
                for p in mine {
                    assert!(held.lock().unwrap().remove(&p.addr()));
                    free(mr, p, 200, stream);
                }
            });
        }
    });
    assert!(device.take_deferred_error().is_none(), "a free was refused");
    assert_eq!(mr.free_blocks(), mr.total_blocks());
    assert_eq!(mr.memory_stats().allocations, Some(0));
    let snap = mr.snapshot().unwrap();
    assert_eq!(snap.blocks().count(), mr.total_blocks());
    assert!(snap.blocks().all(|(_, b)| b.state != BlockState::Live));
    // At most 8 blocks each are held at once: growth stays near that (a shard grows only when
    // it found no free block anywhere), not a chunk per shard per dry spell.
    assert!(
        mr.total_blocks() <= 2 * 8 * THREADS,
        "{}",
        mr.total_blocks()
    );
}
