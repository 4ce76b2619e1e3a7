//! Pageable host memory, 256-byte aligned and zeroed, from the global allocator (small blocks)
//! or straight from the OS (`mmap`, blocks of [`MMAP_THRESHOLD`] and more, on unix): the host
//! emulation's device memory is carved this way, and so is
//! [`HostResource`](crate::HostResource)'s on every backend.

use std::alloc::{self, Layout};

/// The alignment of every allocation, as CUDA guarantees for `cuMemAlloc`.
const ALIGNMENT: usize = 256;

/// Blocks this large and larger are mapped from the OS, not taken from the global allocator.
///
/// glibc's `calloc` hands out lazily zeroed pages only while a block is above its mmap
/// threshold, which rises (up to 32 MiB) each time such a block is freed: after that, every
/// large block comes from the heap and is `memset` in full. Replaying an allocation log on the
/// host spent three quarters of its time there (38 s for RMM's 46,000-event log, 2.5 s with
/// the threshold pinned). Fresh anonymous pages are zero by the OS's guarantee and cost a page
/// fault only where they are touched, which the emulation rarely does.
const MMAP_THRESHOLD: usize = 64 << 10;

/// What one block came from: a 16-byte-aligned allocation of the global allocator, or an
/// anonymous mapping, with room to align its start up to 256 bytes.
#[derive(Clone, Copy)]
pub(crate) struct RawBlock {
    ptr: *mut u8,
    layout: Layout,
    mapped: bool,
}

// SAFETY: a `RawBlock` is an owned allocation of the global allocator, which may be freed from
// any thread; the pointer is only dereferenced by the stream operations their callers order.
unsafe impl Send for RawBlock {}

/// Bytes added to every request so its start can be aligned up to 256 and still leave 8 bytes
/// in front (where `system_allocate` keeps the offset back to the allocation).
const HEADROOM: usize = ALIGNMENT + 8;

/// Allocates `bytes` of zeroed memory whose start is 256-byte aligned.
///
/// Large blocks are fresh pages from the OS ([`MMAP_THRESHOLD`]); small ones ask the global
/// allocator for 16-byte alignment only, so that it takes its `calloc` path. (Asking for
/// 256-byte alignment would make it allocate and then `memset` the whole block.)
pub(crate) fn allocate_zeroed_aligned(bytes: usize) -> Option<(u64, RawBlock)> {
    let layout = Layout::from_size_align(bytes.checked_add(HEADROOM)?, 16).ok()?;
    let (ptr, mapped) = match map_zeroed(layout.size()) {
        Some(ptr) => (ptr, true),
        // SAFETY: `layout` has a non-zero size.
        None => (unsafe { alloc::alloc_zeroed(layout) }, false),
    };
    if ptr.is_null() {
        return None;
    }
    let aligned = (ptr as u64 + 8).next_multiple_of(ALIGNMENT as u64);
    Some((
        aligned,
        RawBlock {
            ptr,
            layout,
            mapped,
        },
    ))
}

/// Fresh zeroed pages for a block of `bytes` ≥ [`MMAP_THRESHOLD`]; `None` for smaller blocks,
/// off unix, or when the OS refuses (the global allocator is tried then).
#[cfg(unix)]
fn map_zeroed(bytes: usize) -> Option<*mut u8> {
    if bytes < MMAP_THRESHOLD {
        return None;
    }
    // SAFETY: an anonymous private mapping at an address the kernel picks: it overlaps nothing
    // of ours, and the result is checked against MAP_FAILED.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (ptr != libc::MAP_FAILED).then_some(ptr.cast())
}

#[cfg(not(unix))]
fn map_zeroed(_bytes: usize) -> Option<*mut u8> {
    None
}

/// Frees a block from [`allocate_zeroed_aligned`].
///
/// # Safety
/// `raw` came from `allocate_zeroed_aligned` and nothing uses its memory any more.
pub(crate) unsafe fn free_raw(raw: RawBlock) {
    #[cfg(unix)]
    if raw.mapped {
        // SAFETY: by the caller's contract, `raw.ptr` is the start of a mapping of
        // `raw.layout.size()` bytes that `map_zeroed` made and nothing uses any more.
        let rc = unsafe { libc::munmap(raw.ptr.cast(), raw.layout.size()) };
        debug_assert_eq!(rc, 0, "munmap of a block map_zeroed mapped");
        return;
    }
    // SAFETY: by the caller's contract, `raw.ptr` came from `alloc_zeroed(raw.layout)` (it was
    // not mapped).
    unsafe { alloc::dealloc(raw.ptr, raw.layout) }
}

/// The bit of `system_allocate`'s header word that says the block was mapped.
const MAPPED_BIT: u32 = 63;

/// Allocates `bytes` (> 0) of zeroed pageable system memory, 256-byte aligned; `None` when the
/// system allocator refuses. Zeroed, so that copying a fresh block to the host never reads
/// uninitialised bytes (large blocks come lazily zeroed from the OS anyway).
pub(crate) fn system_allocate(bytes: usize) -> Option<u64> {
    let (aligned, raw) = allocate_zeroed_aligned(bytes.max(1))?;
    // The offset back to the allocation goes in the 8 bytes in front of the block, which
    // `allocate_zeroed_aligned` always leaves, with whether it was mapped in the top bit (a
    // large block falls back to the global allocator when the OS refuses a mapping).
    let offset = aligned - raw.ptr as u64;
    let tag = offset | (u64::from(raw.mapped) << MAPPED_BIT);
    // SAFETY: `aligned - 8 .. aligned` lies inside the allocation (HEADROOM leaves 8 bytes in
    // front) and is 8-byte aligned, since `aligned` is 256-byte aligned.
    unsafe { ((aligned - 8) as *mut u64).write(tag) };
    Some(aligned)
}

/// Frees what [`system_allocate`] returned.
///
/// # Safety
/// 1. `ptr` came from `system_allocate(bytes)` and is not freed yet.
/// 2. Nothing reads or writes it any more.
pub(crate) unsafe fn system_free(ptr: u64, bytes: usize) {
    // SAFETY: `system_allocate` wrote the offset in the 8 bytes before `ptr` (caller, 1).
    let tag = unsafe { ((ptr - 8) as *const u64).read() };
    let offset = tag & !(1 << MAPPED_BIT);
    let layout =
        Layout::from_size_align(bytes.max(1) + HEADROOM, 16).expect("checked at allocation");
    let raw = RawBlock {
        ptr: (ptr - offset) as *mut u8,
        layout,
        mapped: tag >> MAPPED_BIT == 1,
    };
    // SAFETY: `raw` is the allocation `system_allocate` made for `ptr` with this layout.
    unsafe { free_raw(raw) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks on both sides of the threshold come back zeroed and aligned, also where a freed
    /// block's dirty memory is reused, and free through the path they were made by.
    #[test]
    fn blocks_are_zeroed_aligned_and_freed_by_their_own_path() {
        for bytes in [
            1,
            4096,
            MMAP_THRESHOLD - HEADROOM - 1,
            MMAP_THRESHOLD,
            3 << 20,
        ] {
            for _ in 0..3 {
                let p = system_allocate(bytes).expect("memory");
                assert_eq!(p % ALIGNMENT as u64, 0);
                // SAFETY: `p` is a fresh allocation of `bytes` bytes, used by nothing else.
                let block = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, bytes) };
                assert!(block.iter().all(|&b| b == 0), "{bytes} B not zeroed");
                block.fill(0xA5); // dirty it, so a reuse that is not zeroed shows
                                  // SAFETY: `p` came from `system_allocate(bytes)`; nothing uses it any more.
                unsafe { system_free(p, bytes) };
            }
        }
    }
}
