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
//! attacker-chosen, and a multiply-rotate hash is several times cheaper than SipHash here).
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
//! `rlsf`): sizes are counted in 256-byte *units*; the first level is `log2(units)`, the
//! second level splits each power-of-two range into [`SL_COUNT`] (32) equal classes, and
//! sizes below 64 units (16 KiB) get one exact class each. Each class is an intrusive doubly
//! linked list threaded through the slab, and two bitmaps (one bit per first level, one per
//! class) say which lists are non-empty. An allocation maps its size *up* to the first class
//! whose every block fits, then finds the first non-empty class at or above it with two
//! `trailing_zeros` scans: O(1), and the block found is at most 1/32 (about 3 %) larger than
//! the best fit would have been; the excess is split off and stays free. When nothing at or
//! above that class exists, up to [`OWN_CLASS_PROBES`] blocks of the request's own class
//! (which may hold blocks both smaller and larger than the request) are tried, so that a lone
//! block only slightly larger than the request (say, the last free chunk of a bounded pool) is
//! still found. Free blocks are never scanned beyond that.
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
//! One event of S covers every free on S before it, so frees never record events.
//!
//! # Complexity
//! | operation | cost |
//! |---|---|
//! | [`allocate`](PoolCore::allocate) | O(1): a stream lookup (cached for runs on one stream), two bitmap scans, one hash insert, at most one relink (≤ [`OWN_CLASS_PROBES`] probes when the scan fails) |
//! | [`free`](PoolCore::free) | O(1): one hash remove, two link-following merges, at most one relink |
//! | [`add_chunk`](PoolCore::add_chunk) | O(log chunks) |
//! | [`stream_with_block`](PoolCore::stream_with_block) | O(streams) |
//! | [`merge_stream`](PoolCore::merge_stream) | O(k), k = free blocks of the source stream |
//! | [`release_empty_chunks`](PoolCore::release_empty_chunks) | O(chunks) |
//! | [`largest_free_block`](PoolCore::largest_free_block) | O(streams + blocks in each stream's largest class) |
//! | the other statistics | O(1) |

use std::collections::BTreeMap;
use std::fmt;

use rustc_hash::FxHashMap;

/// The granularity of every address and size in the pool (`cuMemAlloc`'s alignment), and
/// rounding to it: shared by every resource.
pub(crate) use crate::resource::size::{align_up, ALIGN};
const ALIGN_LOG2: u32 = ALIGN.trailing_zeros();

/// log2 of the number of second-level classes per power of two.
const SL_LOG2: u32 = 5;
/// The number of second-level classes per power of two.
const SL_COUNT: usize = 1 << SL_LOG2;
/// The number of first levels: enough for any size below 2^64 bytes (units below 2^56).
const FL_COUNT: usize = (u64::BITS - ALIGN_LOG2 - SL_LOG2 + 1) as usize;
/// The number of size classes of one stream's index.
const CLASS_COUNT: usize = FL_COUNT * SL_COUNT;
/// How many blocks of the request's own class an allocation tries when no class whose every
/// block fits has a block.
const OWN_CLASS_PROBES: usize = 8;
/// The null slab index (also [`Block::stream`] of a vacant slot).
const NIL: u32 = u32::MAX;
/// [`Block::stream`] of an allocated block.
const USED: u32 = u32::MAX - 1;

/// A stream as the core sees it: an opaque key (the wrapper uses the stream's id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct StreamKey(pub(crate) u64);

/// Names a chunk obtained from the upstream resource, in the order the pool received them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ChunkId(pub(crate) u64);

/// The size class `(first level, second level)` of a block of `units` 256-byte units
/// (`units >= 1`). Classes are ordered: a larger size never maps to a smaller class.
fn class_of(units: u64) -> (usize, usize) {
    debug_assert!(units > 0);
    if units < SL_COUNT as u64 {
        (0, units as usize)
    } else {
        let msb = u64::BITS - 1 - units.leading_zeros();
        let shift = msb - SL_LOG2;
        ((shift + 1) as usize, (units >> shift) as usize - SL_COUNT)
    }
}

/// The smallest size, in units, of class `(fl, sl)`.
fn class_min(fl: usize, sl: usize) -> u64 {
    if fl == 0 {
        sl as u64
    } else {
        ((SL_COUNT + sl) as u64) << (fl - 1)
    }
}

/// The smallest class whose *every* block holds `units`: the class of `units` rounded up to
/// the next class boundary. `None` when that is past the largest class.
fn search_class(units: u64) -> Option<(usize, usize)> {
    debug_assert!(units > 0);
    if units < SL_COUNT as u64 {
        return Some((0, units as usize));
    }
    let msb = u64::BITS - 1 - units.leading_zeros();
    let rounded = units.checked_add((1 << (msb - SL_LOG2)) - 1)?;
    let (fl, sl) = class_of(rounded);
    (fl < FL_COUNT).then_some((fl, sl))
}

/// The flat index of class `(fl, sl)` in [`StreamFree::heads`].
fn class_index(fl: usize, sl: usize) -> usize {
    fl * SL_COUNT + sl
}

/// The flat class index of a block of `size` bytes.
fn class_index_of_size(size: u64) -> usize {
    let (fl, sl) = class_of(size >> ALIGN_LOG2);
    class_index(fl, sl)
}

/// A block of a chunk, free or allocated, or a vacant slab slot.
#[derive(Clone, Copy, Debug)]
struct Block {
    /// The first address; a multiple of [`ALIGN`].
    start: u64,
    /// The size in bytes; a non-zero multiple of [`ALIGN`].
    size: u64,
    /// For a free block, the slot in [`PoolCore::streams`] of the owning stream (always below
    /// [`USED`]); [`USED`] for an allocated block; [`NIL`] for a vacant slab slot.
    stream: u32,
    /// Free blocks: the previous block of the same class list ([`NIL`] at the head).
    prev: u32,
    /// Free blocks: the next block of the same class list ([`NIL`] at the tail). Vacant
    /// slots: the next vacant slot.
    next: u32,
    /// The block just below in the same chunk ([`NIL`] for the chunk's first block):
    /// `blocks[prev_phys].start + blocks[prev_phys].size == start`.
    prev_phys: u32,
    /// The block just above in the same chunk ([`NIL`] for the chunk's last block).
    next_phys: u32,
}

impl Block {
    #[cfg(test)]
    fn end(&self) -> u64 {
        self.start + self.size
    }

    fn end_addr(&self) -> u64 {
        self.start + self.size
    }

    fn is_free(&self) -> bool {
        self.stream < USED
    }
}

/// One stream's free blocks: a TLSF index of class lists.
struct StreamFree {
    /// The stream.
    key: StreamKey,
    /// Bit `fl` is set iff `sl_bitmaps[fl] != 0`.
    fl_bitmap: u64,
    /// Bit `sl` of `sl_bitmaps[fl]` is set iff `heads[class_index(fl, sl)] != NIL`.
    sl_bitmaps: [u32; FL_COUNT],
    /// The head of each class's list of blocks (linked through [`Block::prev`]/`next`);
    /// every block on list `c` is owned by this stream and has a size of class `c`.
    heads: Box<[u32]>,
    /// The total size of the blocks on the lists.
    free_bytes: u64,
    /// The number of blocks on the lists.
    blocks: usize,
}

impl StreamFree {
    fn new(key: StreamKey) -> Self {
        StreamFree {
            key,
            fl_bitmap: 0,
            sl_bitmaps: [0; FL_COUNT],
            heads: vec![NIL; CLASS_COUNT].into_boxed_slice(),
            free_bytes: 0,
            blocks: 0,
        }
    }

    /// The first non-empty class at or above `(fl, sl)`.
    fn first_nonempty_from(&self, fl: usize, sl: usize) -> Option<(usize, usize)> {
        let sl_map = self.sl_bitmaps[fl] & (u32::MAX << sl);
        if sl_map != 0 {
            return Some((fl, sl_map.trailing_zeros() as usize));
        }
        // fl + 1 <= FL_COUNT < 64, so the shift never overflows.
        let fl_map = self.fl_bitmap & (u64::MAX << (fl + 1));
        if fl_map == 0 {
            return None;
        }
        let fl = fl_map.trailing_zeros() as usize;
        Some((fl, self.sl_bitmaps[fl].trailing_zeros() as usize))
    }

    /// The largest non-empty class.
    fn last_nonempty(&self) -> Option<(usize, usize)> {
        if self.fl_bitmap == 0 {
            return None;
        }
        let fl = (u64::BITS - 1 - self.fl_bitmap.leading_zeros()) as usize;
        let sl = (u32::BITS - 1 - self.sl_bitmaps[fl].leading_zeros()) as usize;
        Some((fl, sl))
    }
}

/// A chunk obtained from the upstream resource.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    /// For tests; the wrapper keys chunks by base address.
    #[cfg_attr(not(test), allow(dead_code))]
    id: ChunkId,
    size: u64,
    /// The slab slot of the chunk's first block (at the chunk's base); only
    /// [`cut_free_heads`](PoolCore::cut_free_heads) changes it while
    /// the chunk is in the pool.
    first: u32,
}

/// The stream-ordered free-list core of the pool: chunks from the upstream, cut into blocks
/// that are allocated or free and owned by a stream. See the [module documentation](self) for
/// the design.
pub(crate) struct PoolCore {
    /// Every block of every chunk, plus vacant slots chained through [`Block::next`] from
    /// `vacant`. The blocks of a chunk tile it exactly, in `prev_phys`/`next_phys` order, from
    /// `Chunk::first`. A free block is on exactly one class list, of its stream's index; an
    /// allocated block is in `live`. No two physically adjacent free blocks have the same
    /// stream (they are coalesced at once).
    blocks: Vec<Block>,
    /// The first vacant slot of `blocks`, or [`NIL`].
    vacant: u32,
    /// Start address → slot, for every allocated block (and nothing else).
    live: FxHashMap<u64, u32>,
    /// Each stream's index, by slot; `None` for a vacant slot (listed in `vacant_streams`).
    streams: Vec<Option<StreamFree>>,
    /// Stream key → its slot in `streams`, for every `Some` slot.
    stream_slots: FxHashMap<u64, u32>,
    /// The vacant slots of `streams`.
    vacant_streams: Vec<u32>,
    /// The last stream looked up and its slot, unless the slot is [`NIL`]: saves the map
    /// lookup for runs of operations on one stream. Never stale.
    last_stream: (StreamKey, u32),
    /// Base address → chunk. Chunks never overlap.
    chunks: BTreeMap<u64, Chunk>,
    /// The id the next chunk gets.
    next_chunk_id: u64,
    /// Sum of the chunks' sizes.
    chunk_bytes: u64,
    /// Sum of the free blocks' sizes (= sum of the streams' `free_bytes`).
    free_bytes: u64,
    /// The number of free blocks (= sum of the streams' `blocks`).
    free_count: usize,
}

impl Default for PoolCore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for PoolCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolCore")
            .field("chunk_count", &self.chunk_count())
            .field("chunk_bytes", &self.chunk_bytes())
            .field("free_bytes", &self.free_bytes())
            .field("free_block_count", &self.free_block_count())
            .field("allocation_count", &self.allocation_count())
            .field("streams", &self.stream_slots.len())
            .finish()
    }
}

impl PoolCore {
    /// An empty pool: no chunks, no blocks.
    pub(crate) fn new() -> Self {
        PoolCore {
            blocks: Vec::new(),
            vacant: NIL,
            live: FxHashMap::default(),
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
        self.sub_free_bytes(slot, size);
        let addr = self.blocks[used as usize].start;
        let previous = self.live.insert(addr, used);
        debug_assert!(previous.is_none(), "{addr:#x} allocated twice");
        Some(addr)
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
        if let Some(&idx) = self.live.get(&addr) {
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
        let &idx = self.live.get(&addr)?;
        let block_size = self.blocks[idx as usize].size;
        if align_up(size) != Some(block_size as usize) {
            return None;
        }
        self.live.remove(&addr);
        let slot = self.slot_or_insert(stream);
        self.blocks[idx as usize].stream = slot;
        self.coalesce_and_link(idx);
        self.add_free_bytes(slot, block_size);
        Some(slot)
    }

    /// Another stream than `exclude` whose own free blocks can serve `size` bytes, as
    /// [`allocate`](Self::allocate) would find them; among several, the one with the most free
    /// bytes (then the smallest key), so that one [`merge_stream`](Self::merge_stream)
    /// reclaims the most.
    ///
    /// # Panics
    /// When `size` is 0.
    #[cfg(test)]
    pub(crate) fn stream_with_block(&self, size: usize, exclude: StreamKey) -> Option<StreamKey> {
        self.streams_with_block(size, exclude)
            .max_by_key(|&(key, _, bytes)| (bytes, std::cmp::Reverse(key)))
            .map(|(key, _, _)| key)
    }

    /// Every stream other than `exclude` whose own free blocks can serve `size` bytes, as
    /// [`allocate`](Self::allocate) would find them, with its slot and its free bytes.
    ///
    /// # Panics
    /// When `size` is 0.
    pub(crate) fn streams_with_block(
        &self,
        size: usize,
        exclude: StreamKey,
    ) -> impl Iterator<Item = (StreamKey, u32, usize)> + '_ {
        assert!(size != 0, "the pool core does not serve 0-byte requests");
        let size = align_up(size).map(|s| s as u64);
        (0..self.streams.len() as u32).filter_map(move |slot| {
            let s = self.streams[slot as usize].as_ref()?;
            (s.key != exclude && self.find_block(slot, size?).is_some()).then_some((
                s.key,
                slot,
                s.free_bytes as usize,
            ))
        })
    }

    /// Gives every free block of `from` to `into`, coalescing each with `into`'s neighbours,
    /// and forgets `from` (which then owns nothing). The caller must first have made `into`
    /// wait for an event recorded on `from` after all of `from`'s frees so far. A no-op when
    /// `from == into` or `from` has no slot. Returns the slot `from` had, now vacant.
    pub(crate) fn merge_stream(&mut self, from: StreamKey, into: StreamKey) -> Option<u32> {
        if from == into {
            return None;
        }
        let from_slot = self.slot_of(from)?;
        let into_slot = self.slot_or_insert(into);
        let moved = self.stream(from_slot).free_bytes;
        // Blocks of `from` that are not moved yet have another owner than `into`, so a moved
        // block does not merge with them now; each merges with the moved ones when its turn
        // comes, which leaves the result fully coalesced.
        while let Some((fl, sl)) = self.stream(from_slot).first_nonempty_from(0, 0) {
            let idx = self.stream(from_slot).heads[class_index(fl, sl)];
            self.unlink(idx);
            self.blocks[idx as usize].stream = into_slot;
            self.coalesce_and_link(idx);
        }
        self.stream_mut(from_slot).free_bytes = 0;
        self.stream_mut(into_slot).free_bytes += moved;
        self.remove_stream(from_slot);
        Some(from_slot)
    }

    /// Forgets every stream that owns no free block, except `keep`, if given; returns their slots, now
    /// vacant. (A stream's index is kept while it is empty, so that a stream that allocates
    /// and frees in turn does not rebuild it each time; the wrapper calls this off the fast
    /// path.)
    pub(crate) fn remove_idle_streams(&mut self, keep: Option<StreamKey>) -> Vec<u32> {
        let idle: Vec<u32> = (0..self.streams.len() as u32)
            .filter(|&slot| {
                self.streams[slot as usize]
                    .as_ref()
                    .is_some_and(|s| s.blocks == 0 && Some(s.key) != keep)
            })
            .collect();
        for &slot in &idle {
            self.remove_stream(slot);
        }
        idle
    }

    /// The slot of `stream`'s index, while it has one: a small integer, stable until the
    /// stream is removed ([`merge_stream`](Self::merge_stream),
    /// [`remove_idle_streams`](Self::remove_idle_streams)), that the wrapper uses to index its
    /// own per-stream data. Slots of removed streams are reused.
    pub(crate) fn stream_slot(&self, stream: StreamKey) -> Option<u32> {
        if self.last_stream.1 != NIL && self.last_stream.0 == stream {
            return Some(self.last_stream.1);
        }
        self.stream_slots.get(&stream.0).copied()
    }

    /// The number of stream slots, vacant or not: every slot is below it.
    pub(crate) fn stream_slot_bound(&self) -> usize {
        self.streams.len()
    }

    /// Removes every chunk that is wholly free (one free block spanning it) and returns its
    /// `(base, size, owner)`, in address order, for the wrapper to give back to the upstream on
    /// the stream that owns the free memory.
    pub(crate) fn release_empty_chunks(&mut self) -> Vec<(u64, usize, StreamKey)> {
        let empty: Vec<(u64, Chunk)> = self
            .chunks
            .iter()
            .filter(|(_, c)| {
                let first = &self.blocks[c.first as usize];
                first.is_free() && first.next_phys == NIL
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
        let &idx = self.live.get(&addr)?;
        let block = self.blocks[idx as usize];
        if head == 0 || head % ALIGN as u64 != 0 || head >= block.size {
            return None;
        }
        self.live.remove(&addr);
        // The head keeps the slot (a chunk's first block stays its first), the rest gets a new
        // one.
        let rest = self.new_block(addr + head, block.size - head, USED, idx, block.next_phys);
        if block.next_phys != NIL {
            self.blocks[block.next_phys as usize].prev_phys = rest;
        }
        self.live.insert(addr + head, rest);
        let slot = self.slot_or_insert(stream);
        let b = &mut self.blocks[idx as usize];
        b.size = head;
        b.next_phys = rest;
        b.stream = slot;
        self.coalesce_and_link(idx);
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
        self.coalesce_and_link(below);
        self.add_free_bytes(into, size);
        (self.stream(from).blocks == 0).then_some(from)
    }

    /// `(upper, lower)`: the free block just below the allocated block at `addr` and the free
    /// block of another stream just below that one.
    fn free_pair_below(&self, addr: u64) -> Option<(u32, u32)> {
        let &idx = self.live.get(&addr)?;
        let upper = self.blocks[idx as usize].prev_phys;
        if upper == NIL || !self.blocks[upper as usize].is_free() {
            return None;
        }
        let lower = self.blocks[upper as usize].prev_phys;
        let l = self.blocks.get(lower as usize)?;
        (l.is_free() && l.stream != self.blocks[upper as usize].stream).then_some((upper, lower))
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

    // ---- internals ----

    fn stream(&self, slot: u32) -> &StreamFree {
        self.streams[slot as usize]
            .as_ref()
            .expect("stream slot is vacant")
    }

    fn stream_mut(&mut self, slot: u32) -> &mut StreamFree {
        self.streams[slot as usize]
            .as_mut()
            .expect("stream slot is vacant")
    }

    /// `stream`'s slot, if it has one.
    fn slot_of(&mut self, stream: StreamKey) -> Option<u32> {
        if self.last_stream.1 != NIL && self.last_stream.0 == stream {
            return Some(self.last_stream.1);
        }
        let slot = *self.stream_slots.get(&stream.0)?;
        self.last_stream = (stream, slot);
        Some(slot)
    }

    /// `stream`'s slot, made when it has none.
    fn slot_or_insert(&mut self, stream: StreamKey) -> u32 {
        if let Some(slot) = self.slot_of(stream) {
            return slot;
        }
        let index = StreamFree::new(stream);
        let slot = match self.vacant_streams.pop() {
            Some(slot) => {
                self.streams[slot as usize] = Some(index);
                slot
            }
            None => {
                let slot = u32::try_from(self.streams.len())
                    .ok()
                    .filter(|&s| s < USED)
                    .expect("too many streams");
                self.streams.push(Some(index));
                slot
            }
        };
        self.stream_slots.insert(stream.0, slot);
        self.last_stream = (stream, slot);
        slot
    }

    /// Forgets the (empty) stream in `slot`.
    fn remove_stream(&mut self, slot: u32) {
        let index = self.streams[slot as usize]
            .take()
            .expect("stream slot is vacant");
        debug_assert!(index.blocks == 0 && index.fl_bitmap == 0 && index.free_bytes == 0);
        self.stream_slots.remove(&index.key.0);
        self.vacant_streams.push(slot);
        if self.last_stream.1 == slot {
            self.last_stream.1 = NIL;
        }
    }

    fn add_free_bytes(&mut self, slot: u32, size: u64) {
        self.stream_mut(slot).free_bytes += size;
        self.free_bytes += size;
    }

    fn sub_free_bytes(&mut self, slot: u32, size: u64) {
        self.stream_mut(slot).free_bytes -= size;
        self.free_bytes -= size;
    }

    /// A block of `slot`'s that holds `size` bytes: the head of the first non-empty class
    /// whose every block fits, else one of the first [`OWN_CLASS_PROBES`] blocks of the
    /// request's own class that fits.
    fn find_block(&self, slot: u32, size: u64) -> Option<u32> {
        let s = self.stream(slot);
        let units = size >> ALIGN_LOG2;
        if let Some((fl, sl)) = search_class(units) {
            if let Some((fl, sl)) = s.first_nonempty_from(fl, sl) {
                return Some(s.heads[class_index(fl, sl)]);
            }
        }
        let (fl, sl) = class_of(units);
        if class_min(fl, sl) == units {
            // The own class is the search class, already found empty.
            return None;
        }
        let mut idx = s.heads[class_index(fl, sl)];
        for _ in 0..OWN_CLASS_PROBES {
            if idx == NIL {
                break;
            }
            let block = &self.blocks[idx as usize];
            if block.size >= size {
                return Some(idx);
            }
            idx = block.next;
        }
        None
    }

    /// The size of the largest block of `slot`'s: the largest on its largest class's list.
    fn largest_of_slot(&self, slot: u32) -> u64 {
        let s = self.stream(slot);
        let Some((fl, sl)) = s.last_nonempty() else {
            return 0;
        };
        let mut largest = 0;
        let mut idx = s.heads[class_index(fl, sl)];
        while idx != NIL {
            let block = &self.blocks[idx as usize];
            largest = largest.max(block.size);
            idx = block.next;
        }
        largest
    }

    /// Merges the free, unlinked block `idx` with its physical neighbours of the same stream
    /// (the left one survives) and links the result. The byte counters are the caller's.
    fn coalesce_and_link(&mut self, idx: u32) {
        let Block {
            stream,
            prev_phys: left,
            next_phys: right,
            ..
        } = self.blocks[idx as usize];
        debug_assert!(stream < USED);
        if right != NIL && self.blocks[right as usize].stream == stream {
            self.unlink(right);
            let r = self.blocks[right as usize];
            self.blocks[idx as usize].size += r.size;
            self.unlink_phys(right);
        }
        let survivor = if left != NIL && self.blocks[left as usize].stream == stream {
            let size = self.blocks[left as usize].size + self.blocks[idx as usize].size;
            self.unlink_phys(idx);
            self.resize(left, size);
            left
        } else {
            self.link(idx);
            idx
        };
        debug_assert!(self.is_coalesced(survivor));
    }

    /// Takes block `idx`, already merged into its left neighbour's size (or the other way
    /// round) and off any class list, out of its chunk's physical list and frees its slot.
    fn unlink_phys(&mut self, idx: u32) {
        let Block {
            prev_phys,
            next_phys,
            ..
        } = self.blocks[idx as usize];
        debug_assert!(
            prev_phys != NIL,
            "a chunk's first block is never merged away"
        );
        self.blocks[prev_phys as usize].next_phys = next_phys;
        if next_phys != NIL {
            self.blocks[next_phys as usize].prev_phys = prev_phys;
        }
        self.drop_block(idx);
    }

    /// Whether the free block `idx` has no physical neighbour of the same stream.
    fn is_coalesced(&self, idx: u32) -> bool {
        let b = &self.blocks[idx as usize];
        let same = |n: u32| n != NIL && self.blocks[n as usize].stream == b.stream;
        b.is_free() && !same(b.prev_phys) && !same(b.next_phys)
    }

    /// Sets the size of the free, linked block `idx`, moving it to its new class list if the
    /// class changes.
    fn resize(&mut self, idx: u32, size: u64) {
        let old = self.blocks[idx as usize].size;
        if class_index_of_size(old) == class_index_of_size(size) {
            self.blocks[idx as usize].size = size;
        } else {
            self.unlink(idx);
            self.blocks[idx as usize].size = size;
            self.link(idx);
        }
    }

    /// A new block, on no class list and in no map, in a slab slot.
    fn new_block(
        &mut self,
        start: u64,
        size: u64,
        stream: u32,
        prev_phys: u32,
        next_phys: u32,
    ) -> u32 {
        let block = Block {
            start,
            size,
            stream,
            prev: NIL,
            next: NIL,
            prev_phys,
            next_phys,
        };
        if self.vacant != NIL {
            let idx = self.vacant;
            self.vacant = self.blocks[idx as usize].next;
            self.blocks[idx as usize] = block;
            idx
        } else {
            let idx = u32::try_from(self.blocks.len())
                .ok()
                .filter(|&i| i != NIL)
                .expect("too many blocks");
            self.blocks.push(block);
            idx
        }
    }

    /// Returns a slot, on no list and in no map, to the vacant list.
    fn drop_block(&mut self, idx: u32) {
        let block = &mut self.blocks[idx as usize];
        block.stream = NIL;
        block.prev = NIL;
        block.prev_phys = NIL;
        block.next_phys = NIL;
        block.next = self.vacant;
        self.vacant = idx;
    }

    /// Puts the free block `idx` at the head of its class list in its stream's index.
    fn link(&mut self, idx: u32) {
        let Block { size, stream, .. } = self.blocks[idx as usize];
        let (fl, sl) = class_of(size >> ALIGN_LOG2);
        let c = class_index(fl, sl);
        let s = self.streams[stream as usize]
            .as_mut()
            .expect("stream slot is vacant");
        let head = s.heads[c];
        s.heads[c] = idx;
        s.sl_bitmaps[fl] |= 1 << sl;
        s.fl_bitmap |= 1 << fl;
        s.blocks += 1;
        self.free_count += 1;
        let block = &mut self.blocks[idx as usize];
        block.prev = NIL;
        block.next = head;
        if head != NIL {
            self.blocks[head as usize].prev = idx;
        }
    }

    /// Takes the free block `idx` off its class list in its stream's index.
    fn unlink(&mut self, idx: u32) {
        let Block {
            size,
            stream,
            prev,
            next,
            ..
        } = self.blocks[idx as usize];
        let (fl, sl) = class_of(size >> ALIGN_LOG2);
        if next != NIL {
            self.blocks[next as usize].prev = prev;
        }
        if prev != NIL {
            self.blocks[prev as usize].next = next;
        }
        let s = self.streams[stream as usize]
            .as_mut()
            .expect("stream slot is vacant");
        s.blocks -= 1;
        self.free_count -= 1;
        if prev == NIL {
            let c = class_index(fl, sl);
            debug_assert_eq!(s.heads[c], idx, "unlinked block is not on its class list");
            s.heads[c] = next;
            if next == NIL {
                s.sl_bitmaps[fl] &= !(1 << sl);
                if s.sl_bitmaps[fl] == 0 {
                    s.fl_bitmap &= !(1 << fl);
                }
            }
        }
        debug_assert_eq!(
            s.heads[class_index(fl, sl)] != NIL,
            s.sl_bitmaps[fl] & (1 << sl) != 0
        );
    }

    /// The free blocks as `(start, size, owner)`, in address order.
    #[cfg(test)]
    fn free_blocks(&self) -> Vec<(u64, u64, StreamKey)> {
        let mut out: Vec<_> = self
            .blocks
            .iter()
            .filter(|b| b.is_free())
            .map(|b| (b.start, b.size, self.stream(b.stream).key))
            .collect();
        out.sort_unstable();
        out
    }

    /// The chunks as `(base, size, id)`, in address order.
    #[cfg(test)]
    fn chunks(&self) -> Vec<(u64, u64, ChunkId)> {
        self.chunks
            .iter()
            .map(|(&base, c)| (base, c.size, c.id))
            .collect()
    }

    /// Checks every invariant exhaustively; panics with a description of the first broken one.
    #[cfg(test)]
    fn check_invariants(&self) {
        // Streams: map and slots agree; the cache is not stale.
        assert_eq!(
            self.stream_slots.len() + self.vacant_streams.len(),
            self.streams.len()
        );
        for (&key, &slot) in &self.stream_slots {
            assert_eq!(self.stream(slot).key, StreamKey(key));
        }
        for &slot in &self.vacant_streams {
            assert!(self.streams[slot as usize].is_none());
        }
        if self.last_stream.1 != NIL {
            assert_eq!(
                self.stream_slots.get(&self.last_stream.0 .0),
                Some(&self.last_stream.1),
                "stale stream cache"
            );
        }

        // Chunks: aligned, disjoint, counted, tiled exactly by their physical lists.
        let mut chunk_bytes = 0;
        let mut prev_end = 0;
        let (mut reached, mut free_reached, mut used_reached) = (0, 0, 0);
        for (&base, chunk) in &self.chunks {
            assert!(base % ALIGN as u64 == 0 && chunk.size % ALIGN as u64 == 0 && chunk.size > 0);
            assert!(prev_end <= base, "chunks overlap at {base:#x}");
            prev_end = base + chunk.size;
            chunk_bytes += chunk.size;
            let mut at = base;
            let mut prev = NIL;
            let mut idx = chunk.first;
            while idx != NIL {
                let b = self.blocks[idx as usize];
                assert_ne!(b.stream, NIL, "vacant slot {idx} in chunk {base:#x}");
                assert_eq!(b.start, at, "{b:?}: gap or overlap in chunk {base:#x}");
                assert!(b.size % ALIGN as u64 == 0 && b.size > 0, "{b:?} size");
                assert_eq!(b.prev_phys, prev, "{b:?} physical back link");
                if b.is_free() {
                    assert!(self.streams[b.stream as usize].is_some(), "{b:?} owner");
                    assert!(self.is_coalesced(idx), "{b:?} not coalesced");
                    free_reached += 1;
                } else {
                    assert_eq!(self.live.get(&b.start), Some(&idx), "{b:?} not in live");
                    used_reached += 1;
                }
                reached += 1;
                at = b.end();
                prev = idx;
                idx = b.next_phys;
            }
            assert_eq!(
                at,
                base + chunk.size,
                "chunk {base:#x} not tiled to its end"
            );
        }
        assert_eq!(chunk_bytes, self.chunk_bytes, "chunk_bytes");
        assert_eq!(
            used_reached,
            self.live.len(),
            "live has blocks outside the chunks"
        );
        assert_eq!(free_reached, self.free_count, "free_count");

        // Slab: every slot is in a chunk or on the vacant list.
        let mut vacant = 0;
        let mut v = self.vacant;
        while v != NIL {
            assert_eq!(
                self.blocks[v as usize].stream, NIL,
                "block on the vacant list"
            );
            vacant += 1;
            v = self.blocks[v as usize].next;
        }
        assert_eq!(reached + vacant, self.blocks.len(), "slab slots lost");

        // Each stream's index: bitmaps iff lists, lists well linked, classes right, counts.
        let (mut total, mut on_lists) = (0, 0);
        for (slot, s) in self.streams.iter().enumerate() {
            let Some(s) = s else { continue };
            let (mut bytes, mut blocks) = (0, 0);
            for fl in 0..FL_COUNT {
                assert_eq!(
                    s.fl_bitmap & (1 << fl) != 0,
                    s.sl_bitmaps[fl] != 0,
                    "first-level bit {fl}"
                );
                for sl in 0..SL_COUNT {
                    let head = s.heads[class_index(fl, sl)];
                    assert_eq!(
                        s.sl_bitmaps[fl] & (1 << sl) != 0,
                        head != NIL,
                        "bit of class ({fl}, {sl})"
                    );
                    let mut prev = NIL;
                    let mut idx = head;
                    while idx != NIL {
                        let b = self.blocks[idx as usize];
                        assert_eq!(b.stream, slot as u32, "{b:?} on another stream's list");
                        assert_eq!(class_of(b.size >> ALIGN_LOG2), (fl, sl), "{b:?} class");
                        assert_eq!(b.prev, prev, "{b:?} back link");
                        bytes += b.size;
                        blocks += 1;
                        prev = idx;
                        idx = b.next;
                    }
                }
            }
            assert_eq!(bytes, s.free_bytes, "free bytes of {:?}", s.key);
            assert_eq!(blocks, s.blocks, "block count of {:?}", s.key);
            total += bytes;
            on_lists += blocks;
        }
        assert_eq!(
            on_lists, self.free_count,
            "free blocks missing from the class lists"
        );
        assert_eq!(total, self.free_bytes, "free_bytes");
        let live_bytes: u64 = self
            .live
            .values()
            .map(|&i| self.blocks[i as usize].size)
            .sum();
        assert_eq!(self.free_bytes + live_bytes, self.chunk_bytes, "bytes lost");
    }
}

#[cfg(test)]
mod tests;
