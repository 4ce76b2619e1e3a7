//! Frees of pinned host memory off the caller's thread.
//!
//! `cuMemFreeHost` is not stream-ordered: the backend must first wait for the freeing stream,
//! and the free itself takes long (1.6 ms for 16 MiB on an H100). Done on the caller's thread,
//! every `PinnedHostVec` dropped in an async task stalled that executor thread until the
//! stream was idle. Instead, the free records an event on the stream and hands the block to one
//! thread per device, which waits for the event and frees it: the caller's thread never blocks.
//!
//! An allocation of pinned memory that fails for lack of memory waits for the queued frees and
//! tries once more ([`Reclaimer::drain`]), so deferring a free never turns into an
//! out-of-memory error that the synchronous free would not have given.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use cudarc::driver::sys;
use parking_lot::{Condvar, Mutex};

use crate::backend::{BackendEvent, MemoryKind};
use crate::error::Result;

use super::event::CudaEvent;

/// A block to free once its event has completed.
struct Retired {
    /// Recorded on the freeing stream at the free; holds the context alive.
    event: Arc<CudaEvent>,
    kind: MemoryKind,
    ptr: u64,
}

/// The blocks handed to the reclaiming thread and not yet freed.
#[derive(Default)]
struct Outstanding {
    count: Mutex<usize>,
    none_left: Condvar,
}

impl Outstanding {
    fn add(&self) {
        *self.count.lock() += 1;
    }

    fn done(&self) {
        let mut count = self.count.lock();
        *count -= 1;
        if *count == 0 {
            self.none_left.notify_all();
        }
    }
}

/// One device's reclaiming thread, started on the first deferred free. The thread owns no
/// handle of the device: each queued block holds its event, and so the context; once the
/// backend drops the sender, the thread frees what is queued and ends.
#[derive(Default)]
pub(super) struct Reclaimer {
    queue: Mutex<Option<Sender<Retired>>>,
    outstanding: Arc<Outstanding>,
}

impl std::fmt::Debug for Reclaimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reclaimer")
            .field("outstanding", &*self.outstanding.count.lock())
            .finish()
    }
}

impl Reclaimer {
    /// Queues the free of `ptr` (`kind`, from [`allocate`](super::memory::allocate)) for when
    /// `event` completes. Gives the block back when no thread can take it (it could not be
    /// started): the caller then frees it itself.
    ///
    /// # Safety
    /// 1. `ptr` came from [`allocate`](super::memory::allocate)`(ctx, kind, ..)` of the
    ///    context `event` belongs to, and is not freed yet; on `Ok` it belongs to the
    ///    reclaimer.
    /// 2. Every use of it is ordered before `event`.
    pub(super) unsafe fn retire(
        &self,
        event: Arc<CudaEvent>,
        kind: MemoryKind,
        ptr: u64,
    ) -> std::result::Result<(), (Arc<CudaEvent>, u64)> {
        let mut queue = self.queue.lock();
        if queue.is_none() {
            let (tx, rx) = mpsc::channel();
            let outstanding = self.outstanding.clone();
            let started = std::thread::Builder::new()
                .name("streamalloc-reclaim".into())
                .spawn(move || reclaim(rx, &outstanding));
            if started.is_err() {
                return Err((event, ptr));
            }
            *queue = Some(tx);
        }
        self.outstanding.add();
        let sent = queue
            .as_ref()
            .expect("started above")
            .send(Retired { event, kind, ptr });
        sent.map_err(|mpsc::SendError(r)| {
            self.outstanding.done();
            (r.event, r.ptr)
        })
    }

    /// Blocks until every block queued so far is freed (before retrying a failed allocation).
    pub(super) fn drain(&self) {
        let mut count = self.outstanding.count.lock();
        while *count > 0 {
            self.outstanding.none_left.wait(&mut count);
        }
    }

    /// Whether blocks are queued and not yet freed.
    pub(super) fn busy(&self) -> bool {
        *self.outstanding.count.lock() > 0
    }
}

/// The reclaiming thread: frees each block once its stream has passed the free.
fn reclaim(queue: Receiver<Retired>, outstanding: &Outstanding) {
    for Retired { event, kind, ptr } in queue {
        let ctx = event.ctx.clone();
        // A failed wait leaves the block leaked rather than freed under running work.
        match event.synchronize_blocking() {
            Ok(()) => {
                // SAFETY: `ptr` came from `allocate(ctx, kind, ..)` and was handed here once,
                // by its free (`retire`'s caller's contract, 1); every use of it was ordered
                // before the event (2), which has completed.
                if let Err(error) = unsafe { free_now(&ctx, kind, ptr) } {
                    ctx.errors().report(error);
                }
            }
            Err(error) => ctx.errors().report(error),
        }
        drop(event);
        outstanding.done();
    }
}

/// Frees `ptr` at once.
///
/// # Safety
/// 1. `ptr` came from [`allocate`](super::memory::allocate)`(ctx, kind, ..)` and is not freed yet.
/// 2. No work that uses it is queued or running.
pub(super) unsafe fn free_now(
    ctx: &super::context::DeviceContext,
    kind: MemoryKind,
    ptr: u64,
) -> Result<()> {
    ctx.bind()?;
    match kind {
        MemoryKind::Device | MemoryKind::Managed => {
            // SAFETY: `ptr` came from `cuMemAlloc`/`cuMemAllocManaged` of this context and
            // is not freed yet, and no work uses it (caller, 1 and 2).
            let r = unsafe { sys::cuMemFree_v2(ptr) };
            ctx.check_free("cuMemFree", r, ptr)
        }
        MemoryKind::PinnedHost => {
            // SAFETY: `ptr` came from `cuMemHostAlloc` and is not freed yet, and no work uses
            // it (caller, 1 and 2).
            let r = unsafe { sys::cuMemFreeHost(ptr as *mut std::ffi::c_void) };
            ctx.check_free("cuMemFreeHost", r, ptr)
        }
    }
}
