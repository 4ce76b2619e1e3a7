//! What each thread of a per-thread replay runs: its operations in order against the shared
//! resource, with the slots that carry allocations from one thread to another.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::super::failure::{ReplayFailure, ReplayFailureKind};
use super::super::options::ReplayOptions;
use super::super::stack::reserved_now;
use super::plan::Op;
use crate::adaptor::TimelineAdaptor;
use crate::resource::{DevicePtr, Fragmentation, MemoryResource, MemorySnapshot, Timeline};
use crate::rmm_csv::Action;
use crate::stream::Stream;

/// A slot whose allocation is not made yet. (Allocations are 256-aligned: no pointer is
/// either marker.)
const PENDING: u64 = u64::MAX;
/// A slot whose allocation the resource refused: its free is no second failure.
const REFUSED: u64 = u64::MAX - 1;

/// What every thread shares: the resource, the slots, the figures counted across threads.
pub(super) struct Shared<'a, M: ?Sized, T: MemoryResource> {
    mr: &'a M,
    timeline: Option<&'a TimelineAdaptor<T>>,
    options: &'a ReplayOptions,
    /// Per slot: whether another thread waits for it (from the plan).
    awaited: &'a [bool],
    /// Per slot: [`PENDING`], [`REFUSED`] or the pointer made.
    slots: Box<[AtomicU64]>,
    /// Taken by a thread that waits for a slot and by one that fills an awaited slot, so that
    /// no wake-up is lost.
    gate: Mutex<()>,
    made: Condvar,
    /// A thread panicked: nobody waits for its slots any more.
    aborted: AtomicBool,
    /// Logged bytes live now, and their peak (of this interleaving).
    live: AtomicUsize,
    pub(super) peak_live: AtomicUsize,
    /// The most reserved bytes read (recording pass).
    pub(super) peak_reserved: AtomicUsize,
}

/// What one thread did.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) allocations: u64,
    pub(super) frees: u64,
    pub(super) refused: u64,
    pub(super) waits: u64,
    pub(super) waited: Duration,
    pub(super) free_waits: u64,
    pub(super) operations: u64,
    /// Its first refusals, in its (log) order.
    pub(super) failures: Vec<ReplayFailure>,
    /// What it read right after the snapshot line, if it replayed it.
    pub(super) peak: Option<Peak>,
}

/// The resource and the timeline right after the snapshot line.
#[derive(Debug)]
pub(super) struct Peak {
    pub(super) snapshot: Option<MemorySnapshot>,
    pub(super) fragmentation: Option<Fragmentation>,
    pub(super) timeline: Option<Timeline>,
}

/// Marks the replay aborted if its thread unwinds, waking every waiter, so that no thread
/// waits for ever for a slot of a thread that panicked.
struct AbortOnPanic<'s, 'a, M: ?Sized, T: MemoryResource>(&'s Shared<'a, M, T>);

impl<M: ?Sized, T: MemoryResource> Drop for AbortOnPanic<'_, '_, M, T> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.aborted.store(true, Ordering::Release);
            drop(self.0.gate.lock());
            self.0.made.notify_all();
        }
    }
}

impl<'a, M: MemoryResource + ?Sized, T: MemoryResource> Shared<'a, M, T> {
    pub(super) fn new(
        mr: &'a M,
        timeline: Option<&'a TimelineAdaptor<T>>,
        options: &'a ReplayOptions,
        awaited: &'a [bool],
    ) -> Self {
        Shared {
            mr,
            timeline,
            options,
            awaited,
            slots: awaited.iter().map(|_| AtomicU64::new(PENDING)).collect(),
            gate: Mutex::new(()),
            made: Condvar::new(),
            aborted: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            peak_live: AtomicUsize::new(0),
            peak_reserved: AtomicUsize::new(0),
        }
    }

    /// The pointer made for `slot`, once every thread has finished; `None` when its
    /// allocation was refused (or never made).
    pub(super) fn made_for(&self, slot: usize) -> Option<DevicePtr> {
        match self.slots[slot].load(Ordering::Acquire) {
            PENDING | REFUSED => None,
            p => Some(DevicePtr::from_raw(p)),
        }
    }

    /// Runs one thread's operations, in order.
    pub(super) fn run(&self, ops: &[Op]) -> Tally {
        let _abort = AbortOnPanic(self);
        let mut tally = Tally::default();
        for op in ops {
            match op {
                Op::Allocate {
                    slot,
                    logged,
                    bytes,
                    line,
                    stream,
                } => self.allocate(&mut tally, *slot, *logged, *bytes, *line, stream),
                Op::Free {
                    slot,
                    bytes,
                    stream,
                    cross,
                    ..
                } => self.free(&mut tally, *slot, *bytes, stream, *cross),
            }
            if self.options.snapshot_line == Some(op.line()) {
                let snapshot = self.mr.snapshot();
                tally.peak = Some(Peak {
                    fragmentation: match &snapshot {
                        Some(s) => Some(s.fragmentation()),
                        None => self.mr.fragmentation(),
                    },
                    snapshot,
                    timeline: self.timeline.map(TimelineAdaptor::timeline),
                });
            }
        }
        tally
    }

    /// An awaited allocation with the replay's deadline: served at once when memory is
    /// there; else, when the resource says memory may come back, the thread parks until it
    /// does or the deadline passes (a wait, timed).
    fn allocate(
        &self,
        tally: &mut Tally,
        slot: usize,
        logged: DevicePtr,
        bytes: usize,
        line: usize,
        stream: &Stream,
    ) {
        tally.operations += 1;
        let mr = &self.mr;
        let mut future =
            pin!(MemoryResource::allocate(mr, bytes, stream).timeout(self.options.wait_timeout));
        let first = future
            .as_mut()
            .poll(&mut Context::from_waker(futures::task::noop_waker_ref()));
        let result = match first {
            Poll::Ready(done) => done,
            Poll::Pending => {
                let waiting = Instant::now();
                let done = futures::executor::block_on(future);
                tally.waited += waiting.elapsed();
                tally.operations += 1;
                if done.is_ok() {
                    tally.waits += 1;
                }
                done
            }
        };
        self.called();
        let value = match result {
            Ok(ptr) => {
                tally.allocations += 1;
                let live = self.live.fetch_add(bytes, Ordering::AcqRel) + bytes;
                self.peak_live.fetch_max(live, Ordering::Relaxed);
                ptr.addr()
            }
            Err(error) => {
                tally.refused += 1;
                if tally.failures.len() < self.options.max_failures {
                    tally.failures.push(ReplayFailure {
                        line,
                        action: Action::Allocate,
                        ptr: logged,
                        bytes,
                        kind: ReplayFailureKind::AllocationFailed(error),
                    });
                }
                REFUSED
            }
        };
        self.slots[slot].store(value, Ordering::Release);
        if self.awaited[slot] {
            drop(self.gate.lock());
            self.made.notify_all();
        }
    }

    /// Frees `slot`'s allocation, once it is made when it is another thread's; nothing when
    /// it was refused.
    fn free(&self, tally: &mut Tally, slot: usize, bytes: usize, stream: &Stream, cross: bool) {
        let value = if cross {
            self.wait_for(tally, slot)
        } else {
            // This thread made it, earlier.
            self.slots[slot].load(Ordering::Relaxed)
        };
        if value == PENDING || value == REFUSED {
            return;
        }
        tally.operations += 1;
        // Not live from here: before the free, so that an allocation the free lets through
        // (on another thread) finds these bytes gone from the count.
        self.live.fetch_sub(bytes, Ordering::Release);
        // SAFETY: `value` is the pointer `mr.allocate(bytes, ..)` gave for this slot, and the
        // plan has one free per slot, so it is freed once, with its size; the replay never
        // touches the memory, so no work needs ordering before the free.
        unsafe {
            self.mr
                .deallocate(DevicePtr::from_raw(value), bytes, stream)
        };
        self.called();
        tally.frees += 1;
    }

    /// `slot`'s value once its thread has made (or refused) it, parked meanwhile; `PENDING`
    /// only if that thread panicked.
    fn wait_for(&self, tally: &mut Tally, slot: usize) -> u64 {
        let value = self.slots[slot].load(Ordering::Acquire);
        if value != PENDING {
            return value;
        }
        tally.free_waits += 1;
        let mut gate = self.gate.lock();
        loop {
            let value = self.slots[slot].load(Ordering::Acquire);
            if value != PENDING || self.aborted.load(Ordering::Acquire) {
                return value;
            }
            self.made.wait(&mut gate);
        }
    }

    /// After a resource call in a recording pass: the reserved bytes' peak.
    fn called(&self) {
        if self.timeline.is_some() {
            self.peak_reserved
                .fetch_max(reserved_now(self.mr), Ordering::Relaxed);
        }
    }
}
