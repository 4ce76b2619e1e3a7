//! Frees on the shard fast path skip the notify when nobody waits (`nobody_to_notify`, read
//! under the shard's lock): a waiter joining while such a free runs is still served.

use super::PoolResource;
use crate::test_support::{device as host, free, race};
use crate::{CudaResource, LimitingAdaptor, MemoryResource, Stream};

const MIB: usize = 1 << 20;

/// A full sharded pool (bounded, at the sharding threshold) and the 1 MiB blocks that fill it,
/// allocated on `stream`.
fn full_pool(stream: &Stream) -> (PoolResource<CudaResource>, Vec<crate::DevicePtr>) {
    let size = super::inner::SHARDED_CAPACITY;
    let upstream = CudaResource::new(stream.device()).unwrap();
    let pool = PoolResource::new(upstream, size, Some(size)).unwrap();
    let mut held = Vec::new();
    while let Ok(p) = pool.try_allocate(MIB, stream) {
        held.push(p);
    }
    assert!(held.len() > 64, "the pool holds {} blocks", held.len());
    (pool, held)
}

#[test]
fn a_free_racing_a_joining_waiter_never_loses_it() {
    let device = host();
    let (freer, waiter) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let (pool, mut held) = full_pool(&freer);
    race(&pool, &pool, &mut held, MIB, &freer, &waiter, 64);
    for p in held {
        free(&pool, p, MIB, &freer);
    }
}

/// The waiter at an adaptor with a wait queue of its own over the pool, the frees straight
/// into the pool: they reach the waiter through the follower chain alone, and its join runs
/// the pool's barrier.
#[test]
fn a_free_racing_a_waiter_at_a_follower_never_loses_it() {
    let device = host();
    let (freer, waiter) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let (pool, mut held) = full_pool(&freer);
    let limited = LimitingAdaptor::new(pool.clone(), usize::MAX / 2);
    race(&limited, &pool, &mut held, MIB, &freer, &waiter, 64);
    for p in held {
        free(&pool, p, MIB, &freer);
    }
}
