//! The acceptance suite every resource passes, on every backend: RMM's `mr_ref_tests`.
//!
//! `resource_suite!` instantiates it for one resource constructor; each case takes a fresh
//! device (so host-backend accounting starts from zero) and the constructor.

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::thread;

use streamalloc::{Device, DevicePtr, MemoryResource, SharedResource, Stream};

use super::SplitMix64;

pub type Make = fn(&Device) -> SharedResource;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;
const PIB: usize = 1 << 50;

/// Bytes the device has allocated through its raw allocator, where the backend can tell.
fn device_bytes(device: &Device) -> Option<usize> {
    device.host_controls().map(|c| c.allocated_bytes())
}

/// Every free has reached its stream and nothing the resource allocated is still held by the
/// device (for resources that return memory to the device on free).
fn settle(streams: &[&Stream]) {
    for s in streams {
        s.synchronize_blocking().expect("synchronize");
    }
}

/// The largest request `mr` says could ever succeed: the suite asks for no more, except where
/// it checks that larger requests are refused.
fn cap(mr: &SharedResource) -> usize {
    mr.capacity_limit().unwrap_or(usize::MAX)
}

fn assert_aligned(p: DevicePtr) {
    assert!(p.is_aligned(256), "{p:?} is not 256-byte aligned");
}

/// Tracks live ranges and panics if two overlap: the shadow model of the acceptance suite.
#[derive(Default)]
pub struct LiveRanges(BTreeMap<u64, usize>);

impl LiveRanges {
    pub fn insert(&mut self, p: DevicePtr, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let start = p.addr();
        let end = start + bytes as u64;
        if let Some((&s, &b)) = self.0.range(..end).next_back() {
            assert!(
                s + b as u64 <= start,
                "{p:?}+{bytes} overlaps live {s:#x}+{b}"
            );
        }
        self.0.insert(start, bytes);
    }

    pub fn remove(&mut self, p: DevicePtr) {
        if !p.is_null() {
            self.0
                .remove(&p.addr())
                .expect("freeing a range that is not live");
        }
    }
}

fn alloc(mr: &SharedResource, bytes: usize, stream: &Stream) -> DevicePtr {
    let p = mr
        .try_allocate(bytes, stream)
        .unwrap_or_else(|e| panic!("allocate {bytes}: {e}"));
    assert_aligned(p);
    p
}

fn free(mr: &SharedResource, p: DevicePtr, bytes: usize, stream: &Stream) {
    // SAFETY: every caller passes a pointer it allocated from `mr` with `bytes`, used by nothing.
    unsafe { mr.deallocate(p, bytes, stream) }
}

pub fn zero_bytes(device: Device, make: Make) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    let p = alloc(&mr, 0, &s);
    free(&mr, p, 0, &s);
    settle(&[&s]);
}

pub fn allocate_sizes(device: Device, make: Make) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    for bytes in [4, KIB, MIB, GIB] {
        if bytes > cap(&mr) {
            let err = mr
                .try_allocate(bytes, &s)
                .expect_err("over the capacity limit");
            assert!(err.is_out_of_memory(), "{bytes} bytes: {err}");
            continue;
        }
        let p = alloc(&mr, bytes, &s);
        assert!(!p.is_null());
        free(&mr, p, bytes, &s);
    }
    settle(&[&s]);
}

pub fn allocate_too_much(device: Device, make: Make) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    let before = device_bytes(&device);
    let free_before = device.memory_info().unwrap().free;
    let err = mr
        .try_allocate(PIB, &s)
        .expect_err("1 PiB cannot be allocated");
    assert!(err.is_out_of_memory(), "expected out-of-memory, got {err}");
    // Nothing was allocated by the failed request.
    assert_eq!(device_bytes(&device), before);
    let free_after = device.memory_info().unwrap().free;
    assert!(
        free_after + 64 * MIB >= free_before,
        "{free_before} -> {free_after}"
    );
    // The resource still works.
    let p = alloc(&mr, KIB, &s);
    free(&mr, p, KIB, &s);
    settle(&[&s]);
}

pub fn awaited_allocation(device: Device, make: Make) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    let bytes = MIB.min(cap(&mr));
    let p = futures::executor::block_on(mr.allocate(bytes, &s)).unwrap();
    assert_aligned(p);
    free(&mr, p, bytes, &s);
    // A request nothing can satisfy fails at once, even where the resource knows no capacity
    // (the timeout turns the hang that would be the bug into a failure).
    let patience = std::time::Duration::from_secs(20);
    let err = futures::executor::block_on(mr.allocate(PIB, &s).timeout(patience)).unwrap_err();
    assert!(err.is_out_of_memory(), "1 PiB awaited: {err}");
    settle(&[&s]);
}

/// 100 random live allocations up to 5 MiB, checked for overlap, then all freed; twice. The
/// second round must not take more device memory than the first left held: a leaf resource
/// gives everything back, a pool reuses what it kept.
pub fn random_allocations(device: Device, make: Make) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    let mut held_after = Vec::new();
    for round in 0..2 {
        let mut rng = SplitMix64(1);
        let mut ranges = LiveRanges::default();
        let mut live = Vec::new();
        for _ in 0..100 {
            let bytes = rng.size((5 * MIB).min(cap(&mr)));
            let p = alloc(&mr, bytes, &s);
            ranges.insert(p, bytes);
            live.push((p, bytes));
        }
        for (p, bytes) in live {
            ranges.remove(p);
            free(&mr, p, bytes, &s);
        }
        settle(&[&s]);
        held_after.push(device_bytes(&device));
        let _ = round;
    }
    if let [Some(first), Some(second)] = held_after[..] {
        assert!(
            second <= first,
            "device memory grew from {first} to {second} on a repeat"
        );
    }
}

pub fn mixed_allocate_free(device: Device, make: Make) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    let mut rng = SplitMix64(2);
    let mut ranges = LiveRanges::default();
    let mut live: Vec<(DevicePtr, usize)> = Vec::new();
    for _ in 0..200 {
        if live.is_empty() || rng.next() % 100 < 60 {
            let bytes = rng.size(MIB);
            let p = alloc(&mr, bytes, &s);
            ranges.insert(p, bytes);
            live.push((p, bytes));
        } else {
            let i = (rng.next() % live.len() as u64) as usize;
            let (p, bytes) = live.swap_remove(i);
            ranges.remove(p);
            free(&mr, p, bytes, &s);
        }
    }
    for (p, bytes) in live {
        free(&mr, p, bytes, &s);
    }
    settle(&[&s]);
}

pub fn distinct_allocations(device: Device, make: Make) {
    let mr = make(&device);
    let s = Stream::new(&device).unwrap();
    let a = alloc(&mr, 1000, &s);
    let b = alloc(&mr, 1000, &s);
    let mut ranges = LiveRanges::default();
    ranges.insert(a, 1000);
    ranges.insert(b, 1000);
    assert_ne!(a, b);
    free(&mr, a, 1000, &s);
    free(&mr, b, 1000, &s);
    settle(&[&s]);
}

/// Allocates on stream A in one thread, frees on stream B in another.
pub fn cross_thread_cross_stream(device: Device, make: Make) {
    let mr = make(&device);
    let a = Stream::new(&device).unwrap();
    let b = Stream::new(&device).unwrap();
    let mut rng = SplitMix64(3);
    let sizes: Vec<usize> = (0..50).map(|_| rng.size(MIB)).collect();
    let (mr2, a2, sizes2) = (mr.clone(), a.clone(), sizes.clone());
    let allocated = thread::spawn(move || {
        sizes2
            .iter()
            .map(|&bytes| alloc(&mr2, bytes, &a2))
            .collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    // B may reuse the memory only after A's work on it: order B after A, as RMM requires.
    b.wait(&a.record().unwrap()).unwrap();
    let (mr3, b2) = (mr.clone(), b.clone());
    thread::spawn(move || {
        for (p, bytes) in allocated.into_iter().zip(sizes) {
            free(&mr3, p, bytes, &b2);
        }
    })
    .join()
    .unwrap();
    settle(&[&a, &b]);
}

/// The same from four threads at once, each with its own pair of streams.
pub fn four_threads(device: Device, make: Make) {
    let mr = make(&device);
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4u64)
        .map(|i| {
            let (mr, device, barrier) = (mr.clone(), device.clone(), barrier.clone());
            thread::spawn(move || {
                let a = Stream::new(&device).unwrap();
                let b = Stream::new(&device).unwrap();
                let mut rng = SplitMix64(10 + i);
                barrier.wait();
                let mut live = Vec::new();
                for _ in 0..100 {
                    let bytes = rng.size(MIB);
                    live.push((alloc(&mr, bytes, &a), bytes));
                    if rng.next() % 2 == 0 {
                        let (p, bytes) = live.swap_remove(0);
                        free(&mr, p, bytes, &a);
                    }
                }
                b.wait(&a.record().unwrap()).unwrap();
                for (p, bytes) in live {
                    free(&mr, p, bytes, &b);
                }
                settle(&[&a, &b]);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Pointers from all threads must never overlap while live.
pub fn concurrent_distinct(device: Device, make: Make) {
    let mr = make(&device);
    let ranges = Arc::new(parking_lot::Mutex::new(LiveRanges::default()));
    let handles: Vec<_> = (0..4u64)
        .map(|i| {
            let (mr, device, ranges) = (mr.clone(), device.clone(), ranges.clone());
            thread::spawn(move || {
                let s = Stream::new(&device).unwrap();
                let mut rng = SplitMix64(20 + i);
                let mut live = Vec::new();
                for _ in 0..100 {
                    let bytes = rng.size(64 * KIB);
                    let p = alloc(&mr, bytes, &s);
                    ranges.lock().insert(p, bytes);
                    live.push((p, bytes));
                }
                for (p, bytes) in live {
                    ranges.lock().remove(p);
                    free(&mr, p, bytes, &s);
                }
                settle(&[&s]);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Instantiates the acceptance suite for one resource constructor on one device kind.
///
/// `resource_suite!(name, device_expr, |device| make_expr, #[attrs]...)` where `make_expr` is
/// a `SharedResource` built for `device: &Device`.
#[macro_export]
macro_rules! resource_suite {
    ($name:ident, $device:expr, |$d:ident| $make:expr $(, #[$attr:meta])*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::common::suite;

            fn make($d: &::streamalloc::Device) -> ::streamalloc::SharedResource {
                $make
            }

            fn device() -> ::streamalloc::Device {
                $device
            }

            $(#[$attr])* #[test] fn zero_bytes() { suite::zero_bytes(device(), make) }
            $(#[$attr])* #[test] fn allocate_sizes() { suite::allocate_sizes(device(), make) }
            $(#[$attr])* #[test] fn allocate_too_much() { suite::allocate_too_much(device(), make) }
            $(#[$attr])* #[test] fn awaited_allocation() { suite::awaited_allocation(device(), make) }
            $(#[$attr])* #[test] fn random_allocations() { suite::random_allocations(device(), make) }
            $(#[$attr])* #[test] fn mixed_allocate_free() { suite::mixed_allocate_free(device(), make) }
            $(#[$attr])* #[test] fn distinct_allocations() { suite::distinct_allocations(device(), make) }
            $(#[$attr])* #[test] fn cross_thread_cross_stream() { suite::cross_thread_cross_stream(device(), make) }
            $(#[$attr])* #[test] fn four_threads() { suite::four_threads(device(), make) }
            $(#[$attr])* #[test] fn concurrent_distinct() { suite::concurrent_distinct(device(), make) }
            $(#[$attr])* #[test] fn huge_requests_fail_cleanly() { $crate::common::huge_sizes::huge_requests_fail_cleanly(device(), make) }
        }
    };
}
