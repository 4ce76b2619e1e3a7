//! Fault injection of the host backend: a count of calls still to fail, per kind of driver
//! call.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::Error;
use crate::ids::DeviceId;

/// A kind of driver call that the host backend can make fail on purpose
/// ([`HostControls::fail_next`](crate::HostControls::fail_next)).
///
/// Each names the CUDA driver call it stands for; an injected failure is the error that call
/// would return. Calls that enqueue work on a stream ([`Copy`](Self::Copy),
/// [`Memset`](Self::Memset)) fail *asynchronously*, as a faulting kernel does on a GPU: the
/// enqueue succeeds and the stream reports the error at every event recorded after it. The
/// others fail synchronously: the call returns the error and does nothing.
///
/// # Examples
///
/// ```
/// use streamalloc::{Device, Error, FaultPoint, HostConfig, Stream};
///
/// let device = Device::host_with(HostConfig::default());
/// let controls = device.host_controls().unwrap();
/// controls.fail_next(FaultPoint::StreamCreate, 1);
/// let Err(Error::Driver { call, .. }) = Stream::new(&device) else { panic!() };
/// assert_eq!(call, "cuStreamCreate");
/// assert_eq!(controls.faults_injected(FaultPoint::StreamCreate), 1);
/// assert!(Stream::new(&device).is_ok()); // only the next one failed
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultPoint {
    /// A raw allocation of any memory kind, from a driver pool included (`cuMemAlloc`,
    /// `cuMemAllocAsync`, …): fails with [`Error::OutOfMemory`].
    Allocation,
    /// A raw free, plain or stream-ordered, into a driver pool included (`cuMemFree`,
    /// `cuMemFreeAsync`): the block stays allocated, as when the driver call fails.
    Free,
    /// A copy (`cuMemcpyAsync`), asynchronously.
    Copy,
    /// A memset (`cuMemsetD8Async`), asynchronously.
    Memset,
    /// Recording an event (`cuEventRecord`).
    EventRecord,
    /// Making a stream wait for an event (`cuStreamWaitEvent`).
    StreamWait,
    /// Enqueuing a host function (`cuLaunchHostFunc`), the completion driver's notifications
    /// included.
    HostFunction,
    /// Creating a stream (`cuStreamCreate`), a default stream's first use included.
    StreamCreate,
    /// Creating a driver pool (`cuMemPoolCreate`).
    PoolCreate,
    /// Trimming a driver pool (`cuMemPoolTrimTo`).
    PoolTrim,
    /// Prefetching managed memory (`cuMemPrefetchAsync`).
    Prefetch,
    /// Reserving a virtual address range (`cuMemAddressReserve`).
    VmmReserve,
    /// Freeing a virtual address range (`cuMemAddressFree`).
    VmmFreeReservation,
    /// Creating physical memory (`cuMemCreate`; [`Allocation`](Self::Allocation) failures
    /// apply to it as well, as out-of-memory).
    VmmCreate,
    /// Releasing physical memory (`cuMemRelease`): it stays allocated.
    VmmRelease,
    /// Mapping physical memory into a reserved range and granting access (`cuMemMap`,
    /// `cuMemSetAccess`).
    VmmMap,
    /// Unmapping (`cuMemUnmap`): the range stays mapped.
    VmmUnmap,
}

impl FaultPoint {
    /// Every fault point.
    pub const ALL: [FaultPoint; 17] = [
        FaultPoint::Allocation,
        FaultPoint::Free,
        FaultPoint::Copy,
        FaultPoint::Memset,
        FaultPoint::EventRecord,
        FaultPoint::StreamWait,
        FaultPoint::HostFunction,
        FaultPoint::StreamCreate,
        FaultPoint::PoolCreate,
        FaultPoint::PoolTrim,
        FaultPoint::Prefetch,
        FaultPoint::VmmReserve,
        FaultPoint::VmmFreeReservation,
        FaultPoint::VmmCreate,
        FaultPoint::VmmRelease,
        FaultPoint::VmmMap,
        FaultPoint::VmmUnmap,
    ];

    /// The CUDA driver call this point stands for (the `call` of the injected
    /// [`Error::Driver`]).
    ///
    /// ```
    /// assert_eq!(streamalloc::FaultPoint::EventRecord.driver_call(), "cuEventRecord");
    /// ```
    pub fn driver_call(self) -> &'static str {
        match self {
            FaultPoint::Allocation => "cuMemAlloc",
            FaultPoint::Free => "cuMemFreeAsync",
            FaultPoint::Copy => "cuMemcpyAsync",
            FaultPoint::Memset => "cuMemsetD8Async",
            FaultPoint::EventRecord => "cuEventRecord",
            FaultPoint::StreamWait => "cuStreamWaitEvent",
            FaultPoint::HostFunction => "cuLaunchHostFunc",
            FaultPoint::StreamCreate => "cuStreamCreate",
            FaultPoint::PoolCreate => "cuMemPoolCreate",
            FaultPoint::PoolTrim => "cuMemPoolTrimTo",
            FaultPoint::Prefetch => "cuMemPrefetchAsync",
            FaultPoint::VmmReserve => "cuMemAddressReserve",
            FaultPoint::VmmFreeReservation => "cuMemAddressFree",
            FaultPoint::VmmCreate => "cuMemCreate",
            FaultPoint::VmmRelease => "cuMemRelease",
            FaultPoint::VmmMap => "cuMemMap",
            FaultPoint::VmmUnmap => "cuMemUnmap",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

const POINTS: usize = FaultPoint::ALL.len();

/// Per fault point: calls still to fail, failures injected so far, and calls made so far.
#[derive(Debug, Default)]
pub(super) struct Faults {
    armed: [AtomicUsize; POINTS],
    injected: [AtomicUsize; POINTS],
    calls: [AtomicUsize; POINTS],
}

impl Faults {
    pub(super) fn arm(&self, point: FaultPoint, n: usize) {
        self.armed[point.index()].store(n, Ordering::Release);
    }

    pub(super) fn injected(&self, point: FaultPoint) -> usize {
        self.injected[point.index()].load(Ordering::Acquire)
    }

    pub(super) fn calls(&self, point: FaultPoint) -> usize {
        self.calls[point.index()].load(Ordering::Relaxed)
    }

    /// Whether this call of `point` fails (and counts it if so). Every call of `point`
    /// asks once, so this also counts the calls.
    pub(super) fn fires(&self, point: FaultPoint) -> bool {
        self.calls[point.index()].fetch_add(1, Ordering::Relaxed);
        let armed = &self.armed[point.index()];
        // A plain load first: the usual answer, no fault armed, costs no read-modify-write.
        if armed.load(Ordering::Acquire) == 0 {
            return false;
        }
        let fired = armed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if fired {
            self.injected[point.index()].fetch_add(1, Ordering::AcqRel);
        }
        fired
    }

    /// The error of `point`'s call when it fails now, `None` when it goes ahead.
    pub(super) fn check(&self, point: FaultPoint, device: DeviceId) -> Option<Error> {
        self.fires(point).then(|| injected_error(point, device))
    }
}

/// The driver error an injected failure of `point` returns.
pub(super) fn injected_error(point: FaultPoint, device: DeviceId) -> Error {
    Error::Driver {
        call: point.driver_call(),
        code: 999,
        name: "CUDA_ERROR_UNKNOWN (injected)".into(),
        device,
    }
}
