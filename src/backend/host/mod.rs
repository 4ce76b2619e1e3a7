//! The host backend: a CPU emulation of a CUDA device.
//!
//! Device memory is 256-byte-aligned, zeroed host memory counted against a configurable
//! capacity; a stream is an ordered queue run by a worker thread; an event is a position in a
//! queue; stream-wait-event makes one queue wait for a position in another. It can inject
//! delays (stand-ins for kernels) and allocation failures, which makes ordering, pressure and
//! fault tests deterministic.

mod event;
mod fault;
mod memory;
mod mempool;
mod queue;
mod stream;
mod vmm;

use std::sync::{Arc, OnceLock};

pub(crate) use event::HostEvent;
pub use fault::FaultPoint;
pub use memory::HostControls;
pub(crate) use mempool::HostMemPool;
pub(crate) use stream::HostStream;

use crate::backend::seam::{
    Backend, DefaultStream, ErrorSink, MemPoolConfig, MemoryInfo, MemoryKind, PrefetchTarget,
};

use crate::backend::flags::{FlagSlab, FLAG_SLOTS};
use crate::error::Result;
use crate::ids::{BackendKind, DeviceId};
use memory::HostMemory;

#[derive(Debug)]
pub(crate) struct HostBackend {
    id: DeviceId,
    memory: Arc<HostMemory>,
    default_mempool: OnceLock<Arc<HostMemPool>>,
    /// The emulated managed-memory pool, created on first use.
    managed_mempool: OnceLock<Arc<HostMemPool>>,
    /// Completion flags, made on first use (in ordinary memory: the workers store them).
    flags: OnceLock<Arc<FlagSlab>>,
}

impl HostBackend {
    /// A host device `host:{ordinal}` with `capacity` bytes of emulated memory.
    pub(crate) fn new(capacity: usize, ordinal: u32) -> Self {
        let id = DeviceId {
            backend: BackendKind::Host,
            ordinal,
        };
        HostBackend {
            id,
            memory: Arc::new(HostMemory::new(id, capacity)),
            default_mempool: OnceLock::new(),
            managed_mempool: OnceLock::new(),
            flags: OnceLock::new(),
        }
    }

    /// Fault injection and accounting of this device's memory, for the device to hand out
    /// (they stay off the shared [`Backend`] trait: no other backend has them).
    pub(crate) fn controls(&self) -> HostControls {
        HostControls::new(self.memory.clone())
    }

    fn memory(&self) -> &Arc<HostMemory> {
        &self.memory
    }
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        self.memory.tear_down();
    }
}

impl Backend for HostBackend {
    type Stream = HostStream;
    type Event = HostEvent;
    type MemPool = HostMemPool;

    fn id(&self) -> DeviceId {
        self.id
    }

    fn name(&self) -> String {
        "host emulation".into()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        Ok(self.memory().info())
    }

    fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<u64> {
        self.memory().allocate(kind, bytes)
    }

    unsafe fn free(
        &self,
        kind: MemoryKind,
        ptr: u64,
        bytes: usize,
        stream: &HostStream,
    ) -> Result<()> {
        let memory = self.memory().clone();
        // A double free fails here, while the first free may still be queued.
        memory.begin_free(kind, ptr, bytes)?;
        let queued = stream.enqueue_call(Box::new({
            let memory = memory.clone();
            move || {
                // SAFETY: the caller guarantees all work using the block is ordered before this
                // point of the stream, which has now been reached.
                if let Err(e) = unsafe { memory.finish_free(kind, ptr, bytes) } {
                    memory.errors().report(e);
                }
            }
        }));
        if queued.is_err() {
            memory.cancel_free(ptr);
        }
        queued
    }

    fn prefetch_to(
        &self,
        ptr: u64,
        bytes: usize,
        target: PrefetchTarget,
        stream: &HostStream,
    ) -> Result<bool> {
        let _ = stream;
        // Emulated managed memory already lives where the "device" and the host read it:
        // nothing moves, whatever the target, but the request is counted so that tests can see
        // it was made.
        let _ = target;
        self.memory().prefetch(ptr, bytes)
    }

    fn create_stream(&self) -> Result<Arc<HostStream>> {
        self.memory().fail_if(FaultPoint::StreamCreate)?;
        Ok(Arc::new(HostStream::new(self.id, self.memory().clone())?))
    }

    fn create_mempool(&self, config: &MemPoolConfig) -> Result<Arc<HostMemPool>> {
        let _ = config; // the emulated pool keeps nothing cached, so a threshold has no effect
        self.memory().fail_if(FaultPoint::PoolCreate)?;
        Ok(Arc::new(HostMemPool::new(self.memory().clone())))
    }

    fn default_stream(&self, kind: DefaultStream) -> Result<Arc<HostStream>> {
        // An ordinary queue: `Stream` keeps one per device (legacy) or per thread and device
        // (per-thread) while handles to it live, which is all that the emulation needs. The
        // per-thread one is refused on other threads, as CUDA's must be.
        self.memory().fail_if(FaultPoint::StreamCreate)?;
        let memory = self.memory().clone();
        Ok(Arc::new(match kind {
            DefaultStream::Legacy => HostStream::new(self.id, memory)?,
            DefaultStream::PerThread => HostStream::per_thread(self.id, memory)?,
        }))
    }

    fn managed_mempool(&self) -> Result<Arc<HostMemPool>> {
        // Host memory is managed memory already: the emulated pool hands out blocks that the
        // host backend counts as managed (so prefetches of them are made, not skipped).
        Ok(self
            .managed_mempool
            .get_or_init(|| {
                Arc::new(HostMemPool::with_kind(
                    self.memory().clone(),
                    MemoryKind::Managed,
                ))
            })
            .clone())
    }

    fn default_mempool(&self) -> Result<Arc<HostMemPool>> {
        Ok(self
            .default_mempool
            .get_or_init(|| Arc::new(HostMemPool::new(self.memory().clone())))
            .clone())
    }

    fn errors(&self) -> &ErrorSink {
        self.memory().errors()
    }

    fn flag_slab(&self) -> Option<Arc<FlagSlab>> {
        Some(
            self.flags
                .get_or_init(|| FlagSlab::on_heap(FLAG_SLOTS))
                .clone(),
        )
    }

    fn vmm_granularity(&self) -> Result<usize> {
        if cfg!(unix) {
            Ok(vmm::GRANULARITY)
        } else {
            Err(crate::error::Error::unsupported(
                "virtual memory management (the host emulation needs Unix mmap)",
                self.id,
            ))
        }
    }

    fn vmm_reserve(&self, bytes: usize) -> Result<u64> {
        self.memory().fail_if(FaultPoint::VmmReserve)?;
        self.memory().vmm().reserve(bytes)
    }

    unsafe fn vmm_free_reservation(&self, va: u64, bytes: usize) -> Result<()> {
        self.memory().fail_if(FaultPoint::VmmFreeReservation)?;
        // SAFETY: the caller's contract, forwarded.
        unsafe { self.memory().vmm().free_reservation(va, bytes) }
    }

    fn vmm_create(&self, bytes: usize) -> Result<u64> {
        self.memory().fail_if(FaultPoint::VmmCreate)?;
        let memory = self.memory();
        memory.vmm().create(bytes, || memory.charge_physical(bytes))
    }

    unsafe fn vmm_release(&self, handle: u64, bytes: usize) -> Result<()> {
        self.memory().fail_if(FaultPoint::VmmRelease)?;
        let memory = self.memory();
        memory
            .vmm()
            .release(handle, bytes, || memory.refund_physical(bytes))
    }

    unsafe fn vmm_map(&self, va: u64, page: usize, handles: &[u64]) -> Result<()> {
        let memory = self.memory();
        // SAFETY: the caller's contract, forwarded.
        unsafe {
            memory
                .vmm()
                .map_run(va, page, handles, || memory.fail_if(FaultPoint::VmmMap))
        }
    }

    unsafe fn vmm_unmap(&self, va: u64, bytes: usize) -> Result<()> {
        self.memory().fail_if(FaultPoint::VmmUnmap)?;
        // SAFETY: the caller's contract, forwarded.
        unsafe { self.memory().vmm().unmap(va, bytes) }
    }
}

#[cfg(test)]
mod tests;
