//! Virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree`): what
//! [`MappedPoolResource`](crate::MappedPoolResource) builds on, as PyTorch's expandable
//! segments do.

use std::ffi::c_int;

use cudarc::driver::sys;

use crate::error::{Error, Result};

use super::context::DeviceContext;

/// Pinned device memory of `ctx`'s device, exported as nothing: what every physical
/// allocation of the pool is.
fn allocation_prop(ctx: &DeviceContext) -> Result<sys::CUmemAllocationProp> {
    let location_id = c_int::try_from(ctx.id().ordinal)
        .map_err(|_| Error::invalid("device ordinal out of range"))?;
    // SAFETY: `CUmemAllocationProp` is a plain C struct for which all-zero bytes are valid:
    // its enums have a 0 variant, the handle-type field is an integer newtype, the pointer may
    // be null and zero flags mean "none".
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = location_id;
    Ok(prop)
}

/// [`Backend::vmm_granularity`](crate::backend::Backend::vmm_granularity).
pub(super) fn granularity(ctx: &DeviceContext) -> Result<usize> {
    ctx.bind()?;
    let supported = ctx.attribute(
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    )?;
    if supported == 0 {
        return Err(Error::unsupported(
            "virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED \
             is 0)",
            ctx.id(),
        ));
    }
    let prop = allocation_prop(ctx)?;
    let mut granularity = 0usize;
    // SAFETY: the context is current; `prop` is a valid, initialised property struct and
    // `granularity` a valid out-pointer, both live for the call.
    let r = unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    };
    ctx.check("cuMemGetAllocationGranularity", r)?;
    Ok(granularity.max(1))
}

/// [`Backend::vmm_reserve`](crate::backend::Backend::vmm_reserve).
pub(super) fn reserve(ctx: &DeviceContext, bytes: usize, align: usize) -> Result<u64> {
    ctx.bind()?;
    let mut va: sys::CUdeviceptr = 0;
    // SAFETY: the context is current; `va` is a valid out-pointer; address 0 lets the driver
    // choose, and no flags are defined.
    let r = unsafe { sys::cuMemAddressReserve(&mut va, bytes, align, 0, 0) };
    ctx.check_alloc("cuMemAddressReserve", r, bytes)?;
    Ok(va)
}

/// [`Backend::vmm_free_reservation`](crate::backend::Backend::vmm_free_reservation).
///
/// # Safety
/// As there.
pub(super) unsafe fn free_reservation(ctx: &DeviceContext, va: u64, bytes: usize) -> Result<()> {
    ctx.bind()?;
    // SAFETY: the caller guarantees a whole reservation with nothing mapped in it.
    let r = unsafe { sys::cuMemAddressFree(va, bytes) };
    ctx.check("cuMemAddressFree", r)
}

/// [`Backend::vmm_create`](crate::backend::Backend::vmm_create).
pub(super) fn create(ctx: &DeviceContext, bytes: usize) -> Result<u64> {
    ctx.bind()?;
    let prop = allocation_prop(ctx)?;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: the context is current; `prop` is valid and initialised, `handle` a valid
    // out-pointer; no flags are defined.
    let r = unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) };
    ctx.check_alloc("cuMemCreate", r, bytes)?;
    Ok(handle)
}

/// [`Backend::vmm_release`](crate::backend::Backend::vmm_release).
///
/// # Safety
/// As there.
pub(super) unsafe fn release(ctx: &DeviceContext, handle: u64) -> Result<()> {
    ctx.bind()?;
    // SAFETY: the caller guarantees `handle` came from `cuMemCreate`, is unreleased and
    // mapped nowhere.
    let r = unsafe { sys::cuMemRelease(handle) };
    ctx.check("cuMemRelease", r)
}

/// [`Backend::vmm_map`](crate::backend::Backend::vmm_map).
///
/// # Safety
/// As there.
pub(super) unsafe fn map(ctx: &DeviceContext, va: u64, page: usize, handles: &[u64]) -> Result<()> {
    if handles.is_empty() {
        return Ok(());
    }
    ctx.bind()?;
    let at = |i: usize| va + (i * page) as u64;
    // Undoes the first `n` mappings of the run: made here, and nothing can use them yet (their
    // access was never granted).
    let unmap_first = |n: usize| {
        for i in 0..n {
            // SAFETY: as said above: page `i` of the run is one mapping made by this call.
            let _ = unsafe { sys::cuMemUnmap(at(i), page) };
        }
    };
    for (i, &handle) in handles.iter().enumerate() {
        // SAFETY: the caller guarantees an aligned, unmapped run inside a reservation and
        // live, unmapped handles of `page` bytes each; offset 0 maps all of one; no flags are
        // defined.
        let r = unsafe { sys::cuMemMap(at(i), page, 0, handle, 0) };
        if let Err(e) = ctx.check_alloc("cuMemMap", r, page) {
            unmap_first(i);
            return Err(e);
        }
    }
    let bytes = page * handles.len();
    let prop = allocation_prop(ctx)?;
    let access = sys::CUmemAccessDesc {
        location: prop.location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the whole run was mapped just above (cuMemSetAccess takes a range of several
    // mappings as long as all of it is mapped); `access` is one valid descriptor, live for
    // the call.
    let r = unsafe { sys::cuMemSetAccess(va, bytes, &access, 1) };
    if let Err(e) = ctx.check_alloc("cuMemSetAccess", r, bytes) {
        unmap_first(handles.len());
        return Err(e);
    }
    Ok(())
}

/// [`Backend::vmm_unmap`](crate::backend::Backend::vmm_unmap).
///
/// # Safety
/// As there.
pub(super) unsafe fn unmap(ctx: &DeviceContext, va: u64, bytes: usize) -> Result<()> {
    ctx.bind()?;
    // SAFETY: the caller guarantees one whole mapping that no queued or running work uses.
    let r = unsafe { sys::cuMemUnmap(va, bytes) };
    ctx.check("cuMemUnmap", r)
}
