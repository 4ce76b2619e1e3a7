use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::backend::seam::{BackendEvent, BackendStream, Completion, HomeThread};

use crate::backend::flags::DeviceFlag;
use crate::error::Result;
use crate::ids::DeviceId;

use super::event::HostEvent;
use super::fault::FaultPoint;
use super::memory::HostMemory;
use super::queue::{Op, Queue, QueueState};

/// A host stream: an ordered queue run by its own worker thread.
pub(crate) struct HostStream {
    device: DeviceId,
    handle: u64,
    queue: Arc<Queue>,
    /// The emulated per-thread default stream's thread: refused on any other, as on CUDA.
    home: Option<HomeThread>,
}

impl HostStream {
    /// A stream and its worker thread.
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) when the worker thread cannot be started (the OS is
    /// out of threads or memory), where CUDA's `cuStreamCreate` would fail too.
    pub(crate) fn new(device: DeviceId, memory: Arc<HostMemory>) -> Result<Self> {
        memory.note_call();
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
        let handle = NEXT.fetch_add(1, Ordering::Relaxed);
        // Under Miri, the stream has no worker: `enqueue` runs each operation at once
        // (`Queue::run_inline`).
        #[cfg(not(miri))]
        {
            let worker = queue.clone();
            thread::Builder::new()
                .name(format!("streamalloc-host-stream-{handle}"))
                .spawn(move || worker.run())
                .map_err(|e| {
                    crate::error::Error::io(
                        "cuStreamCreate: starting a host stream's worker thread",
                        &e,
                    )
                })?;
        }
        Ok(HostStream {
            device,
            handle,
            queue,
            home: None,
        })
    }

    /// The calling thread's emulated per-thread default stream: it belongs to this thread.
    ///
    /// # Errors
    /// As [`new`](HostStream::new).
    pub(crate) fn per_thread(device: DeviceId, memory: Arc<HostMemory>) -> Result<Self> {
        let mut stream = HostStream::new(device, memory)?;
        stream.home = Some(HomeThread::current(device));
        Ok(stream)
    }

    fn enqueue(&self, op: Op) -> Result<()> {
        self.queue.memory.note_call();
        let mut state = self.queue.state.lock();
        state.ops.push_back(op);
        state.enqueued += 1;
        self.queue.work.notify_one();
        drop(state);
        #[cfg(miri)]
        self.queue.run_inline();
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

    fn home_thread(&self) -> Option<&HomeThread> {
        self.home.as_ref()
    }

    fn record(&self) -> Result<Arc<HostEvent>> {
        self.queue.memory.fail_if(FaultPoint::EventRecord)?;
        let position = self.queue.state.lock().enqueued;
        self.queue.memory.note_call();
        Ok(Arc::new(HostEvent {
            queue: self.queue.clone(),
            position,
        }))
    }

    fn wait_event(&self, event: &HostEvent) -> Result<()> {
        self.queue.memory.fail_if(FaultPoint::StreamWait)?;
        if event.query()? {
            return Ok(());
        }
        self.enqueue(Op::WaitFor(event.queue.clone(), event.position))
    }

    fn notify(&self, completion: Arc<Completion>) -> Result<()> {
        self.queue.memory.fail_if(FaultPoint::HostFunction)?;
        self.enqueue(Op::Notify(completion))
    }

    fn host_fn(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        self.queue.memory.fail_if(FaultPoint::HostFunction)?;
        self.enqueue(Op::Call(f))
    }

    fn write_flag(&self, flag: &DeviceFlag) -> Result<()> {
        let (slab, slot) = flag.target();
        let token = flag.token();
        // The store holds the slab, so its memory outlives the write.
        self.enqueue(Op::Call(Box::new(move || {
            slab.word(slot).store(token, Ordering::Release)
        })))
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        match self.queue.memory.injected(FaultPoint::Copy) {
            Some(e) => self.enqueue(Op::Fail(e)),
            None => self.enqueue(Op::Copy { dst, src, bytes }),
        }
    }

    unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        match self.queue.memory.injected(FaultPoint::Memset) {
            Some(e) => self.enqueue(Op::Fail(e)),
            None => self.enqueue(Op::Set { dst, value, bytes }),
        }
    }

    fn delay(&self, duration: Duration) -> Result<()> {
        self.enqueue(Op::Delay(duration))
    }

    fn synchronize_blocking(&self) -> Result<()> {
        self.queue.memory.note_call();
        let position = self.queue.state.lock().enqueued;
        self.queue.wait_for(position);
        self.queue.fault_at(position)
    }
}
