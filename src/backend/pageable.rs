//! Pageable host memory, 256-byte aligned and zeroed, from the global allocator: the host
//! emulation's device memory is carved this way, and so is
//! [`HostResource`](crate::HostResource)'s on every backend.

use std::alloc::{self, Layout};

/// The alignment of every allocation, as CUDA guarantees for `cuMemAlloc`.
const ALIGNMENT: usize = 256;

/// What the global allocator returned for one block: a 16-byte-aligned allocation with room
/// to align its start up to 256 bytes.
#[derive(Clone, Copy)]
pub(crate) struct RawBlock {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: a `RawBlock` is an owned allocation of the global allocator, which may be freed from
// any thread; the pointer is only dereferenced by the stream operations their callers order.
unsafe impl Send for RawBlock {}

/// Bytes added to every request so its start can be aligned up to 256 and still leave 8 bytes
/// in front (where `system_allocate` keeps the offset back to the allocation).
const HEADROOM: usize = ALIGNMENT + 8;

/// Allocates `bytes` of zeroed memory whose start is 256-byte aligned.
///
/// The allocation asks only for 16-byte alignment, so the global allocator takes its `calloc`
/// path: large blocks come as fresh, lazily zeroed pages from the OS. (Asking for 256-byte
/// alignment would make it allocate and then `memset` the whole block: seconds and real memory
/// for the multi-GiB blocks that tests of a 16 GiB emulated device allocate.)
pub(crate) fn allocate_zeroed_aligned(bytes: usize) -> Option<(u64, RawBlock)> {
    let layout = Layout::from_size_align(bytes.checked_add(HEADROOM)?, 16).ok()?;
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe { alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return None;
    }
    let aligned = (ptr as u64 + 8).next_multiple_of(ALIGNMENT as u64);
    Some((aligned, RawBlock { ptr, layout }))
}

/// Frees a block from [`allocate_zeroed_aligned`].
///
/// # Safety
/// `raw` came from `allocate_zeroed_aligned` and nothing uses its memory any more.
pub(crate) unsafe fn free_raw(raw: RawBlock) {
    // SAFETY: by the caller's contract, `raw.ptr` came from `alloc_zeroed(raw.layout)`.
    unsafe { alloc::dealloc(raw.ptr, raw.layout) }
}

/// Allocates `bytes` (> 0) of zeroed pageable system memory, 256-byte aligned; `None` when the
/// system allocator refuses. Zeroed, so that copying a fresh block to the host never reads
/// uninitialised bytes (large blocks come lazily zeroed from the OS anyway).
pub(crate) fn system_allocate(bytes: usize) -> Option<u64> {
    let (aligned, raw) = allocate_zeroed_aligned(bytes.max(1))?;
    // The offset back to the allocation goes in the 8 bytes in front of the block, which
    // `allocate_zeroed_aligned` always leaves.
    let offset = aligned - raw.ptr as u64;
    // SAFETY: `aligned - 8 .. aligned` lies inside the allocation (HEADROOM leaves 8 bytes in
    // front) and is 8-byte aligned, since `aligned` is 256-byte aligned.
    unsafe { ((aligned - 8) as *mut u64).write(offset) };
    Some(aligned)
}

/// Frees what [`system_allocate`] returned.
///
/// # Safety
/// 1. `ptr` came from `system_allocate(bytes)` and is not freed yet.
/// 2. Nothing reads or writes it any more.
pub(crate) unsafe fn system_free(ptr: u64, bytes: usize) {
    // SAFETY: `system_allocate` wrote the offset in the 8 bytes before `ptr` (caller, 1).
    let offset = unsafe { ((ptr - 8) as *const u64).read() };
    let layout =
        Layout::from_size_align(bytes.max(1) + HEADROOM, 16).expect("checked at allocation");
    let raw = RawBlock {
        ptr: (ptr - offset) as *mut u8,
        layout,
    };
    // SAFETY: `raw` is the allocation `system_allocate` made for `ptr` with this layout.
    unsafe { free_raw(raw) }
}
