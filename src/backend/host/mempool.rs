use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::backend::seam::{BackendMemPool, MemoryKind};
use crate::error::Result;

use super::fault::FaultPoint;
use super::memory::HostMemory;
use super::stream::HostStream;

/// The host emulation of a driver pool: allocation is immediate, and a free takes effect when
/// the stream reaches it, as with `cuMemFreeAsync`.
#[derive(Debug)]
pub(crate) struct HostMemPool {
    memory: Arc<HostMemory>,
    handle: u64,
    reserved: Arc<AtomicUsize>,
    /// What the blocks count as: device memory, or managed for the managed pool.
    kind: MemoryKind,
}

impl HostMemPool {
    pub(crate) fn new(memory: Arc<HostMemory>) -> Self {
        Self::with_kind(memory, MemoryKind::Device)
    }

    /// A pool whose blocks are `kind` memory.
    pub(crate) fn with_kind(memory: Arc<HostMemory>, kind: MemoryKind) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        HostMemPool {
            memory,
            handle: NEXT.fetch_add(1, Ordering::Relaxed),
            reserved: Arc::default(),
            kind,
        }
    }
}

impl BackendMemPool for HostMemPool {
    type Stream = HostStream;

    fn handle(&self) -> u64 {
        self.handle
    }

    fn allocate_async(&self, bytes: usize, stream: &HostStream) -> Result<u64> {
        let _ = stream; // the emulation allocates at once, as the driver may
        let ptr = self.memory.allocate(self.kind, bytes)?;
        self.reserved.fetch_add(bytes.max(1), Ordering::Relaxed);
        Ok(ptr)
    }

    unsafe fn free_async(&self, ptr: u64, bytes: usize, stream: &HostStream) -> Result<()> {
        // A double free fails here, while the first free may still be queued.
        self.memory.begin_free(self.kind, ptr, bytes)?;
        let memory = self.memory.clone();
        let reserved = self.reserved.clone();
        let kind = self.kind;
        let queued = stream.enqueue_call(Box::new(move || {
            // SAFETY: the caller guarantees all work using the block is ordered before this
            // point of the stream, which has now been reached.
            match unsafe { memory.finish_free(kind, ptr, bytes) } {
                Ok(()) => {
                    reserved.fetch_sub(bytes.max(1), Ordering::Relaxed);
                }
                Err(e) => memory.errors().report(e),
            }
        }));
        if queued.is_err() {
            self.memory.cancel_free(ptr);
        }
        queued
    }

    fn trim_to(&self, _keep: usize) -> Result<()> {
        self.memory.fail_if(FaultPoint::PoolTrim)?;
        Ok(()) // nothing is cached beyond live blocks
    }

    fn reserved(&self) -> Result<usize> {
        Ok(self.reserved.load(Ordering::Relaxed))
    }
}
