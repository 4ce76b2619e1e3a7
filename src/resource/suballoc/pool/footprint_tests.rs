//! W4 of `../shared/bench/WORKLOADS.md` on the host backend: how much the pool takes from its
//! upstream for the memory it hands out, under its default growth.

use super::PoolResource;
use crate::test_support::{free, SplitMix64};
use crate::{CudaResource, Device, DevicePtr, HostConfig, MemoryResource, Stream};

/// The figures of one W4 pass: the most bytes live at once, and the most the pool held from
/// its upstream (sampled after every allocation, as WORKLOADS.md does on the device).
#[derive(Debug, Clone, Copy)]
pub(super) struct Footprint {
    pub(super) peak_live: usize,
    pub(super) peak_held: usize,
}

impl Footprint {
    pub(super) fn ratio(&self) -> f64 {
        self.peak_held as f64 / self.peak_live as f64
    }
}

/// Runs W4 (seed 9, 20,000 steps, one stream) on `pool`; `held` reads what it holds upstream.
pub(super) fn w4<R: MemoryResource>(
    pool: &PoolResource<R>,
    stream: &Stream,
    held: impl Fn() -> usize,
) -> Footprint {
    let mut rng = SplitMix64(9);
    // (expiry step, pointer, bytes), in allocation order.
    let mut live: Vec<(usize, DevicePtr, usize)> = Vec::new();
    let (mut live_bytes, mut peak_live, mut peak_held) = (0usize, 0usize, 0usize);
    for i in 0..20_000usize {
        let k = rng.next() % 100;
        let block = if k < 50 {
            let bytes = 1 + (rng.next() % 65_536) as usize;
            Some((bytes, 1 + (rng.next() % 1_000) as usize))
        } else if k < 55 {
            let bytes = (1 << 20) + (rng.next() % (63 << 20)) as usize;
            Some((bytes, 1 + (rng.next() % 50) as usize))
        } else {
            None
        };
        if let Some((bytes, lifetime)) = block {
            let p = pool
                .try_allocate(bytes, stream)
                .unwrap_or_else(|e| panic!("W4 step {i}: {e}"));
            live.push((i + lifetime, p, bytes));
            live_bytes += bytes;
            peak_live = peak_live.max(live_bytes);
            peak_held = peak_held.max(held());
        }
        live.retain(|&(expiry, p, bytes)| {
            if expiry == i {
                free(pool, p, bytes, stream);
                live_bytes -= bytes;
            }
            expiry != i
        });
    }
    for (_, p, bytes) in live.drain(..) {
        free(pool, p, bytes, stream);
    }
    Footprint {
        peak_live,
        peak_held,
    }
}

/// W4's pool: over device memory, empty at first, no maximum.
///
/// The device is large enough never to bound W4 (1 TiB of address space, untouched): the host
/// backend frees in stream order on the stream's worker thread, and counts a queued free as
/// allocated until the worker reaches it. An optimised build runs W4 in about 10 ms, far ahead
/// of the worker, with up to 17 GB of the chunks the pool gave back still queued: over the
/// default 16 GiB, the pool's growth was refused (a spurious out-of-memory, in release builds
/// only). What is measured, the bytes the pool holds, does not depend on the device's size.
fn w4_default() -> Footprint {
    let device = Device::host_with(HostConfig::default().capacity(1 << 40));
    let stream = Stream::new(&device).unwrap();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
    let held = pool.clone();
    w4(&pool, &stream, move || held.pool_size())
}

/// The growth policy's bound: on W4 the pool holds at most 1.10 × the peak of live bytes from
/// its upstream (RMM's pool, which doubles, holds 1.64 ×; doubling growth 2 ×).
#[test]
fn w4_holds_at_most_a_tenth_more_than_the_peak_of_live_bytes() {
    let f = w4_default();
    eprintln!("W4 footprint: {f:?}, ratio {:.3}", f.ratio());
    assert!(f.ratio() <= 1.10, "W4: {f:?}, ratio {:.3}", f.ratio());
}
