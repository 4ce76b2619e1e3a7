//! The stream-ordered, coalescing free-list core of the pool resource.
//!
//! [`PoolCore`] is a plain single-threaded data structure over *addresses and sizes*: it knows
//! nothing of CUDA, streams or events. A stream is an opaque [`StreamKey`]; the public pool
//! wrapper puts the core behind a lock, obtains chunks from the upstream resource, records and
//! waits on events, and decides when to grow, steal and trim. All metadata lives in host
//! memory, keyed by address, because device memory is not host-writable (no in-band headers).
//!
//! # Granularity
//! Every address and size the core hands out or takes back is a multiple of [`ALIGN`]
//! (256 bytes, `cuMemAlloc`'s alignment). [`PoolCore::allocate`] and [`PoolCore::free`] round
//! the size they are given up to a multiple of [`ALIGN`] themselves, so the caller passes the
//! user's byte count to both; chunks given to [`PoolCore::add_chunk`] must already be aligned.
//! A size of 0 is the wrapper's business (it returns a null pointer); the core panics on it.
//!
//! # Blocks: physical lists per chunk, one map for allocated blocks
//! Each chunk is cut into blocks, free or allocated, that tile it; they live in a slab
//! (`Vec<Block>` with a vacant list, `u32` indices) and each chunk's blocks form a doubly
//! linked list in address order (TLSF's "physical" neighbour links). A freed block therefore
//! finds its left and right neighbours by following two links, with no search and no map;
//! and since the lists of two chunks are never linked, blocks never merge across chunks, even
//! when two upstream allocations happen to be adjacent (each must go back upstream exactly as
//! it came, and [`PoolCore::release_empty_chunks`] relies on a wholly free chunk being one
//! block). The only map is `live`: the start address of every *allocated* block → its slab
//! index, because [`PoolCore::free`] is given an address. So an allocation costs one hash
//! insert and a free one hash remove (`rustc-hash`'s Fx hasher: keys are addresses, not
//! attacker-chosen, and a multiply-rotate hash is several times cheaper than SipHash here),
//! except for the newest allocation, which waits in front of the hash map until the next one
//! comes: a block freed before the next allocation (the fast path's pattern) costs no hash
//! operation at all (`live.rs`).
//! Freeing an address the pool did not hand out, or with another size, is caught at once.
//!
//! An allocation is carved from the *tail* of the free block it uses: the free block keeps its
//! start and its slab slot, so a large block whose class does not change stays where it is on
//! its class list, and a chunk's first block is always the same slab slot (merges keep the
//! left block), which makes "is this chunk wholly free?" an O(1) check. (The pool's shards
//! cut a chunk's free head off and give it back, [`PoolCore::cut_free_heads`]; the chunk then
//! starts at its next block.)
//!
//! # Per-stream TLSF index
//! Each stream that owns free memory has its own two-level segregated-fit index (TLSF, as in
//! `rlsf`): sizes are counted in 256-byte *units*; the first level is `log2(units)`, the second
//! level splits each power-of-two range into [`SL_COUNT`](classes::SL_COUNT) (32) equal classes, and
//! sizes below 64 units (16 KiB) get one exact class each. Each class is an intrusive doubly linked
//! list threaded through the slab, and two bitmaps (one bit per first level, one per class) say
//! which lists are non-empty. An allocation maps its size *up* to the first class whose every block
//! fits, then finds the first non-empty class at or above it with two `trailing_zeros` scans: O(1),
//! and the block found is at most 1/32 (about 3 %) larger than the best fit would have been; the
//! excess is split off and stays free. When nothing at or above that class exists, up to
//! [`OWN_CLASS_PROBES`](index::OWN_CLASS_PROBES) blocks of the request's own class (which may hold
//! blocks both smaller and larger than the request) are tried, so that a lone block only slightly
//! larger than the request (say, the last free chunk of a bounded pool) is still found. Free blocks
//! are never scanned beyond that.
//!
//! # Stream ownership, taking and merging
//! A block freed on stream S is owned by S: S may reuse it at once, because any later work on S
//! is ordered after the free. Another stream T may not touch it until T has waited for an event
//! recorded on S after the free. [`PoolCore::allocate`] therefore serves a stream from its own
//! blocks only, and blocks of different streams never coalesce. The wrapper decides when memory
//! crosses streams, with two operations of the core:
//! - *take*: when T's own blocks cannot serve a request and another stream S has a block that
//!   can ([`PoolCore::streams_with_block`]), the wrapper makes T wait for an event of S and calls
//!   [`PoolCore::allocate`]`(size, S)`: the piece is carved from S's block, the rest stays S's,
//!   and when T frees the piece it becomes T's. So memory freed on a stream that then goes
//!   quiet is never stranded there (RMM issue #2039), and busy streams do not hand their whole
//!   free lists back and forth.
//! - *merge*: when no single stream has a block big enough, [`PoolCore::merge_stream`]`(S, T)`
//!   makes *every* free block of S T's, coalescing with T's neighbours, after the same kind of
//!   wait; it is the remedy against fragmentation across streams, and how a trim gathers free
//!   memory so that wholly free chunks become single blocks again.
//!
//! One event of S covers every free on S before it, so frees need not record events. Each
//! stream numbers the changes to its free memory (frees, chunks, memory merged in;
//! [`PoolCore::seq_of`]) and each free block carries the number of the latest it took part in
//! (in the padding of its slab entry), so that the wrapper can order a taker after the one
//! free that made the block it takes, rather than after the stream's newest. A merged block
//! carries its newest part's number, so a stream whose memory others take coalesces lazily
//! ([`PoolCore::set_lazy_coalescing`]): its frees are linked alone and merged only when a
//! request finds no block big enough, or before chunks are released. (Otherwise a pipeline's
//! download stream merges each batch it frees into the free memory around it, and the upload
//! that takes any of it waits for the download just queued.)
//!
//! # Complexity
//! | operation | cost |
//! |---|---|
//! | [`allocate`](PoolCore::allocate) | O(1): a stream lookup (cached for runs on one stream), two bitmap scans, one hash insert, at most one relink (≤ [`OWN_CLASS_PROBES`](index::OWN_CLASS_PROBES) probes when the scan fails) |
//! | [`free`](PoolCore::free) | O(1): one hash remove, two link-following merges, at most one relink |
//! | [`add_chunk`](PoolCore::add_chunk) | O(log chunks) |
//! | [`stream_with_block`](PoolCore::stream_with_block) | O(streams) |
//! | [`merge_stream`](PoolCore::merge_stream) | O(k), k = free blocks of the source stream |
//! | [`release_empty_chunks`](PoolCore::release_empty_chunks) | O(chunks) |
//! | [`largest_free_block`](PoolCore::largest_free_block) | O(streams + blocks in each stream's largest class) |
//! | [`largest_free_extent`](PoolCore::largest_free_extent), [`chunks_and_blocks`](PoolCore::chunks_and_blocks) (snapshots) | O(blocks) |
//! | the other statistics | O(1) |
//!
//! # Files
//! This file holds the core's operations on chunks and allocations; beside it, `state.rs` the
//! [`PoolCore`] struct, `types.rs` the small types every file shares, `slab.rs` the slab's
//! [`Block`](slab::Block) entries, `classes.rs` the size classes, `stream_free.rs` each stream's
//! class lists, `index.rs` finding and (un)linking blocks on them, `blocks.rs` the coalescing of
//! blocks, `streams.rs` the per-stream slots and memory crossing streams, `live.rs` the map of
//! allocated blocks, `snapshot.rs` the walk for snapshots, and `invariants.rs` (tests only) the
//! exhaustive invariant check.

mod blocks;
mod classes;
mod index;
#[cfg(test)]
mod invariants;
mod live;
mod slab;
mod snapshot;
pub(crate) mod state;
mod stream_free;
mod streams;
pub(crate) mod types;

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use self::live::LiveMap;
use self::slab::{NIL, USED};
use self::state::PoolCore;
use self::types::{Chunk, ChunkId, StreamKey};

/// The granularity of every address and size in the pool (`cuMemAlloc`'s alignment), and
/// rounding to it: shared by every resource.
pub(crate) use crate::resource::contract::size::{align_up, ALIGN};

/// How many blocks of one class list [`PoolCore::oldest_block_for`] compares.
pub(crate) const OLDEST_PROBES: usize = 32;

impl PoolCore {
    /// An empty pool: no chunks, no blocks.
    pub(crate) fn new() -> Self {
        PoolCore {
            blocks: Vec::new(),
            vacant: NIL,
            live: LiveMap::default(),
            streams: Vec::new(),
            stream_slots: FxHashMap::default(),
            vacant_streams: Vec::new(),
            last_stream: (StreamKey(0), NIL),
            chunks: BTreeMap::new(),
            next_chunk_id: 0,
            chunk_bytes: 0,
            free_bytes: 0,
            free_count: 0,
        }
    }

    /// Adds `[base, base + size)`, just obtained from the upstream, as one free block owned by
    /// `stream` (the stream the upstream allocation is ordered on).
    ///
    /// # Panics
    /// When `base` or `size` is not a multiple of [`ALIGN`], `size` is 0, the range wraps
    /// around or it overlaps a chunk already in the pool.
    pub(crate) fn add_chunk(&mut self, base: u64, size: usize, stream: StreamKey) -> ChunkId {
        let size = size as u64;
        assert!(
            base % ALIGN as u64 == 0 && size % ALIGN as u64 == 0 && size > 0,
            "pool chunk {base:#x}+{size:#x} is not a non-empty, {ALIGN}-byte aligned range"
        );
        let end = base
            .checked_add(size)
            .unwrap_or_else(|| panic!("pool chunk {base:#x}+{size:#x} wraps around"));
        let below = self.chunks.range(..end).next_back();
        assert!(
            below.is_none_or(|(&b, c)| b + c.size <= base),
            "pool chunk {base:#x}+{size:#x} overlaps a chunk of the pool"
        );
        let id = ChunkId(self.next_chunk_id);
        self.next_chunk_id += 1;
        let slot = self.slot_or_insert(stream);
        let first = self.new_block(base, size, slot, NIL, NIL);
        self.blocks[first as usize].freed = self.next_seq(slot);
        self.link(first);
        self.chunks.insert(base, Chunk { id, size, first });
        self.chunk_bytes += size;
        self.add_free_bytes(slot, size);
        id
    }

    /// Allocates `size` bytes (rounded up to a multiple of [`ALIGN`]) from `stream`'s own free
    /// blocks: a good fit (see the module docs), carved from the block's tail when the block is
    /// larger, the rest staying free and owned by `stream`. `None` when `stream` has no block
    /// that this search finds; other streams' blocks are never used (see
    /// [`stream_with_block`](Self::stream_with_block)).
    ///
    /// # Panics
    /// When `size` is 0.
    pub(crate) fn allocate(&mut self, size: usize, stream: StreamKey) -> Option<u64> {
        assert!(size != 0, "the pool core does not serve 0-byte requests");
        let size = align_up(size)? as u64;
        let slot = self.slot_of(stream)?;
        let idx = self.find_block(slot, size)?;
        Some(self.carve(idx, size, slot, stream))
    }

    /// For another stream's take of `stream`'s memory: the block [`allocate`](Self::allocate)
    /// would use, or rather the one freed longest ago (the smallest stamp, see
    /// [`seq_of`](Self::seq_of)) among up to [`OLDEST_PROBES`] blocks that fit on its class
    /// list, with its stamp. A class list is last in, first out, which suits a stream reusing
    /// its own memory; a taker on another stream must wait for the free of the block it takes,
    /// and the oldest free is the one the device has most likely passed (a pipeline's upload
    /// then reuses the batch whose download ended first, not the one just queued).
    pub(crate) fn oldest_block_for(&self, size: usize, stream: StreamKey) -> Option<(u32, u32)> {
        let size = align_up(size)? as u64;
        let slot = *self.stream_slots.get(&stream.0)?;
        let found = self.find_block(slot, size)?;
        let seq = self.stream(slot).seq as u32;
        let age = |idx: u32| seq.wrapping_sub(self.blocks[idx as usize].freed);
        // The found block's list: walk it from its head.
        let mut idx = found;
        while self.blocks[idx as usize].prev != NIL {
            idx = self.blocks[idx as usize].prev;
        }
        let mut oldest = found;
        for _ in 0..OLDEST_PROBES {
            if idx == NIL {
                break;
            }
            let b = &self.blocks[idx as usize];
            if b.size >= size && age(idx) > age(oldest) {
                oldest = idx;
            }
            idx = b.next;
        }
        Some((oldest, self.blocks[oldest as usize].freed))
    }

    /// Allocates `size` bytes for `stream` from `stream`'s free block `idx` (found by
    /// [`oldest_block_for`](Self::oldest_block_for) with the same size and stream, and
    /// nothing changed since), as [`allocate`](Self::allocate) does from the block it finds.
    ///
    /// # Panics
    /// When `idx` is not a free block of `stream` of at least `size` bytes.
    pub(crate) fn allocate_block(&mut self, idx: u32, size: usize, stream: StreamKey) -> u64 {
        let size = align_up(size).expect("the size was found to fit") as u64;
        let slot = self.slot_of(stream).expect("the stream owns the block");
        let block = self.blocks[idx as usize];
        assert!(
            block.stream == slot && block.size >= size,
            "block {idx} is not a free block of the stream that fits {size} bytes"
        );
        self.carve(idx, size, slot, stream)
    }

    /// Cuts `size` bytes (aligned) off the tail of `slot`'s free block `idx` for `stream`.
    fn carve(&mut self, idx: u32, size: u64, slot: u32, stream: StreamKey) -> u64 {
        let block = self.blocks[idx as usize];
        let used = if block.size == size {
            self.unlink(idx);
            self.blocks[idx as usize].stream = USED;
            idx
        } else {
            let rest = block.size - size;
            let used = self.new_block(block.start + rest, size, USED, idx, block.next_phys);
            if block.next_phys != NIL {
                self.blocks[block.next_phys as usize].prev_phys = used;
            }
            self.blocks[idx as usize].next_phys = used;
            self.resize(idx, rest);
            used
        };
        // The block's class-list links are unused while it is allocated: they keep the stream
        // it was allocated for (for snapshots; two stores to a line written just above).
        self.blocks[used as usize].set_allocated_for(stream);
        self.sub_free_bytes(slot, size);
        let addr = self.blocks[used as usize].start;
        self.live.insert(addr, used);
        addr
    }

    /// [`allocate`](Self::allocate), but only from a block of at most `max_block` bytes: a
    /// large block carved from a much larger free one would pin the rest of its chunk.
    pub(crate) fn allocate_close(
        &mut self,
        size: usize,
        max_block: usize,
        stream: StreamKey,
    ) -> Option<u64> {
        let slot = self.slot_of(stream)?;
        let idx = self.find_block(slot, align_up(size)? as u64)?;
        if self.blocks[idx as usize].size > max_block as u64 {
            return None;
        }
        self.allocate(size, stream)
    }

    /// Returns the block at `addr`, allocated with `size` bytes, to the pool, owned by
    /// `stream` from now on, and coalesces it at once with the free neighbours of the same
    /// stream in its chunk. Returns `stream`'s slot (see [`stream_slot`](Self::stream_slot)).
    ///
    /// # Panics
    /// When `addr` is not a block allocated from this pool and not freed since (a double
    /// free, or a foreign pointer), or `size` does not round to that block's size.
    #[cfg(test)]
    pub(crate) fn free(&mut self, addr: u64, size: usize, stream: StreamKey) -> u32 {
        if let Some(idx) = self.live.get(addr) {
            let block_size = self.blocks[idx as usize].size;
            assert!(
                align_up(size) == Some(block_size as usize),
                "{addr:#x} was allocated with {block_size} bytes, freed with {size}"
            );
        }
        self.try_free(addr, size, stream)
            .unwrap_or_else(|| panic!("{addr:#x} is not allocated from this pool (double free?)"))
    }

    /// [`free`](Self::free) for an address that may belong to another core: `None`, and
    /// nothing changed, when `addr` is not a block allocated here with a size that rounds to
    /// `size`'s (a wrong size is refused like a foreign pointer: the caller reports it).
    pub(crate) fn try_free(&mut self, addr: u64, size: usize, stream: StreamKey) -> Option<u32> {
        // One hash lookup on the usual path; a wrong size (a bug of the caller's) puts the
        // entry back.
        let idx = self.live.remove(addr)?;
        let block_size = self.blocks[idx as usize].size;
        if align_up(size) != Some(block_size as usize) {
            self.live.insert(addr, idx);
            return None;
        }
        let slot = self.slot_or_insert(stream);
        self.blocks[idx as usize].stream = slot;
        self.blocks[idx as usize].freed = self.next_seq(slot);
        self.coalesce_and_link(idx);
        self.add_free_bytes(slot, block_size);
        Some(slot)
    }

    /// Removes every chunk that is wholly free (one free block spanning it) and returns its
    /// `(base, size, owner)`, in address order, for the wrapper to give back to the upstream on
    /// the stream that owns the free memory.
    #[cfg(test)]
    pub(crate) fn release_empty_chunks(&mut self) -> Vec<(u64, usize, StreamKey)> {
        self.release_empty_chunks_upto(usize::MAX)
    }

    /// [`release_empty_chunks`](Self::release_empty_chunks), stopping once the chunks
    /// released add up to `at_least` bytes (in address order).
    pub(crate) fn release_empty_chunks_upto(
        &mut self,
        at_least: usize,
    ) -> Vec<(u64, usize, StreamKey)> {
        // A wholly free chunk is one block once merged.
        self.coalesce_lazy_streams();
        let mut total = 0u64;
        let empty: Vec<(u64, Chunk)> = self
            .chunks
            .iter()
            .filter(|(_, c)| {
                let first = &self.blocks[c.first as usize];
                first.is_free() && first.next_phys == NIL
            })
            .take_while(|(_, c)| {
                let more = total < at_least as u64;
                total += c.size;
                more
            })
            .map(|(&base, &c)| (base, c))
            .collect();
        let mut owners = Vec::with_capacity(empty.len());
        for &(base, chunk) in &empty {
            let slot = self.blocks[chunk.first as usize].stream;
            owners.push(self.stream(slot).key);
            self.unlink(chunk.first);
            self.drop_block(chunk.first);
            self.sub_free_bytes(slot, chunk.size);
            self.chunks.remove(&base);
            self.chunk_bytes -= chunk.size;
        }
        empty
            .into_iter()
            .zip(owners)
            .map(|((base, chunk), owner)| (base, chunk.size as usize, owner))
            .collect()
    }

    /// Cuts the free first block off every chunk that has one and is not wholly free: the
    /// chunk then starts at its next block. Returns `(old base, head bytes, owner)` of each,
    /// for the caller to give the heads back to where the chunks came from. (A shard's
    /// sub-chunk is carved from its tail, so its unused rest is its head; given back, it joins
    /// the free memory just below it instead of being stranded in the shard.)
    pub(crate) fn cut_free_heads(&mut self) -> Vec<(u64, usize, StreamKey)> {
        let heads: Vec<(u64, Chunk)> = self
            .chunks
            .iter()
            .filter(|(_, c)| {
                let first = &self.blocks[c.first as usize];
                first.is_free() && first.next_phys != NIL
            })
            .map(|(&base, &c)| (base, c))
            .collect();
        let mut out = Vec::with_capacity(heads.len());
        for (base, chunk) in heads {
            let first = self.blocks[chunk.first as usize];
            let owner = self.stream(first.stream).key;
            self.unlink(chunk.first);
            self.sub_free_bytes(first.stream, first.size);
            self.blocks[first.next_phys as usize].prev_phys = NIL;
            self.drop_block(chunk.first);
            self.chunks.remove(&base);
            self.chunks.insert(
                first.end_addr(),
                Chunk {
                    id: chunk.id,
                    size: chunk.size - first.size,
                    first: first.next_phys,
                },
            );
            self.chunk_bytes -= first.size;
            out.push((base, first.size as usize, owner));
        }
        out
    }

    /// Frees the first `head` bytes of the allocated block at `addr` (a multiple of [`ALIGN`],
    /// less than its size) on `stream`, coalescing them like [`try_free`](Self::try_free); the
    /// rest stays allocated, now at `addr + head`. Returns `stream`'s slot; `None`, and
    /// nothing changed, when `addr` is not an allocated block here or `head` does not fit.
    pub(crate) fn free_front(&mut self, addr: u64, head: usize, stream: StreamKey) -> Option<u32> {
        let head = head as u64;
        let idx = self.live.get(addr)?;
        let block = self.blocks[idx as usize];
        if head == 0 || head % ALIGN as u64 != 0 || head >= block.size {
            return None;
        }
        self.live.remove(addr);
        // The head keeps the slot (a chunk's first block stays its first), the rest gets a new
        // one.
        let rest = self.new_block(addr + head, block.size - head, USED, idx, block.next_phys);
        if block.next_phys != NIL {
            self.blocks[block.next_phys as usize].prev_phys = rest;
        }
        let owner = block.allocated_for();
        self.blocks[rest as usize].set_allocated_for(owner);
        self.live.insert(addr + head, rest);
        let slot = self.slot_or_insert(stream);
        let freed = self.next_seq(slot);
        let b = &mut self.blocks[idx as usize];
        b.size = head;
        b.next_phys = rest;
        b.stream = slot;
        b.freed = freed;
        // Merged even for a lazy stream: a head given back joins the free memory below it.
        self.merge_and_link(idx);
        self.add_free_bytes(slot, head);
        Some(slot)
    }

    /// The owner of the free block below the free block below the allocated block at `addr`,
    /// when that owner is not the lower one's: after [`free_front`](Self::free_front), the
    /// stream whose free memory the freed head touches without coalescing with it.
    pub(crate) fn other_owner_below(&self, addr: u64) -> Option<StreamKey> {
        let (_, below) = self.free_pair_below(addr)?;
        Some(self.stream(self.blocks[below as usize].stream).key)
    }

    /// Gives the free block found by [`other_owner_below`](Self::other_owner_below) to the
    /// owner of the one above it, which then coalesce. The caller must first have made that
    /// owner wait for the giver's frees (as for [`merge_stream`](Self::merge_stream)). Returns
    /// the giver's slot when the giver has no free block left (for the caller to forget).
    pub(crate) fn adopt_below(&mut self, addr: u64) -> Option<u32> {
        let (upper, below) = self.free_pair_below(addr)?;
        let into = self.blocks[upper as usize].stream;
        let from = self.blocks[below as usize].stream;
        let size = self.blocks[below as usize].size;
        self.unlink(below);
        self.sub_free_bytes(from, size);
        self.blocks[below as usize].stream = into;
        self.blocks[below as usize].freed = self.next_seq(into);
        // Merged even for a lazy stream: joining the two is the point.
        self.merge_and_link(below);
        self.add_free_bytes(into, size);
        (self.stream(from).blocks == 0).then_some(from)
    }

    /// `(upper, lower)`: the free block just below the allocated block at `addr` and the free
    /// block of another stream just below that one.
    fn free_pair_below(&self, addr: u64) -> Option<(u32, u32)> {
        let idx = self.live.get(addr)?;
        let upper = self.blocks[idx as usize].prev_phys;
        if upper == NIL || !self.blocks[upper as usize].is_free() {
            return None;
        }
        let lower = self.blocks[upper as usize].prev_phys;
        let l = self.blocks.get(lower as usize)?;
        (l.is_free() && l.stream != self.blocks[upper as usize].stream).then_some((upper, lower))
    }

    /// Numbers a change to the free memory of the stream in `slot` (see [`seq_of`](Self::seq_of)):
    /// the low bits of the new number, for the block it stamps.
    fn next_seq(&mut self, slot: u32) -> u32 {
        let s = self.stream_mut(slot);
        s.seq += 1;
        s.seq as u32
    }

    /// The number of the latest change to the free memory of the stream in `slot`: a free, a
    /// chunk added, memory merged or adopted into it ([`try_free`](Self::try_free),
    /// [`add_chunk`](Self::add_chunk), [`merge_stream`](Self::merge_stream),
    /// [`adopt_below`](Self::adopt_below), [`free_front`](Self::free_front) each make one).
    /// Counted from 1 for each stream since its slot was made; every free block carries the
    /// low 32 bits of the change it last took part in.
    pub(crate) fn seq_of(&self, slot: u32) -> u64 {
        self.stream(slot).seq
    }

    /// The total size of the free blocks, of all streams.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free_bytes as usize
    }

    /// The total size of `stream`'s free blocks.
    pub(crate) fn free_bytes_of(&self, stream: StreamKey) -> usize {
        self.stream_slots
            .get(&stream.0)
            .map_or(0, |&slot| self.stream(slot).free_bytes as usize)
    }

    /// The size of the largest free block, of any stream; 0 when there is none.
    pub(crate) fn largest_free_block(&self) -> usize {
        (0..self.streams.len() as u32)
            .filter(|&slot| self.streams[slot as usize].is_some())
            .map(|slot| self.largest_of_slot(slot))
            .max()
            .unwrap_or(0) as usize
    }

    /// The size of `stream`'s largest free block; 0 when it has none.
    #[cfg(test)]
    pub(crate) fn largest_free_block_of(&self, stream: StreamKey) -> usize {
        self.stream_slots
            .get(&stream.0)
            .map_or(0, |&slot| self.largest_of_slot(slot) as usize)
    }

    /// The number of free blocks, of all streams.
    pub(crate) fn free_block_count(&self) -> usize {
        self.free_count
    }

    /// The number of allocated blocks.
    pub(crate) fn allocation_count(&self) -> usize {
        self.live.len()
    }

    /// The number of chunks in the pool.
    pub(crate) fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The total size of the chunks in the pool (free and allocated).
    pub(crate) fn chunk_bytes(&self) -> usize {
        self.chunk_bytes as usize
    }
}

#[cfg(test)]
mod tests;
