//! The allocator cores, for the fuzz targets in `fuzz/` (cargo feature `fuzzing`, hidden from
//! the docs and not part of the API: nothing here is stable).
//!
//! Each type is a thin wrapper over a crate-private core that takes plain integers for stream
//! keys, payloads and fences, so a fuzz target can drive random operation sequences against a
//! shadow model of its own. The wrappers add no checks: a call the core documents as a panic
//! (a double free, say) panics here as well, so targets only make calls the wrappers above the
//! cores would make.

#![allow(missing_docs, missing_debug_implementations)]

use crate::ids::StreamId;
use crate::resource::suballoc::arena::core as arena;
use crate::resource::suballoc::fixed_size::core::FixedSizeCore as FixedCore;
use crate::resource::suballoc::pool::core::state::PoolCore as PCore;
use crate::resource::suballoc::pool::core::types::StreamKey;

/// The granularity of every address and size of the cores (256 bytes).
pub const ALIGN: usize = crate::resource::contract::size::ALIGN;
/// The arena's page (64 KiB).
pub const ARENA_PAGE_SIZE: usize = arena::consts::PAGE_SIZE;
/// The arena's smallest superblock (1 MiB).
pub const SUPERBLOCK_SIZE: usize = arena::consts::SUPERBLOCK_SIZE;
/// Pages in the smallest superblock.
pub const SUPERBLOCK_PAGES: u64 = arena::consts::SUPERBLOCK_PAGES;

/// The pool resource's core (`resource/pool/core.rs`).
#[derive(Default)]
pub struct PoolCore(PCore);

impl PoolCore {
    pub fn new() -> Self {
        PoolCore(PCore::new())
    }
    /// Panics on an unaligned, empty or overlapping chunk.
    pub fn add_chunk(&mut self, base: u64, size: usize, stream: u64) {
        self.0.add_chunk(base, size, StreamKey(stream));
    }
    /// Panics when `size` is 0.
    pub fn allocate(&mut self, size: usize, stream: u64) -> Option<u64> {
        self.0.allocate(size, StreamKey(stream))
    }
    /// `false`, changing nothing, for a block not allocated here with a size rounding to `size`.
    pub fn try_free(&mut self, addr: u64, size: usize, stream: u64) -> bool {
        self.0.try_free(addr, size, StreamKey(stream)).is_some()
    }
    pub fn free_front(&mut self, addr: u64, head: usize, stream: u64) -> bool {
        self.0.free_front(addr, head, StreamKey(stream)).is_some()
    }
    pub fn release_empty_chunks(&mut self) -> Vec<(u64, usize, u64)> {
        let out = self.0.release_empty_chunks_upto(usize::MAX);
        out.into_iter().map(|(b, s, k)| (b, s, k.0)).collect()
    }
    pub fn cut_free_heads(&mut self) -> Vec<(u64, usize, u64)> {
        let out = self.0.cut_free_heads();
        out.into_iter().map(|(b, s, k)| (b, s, k.0)).collect()
    }
    /// Streams other than `exclude` whose blocks serve `size` (panics when `size` is 0).
    pub fn streams_with_block(&self, size: usize, exclude: u64) -> Vec<u64> {
        self.0
            .streams_with_block(size, StreamKey(exclude))
            .map(|(k, _, _)| k.0)
            .collect()
    }
    pub fn merge_stream(&mut self, from: u64, into: u64) -> bool {
        self.0
            .merge_stream(StreamKey(from), StreamKey(into))
            .is_some()
    }
    pub fn other_owner_below(&self, addr: u64) -> Option<u64> {
        self.0.other_owner_below(addr).map(|k| k.0)
    }
    pub fn adopt_below(&mut self, addr: u64) -> bool {
        self.0.adopt_below(addr).is_some()
    }
    pub fn remove_idle_streams(&mut self, keep: Option<u64>) -> usize {
        self.0.remove_idle_streams(keep.map(StreamKey)).len()
    }
    pub fn free_bytes(&self) -> usize {
        self.0.free_bytes()
    }
    pub fn free_bytes_of(&self, stream: u64) -> usize {
        self.0.free_bytes_of(StreamKey(stream))
    }
    pub fn largest_free_block(&self) -> usize {
        self.0.largest_free_block()
    }
    pub fn free_block_count(&self) -> usize {
        self.0.free_block_count()
    }
    pub fn allocation_count(&self) -> usize {
        self.0.allocation_count()
    }
    pub fn chunk_count(&self) -> usize {
        self.0.chunk_count()
    }
    pub fn chunk_bytes(&self) -> usize {
        self.0.chunk_bytes()
    }
}

/// The fixed-size resource's core (`resource/fixed_size/core.rs`), with a `u64` payload per
/// stream list.
pub struct FixedSizeCore(FixedCore<u64>);

impl FixedSizeCore {
    /// `block_size` a multiple of 256; a chunk's size must fit a `usize`.
    pub fn new(block_size: usize, blocks_per_chunk: usize) -> Self {
        FixedSizeCore(FixedCore::new(block_size, blocks_per_chunk))
    }
    pub fn slot_or_insert(&mut self, stream: u64, payload: u64) -> u32 {
        self.0.slot_or_insert(StreamId(stream), || payload)
    }
    pub fn payload(&mut self, slot: u32) -> u64 {
        *self.0.order_mut(slot)
    }
    pub fn add_chunk(&mut self, base: u64, slot: u32) {
        self.0.add_chunk(base, slot);
    }
    pub fn allocate(&mut self, slot: u32) -> Option<u64> {
        self.0.allocate(slot)
    }
    /// `false`, changing nothing, when `addr` is not a block in use.
    pub fn free(&mut self, addr: u64, stream: u64, payload: u64) -> bool {
        self.0.free(addr, StreamId(stream), || payload).is_some()
    }
    /// The list other than `slot`'s with blocks and the highest payload, then the most blocks.
    pub fn pick_victim(&self, slot: u32) -> Option<u32> {
        self.0.pick_victim(Some(slot), |&p| p)
    }
    pub fn move_half(&mut self, from: u32, to: u32) {
        self.0.move_half(from, to);
    }
    pub fn forget_idle(&mut self, keep: u32) {
        self.0.forget_idle(Some(keep));
    }
    pub fn take_chunks(&mut self) -> Vec<u64> {
        self.0.take_chunks()
    }
    /// A lone core hands out every block freed into it: never below 0.
    pub fn live(&self) -> usize {
        self.0
            .live()
            .try_into()
            .expect("more frees than allocations")
    }
    pub fn free_blocks(&self) -> usize {
        self.0.free_blocks()
    }
    pub fn chunk_count(&self) -> usize {
        self.0.chunk_count()
    }
}

/// One stream's arena of the arena resource (`resource/arena/core/stream.rs`), with `u64`
/// fences.
#[derive(Default)]
pub struct StreamArena(arena::StreamArena<u64>);

/// A superblock a [`StreamArena`] gave back: `(base, size, fences)`.
pub type ReleasedSuperblock = (u64, u64, Vec<u64>);

impl StreamArena {
    pub fn new() -> Self {
        StreamArena(arena::StreamArena::default())
    }
    pub fn add_superblock(&mut self, base: u64, size: u64) {
        self.0.add_superblock(base, size);
    }
    /// `size` a non-zero multiple of [`ALIGN`].
    pub fn allocate(&mut self, size: u64) -> Option<u64> {
        self.0.allocate(size)
    }
    /// Panics when `addr` is not live with `size`.
    pub fn free(&mut self, addr: u64, size: u64) {
        self.0.free(addr, size);
    }
    pub fn free_pending(&mut self, addr: u64, size: u64, fence: u64) {
        self.0.free_pending(addr, size, fence);
    }
    pub fn pending_fences(&self) -> Vec<u64> {
        self.0.pending_fences()
    }
    pub fn reclaim_pending(&mut self) {
        self.0.reclaim_pending();
    }
    pub fn release_free_superblocks(&mut self, home: u64) -> Vec<ReleasedSuperblock> {
        let out = self.0.release_free_superblocks(&home);
        out.into_iter()
            .map(|r| (r.base, r.size, r.fences))
            .collect()
    }
    pub fn is_live_with(&self, addr: u64, size: u64) -> bool {
        self.0.is_live_with(addr, size)
    }
    pub fn superblock_count(&self) -> usize {
        self.0.superblock_count()
    }
    pub fn superblock_bytes(&self) -> u64 {
        self.0.superblock_bytes()
    }
    pub fn free_bytes(&self) -> u64 {
        self.0.free_bytes()
    }
    pub fn live_bytes(&self) -> u64 {
        self.0.live_bytes()
    }
    pub fn pending_bytes(&self) -> u64 {
        self.0.pending_bytes()
    }
    pub fn live_count(&self) -> usize {
        self.0.live_count()
    }
    pub fn free_block_count(&self) -> usize {
        self.0.free_block_count()
    }
    pub fn largest_free(&self) -> u64 {
        self.0.largest_free()
    }
}

/// The arena resource's global arena (`resource/arena/core/global.rs`), in pages, with `u64`
/// fences.
pub struct GlobalArena(arena::GlobalArena<u64>);

/// Pages [`GlobalArena::take`] handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    /// The first page.
    pub start: u64,
    pub pages: u64,
    /// The fences of the free range the pages came from.
    pub fences: Vec<u64>,
}

impl GlobalArena {
    /// Panics when `pages` is below [`SUPERBLOCK_PAGES`].
    pub fn new(pages: u64, fences: Vec<u64>) -> Self {
        GlobalArena(arena::GlobalArena::new(pages, fences))
    }
    fn what(large: bool) -> arena::Use {
        if large {
            arena::Use::Large
        } else {
            arena::Use::Superblock
        }
    }
    /// `(first page, pages)` that [`take`](Self::take) would hand out for a superblock
    /// (`large == false`) or a large block of exactly `pages` (> 0).
    pub fn find(&self, large: bool, pages: u64) -> Option<(u64, u64)> {
        self.0
            .find(Self::what(large), pages)
            .map(|c| (c.start, c.pages))
    }
    /// Finds (as [`find`](Self::find)) and hands out the pages, with the fences to wait on.
    pub fn take(&mut self, large: bool, pages: u64) -> Option<Taken> {
        let c = self.0.find(Self::what(large), pages)?;
        let fences = self.0.fences(&c).to_vec();
        self.0.take(c, 0); // the fuzz target keeps no large-block tags
        Some(Taken {
            start: c.start,
            pages: c.pages,
            fences,
        })
    }
    pub fn is_large(&self, start: u64, pages: u64) -> bool {
        self.0.is_large(start, pages)
    }
    pub fn free_large(&mut self, start: u64, pages: u64, fence: u64) {
        self.0.free_large(start, pages, fence);
    }
    pub fn return_superblock(&mut self, start: u64, pages: u64, fences: Vec<u64>) {
        self.0.return_superblock(start, pages, fences);
    }
    pub fn pages(&self) -> u64 {
        self.0.pages()
    }
    pub fn free_pages(&self) -> u64 {
        self.0.free_pages()
    }
    pub fn large_pages(&self) -> u64 {
        self.0.large_pages()
    }
    pub fn large_count(&self) -> usize {
        self.0.large_count()
    }
    pub fn lent_pages(&self) -> u64 {
        self.0.lent_pages()
    }
    pub fn largest_free_pages(&self) -> u64 {
        self.0.largest_free_pages()
    }
    /// `(first page, pages, fences)` of each free range, in address order.
    pub fn free_ranges(&self) -> Vec<(u64, u64, Vec<u64>)> {
        self.0
            .free_ranges()
            .into_iter()
            .map(|(s, p, f)| (s, p, f.to_vec()))
            .collect()
    }
}
