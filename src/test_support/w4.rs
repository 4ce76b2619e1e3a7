//! W4 of `../shared/bench/WORKLOADS.md` (the footprint workload) on the host backend, with the
//! driver calls it makes: on the host a driver call is cheap, so the count of calls, not the
//! time, is what tells how a resource would fare on a GPU.

use std::fmt;

use super::{free, SplitMix64};
use crate::{Device, DevicePtr, FaultPoint, MemoryResource, Stream};

/// Driver calls that take or give back device memory, and event records, counted by the
/// host device ([`HostControls::calls`](crate::HostControls::calls)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DriverCalls {
    /// `cuMemAlloc` (raw allocations; the host counts `cuMemCreate`'s charge as one too,
    /// taken off here).
    pub(crate) alloc: usize,
    /// `cuMemFree`.
    pub(crate) free: usize,
    /// `cuMemCreate`.
    pub(crate) create: usize,
    /// `cuMemMap` (one per page).
    pub(crate) map: usize,
    /// `cuMemUnmap`.
    pub(crate) unmap: usize,
    /// `cuMemRelease`.
    pub(crate) release: usize,
    /// `cuEventRecord`.
    pub(crate) record: usize,
}

impl DriverCalls {
    /// The counts of `device` (a host device) so far.
    pub(crate) fn of(device: &Device) -> Self {
        let c = device.host_controls().expect("a host device");
        let create = c.calls(FaultPoint::VmmCreate);
        DriverCalls {
            alloc: c.calls(FaultPoint::Allocation) - create,
            free: c.calls(FaultPoint::Free),
            create,
            map: c.calls(FaultPoint::VmmMap),
            unmap: c.calls(FaultPoint::VmmUnmap),
            release: c.calls(FaultPoint::VmmRelease),
            record: c.calls(FaultPoint::EventRecord),
        }
    }

    /// The calls made since `before`.
    pub(crate) fn since(self, before: Self) -> Self {
        DriverCalls {
            alloc: self.alloc - before.alloc,
            free: self.free - before.free,
            create: self.create - before.create,
            map: self.map - before.map,
            unmap: self.unmap - before.unmap,
            release: self.release - before.release,
            record: self.record - before.record,
        }
    }

    /// Calls that move device memory (all but event records).
    pub(crate) fn memory(&self) -> usize {
        self.alloc + self.free + self.create + self.map + self.unmap + self.release
    }
}

impl fmt::Display for DriverCalls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cuMemAlloc {}, cuMemFree {}, cuMemCreate {}, cuMemMap {}, cuMemUnmap {}, \
             cuMemRelease {}, cuEventRecord {}",
            self.alloc, self.free, self.create, self.map, self.unmap, self.release, self.record
        )
    }
}

/// The figures of one W4 pass.
#[derive(Debug, Clone, Copy)]
pub(crate) struct W4 {
    /// The most bytes live at once (as requested).
    pub(crate) peak_live: usize,
    /// The most `held()` read after an allocation.
    pub(crate) peak_held: usize,
    /// Driver calls over the whole pass, the final frees included.
    pub(crate) calls: DriverCalls,
    /// Driver calls over the second half of the steps: the steady state, once the resource
    /// has seen the workload's sizes.
    pub(crate) steady: DriverCalls,
}

/// W4's steps.
pub(crate) const W4_STEPS: usize = 20_000;

impl W4 {
    /// Peak held over peak live.
    pub(crate) fn ratio(&self) -> f64 {
        self.peak_held as f64 / self.peak_live as f64
    }

    /// Calls that move device memory per step, over the steady half.
    pub(crate) fn steady_calls_per_step(&self) -> f64 {
        self.steady.memory() as f64 / (W4_STEPS / 2) as f64
    }
}

impl fmt::Display for W4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "peak live {} B, peak held {} B, ratio {:.3}; calls {} ({:.4} per step); \
             steady half: {} ({:.4} per step)",
            self.peak_live,
            self.peak_held,
            self.ratio(),
            self.calls,
            self.calls.memory() as f64 / W4_STEPS as f64,
            self.steady,
            self.steady_calls_per_step(),
        )
    }
}

/// One W4 step's allocation, if the step makes one: (bytes, steps it lives). Half the steps
/// take up to 64 KiB for up to 1,000 steps, one in twenty 1–64 MiB for up to 50.
pub(crate) fn w4_block(rng: &mut SplitMix64) -> Option<(usize, usize)> {
    let k = rng.next() % 100;
    if k < 50 {
        let bytes = 1 + (rng.next() % 65_536) as usize;
        Some((bytes, 1 + (rng.next() % 1_000) as usize))
    } else if k < 55 {
        let bytes = (1 << 20) + (rng.next() % (63 << 20)) as usize;
        Some((bytes, 1 + (rng.next() % 50) as usize))
    } else {
        None
    }
}

/// Runs W4 (seed 9, [`W4_STEPS`] steps, one stream) on `mr` of the host device `device`;
/// `held` reads what it holds of the device after each allocation.
pub(crate) fn w4<R: MemoryResource>(
    mr: &R,
    device: &Device,
    stream: &Stream,
    held: impl Fn() -> usize,
) -> W4 {
    let start = DriverCalls::of(device);
    let mut half = start;
    let mut rng = SplitMix64(9);
    // (expiry step, pointer, bytes), in allocation order.
    let mut live: Vec<(usize, DevicePtr, usize)> = Vec::new();
    let (mut live_bytes, mut peak_live, mut peak_held) = (0usize, 0usize, 0usize);
    for i in 0..W4_STEPS {
        if i == W4_STEPS / 2 {
            half = DriverCalls::of(device);
        }
        if let Some((bytes, lifetime)) = w4_block(&mut rng) {
            let p = mr
                .try_allocate(bytes, stream)
                .unwrap_or_else(|e| panic!("W4 step {i}: {e}"));
            live.push((i + lifetime, p, bytes));
            live_bytes += bytes;
            peak_live = peak_live.max(live_bytes);
            peak_held = peak_held.max(held());
        }
        live.retain(|&(expiry, p, bytes)| {
            if expiry == i {
                free(mr, p, bytes, stream);
                live_bytes -= bytes;
            }
            expiry != i
        });
    }
    let steady = DriverCalls::of(device).since(half);
    for (_, p, bytes) in live.drain(..) {
        free(mr, p, bytes, stream);
    }
    W4 {
        peak_live,
        peak_held,
        calls: DriverCalls::of(device).since(start),
        steady,
    }
}
