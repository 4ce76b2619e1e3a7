//! The mapped pool on a GPU: real `cuMemCreate`/`cuMemMap`/`cuMemUnmap` under it.

use std::collections::BTreeMap;

use futures::executor::block_on;
use streamalloc::*;

use crate::common::SplitMix64;
use crate::{gpu, kernels};

const MIB: usize = 1 << 20;

fn device_used(device: &Device) -> usize {
    let info = device.memory_info().unwrap();
    info.total - info.free
}

/// Data written into blocks that span pages mapped at different times (growth in place)
/// reads back intact, also after the pages were released and mapped again.
#[test]
#[ignore = "needs a CUDA device"]
fn mapped_pool_data_reads_back_across_pages_and_remaps() {
    let device = gpu();
    let s = Stream::new(&device).unwrap();
    let pool = MappedPoolResource::new(&device).unwrap();
    for round in 0..2u8 {
        let sizes = [1000, 3 * MIB + 17, 256, 9 * MIB, 5 * MIB + 3];
        let mut bufs = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let mut b = DeviceBuffer::try_new(n, &s, pool.clone()).unwrap();
            b.fill(round * 16 + i as u8).unwrap();
            bufs.push(b);
        }
        for (i, b) in bufs.into_iter().enumerate() {
            let n = b.len();
            let host = block_on(b.copy_to_host(vec![0u8; n])).unwrap();
            assert!(
                host.iter().all(|&x| x == round * 16 + i as u8),
                "round {round} block {i}"
            );
        }
        s.synchronize_blocking().unwrap();
        pool.trim();
        assert_eq!(pool.statistics().reserved_bytes, 0, "round {round}");
    }
}

/// Released pages go back to the device (`cuMemGetInfo` sees them), and the range is reused.
#[test]
#[ignore = "needs a CUDA device"]
fn mapped_pool_gives_physical_memory_back_to_the_device() {
    let device = gpu();
    let s = Stream::new(&device).unwrap();
    let before = device_used(&device);
    let pool = MappedPoolResource::new(&device).unwrap();
    let p = pool.try_allocate(512 * MIB, &s).unwrap();
    assert!(device_used(&device) >= before + 512 * MIB);
    // SAFETY: `p` is a live 512 MiB allocation of `pool`, used by nothing.
    unsafe { pool.deallocate(p, 512 * MIB, &s) };
    s.synchronize_blocking().unwrap();
    pool.trim();
    assert_eq!(pool.statistics().reserved_bytes, 0);
    assert!(device_used(&device) <= before + 4 * MIB, "not given back");
    // Above 1 MiB: placed from the bottom of the range, where `p` was.
    let q = pool.try_allocate(2 * MIB, &s).unwrap();
    assert_eq!(q, p, "the range is used again from its start");
    // SAFETY: as above.
    unsafe { pool.deallocate(q, 2 * MIB, &s) };
}

/// A block freed while a kernel still writes it: its pages must stay mapped until the kernel is
/// done (unmapping under it would fault the context), and another stream that takes the memory
/// waits for the kernel.
#[test]
#[ignore = "needs a CUDA device"]
fn mapped_pool_never_unmaps_under_a_running_kernel() {
    let device = gpu();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let pool = MappedPoolResource::new(&device).unwrap();
    let n = 16 * MIB;
    let buf = DeviceBuffer::try_new(n, &a, pool.clone()).unwrap();
    kernels::launch_spin_then_fill(&a, buf.ptr().addr(), n, 0xab, 200_000_000).unwrap();
    drop(buf); // a stream-ordered free on `a`, while the kernel spins
    assert_eq!(pool.trim(), 0, "released pages a running kernel uses");
    assert!(pool.statistics().pending_release_bytes >= n);
    let reuse = DeviceBuffer::try_new(n, &b, pool.clone()).unwrap();
    let host = block_on(reuse.copy_to_host(vec![0u8; n])).unwrap();
    assert!(
        host.iter().all(|&x| x == 0xab),
        "b read before a's kernel wrote"
    );
    a.synchronize_blocking().unwrap();
    b.synchronize_blocking().unwrap();
}

/// W4 (`../shared/bench/WORKLOADS.md`), sampled with `cuMemGetInfo` after every allocation:
/// peak device memory in use over peak live bytes, at most 1.05.
#[test]
#[ignore = "needs a CUDA device"]
fn mapped_pool_w4_footprint_is_within_five_percent() {
    let device = gpu();
    let s = Stream::new(&device).unwrap();
    let before = device_used(&device);
    let mr = MappedPoolResource::new(&device).unwrap();
    let mut rng = SplitMix64(9);
    let mut expiring: BTreeMap<u64, Vec<(DevicePtr, usize)>> = BTreeMap::new();
    let (mut live, mut peak_live, mut peak_used) = (0usize, 0usize, 0usize);
    for i in 0..20_000u64 {
        let k = rng.next() % 100;
        let block = if k < 50 {
            Some((1 + (rng.next() % 65_536) as usize, 1 + rng.next() % 1_000))
        } else if k < 55 {
            Some((
                (1 << 20) + (rng.next() % (63 << 20)) as usize,
                1 + rng.next() % 50,
            ))
        } else {
            None
        };
        if let Some((size, lifetime)) = block {
            let p = mr.try_allocate(size, &s).unwrap();
            live += size;
            peak_live = peak_live.max(live);
            peak_used = peak_used.max(device_used(&device).saturating_sub(before));
            expiring.entry(i + lifetime).or_default().push((p, size));
        }
        for (p, size) in expiring.remove(&i).unwrap_or_default() {
            // SAFETY: a live allocation of `mr` with its size, used by nothing.
            unsafe { mr.deallocate(p, size, &s) };
            live -= size;
        }
    }
    for (p, size) in expiring.into_values().flatten() {
        // SAFETY: as above.
        unsafe { mr.deallocate(p, size, &s) };
    }
    let ratio = peak_used as f64 / peak_live as f64;
    println!(
        "W4 mapped pool (GPU): peak live {peak_live}, peak device {peak_used}, ratio {ratio:.4}"
    );
    assert!(ratio <= 1.05, "W4 ratio {ratio:.4}");
}

/// W1 on the default pool: after the first pair, the loop keeps its page mapped (no
/// `cuMemMap`/`cuMemUnmap` per pair: the mapped bytes and their peak stay one granule), and a
/// block spanning a run of freshly mapped pages (one `cuMemSetAccess` over the run) is usable.
#[test]
#[ignore = "needs a CUDA device"]
fn mapped_pool_default_keeps_the_page_of_a_pair_loop() {
    let device = gpu();
    let s = Stream::new(&device).unwrap();
    let pool = MappedPoolResource::new(&device).unwrap();
    let g = pool.statistics().granularity;
    let mut rng = SplitMix64(42);
    for _ in 0..10_000 {
        let n = 1 + (rng.next() % (1 << 20)) as usize;
        let p = pool.try_allocate(n, &s).unwrap();
        // SAFETY: just allocated from `pool` with `n`; no work uses it.
        unsafe { pool.deallocate(p, n, &s) };
    }
    let stats = pool.statistics();
    assert_eq!((stats.reserved_bytes, stats.peak_reserved_bytes), (g, g));
    let mut run = DeviceBuffer::try_new(5 * g + 17, &s, pool.clone()).unwrap();
    run.fill(0x5a).unwrap();
    let host = block_on(run.copy_to_host(vec![0u8; 5 * g + 17])).unwrap();
    assert!(host.iter().all(|&x| x == 0x5a));
    drop(run);
    s.synchronize_blocking().unwrap();
    pool.trim();
    assert_eq!(pool.statistics().reserved_bytes, 0);
}
