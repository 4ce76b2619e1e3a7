//! Frees of pinned host memory (`cuMemFreeHost`) off the caller's thread.
//!
//! The free is not stream-ordered: the backend must first wait for the freeing stream, and the
//! free itself takes long (1.6 ms for 16 MiB on an H100). Done on the caller's thread, every
//! `PinnedHostVec` dropped in an async task stalled that executor thread until the stream was
//! idle. Instead, the free records an event on the stream and hands the block to one thread per
//! device, which waits for the event and frees it: the caller's thread never blocks. (Device
//! and managed memory are freed synchronously: deferred, their frees kept memory allocated past
//! the next allocation and raised the pool's W4 footprint.)
//!
//! Deferring a free must not make an allocation fail that a synchronous free would have let
//! through: an allocation that fails for lack of memory waits for the queued frees and tries
//! once more ([`Reclaimer::drain`]).

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use cudarc::driver::sys;
use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashSet;

use crate::backend::seam::{BackendEvent, MemoryKind};
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
    /// Their addresses: a second free of one is refused at once, as the driver would refuse
    /// it (later, on the reclaiming thread, where the error would reach the device long after
    /// the call that made it).
    queued: Mutex<FxHashSet<u64>>,
    none_left: Condvar,
}

impl Outstanding {
    /// Counts `ptr` as queued; `false` when it is queued already.
    fn add(&self, ptr: u64) -> bool {
        self.queued.lock().insert(ptr)
    }

    fn done(&self, ptr: u64) {
        let mut queued = self.queued.lock();
        queued.remove(&ptr);
        if queued.is_empty() {
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
            .field("outstanding", &self.outstanding.queued.lock().len())
            .finish()
    }
}

/// Why [`Reclaimer::retire`] did not take a block.
pub(super) enum NotRetired {
    /// No thread could be started, or it is gone: the caller frees the block itself.
    NoThread(Arc<CudaEvent>),
    /// The block is queued already: a double free, refused without touching anything.
    AlreadyQueued,
}

impl Reclaimer {
    /// Queues the free of `ptr` (of `kind`, from
    /// [`allocate`](super::memory::allocate)) for when `event` completes. Gives the block back
    /// when no thread can take it (it could not be started): the caller then frees it itself.
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
    ) -> std::result::Result<(), NotRetired> {
        let mut queue = self.queue.lock();
        if queue.is_none() {
            let (tx, rx) = mpsc::channel();
            let outstanding = self.outstanding.clone();
            let started = std::thread::Builder::new()
                .name("streamalloc-reclaim".into())
                .spawn(move || reclaim(rx, &outstanding));
            if started.is_err() {
                return Err(NotRetired::NoThread(event));
            }
            *queue = Some(tx);
        }
        if !self.outstanding.add(ptr) {
            return Err(NotRetired::AlreadyQueued);
        }
        let sent = queue
            .as_ref()
            .expect("started above")
            .send(Retired { event, kind, ptr });
        sent.map_err(|mpsc::SendError(r)| {
            self.outstanding.done(ptr);
            NotRetired::NoThread(r.event)
        })
    }

    /// Blocks until every block queued so far is freed (before retrying a failed allocation).
    pub(super) fn drain(&self) {
        let mut queued = self.outstanding.queued.lock();
        while !queued.is_empty() {
            self.outstanding.none_left.wait(&mut queued);
        }
    }

    /// Whether blocks are queued and not yet freed.
    pub(super) fn busy(&self) -> bool {
        !self.outstanding.queued.lock().is_empty()
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
        outstanding.done(ptr);
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
