//! Frees on the shard fast path skip the notify when nobody waits (`nobody_to_notify`, read
//! under the shard's lock): a waiter joining while such a free runs is still served.

use std::time::Duration;

use super::PoolResource;
use crate::test_support::{device as host, free};
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

/// Runs `rounds` races of a free of one of `held` into `pool` on `freer` (the shard fast
/// path) against an awaited allocation of one block on `waiter` through `mr` (the pool, or an
/// adaptor over it), with the free at varying points of the waiter's join. Every waiter must
/// be served.
fn race<R: MemoryResource + Clone + 'static>(
    mr: &R,
    pool: &PoolResource<CudaResource>,
    held: &mut Vec<crate::DevicePtr>,
    freer: &Stream,
    waiter: &Stream,
    rounds: usize,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut served = Vec::new();
    for round in 0..rounds {
        let task = {
            let (mr, s) = (mr.clone(), waiter.clone());
            rt.spawn(async move { mr.allocate(MIB, &s).await })
        };
        if round % 4 == 0 {
            // A quarter of the rounds free only once the waiter has queued, so that waiting is
            // exercised however the machine schedules the others.
            let queued = std::time::Instant::now();
            while mr.availability().unwrap().stats().waiting == 0 {
                assert!(
                    queued.elapsed() < Duration::from_secs(10),
                    "round {round}: never queued"
                );
                std::thread::yield_now();
            }
        } else {
            for _ in 0..(round * 37) % 2_000 {
                std::hint::spin_loop();
            }
        }
        free(pool, held.pop().unwrap(), MIB, freer);
        let p = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), task).await })
            .unwrap_or_else(|_| panic!("round {round}: the waiter was never woken"))
            .unwrap()
            .unwrap();
        served.push(p);
    }
    for p in served {
        free(mr, p, MIB, waiter);
    }
    // The rounds that waited for it queued: the pool was full.
    assert!(mr.availability().unwrap().stats().waits >= rounds as u64 / 4);
}

#[test]
fn a_free_racing_a_joining_waiter_never_loses_it() {
    let device = host();
    let (freer, waiter) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let (pool, mut held) = full_pool(&freer);
    race(&pool, &pool, &mut held, &freer, &waiter, 64);
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
    race(&limited, &pool, &mut held, &freer, &waiter, 64);
    for p in held {
        free(&pool, p, MIB, &freer);
    }
}
