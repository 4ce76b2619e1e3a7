//! Raw allocation of each memory kind (`cuMemAlloc`, `cuMemAllocManaged`, `cuMemHostAlloc`) and
//! their frees.

use std::ffi::{c_uint, c_void};
use std::ptr;

use cudarc::driver::sys;

use crate::backend::seam::{BackendStream, MemoryKind};
use crate::error::{Error, Result};

use super::context::DeviceContext;
use super::stream::CudaStream;

/// Allocates `bytes` (> 0) of `kind` in `ctx`, 256-byte aligned ([`Backend::allocate`](crate::backend::Backend::allocate)).
pub(super) fn allocate(ctx: &DeviceContext, kind: MemoryKind, bytes: usize) -> Result<u64> {
    ctx.bind()?;
    // The driver rejects 0 bytes; the trait asks for > 0, so this only guards misuse.
    let size = bytes.max(1);
    match kind {
        MemoryKind::Device => {
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: the context is current; `ptr` is a valid out-pointer.
            let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, size) };
            ctx.check_alloc("cuMemAlloc", r, bytes)?;
            Ok(ptr)
        }
        MemoryKind::Managed => {
            let mut ptr: sys::CUdeviceptr = 0;
            let flags = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as c_uint;
            // SAFETY: the context is current; `ptr` is a valid out-pointer.
            let r = unsafe { sys::cuMemAllocManaged(&mut ptr, size, flags) };
            if r == sys::CUresult::CUDA_ERROR_NOT_SUPPORTED {
                return Err(Error::unsupported("managed memory", ctx.id()));
            }
            ctx.check_alloc("cuMemAllocManaged", r, bytes)?;
            Ok(ptr)
        }
        MemoryKind::PinnedHost => {
            let mut ptr: *mut c_void = ptr::null_mut();
            let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
            // SAFETY: the context is current; `ptr` is a valid out-pointer.
            let r = unsafe { sys::cuMemHostAlloc(&mut ptr, size, flags as c_uint) };
            ctx.check_alloc("cuMemHostAlloc", r, bytes)?;
            // With unified addressing (checked in `new`) the host pointer is also the
            // device address of the mapping.
            Ok(ptr as u64)
        }
    }
}

/// Frees what [`allocate`] returned, after `stream` reaches this point ([`Backend::free`](crate::backend::Backend::free)).
///
/// # Safety
/// 1. `ptr` came from `allocate(ctx, kind, ..)` and is not freed yet.
/// 2. All work that uses it is ordered before this point of `stream`.
pub(super) unsafe fn free(
    ctx: &DeviceContext,
    kind: MemoryKind,
    ptr: u64,
    stream: &CudaStream,
) -> Result<()> {
    ctx.bind()?;
    // `cuMemFree`/`cuMemFreeHost` wait for the device in practice, but that is not a
    // documented promise for non-blocking streams; waiting for `stream` first makes "freed
    // once the stream reaches this point" hold by construction, at little cost next to the
    // free itself. On failure the block is leaked, never freed under running work.
    stream.synchronize_blocking()?;
    // SAFETY: `ptr` came from `allocate(ctx, kind, ..)` and is not freed yet (caller, 1); work
    // using it is done (caller, 2, and the synchronization above).
    unsafe { super::reclaim::free_now(ctx, kind, ptr) }
}
