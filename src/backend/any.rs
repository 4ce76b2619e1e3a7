//! The erased backend: one enum per backend type (host, cuda), and the only place that
//! dispatches between them (wgpu's `dynamic` layer over wgpu-hal). Inside a backend every call
//! is static; here a stream, event or pool of one backend handed to another is refused with
//! [`Error::InvalidArgument`], once, instead of a downcast in each backend, and a stream used
//! on a thread it does not belong to (the per-thread default stream) with
//! [`Error::WrongThread`], before any driver call through it.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "cuda-driver")]
use super::cuda::{CudaBackend, CudaEvent, CudaMemPool, CudaStream};
use super::host::{HostBackend, HostEvent, HostMemPool, HostStream};
use crate::backend::flags::{DeviceFlag, FlagSlab};
use crate::backend::seam::{
    Backend, BackendEvent, BackendMemPool, BackendStream, Completion, DefaultStream, ErrorSink,
    MemPoolConfig, MemoryInfo, MemoryKind, PrefetchTarget,
};
use crate::error::{Error, Result};
use crate::ids::DeviceId;

/// Calls `$body` with `$x` bound to whichever backend's value `$value` holds.
macro_rules! dispatch {
    ($kind:ident, $value:expr, $x:ident => $body:expr) => {
        match $value {
            $kind::Host($x) => $body,
            #[cfg(feature = "cuda-driver")]
            $kind::Cuda($x) => $body,
        }
    };
}

/// Calls `$body` with `$a` and `$b` bound to the values of `$left` and `$right` when both are
/// of one backend; else returns the error that `$what` (the right-hand thing) was of another.
macro_rules! dispatch_pair {
    ($left_kind:ident, $left:expr, $right_kind:ident, $right:expr, $what:literal,
     $a:ident, $b:ident => $body:expr) => {
        #[allow(unreachable_patterns)] // one backend without the `cuda` feature
        match ($left, $right) {
            ($left_kind::Host($a), $right_kind::Host($b)) => $body,
            #[cfg(feature = "cuda-driver")]
            ($left_kind::Cuda($a), $right_kind::Cuda($b)) => $body,
            _ => Err(Error::invalid(concat!(
                "an operation of one backend was given a ",
                $what,
                " of another backend"
            ))),
        }
    };
}

/// A device of any backend.
#[derive(Debug)]
pub(crate) enum AnyBackend {
    Host(HostBackend),
    #[cfg(feature = "cuda-driver")]
    Cuda(CudaBackend),
}

/// A stream of any backend; clones are the same stream.
#[derive(Debug, Clone)]
pub(crate) enum AnyStream {
    Host(Arc<HostStream>),
    #[cfg(feature = "cuda-driver")]
    Cuda(Arc<CudaStream>),
}

/// An event of any backend; clones are the same event.
#[derive(Debug, Clone)]
pub(crate) enum AnyEvent {
    Host(Arc<HostEvent>),
    #[cfg(feature = "cuda-driver")]
    Cuda(Arc<CudaEvent>),
}

/// A driver pool of any backend; clones are the same pool.
#[derive(Debug, Clone)]
pub(crate) enum AnyMemPool {
    Host(Arc<HostMemPool>),
    #[cfg(feature = "cuda-driver")]
    Cuda(Arc<CudaMemPool>),
}

impl AnyBackend {
    pub(crate) fn id(&self) -> DeviceId {
        dispatch!(AnyBackend, self, b => b.id())
    }

    pub(crate) fn name(&self) -> String {
        dispatch!(AnyBackend, self, b => b.name())
    }

    pub(crate) fn memory_info(&self) -> Result<MemoryInfo> {
        dispatch!(AnyBackend, self, b => b.memory_info())
    }

    /// [`Backend::check_kind`].
    pub(crate) fn check_kind(&self, kind: MemoryKind) -> Result<()> {
        dispatch!(AnyBackend, self, b => b.check_kind(kind))
    }

    /// [`Backend::allocate`].
    pub(crate) fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<u64> {
        dispatch!(AnyBackend, self, b => b.allocate(kind, bytes))
    }

    /// [`Backend::free`].
    ///
    /// # Safety
    /// As [`Backend::free`].
    pub(crate) unsafe fn free(
        &self,
        kind: MemoryKind,
        ptr: u64,
        bytes: usize,
        stream: &AnyStream,
    ) -> Result<()> {
        stream.usable_here()?;
        // SAFETY: the caller's contract, forwarded.
        dispatch_pair!(AnyBackend, self, AnyStream, stream, "stream", b, s => unsafe {
            b.free(kind, ptr, bytes, s)
        })
    }

    /// [`Backend::prefetch`].
    pub(crate) fn prefetch(&self, ptr: u64, bytes: usize, stream: &AnyStream) -> Result<bool> {
        stream.usable_here()?;
        dispatch_pair!(AnyBackend, self, AnyStream, stream, "stream", b, s => {
            b.prefetch(ptr, bytes, s)
        })
    }

    /// [`Backend::prefetch_to`].
    pub(crate) fn prefetch_to(
        &self,
        ptr: u64,
        bytes: usize,
        target: PrefetchTarget,
        stream: &AnyStream,
    ) -> Result<bool> {
        stream.usable_here()?;
        dispatch_pair!(AnyBackend, self, AnyStream, stream, "stream", b, s => {
            b.prefetch_to(ptr, bytes, target, s)
        })
    }

    pub(crate) fn create_stream(&self) -> Result<AnyStream> {
        Ok(match self {
            AnyBackend::Host(b) => AnyStream::Host(b.create_stream()?),
            #[cfg(feature = "cuda-driver")]
            AnyBackend::Cuda(b) => AnyStream::Cuda(b.create_stream()?),
        })
    }

    /// [`Backend::default_stream`].
    pub(crate) fn default_stream(&self, kind: DefaultStream) -> Result<AnyStream> {
        Ok(match self {
            AnyBackend::Host(b) => AnyStream::Host(b.default_stream(kind)?),
            #[cfg(feature = "cuda-driver")]
            AnyBackend::Cuda(b) => AnyStream::Cuda(b.default_stream(kind)?),
        })
    }

    pub(crate) fn create_mempool(&self, config: &MemPoolConfig) -> Result<AnyMemPool> {
        Ok(match self {
            AnyBackend::Host(b) => AnyMemPool::Host(b.create_mempool(config)?),
            #[cfg(feature = "cuda-driver")]
            AnyBackend::Cuda(b) => AnyMemPool::Cuda(b.create_mempool(config)?),
        })
    }

    /// [`Backend::default_mempool`].
    pub(crate) fn default_mempool(&self) -> Result<AnyMemPool> {
        Ok(match self {
            AnyBackend::Host(b) => AnyMemPool::Host(b.default_mempool()?),
            #[cfg(feature = "cuda-driver")]
            AnyBackend::Cuda(b) => AnyMemPool::Cuda(b.default_mempool()?),
        })
    }

    /// [`Backend::managed_mempool`].
    pub(crate) fn managed_mempool(&self) -> Result<AnyMemPool> {
        Ok(match self {
            AnyBackend::Host(b) => AnyMemPool::Host(b.managed_mempool()?),
            #[cfg(feature = "cuda-driver")]
            AnyBackend::Cuda(b) => AnyMemPool::Cuda(b.managed_mempool()?),
        })
    }

    /// [`Backend::errors`].
    /// [`Backend::flag_slab`].
    pub(crate) fn flag_slab(&self) -> Option<Arc<FlagSlab>> {
        dispatch!(AnyBackend, self, b => b.flag_slab())
    }

    pub(crate) fn errors(&self) -> &ErrorSink {
        dispatch!(AnyBackend, self, b => b.errors())
    }

    /// [`Backend::vmm_granularity`].
    pub(crate) fn vmm_granularity(&self) -> Result<usize> {
        dispatch!(AnyBackend, self, b => b.vmm_granularity())
    }

    /// [`Backend::vmm_reserve`].
    pub(crate) fn vmm_reserve(&self, bytes: usize) -> Result<u64> {
        dispatch!(AnyBackend, self, b => b.vmm_reserve(bytes))
    }

    /// [`Backend::vmm_free_reservation`].
    ///
    /// # Safety
    /// As [`Backend::vmm_free_reservation`].
    pub(crate) unsafe fn vmm_free_reservation(&self, va: u64, bytes: usize) -> Result<()> {
        // SAFETY: the caller's contract, forwarded.
        dispatch!(AnyBackend, self, b => unsafe { b.vmm_free_reservation(va, bytes) })
    }

    /// [`Backend::vmm_create`].
    pub(crate) fn vmm_create(&self, bytes: usize) -> Result<u64> {
        dispatch!(AnyBackend, self, b => b.vmm_create(bytes))
    }

    /// [`Backend::vmm_release`].
    ///
    /// # Safety
    /// As [`Backend::vmm_release`].
    pub(crate) unsafe fn vmm_release(&self, handle: u64, bytes: usize) -> Result<()> {
        // SAFETY: the caller's contract, forwarded.
        dispatch!(AnyBackend, self, b => unsafe { b.vmm_release(handle, bytes) })
    }

    /// [`Backend::vmm_map`].
    ///
    /// # Safety
    /// As [`Backend::vmm_map`].
    pub(crate) unsafe fn vmm_map(&self, va: u64, page: usize, handles: &[u64]) -> Result<()> {
        // SAFETY: the caller's contract, forwarded.
        dispatch!(AnyBackend, self, b => unsafe { b.vmm_map(va, page, handles) })
    }

    /// [`Backend::vmm_unmap`].
    ///
    /// # Safety
    /// As [`Backend::vmm_unmap`].
    pub(crate) unsafe fn vmm_unmap(&self, va: u64, bytes: usize) -> Result<()> {
        // SAFETY: the caller's contract, forwarded.
        dispatch!(AnyBackend, self, b => unsafe { b.vmm_unmap(va, bytes) })
    }
}

impl AnyStream {
    /// [`BackendStream::raw_handle`].
    pub(crate) fn raw_handle(&self) -> u64 {
        dispatch!(AnyStream, self, s => s.raw_handle())
    }

    /// [`Error::WrongThread`] when the stream belongs to another thread than the calling one
    /// (the per-thread default stream, [`BackendStream::home_thread`]): called before every
    /// driver call through the handle, here and wherever a stream is passed in below.
    pub(crate) fn usable_here(&self) -> Result<()> {
        match dispatch!(AnyStream, self, s => s.home_thread()) {
            Some(home) => home.check(),
            None => Ok(()),
        }
    }

    /// [`BackendStream::record`].
    pub(crate) fn record(&self) -> Result<AnyEvent> {
        self.usable_here()?;
        Ok(match self {
            AnyStream::Host(s) => AnyEvent::Host(s.record()?),
            #[cfg(feature = "cuda-driver")]
            AnyStream::Cuda(s) => AnyEvent::Cuda(s.record()?),
        })
    }

    /// [`BackendStream::wait_event`].
    pub(crate) fn wait_event(&self, event: &AnyEvent) -> Result<()> {
        self.usable_here()?;
        dispatch_pair!(AnyStream, self, AnyEvent, event, "event", s, e => s.wait_event(e))
    }

    /// [`BackendStream::notify`].
    pub(crate) fn notify(&self, completion: Arc<Completion>) -> Result<()> {
        self.usable_here()?;
        dispatch!(AnyStream, self, s => s.notify(completion))
    }

    /// [`BackendStream::host_fn`].
    pub(crate) fn host_fn(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        self.usable_here()?;
        dispatch!(AnyStream, self, s => s.host_fn(f))
    }

    /// [`BackendStream::write_flag`].
    pub(crate) fn write_flag(&self, flag: &DeviceFlag) -> Result<()> {
        dispatch!(AnyStream, self, s => s.write_flag(flag))
    }

    /// [`BackendStream::copy`].
    ///
    /// # Safety
    /// As [`BackendStream::copy`].
    pub(crate) unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.usable_here()?;
        // SAFETY: the caller's contract, forwarded.
        dispatch!(AnyStream, self, s => unsafe { s.copy(dst, src, bytes) })
    }

    /// [`BackendStream::copy_peer`]: a copy on this stream from memory of `src_stream`'s
    /// device.
    ///
    /// # Safety
    /// As [`BackendStream::copy_peer`].
    pub(crate) unsafe fn copy_peer(
        &self,
        dst: u64,
        src: u64,
        src_stream: &AnyStream,
        bytes: usize,
    ) -> Result<()> {
        self.usable_here()?;
        // SAFETY: the caller's contract, forwarded.
        dispatch_pair!(AnyStream, self, AnyStream, src_stream, "stream", s, t => unsafe {
            s.copy_peer(dst, src, t, bytes)
        })
    }

    /// [`BackendStream::copy_pageable`].
    ///
    /// # Safety
    /// As [`BackendStream::copy`].
    pub(crate) unsafe fn copy_pageable(
        &self,
        dst: u64,
        src: u64,
        bytes: usize,
        to_host: bool,
    ) -> Result<()> {
        self.usable_here()?;
        // SAFETY: the caller's contract, forwarded.
        dispatch!(AnyStream, self, s => unsafe { s.copy_pageable(dst, src, bytes, to_host) })
    }

    /// [`BackendStream::memset`].
    ///
    /// # Safety
    /// As [`BackendStream::memset`].
    pub(crate) unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.usable_here()?;
        // SAFETY: the caller's contract, forwarded.
        dispatch!(AnyStream, self, s => unsafe { s.memset(dst, value, bytes) })
    }

    /// [`BackendStream::delay`].
    pub(crate) fn delay(&self, duration: Duration) -> Result<()> {
        self.usable_here()?;
        dispatch!(AnyStream, self, s => s.delay(duration))
    }

    /// [`BackendStream::synchronize_blocking`].
    pub(crate) fn synchronize_blocking(&self) -> Result<()> {
        self.usable_here()?;
        dispatch!(AnyStream, self, s => s.synchronize_blocking())
    }
}

impl AnyEvent {
    /// [`BackendEvent::query`].
    pub(crate) fn query(&self) -> Result<bool> {
        dispatch!(AnyEvent, self, e => e.query())
    }

    /// [`BackendEvent::synchronize_blocking`].
    pub(crate) fn synchronize_blocking(&self) -> Result<()> {
        dispatch!(AnyEvent, self, e => e.synchronize_blocking())
    }
}

impl AnyMemPool {
    /// [`BackendMemPool::handle`].
    pub(crate) fn handle(&self) -> u64 {
        dispatch!(AnyMemPool, self, p => p.handle())
    }

    /// The address of the pool's shared state: equal for clones, distinct for two pools.
    pub(crate) fn address(&self) -> usize {
        dispatch!(AnyMemPool, self, p => Arc::as_ptr(p) as usize)
    }

    /// [`BackendMemPool::allocate_async`].
    pub(crate) fn allocate_async(&self, bytes: usize, stream: &AnyStream) -> Result<u64> {
        stream.usable_here()?;
        dispatch_pair!(AnyMemPool, self, AnyStream, stream, "stream", p, s => {
            p.allocate_async(bytes, s)
        })
    }

    /// [`BackendMemPool::free_async`].
    ///
    /// # Safety
    /// As [`BackendMemPool::free_async`].
    pub(crate) unsafe fn free_async(
        &self,
        ptr: u64,
        bytes: usize,
        stream: &AnyStream,
    ) -> Result<()> {
        stream.usable_here()?;
        // SAFETY: the caller's contract, forwarded.
        dispatch_pair!(AnyMemPool, self, AnyStream, stream, "stream", p, s => unsafe {
            p.free_async(ptr, bytes, s)
        })
    }

    /// [`BackendMemPool::trim_to`].
    pub(crate) fn trim_to(&self, keep: usize) -> Result<()> {
        dispatch!(AnyMemPool, self, p => p.trim_to(keep))
    }

    /// [`BackendMemPool::reserved`].
    pub(crate) fn reserved(&self) -> Result<usize> {
        dispatch!(AnyMemPool, self, p => p.reserved())
    }
}
