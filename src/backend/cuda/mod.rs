//! The CUDA backend: cudarc's driver API at its thin `result` / raw `sys` level, with `libcuda`
//! loaded at run time.
//!
//! - Driver loading ([`context`]): [`device_count`] checks that `libcuda` can be opened (and has every entry
//!   point this backend calls) before the first driver call, because cudarc's dynamic loading
//!   panics on a missing library or symbol. The outcome of `cuInit` is cached for the process.
//! - Contexts: each device uses its primary context, retained for the life of its
//!   [`DeviceContext`]. Every method that calls the driver first makes that context current on
//!   the calling thread ([`DeviceContext::bind`]), after asking the driver which one is current
//!   (other code on the thread binds contexts too), and skips `cuCtxSetCurrent` when it is.
//! - Errors: `CUDA_ERROR_OUT_OF_MEMORY` from an allocation is [`Error::OutOfMemory`]; every other
//!   failure is [`Error::Driver`] with the entry point's name and the driver's name of the code.
//! - Handles ([`handles`]): `CUcontext`, `CUstream`, `CUevent`, `CUmemoryPool`, `CUmodule` and
//!   `CUfunction` are raw pointers; they are wrapped in `Send + Sync` newtypes because the driver
//!   API is thread-safe.

mod context;
mod event;
mod handles;
pub(crate) mod interop;
mod memory;
mod mempool;
mod reclaim;
mod retired;
mod spin;
mod stream;
#[cfg(test)]
mod tests;
mod vmm;

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::{Arc, OnceLock};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

use crate::backend::seam::{
    Backend, BackendStream, DefaultStream, ErrorSink, MemPoolConfig, MemoryInfo, MemoryKind,
    PrefetchTarget,
};

use crate::backend::flags::{FlagSlab, FLAG_SLOTS};
use crate::error::{Error, Result};
use crate::ids::{BackendKind, DeviceId};

pub(crate) use self::context::device_count;
use self::context::{error_name, DeviceContext};
pub(crate) use self::event::CudaEvent;
use self::handles::RawContext;
pub(crate) use self::mempool::CudaMemPool;
pub(crate) use self::stream::CudaStream;

/// A CUDA device with its primary context.
#[derive(Debug)]
pub(crate) struct CudaBackend {
    ctx: Arc<DeviceContext>,
    /// `cuDeviceGetName`, read once.
    name: String,
    /// The wrapper of the device's default pool, created on first use.
    default_mempool: OnceLock<Arc<CudaMemPool>>,
    /// Whether prefetches can run here, found out on the first one.
    can_prefetch: OnceLock<bool>,
    /// The wrapper of the device's default managed-memory pool, created on first use.
    managed_mempool: OnceLock<Arc<CudaMemPool>>,
    /// Frees device, managed and pinned host memory off the freeing thread.
    reclaimer: reclaim::Reclaimer,
    /// Completion flags in pinned memory, made on first use; `None` inside when the device or
    /// driver has no stream memory operations.
    flags: OnceLock<Option<Arc<FlagSlab>>>,
}

impl CudaBackend {
    /// Device `ordinal` with its primary context retained (and released when the backend and
    /// everything created from it are gone).
    ///
    /// # Errors
    /// [`Error::DriverUnavailable`] without a driver, [`Error::NoSuchDevice`] for an ordinal
    /// past the count, driver errors.
    pub(crate) fn new(ordinal: usize) -> Result<Self> {
        let count = device_count()?;
        let no_such = || Error::NoSuchDevice { ordinal, count };
        if ordinal >= count {
            return Err(no_such());
        }
        let id = DeviceId {
            backend: BackendKind::Cuda,
            ordinal: u32::try_from(ordinal).map_err(|_| no_such())?,
        };
        let driver_error = |call: &'static str, e: DriverError| Error::Driver {
            call,
            code: e.0 as i32,
            name: error_name(e),
            device: id,
        };
        let mut device: sys::CUdevice = 0;
        let ordinal_c = c_int::try_from(ordinal).map_err(|_| no_such())?;
        // SAFETY: the driver is initialised (`device_count` succeeded); `device` is a valid
        // out-pointer.
        unsafe { sys::cuDeviceGet(&mut device, ordinal_c) }
            .result()
            .map_err(|e| driver_error("cuDeviceGet", e))?;

        let mut name_buf = [0u8; 256];
        // SAFETY: `device` came from `cuDeviceGet`; the driver writes at most `len` bytes,
        // NUL-terminated, into the buffer.
        unsafe {
            sys::cuDeviceGetName(
                name_buf.as_mut_ptr().cast(),
                name_buf.len() as c_int,
                device,
            )
        }
        .result()
        .map_err(|e| driver_error("cuDeviceGetName", e))?;
        let len = name_buf
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(name_buf.len());
        let name = String::from_utf8_lossy(&name_buf[..len]).into_owned();

        let mut ctx: sys::CUcontext = ptr::null_mut();
        // SAFETY: `device` came from `cuDeviceGet`; `ctx` is a valid out-pointer. The matching
        // release is in `DeviceContext::drop`, which exists from here on.
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, device) }
            .result()
            .map_err(|e| driver_error("cuDevicePrimaryCtxRetain", e))?;
        let ctx = Arc::new(DeviceContext::new(id, device, RawContext(ctx)));
        ctx.bind()?;
        if ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? == 0 {
            // Copies and pinned host memory rely on one address space for host and device.
            return Err(Error::unsupported("devices without unified addressing", id));
        }
        Ok(CudaBackend {
            ctx,
            name,
            default_mempool: OnceLock::new(),
            can_prefetch: OnceLock::new(),
            managed_mempool: OnceLock::new(),
            reclaimer: reclaim::Reclaimer::default(),
            flags: OnceLock::new(),
        })
    }

    /// The completion flags: `FLAG_SLOTS` words of pinned host memory mapped for the device,
    /// which `cuStreamWriteValue32` writes. `None` when the driver lacks the call or the
    /// memory cannot be had (the completion driver then queries events).
    fn make_flag_slab(&self) -> Option<Arc<FlagSlab>> {
        // SAFETY: the library is loaded (this backend exists); the symbol is only looked up.
        let present =
            unsafe { sys::culib().get::<*const c_void>("cuStreamWriteValue32_v2") }.is_ok();
        // (CUDA 12 made the 32-bit stream memory operations part of every device; where a write
        // is refused all the same, the completion driver queries that event instead.)
        if !present || self.ctx.bind().is_err() {
            return None;
        }
        let bytes = FLAG_SLOTS as usize * std::mem::size_of::<u32>();
        let ptr = memory::allocate(&self.ctx, MemoryKind::PinnedHost, bytes).ok()?;
        // SAFETY: `ptr` is `bytes` of pinned host memory just allocated, host-writable.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        let ctx = self.ctx.clone();
        let release = Box::new(move || {
            // SAFETY: `ptr` came from `allocate(ctx, PinnedHost, ..)` above and is freed once,
            // here; the slab releases it only when no write to it is pending (see `FlagSlab`).
            if let Err(error) = unsafe { reclaim::free_now(&ctx, MemoryKind::PinnedHost, ptr) } {
                ctx.errors().report(error);
            }
        });
        let words = std::ptr::NonNull::new(ptr as *mut std::sync::atomic::AtomicU32)?;
        // SAFETY: `FLAG_SLOTS` zeroed, 4-byte aligned (256-byte aligned) words that nothing else
        // uses and that stay allocated until `release` runs.
        Some(unsafe { FlagSlab::new(words, FLAG_SLOTS, release) })
    }

    /// Whether prefetches can run here: the driver has `cuMemPrefetchAsync_v2` (CUDA 12.2+;
    /// looked up here rather than required at load, so older drivers keep everything else) and
    /// the device has concurrent managed access (without it the driver refuses prefetches; RMM
    /// skips them there). The caller has bound the context.
    fn can_prefetch(&self) -> Result<bool> {
        if let Some(&yes) = self.can_prefetch.get() {
            return Ok(yes);
        }
        // SAFETY: the library is loaded (this backend exists, so `device_count` found it);
        // the symbol is only looked up, never called through this pointer type.
        let entry_point = unsafe { sys::culib().get::<*const c_void>("cuMemPrefetchAsync_v2") };
        let attribute = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS;
        let yes = entry_point.is_ok() && self.ctx.attribute(attribute)? != 0;
        Ok(*self.can_prefetch.get_or_init(|| yes))
    }
}

impl Backend for CudaBackend {
    type Stream = CudaStream;
    type Event = CudaEvent;
    type MemPool = CudaMemPool;

    fn id(&self) -> DeviceId {
        self.ctx.id()
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        self.ctx.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the context is current; both are valid out-pointers.
        let r = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
        self.ctx.check("cuMemGetInfo", r)?;
        Ok(MemoryInfo { free, total })
    }

    fn check_kind(&self, kind: MemoryKind) -> Result<()> {
        let (attribute, what) = match kind {
            // Every device has device memory.
            MemoryKind::Device => return Ok(()),
            MemoryKind::Managed => (
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY,
                "managed memory (CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY is 0)",
            ),
            MemoryKind::PinnedHost => (
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
                "pinned host memory mapped for the device (CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY is 0)",
            ),
        };
        self.ctx.bind()?;
        if self.ctx.attribute(attribute)? == 0 {
            return Err(Error::unsupported(what, self.ctx.id()));
        }
        Ok(())
    }

    fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<u64> {
        match memory::allocate(&self.ctx, kind, bytes) {
            // Frees still queued for the reclaiming thread would have been done by now had
            // they been synchronous: wait for them, then try again.
            Err(Error::OutOfMemory { .. }) if self.reclaimer.busy() => {
                self.reclaimer.drain();
                memory::allocate(&self.ctx, kind, bytes)
            }
            result => result,
        }
    }

    unsafe fn free(
        &self,
        kind: MemoryKind,
        ptr: u64,
        bytes: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let _ = bytes; // the driver's frees take the address alone
                       // `cuMemFreeHost` needs the stream idle and takes milliseconds for large blocks: the
                       // reclaiming thread does both once the stream passes this point, so that dropping a
                       // pinned vector never blocks. Where no event can be recorded or no thread takes the
                       // block, it is freed here, synchronously. Device and managed memory are freed here:
                       // deferred, their frees kept memory allocated past the next allocation, and on an H200
                       // the pool's W4 footprint rose from 1.06 to 1.32 times its live peak (the large level
                       // gives each large block back at its free).
        let deferred = kind == MemoryKind::PinnedHost;
        if let (true, Ok(event)) = (deferred, stream.record()) {
            // SAFETY: `ptr` came from `allocate(kind, bytes)` of this context and is freed
            // once, here (caller, 1); every use is ordered before this point of `stream`
            // (caller, 2), where the event was just recorded.
            match unsafe { self.reclaimer.retire(event, kind, ptr) } {
                Ok(()) => return Ok(()),
                Err(reclaim::NotRetired::NoThread(event)) => drop(event),
                Err(reclaim::NotRetired::AlreadyQueued) => {
                    return Err(Error::invalid(format!(
                        "free of pointer {ptr:#x} on {}, whose earlier free is still queued \
                         (a double free); refused",
                        self.ctx.id()
                    )));
                }
            }
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { memory::free(&self.ctx, kind, ptr, stream) }
    }

    fn prefetch_to(
        &self,
        ptr: u64,
        bytes: usize,
        target: PrefetchTarget,
        stream: &CudaStream,
    ) -> Result<bool> {
        if bytes == 0 {
            return Ok(false);
        }
        self.ctx.bind()?;
        if !self.can_prefetch()? {
            return Ok(false);
        }
        // The `_v2` entry point (CUDA 12.2+; the only one in CUDA 13 headers, where it is
        // spelled `cuMemPrefetchAsync`) takes a location instead of a device ordinal; the host
        // is `CU_MEM_LOCATION_TYPE_HOST` (the id is ignored), the old API's `CU_DEVICE_CPU`.
        let location = match target {
            PrefetchTarget::Device => sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.ctx.device,
            },
            PrefetchTarget::Host => sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
                id: 0,
            },
        };
        // SAFETY: the context is current and the stream live (borrowed). The driver checks the
        // range and only migrates pages of it, leaving their contents unchanged; flags must be
        // 0.
        let r = unsafe { sys::cuMemPrefetchAsync_v2(ptr, bytes, location, 0, stream.raw()) };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            // What the driver says for memory that is not managed (`cuMemAlloc`, pinned host):
            // nothing to migrate. RMM treats it as a no-op too.
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => Ok(false),
            r => self.ctx.check("cuMemPrefetchAsync", r).map(|()| false),
        }
    }

    fn create_stream(&self) -> Result<Arc<CudaStream>> {
        Ok(Arc::new(CudaStream::new(self.ctx.clone())?))
    }

    fn create_mempool(&self, config: &MemPoolConfig) -> Result<Arc<CudaMemPool>> {
        Ok(Arc::new(CudaMemPool::create(self.ctx.clone(), config)?))
    }

    fn default_stream(&self, kind: DefaultStream) -> Result<Arc<CudaStream>> {
        Ok(Arc::new(CudaStream::builtin(self.ctx.clone(), kind)))
    }

    fn managed_mempool(&self) -> Result<Arc<CudaMemPool>> {
        if let Some(pool) = self.managed_mempool.get() {
            return Ok(pool.clone());
        }
        let pool = Arc::new(CudaMemPool::managed_default(self.ctx.clone())?);
        // A racing thread may have set it first; both wrap the same driver pool.
        Ok(self.managed_mempool.get_or_init(|| pool).clone())
    }

    fn default_mempool(&self) -> Result<Arc<CudaMemPool>> {
        if let Some(pool) = self.default_mempool.get() {
            return Ok(pool.clone());
        }
        let pool = Arc::new(CudaMemPool::device_default(self.ctx.clone())?);
        // A racing thread may have set it first; both wrap the same driver pool.
        Ok(self.default_mempool.get_or_init(|| pool).clone())
    }

    fn errors(&self) -> &ErrorSink {
        self.ctx.errors()
    }

    fn flag_slab(&self) -> Option<Arc<FlagSlab>> {
        self.flags.get_or_init(|| self.make_flag_slab()).clone()
    }

    fn vmm_granularity(&self) -> Result<usize> {
        vmm::granularity(&self.ctx)
    }

    fn vmm_reserve(&self, bytes: usize) -> Result<u64> {
        let align = vmm::granularity(&self.ctx)?;
        vmm::reserve(&self.ctx, bytes, align)
    }

    unsafe fn vmm_free_reservation(&self, va: u64, bytes: usize) -> Result<()> {
        // SAFETY: the caller's contract, forwarded.
        unsafe { vmm::free_reservation(&self.ctx, va, bytes) }
    }

    fn vmm_create(&self, bytes: usize) -> Result<u64> {
        match vmm::create(&self.ctx, bytes) {
            // As `allocate`: device memory still queued for the reclaiming thread is free.
            Err(Error::OutOfMemory { .. }) if self.reclaimer.busy() => {
                self.reclaimer.drain();
                vmm::create(&self.ctx, bytes)
            }
            result => result,
        }
    }

    unsafe fn vmm_release(&self, handle: u64, bytes: usize) -> Result<()> {
        let _ = bytes; // the driver knows the handle's size
                       // SAFETY: the caller's contract, forwarded.
        unsafe { vmm::release(&self.ctx, handle) }
    }

    unsafe fn vmm_map(&self, va: u64, page: usize, handles: &[u64]) -> Result<()> {
        // SAFETY: the caller's contract, forwarded.
        unsafe { vmm::map(&self.ctx, va, page, handles) }
    }

    unsafe fn vmm_unmap(&self, va: u64, bytes: usize) -> Result<()> {
        // SAFETY: the caller's contract, forwarded.
        unsafe { vmm::unmap(&self.ctx, va, bytes) }
    }
}
