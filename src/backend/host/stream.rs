use std::collections::VecDeque;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::backend::{panic_message, BackendEvent, BackendStream, Completion};
use crate::error::{Error, Result};
use crate::ids::DeviceId;

use super::event::HostEvent;
use super::memory::HostMemory;

/// One queued operation of a host stream.
enum Op {
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
    state: Mutex<QueueState>,
    /// Signalled when work is enqueued or the stream is dropped.
    work: Condvar,
    /// Signalled after every completed operation.
    progress: Condvar,
    /// Operations completed so far; the worker is the only writer.
    pub(super) completed: AtomicU64,
    /// The first operation that failed, as a position (events at or after it report the
    /// error), and its error. Sticky, as an asynchronous error is on a CUDA context.
    fault: OnceLock<(u64, Error)>,
    /// The device's memory: its fault injection, and its sink for errors met here.
    memory: Arc<HostMemory>,
}

struct QueueState {
    ops: VecDeque<Op>,
    /// Operations enqueued so far; an event is a value of this counter.
    enqueued: u64,
    /// The stream handle is gone: run what is queued, then stop.
    closed: bool,
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

    fn run(&self) {
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

/// A host stream: an ordered queue run by its own worker thread.
pub(crate) struct HostStream {
    device: DeviceId,
    handle: u64,
    queue: Arc<Queue>,
}

impl HostStream {
    pub(crate) fn new(device: DeviceId, memory: Arc<HostMemory>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let queue = Arc::new(Queue {
            state: Mutex::new(QueueState {
                ops: VecDeque::new(),
                enqueued: 0,
                closed: false,
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
            completed: AtomicU64::new(0),
            fault: OnceLock::new(),
            memory,
        });
        let worker = queue.clone();
        let handle = NEXT.fetch_add(1, Ordering::Relaxed);
        thread::Builder::new()
            .name(format!("streamalloc-host-stream-{handle}"))
            .spawn(move || worker.run())
            .expect("failed to spawn a host stream worker thread");
        HostStream {
            device,
            handle,
            queue,
        }
    }

    fn enqueue(&self, op: Op) -> Result<()> {
        let mut state = self.queue.state.lock();
        state.ops.push_back(op);
        state.enqueued += 1;
        self.queue.work.notify_one();
        Ok(())
    }

    pub(crate) fn enqueue_call(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        self.enqueue(Op::Call(f))
    }
}

impl Drop for HostStream {
    fn drop(&mut self) {
        // The worker drains what is queued (frees, notifications) and then exits; nobody joins
        // it, so dropping a stream never blocks.
        self.queue.state.lock().closed = true;
        self.queue.work.notify_one();
    }
}

impl fmt::Debug for HostStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostStream")
            .field("device", &self.device)
            .field("handle", &self.handle)
            .finish()
    }
}

impl BackendStream for HostStream {
    type Event = HostEvent;

    fn raw_handle(&self) -> u64 {
        self.handle
    }

    fn record(&self) -> Result<Arc<HostEvent>> {
        let position = self.queue.state.lock().enqueued;
        Ok(Arc::new(HostEvent {
            queue: self.queue.clone(),
            position,
        }))
    }

    fn wait_event(&self, event: &HostEvent) -> Result<()> {
        if event.query()? {
            return Ok(());
        }
        self.enqueue(Op::WaitFor(event.queue.clone(), event.position))
    }

    fn notify(&self, completion: Arc<Completion>) -> Result<()> {
        self.enqueue(Op::Notify(completion))
    }

    fn host_fn(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        self.enqueue(Op::Call(f))
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        match self.queue.memory.injected_copy_failure() {
            Some(e) => self.enqueue(Op::Fail(e)),
            None => self.enqueue(Op::Copy { dst, src, bytes }),
        }
    }

    unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.enqueue(Op::Set { dst, value, bytes })
    }

    fn delay(&self, duration: Duration) -> Result<()> {
        self.enqueue(Op::Delay(duration))
    }

    fn synchronize_blocking(&self) -> Result<()> {
        let position = self.queue.state.lock().enqueued;
        self.queue.wait_for(position);
        self.queue.fault_at(position)
    }
}
