use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::Arc;

use cudarc::driver::sys;

use crate::backend::seam::{BackendMemPool, MemPoolConfig};
use crate::error::{Error, Result};

use super::context::DeviceContext;
use super::handles::RawMemPool;
use super::stream::CudaStream;

/// A driver memory pool (`CUmemoryPool`): one this crate created (destroyed on drop) or the
/// device's default pool (never destroyed).
#[derive(Debug)]
pub(crate) struct CudaMemPool {
    ctx: Arc<DeviceContext>,
    raw: RawMemPool,
    /// Created by `cuMemPoolCreate`, so destroyed on drop.
    owned: bool,
}

impl CudaMemPool {
    /// A new pool of pinned device memory on `ctx`'s device (`cuMemPoolCreate`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device has no memory pools or cannot export the
    /// requested handle types; driver errors.
    pub(crate) fn create(ctx: Arc<DeviceContext>, config: &MemPoolConfig) -> Result<CudaMemPool> {
        ctx.bind()?;
        let id = ctx.id();
        let pools =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)?;
        if pools == 0 {
            return Err(Error::unsupported("memory pools (cuMemPoolCreate)", id));
        }
        let export = config.export_handle_types;
        if export != 0 {
            let supported = ctx.attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
            )? as u32;
            if supported & export != export {
                return Err(Error::unsupported(
                    format!(
                        "exporting pool memory as handle types {export:#x} (the device \
                         supports {supported:#x})"
                    ),
                    id,
                ));
            }
        }
        let location_id = c_int::try_from(id.ordinal)
            .map_err(|_| Error::invalid("device ordinal out of range"))?;

        // SAFETY: `CUmemPoolProps` is a plain C struct for which all-zero bytes are valid: its
        // enums have a 0 variant (`..._INVALID`), the handle-type field is an integer newtype,
        // the pointer may be null, and zero in `maxSize`/`usage`/`reserved` means "default".
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType(export);
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = location_id;

        let mut raw: sys::CUmemoryPool = ptr::null_mut();
        // SAFETY: the context is current; `props` is a valid, initialised `CUmemPoolProps` and
        // `raw` a valid out-pointer.
        let r = unsafe { sys::cuMemPoolCreate(&mut raw, &props) };
        ctx.check("cuMemPoolCreate", r)?;
        // From here on `pool` owns the driver pool and destroys it if setup fails.
        let pool = CudaMemPool {
            ctx,
            raw: RawMemPool(raw),
            owned: true,
        };
        let mut threshold: u64 = config.release_threshold;
        // SAFETY: the pool is live; `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` takes a pointer to a
        // `cuuint64_t`, which `threshold` is, and the driver only reads it during the call.
        let r = unsafe {
            sys::cuMemPoolSetAttribute(
                pool.raw.0,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                ptr::addr_of_mut!(threshold).cast::<c_void>(),
            )
        };
        pool.ctx.check("cuMemPoolSetAttribute", r)?;
        Ok(pool)
    }

    /// The device's default pool (`cuDeviceGetDefaultMemPool`); never destroyed.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device has no memory pools; driver errors.
    pub(crate) fn device_default(ctx: Arc<DeviceContext>) -> Result<CudaMemPool> {
        ctx.bind()?;
        let pools =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)?;
        if pools == 0 {
            return Err(Error::unsupported(
                "memory pools (cuDeviceGetDefaultMemPool)",
                ctx.id(),
            ));
        }
        let mut raw: sys::CUmemoryPool = ptr::null_mut();
        // SAFETY: the context is current; `ctx.device` came from `cuDeviceGet`; `raw` is a
        // valid out-pointer.
        let r = unsafe { sys::cuDeviceGetDefaultMemPool(&mut raw, ctx.device) };
        ctx.check("cuDeviceGetDefaultMemPool", r)?;
        Ok(CudaMemPool {
            ctx,
            raw: RawMemPool(raw),
            owned: false,
        })
    }

    /// The device's default pool of managed memory (CUDA 13's `cuMemGetDefaultMemPool` with
    /// `CU_MEM_ALLOCATION_TYPE_MANAGED`, as RMM's `cuda_async_managed_memory_resource`); never
    /// destroyed.
    ///
    /// # Errors
    /// [`Error::Unsupported`] in builds for CUDA 12 headers, with a driver older than CUDA 13,
    /// on a device without memory pools or without concurrent managed access; driver errors.
    pub(crate) fn managed_default(ctx: Arc<DeviceContext>) -> Result<CudaMemPool> {
        ctx.bind()?;
        let id = ctx.id();
        let what = "stream-ordered managed memory pools (cuMemGetDefaultMemPool, CUDA 13)";
        let pools =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)?;
        let concurrent =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)?;
        if pools == 0 || concurrent == 0 {
            return Err(Error::unsupported(
                format!("{what}: the device lacks memory pools or concurrent managed access"),
                id,
            ));
        }
        #[cfg(feature = "cuda-13000")]
        {
            // SAFETY: the library is loaded (a context exists); the symbol is only looked up,
            // never called through this pointer type. A driver older than CUDA 13 lacks it, and
            // cudarc's loader would panic on the call.
            let present = unsafe { sys::culib().get::<*const c_void>("cuMemGetDefaultMemPool") };
            if present.is_err() {
                return Err(Error::unsupported(
                    format!("{what}: the driver is older than CUDA 13"),
                    id,
                ));
            }
            let mut location = sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ctx.device,
            };
            let mut raw: sys::CUmemoryPool = ptr::null_mut();
            // SAFETY: the context is current and the entry point present (checked above);
            // `raw` and `location` are valid pointers for the call, which only reads
            // `location`.
            let r = unsafe {
                sys::cuMemGetDefaultMemPool(
                    &mut raw,
                    &mut location,
                    sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED,
                )
            };
            if r == sys::CUresult::CUDA_ERROR_NOT_SUPPORTED {
                return Err(Error::unsupported(what, id));
            }
            ctx.check("cuMemGetDefaultMemPool", r)?;
            Ok(CudaMemPool {
                ctx,
                raw: RawMemPool(raw),
                owned: false,
            })
        }
        #[cfg(not(feature = "cuda-13000"))]
        {
            Err(Error::unsupported(
                format!("{what}: this build uses CUDA 12 headers"),
                id,
            ))
        }
    }

    /// The CUDA stream behind `stream`, checked to belong to this pool's device.
    fn stream<'s>(&self, stream: &'s CudaStream) -> Result<&'s CudaStream> {
        let (expected, actual) = (self.ctx.id(), stream.context().id());
        if expected != actual {
            return Err(Error::DeviceMismatch {
                expected,
                actual,
                call: "CudaAsyncResource::try_allocate(stream)",
            });
        }
        Ok(stream)
    }
}

impl Drop for CudaMemPool {
    fn drop(&mut self) {
        if !self.owned {
            return; // the device's default pool belongs to the driver
        }
        if !self.ctx.bind_in_drop("a memory pool") {
            return; // leaked: no driver call is possible here
        }
        // SAFETY: the pool was created by `cuMemPoolCreate` and is destroyed only here. Blocks
        // still allocated or frees still pending keep its memory alive: the driver then
        // releases it once they are done, without blocking.
        let r = unsafe { sys::cuMemPoolDestroy(self.raw.0) };
        if let Err(error) = self.ctx.check("cuMemPoolDestroy", r) {
            self.ctx.errors().report(error);
        }
    }
}

impl BackendMemPool for CudaMemPool {
    type Stream = CudaStream;

    fn handle(&self) -> u64 {
        self.raw.0 as u64
    }

    fn allocate_async(&self, bytes: usize, stream: &CudaStream) -> Result<u64> {
        let stream = self.stream(stream)?;
        self.ctx.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the context is current; pool and stream are live handles of this device;
        // `ptr` is a valid out-pointer. The driver rejects 0 bytes; callers ask for more.
        let r = unsafe {
            sys::cuMemAllocFromPoolAsync(&mut ptr, bytes.max(1), self.raw.0, stream.raw())
        };
        self.ctx.check_alloc("cuMemAllocFromPoolAsync", r, bytes)?;
        Ok(ptr)
    }

    unsafe fn free_async(&self, ptr: u64, bytes: usize, stream: &CudaStream) -> Result<()> {
        let _ = bytes;
        let stream = self.stream(stream)?;
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live; `ptr` came from this pool and is
        // not freed yet, and work using it is ordered before this point of `stream` (caller).
        let r = unsafe { sys::cuMemFreeAsync(ptr, stream.raw()) };
        self.ctx.check_free("cuMemFreeAsync", r, ptr)
    }

    fn trim_to(&self, keep: usize) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the pool live.
        let r = unsafe { sys::cuMemPoolTrimTo(self.raw.0, keep) };
        self.ctx.check("cuMemPoolTrimTo", r)
    }

    fn reserved(&self) -> Result<usize> {
        self.ctx.bind()?;
        let mut value: u64 = 0;
        // SAFETY: the context is current and the pool live;
        // `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` writes a `cuuint64_t`, which `value` is.
        let r = unsafe {
            sys::cuMemPoolGetAttribute(
                self.raw.0,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                ptr::addr_of_mut!(value).cast::<c_void>(),
            )
        };
        self.ctx.check("cuMemPoolGetAttribute", r)?;
        Ok(usize::try_from(value).unwrap_or(usize::MAX))
    }
}
