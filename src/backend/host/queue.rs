//! The ordered queue behind a host stream: its operations, and the worker loop that runs them.

use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::backend::seam::{panic_message, Completion};
use crate::error::{Error, Result};

use super::memory::HostMemory;

/// One queued operation of a host stream.
pub(super) enum Op {
    Delay(Duration),
    /// Wait until another queue has completed this many operations.
    WaitFor(Arc<Queue>, u64),
    Call(Box<dyn FnOnce() + Send>),
    Notify(Arc<Completion>),
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    Set {
        dst: u64,
        value: u8,
        bytes: usize,
    },
    /// An operation that fails when the stream reaches it (an injected copy failure).
    Fail(Error),
}

/// The queue shared by a stream handle, its events and its worker thread.
pub(super) struct Queue {
    pub(super) state: Mutex<QueueState>,
    /// Signalled when work is enqueued or the stream is dropped.
    pub(super) work: Condvar,
    /// Signalled after every completed operation.
    pub(super) progress: Condvar,
    /// Operations completed so far; the worker is the only writer.
    pub(super) completed: AtomicU64,
    /// The first operation that failed, as a position (events at or after it report the
    /// error), and its error. Sticky, as an asynchronous error is on a CUDA context.
    pub(super) fault: OnceLock<(u64, Error)>,
    /// The device's memory: its fault injection, and its sink for errors met here.
    pub(super) memory: Arc<HostMemory>,
}

pub(super) struct QueueState {
    pub(super) ops: VecDeque<Op>,
    /// Operations enqueued so far; an event is a value of this counter.
    pub(super) enqueued: u64,
    /// The stream handle is gone: run what is queued, then stop.
    pub(super) closed: bool,
}

impl Queue {
    pub(super) fn wait_for(&self, position: u64) {
        if self.completed.load(Ordering::Acquire) >= position {
            return;
        }
        let mut state = self.state.lock();
        while self.completed.load(Ordering::Acquire) < position {
            self.progress.wait(&mut state);
        }
    }

    /// The error of a failure at or before `position`, if the queue had one.
    pub(super) fn fault_at(&self, position: u64) -> Result<()> {
        match self.fault.get() {
            Some((failed, e)) if *failed <= position => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Fails the queue at the operation now running (the first failure sticks).
    fn fail(&self, error: Error) {
        let position = self.completed.load(Ordering::Acquire) + 1;
        let _ = self.fault.set((position, error));
    }

    /// Under Miri, which cannot run the worker thread (parking_lot parks it through a raw
    /// `futex` syscall whose arguments Miri refuses): runs what is queued on the calling
    /// thread, now, in order. Every queue is then always drained, so a wait for another queue's
    /// position has been reached already. An operation that enqueues on its own stream finds it
    /// draining and leaves its work to the loop below. Only the memory accesses of the
    /// operations are checked this way, not their concurrency: the tests Miri runs (`.ci/run`)
    /// are those of `unsafe` code, not of ordering.
    #[cfg(miri)]
    pub(super) fn run_inline(&self) {
        use std::cell::RefCell;
        thread_local! {
            /// The queues this thread is draining now (by address).
            static RUNNING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
        }
        let me = self as *const Queue as usize;
        if RUNNING.with(|r| r.borrow().contains(&me)) {
            return;
        }
        RUNNING.with(|r| r.borrow_mut().push(me));
        loop {
            let op = self.state.lock().ops.pop_front();
            let Some(op) = op else { break };
            self.execute(op);
            self.completed.fetch_add(1, Ordering::AcqRel);
        }
        RUNNING.with(|r| r.borrow_mut().retain(|&q| q != me));
    }

    #[cfg_attr(miri, allow(dead_code))]
    pub(super) fn run(&self) {
        loop {
            let op = {
                let mut state = self.state.lock();
                loop {
                    if let Some(op) = state.ops.pop_front() {
                        break op;
                    }
                    if state.closed {
                        return;
                    }
                    self.work.wait(&mut state);
                }
            };
            self.execute(op);
            self.completed.fetch_add(1, Ordering::AcqRel);
            let _state = self.state.lock();
            self.progress.notify_all();
        }
    }

    fn execute(&self, op: Op) {
        match op {
            Op::Delay(d) => thread::sleep(d),
            Op::WaitFor(queue, position) => {
                queue.wait_for(position);
                // Waiting on a failed point passes the failure on, as on a CUDA context.
                if let Err(e) = queue.fault_at(position) {
                    self.fail(e);
                }
            }
            Op::Call(f) => {
                // A panicking callback must not kill the worker: later work would never run.
                // The panic reaches the user through the device's deferred errors.
                if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(f)) {
                    self.memory.errors().report(Error::invalid(format!(
                        "a host function panicked on a stream of {}: {}; the stream went on",
                        self.memory.device(),
                        panic_message(&*payload)
                    )));
                }
            }
            Op::Notify(c) => match self.fault_at(self.completed.load(Ordering::Acquire)) {
                Ok(()) => c.complete(),
                Err(e) => c.fail(e),
            },
            // SAFETY: the enqueuing caller guaranteed both ranges valid until the copy
            // completes (`BackendStream::copy`); `ptr::copy` allows overlap.
            Op::Copy { dst, src, bytes } => unsafe {
                std::ptr::copy(src as *const u8, dst as *mut u8, bytes)
            },
            // SAFETY: the enqueuing caller guaranteed the range valid (`BackendStream::memset`).
            Op::Set { dst, value, bytes } => unsafe {
                std::ptr::write_bytes(dst as *mut u8, value, bytes)
            },
            Op::Fail(e) => self.fail(e),
        }
    }
}
