//! The release policy: what the pool gives back on its own, beyond `trim`.

use std::time::{Duration, Instant};

use super::{PoolResource, ReleasePolicy};
use crate::test_support::{allocated, device as host, free};
use crate::{CudaResource, MemoryResource, Stream};

const MIB: usize = 1 << 20;

fn unbounded() -> (crate::Device, Stream, PoolResource<CudaResource>) {
    let device = host();
    let stream = Stream::new(&device).unwrap();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
    (device, stream, pool)
}

/// By default the pool keeps what it took: a freed large block's chunk stays.
#[test]
fn the_default_policy_keeps_free_chunks() {
    let (_device, stream, pool) = unbounded();
    assert_eq!(pool.release_policy(), ReleasePolicy::default());
    let p = pool.try_allocate(8 * MIB, &stream).unwrap();
    free(&pool, p, 8 * MIB, &stream);
    assert_eq!(pool.pool_size(), 8 * MIB);
}

/// `keep_free(16 MiB)`: four 8 MiB chunks freed, two go back, two stay; the upstream gets
/// them back on the stream (its live bytes fall once the stream passes the frees).
#[test]
fn keep_free_gives_back_wholly_free_chunks_above_the_threshold() {
    let (device, stream, pool) = unbounded();
    pool.set_release_policy(ReleasePolicy::default().keep_free(16 * MIB))
        .unwrap();
    let blocks: Vec<_> = (0..4)
        .map(|_| pool.try_allocate(8 * MIB, &stream).unwrap())
        .collect();
    assert_eq!(pool.pool_size(), 32 * MIB);
    for p in blocks {
        free(&pool, p, 8 * MIB, &stream);
    }
    assert_eq!(pool.pool_size(), 16 * MIB);
    assert_eq!(pool.statistics().free_bytes, 16 * MIB);
    stream.synchronize_blocking().unwrap();
    assert_eq!(allocated(&device), 16 * MIB);
    // Setting a lower threshold applies it at once.
    pool.set_release_policy(ReleasePolicy::default().keep_free(0))
        .unwrap();
    assert_eq!(pool.pool_size(), 0);
}

/// A chunk still partly in use never goes back, whatever the threshold.
#[test]
fn keep_free_never_gives_back_a_chunk_in_use() {
    let device = host();
    let stream = Stream::new(&device).unwrap();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 4 * MIB, None).unwrap();
    let a = pool.try_allocate(MIB, &stream).unwrap();
    let b = pool.try_allocate(MIB, &stream).unwrap();
    pool.set_release_policy(ReleasePolicy::default().keep_free(0))
        .unwrap();
    free(&pool, a, MIB, &stream);
    assert_eq!(pool.pool_size(), 4 * MIB, "b still lives in the chunk");
    free(&pool, b, MIB, &stream);
    // (b may sit in a shard's sub-chunk: trim gathers those.)
    pool.trim();
    assert_eq!(pool.pool_size(), 0);
}

/// `idle`: a pool that serves nothing for the idle time trims itself.
#[test]
fn an_idle_pool_trims_itself() {
    let (_device, stream, pool) = unbounded();
    pool.set_release_policy(ReleasePolicy::default().idle(Duration::from_millis(10)))
        .unwrap();
    let small = pool.try_allocate(4096, &stream).unwrap();
    let large = pool.try_allocate(8 * MIB, &stream).unwrap();
    free(&pool, small, 4096, &stream);
    free(&pool, large, 8 * MIB, &stream);
    assert!(pool.pool_size() > 0);
    let start = Instant::now();
    while pool.pool_size() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "an idle pool still holds {} bytes",
            pool.pool_size()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // A new policy without idle ends the thread; the pool keeps what it takes again.
    pool.set_release_policy(ReleasePolicy::default()).unwrap();
    let p = pool.try_allocate(8 * MIB, &stream).unwrap();
    free(&pool, p, 8 * MIB, &stream);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(pool.pool_size(), 8 * MIB);
}

/// A request that cannot fit fails with the pool's details: the largest free block, free and
/// reserved bytes, and other streams' free memory as pending frees.
#[test]
fn out_of_memory_carries_the_pools_details() {
    let device = host();
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 8 * MIB, Some(8 * MIB)).unwrap();
    let a = pool.try_allocate(2 * MIB, &s).unwrap();
    let b = pool.try_allocate(4 * MIB, &t).unwrap();
    free(&pool, a, 2 * MIB, &s);
    let e = pool.try_allocate(6 * MIB, &t).unwrap_err();
    let d = e.out_of_memory_details().expect("the pool gives details");
    assert_eq!(d.largest_free_block, Some(2 * MIB), "{e}");
    assert_eq!(d.free_bytes, Some(4 * MIB), "{e}");
    assert_eq!(d.reserved_bytes, Some(8 * MIB), "{e}");
    // (Before failing, the pool gathers its free memory on one stream, so whose it is
    // depends on that; it is never the requester's.)
    assert_eq!(
        d.pending_frees.iter().map(|p| p.1).sum::<usize>(),
        4 * MIB,
        "{e}"
    );
    assert!(!d.pending_frees.iter().any(|p| p.0 == t.id()), "{e}");
    assert!(e.to_string().contains("largest free block 2097152"), "{e}");
    free(&pool, b, 4 * MIB, &t);
}
