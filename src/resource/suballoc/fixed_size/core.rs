//! The allocator core of the fixed-size resource: per-stream free lists of equal blocks, and
//! the chunks they were cut from, with a flag per block in use.
//!
//! A single-threaded data structure over *addresses*: it knows nothing of CUDA, events or
//! upstream resources. A resource has one core per shard (a shard serves a set of streams);
//! the cores share their chunks ([`chunks`]), so a block one shard handed out may be freed
//! into another, and blocks may move between the shards' lists. Each free list carries an opaque per-stream payload `O` (the wrapper's
//! [`FreeOrder`](crate::resource::suballoc::stream_order::FreeOrder): what another stream must wait for
//! before it takes blocks from that list); the wrapper decides when lists trade blocks and
//! waits in between, puts the core behind a lock and takes chunks from the upstream.

mod chunks;

use rustc_hash::FxHashMap;

use self::chunks::{ChunkRef, ChunkView};
use crate::stream::StreamId;

/// Blocks of one size, on per-stream free lists. See the [module documentation](self).
pub(crate) struct FixedSizeCore<O> {
    geometry: Geometry,
    blocks_per_chunk: usize,
    /// Each stream's free blocks, by slot; `None` for a vacant slot.
    lists: Vec<Option<FreeList<O>>>,
    /// Stream → its slot in `lists`.
    slots: FxHashMap<StreamId, u32>,
    /// The last stream looked up and its slot: saves the map lookup for runs on one stream.
    /// Never stale: cleared when that slot is vacated.
    last: Option<(StreamId, u32)>,
    /// Vacant slots of `lists`.
    vacant: Vec<u32>,
    /// Every chunk (of every sibling core), sorted by base, with a flag per block that is in
    /// use: a free finds its block's flag with a binary search over the chunks, which is how a
    /// foreign pointer or a double free is caught without a hash per operation.
    chunks: ChunkView,
    /// Blocks handed out by this core less blocks freed into it: the sum over sibling cores is
    /// the blocks in use (one core's figure may be negative).
    live: isize,
    /// Blocks on this core's free lists.
    free_blocks: usize,
}

/// One stream's free blocks, and its payload.
struct FreeList<O> {
    stream: StreamId,
    order: O,
    blocks: Vec<u64>,
}

/// The sizes `locate` needs, with a shift in place of a division for power-of-two blocks.
#[derive(Clone, Copy)]
struct Geometry {
    block_size: u64,
    block_shift: Option<u32>,
    chunk_bytes: u64,
}

/// Where a block lies: `(chunk index, block index)`, when `addr` is a block of these chunks.
#[inline]
fn locate(chunks: &[ChunkRef], geometry: &Geometry, addr: u64) -> Option<(usize, usize)> {
    let c = chunks.partition_point(|c| c.base <= addr).checked_sub(1)?;
    let offset = addr - chunks[c].base;
    if offset >= geometry.chunk_bytes {
        return None;
    }
    let block = match geometry.block_shift {
        Some(shift) => (offset & ((1 << shift) - 1) == 0).then_some((offset >> shift) as usize)?,
        None => (offset % geometry.block_size == 0)
            .then_some((offset / geometry.block_size) as usize)?,
    };
    Some((c, block))
}

impl<O> FixedSizeCore<O> {
    /// A core of `block_size`-byte blocks (a multiple of 256) taken `blocks_per_chunk` at a
    /// time; the caller has checked that a chunk's size fits a `usize`.
    pub(crate) fn new(block_size: usize, blocks_per_chunk: usize) -> Self {
        FixedSizeCore {
            geometry: Geometry {
                block_size: block_size as u64,
                block_shift: block_size
                    .is_power_of_two()
                    .then(|| block_size.trailing_zeros()),
                chunk_bytes: (block_size * blocks_per_chunk) as u64,
            },
            blocks_per_chunk,
            lists: Vec::new(),
            slots: FxHashMap::default(),
            last: None,
            vacant: Vec::new(),
            chunks: ChunkView::new(),
            live: 0,
            free_blocks: 0,
        }
    }

    /// Another core (for another shard) of the same geometry, sharing this one's chunks, with
    /// no free list.
    pub(crate) fn sibling(&self) -> Self {
        FixedSizeCore {
            geometry: self.geometry,
            blocks_per_chunk: self.blocks_per_chunk,
            lists: Vec::new(),
            slots: FxHashMap::default(),
            last: None,
            vacant: Vec::new(),
            chunks: self.chunks.sibling(),
            live: 0,
            free_blocks: 0,
        }
    }

    /// The chunk and index of the block at `addr`, catching up with chunks sibling cores
    /// added before giving up.
    #[inline(always)]
    fn locate(&mut self, addr: u64) -> Option<(&ChunkRef, usize)> {
        let (c, i) = match locate(self.chunks.seen(), &self.geometry, addr) {
            Some(at) => at,
            None => self.locate_new(addr)?,
        };
        Some((&self.chunks.seen()[c], i))
    }

    /// [`locate`](Self::locate) after catching up with the siblings' chunks.
    #[cold]
    fn locate_new(&mut self, addr: u64) -> Option<(usize, usize)> {
        if !self.chunks.refresh() {
            return None;
        }
        locate(self.chunks.seen(), &self.geometry, addr)
    }

    /// The slot of `stream`'s free list, made (with the payload `make` returns) if it has none.
    #[inline]
    pub(crate) fn slot_or_insert(&mut self, stream: StreamId, make: impl FnOnce() -> O) -> u32 {
        match self.last {
            Some((s, slot)) if s == stream => slot,
            _ => self.slot_or_insert_slow(stream, make),
        }
    }

    #[cold]
    fn slot_or_insert_slow(&mut self, stream: StreamId, make: impl FnOnce() -> O) -> u32 {
        // The fast path already found `last` to be another stream.
        if let Some(&slot) = self.slots.get(&stream) {
            self.last = Some((stream, slot));
            return slot;
        }
        let list = FreeList {
            stream,
            order: make(),
            blocks: Vec::new(),
        };
        let slot = match self.vacant.pop() {
            Some(slot) => {
                self.lists[slot as usize] = Some(list);
                slot
            }
            None => {
                self.lists.push(Some(list));
                (self.lists.len() - 1) as u32
            }
        };
        self.slots.insert(stream, slot);
        self.last = Some((stream, slot));
        slot
    }

    #[inline]
    fn list(&mut self, slot: u32) -> &mut FreeList<O> {
        self.lists[slot as usize]
            .as_mut()
            .expect("a vacant fixed-size list")
    }

    /// The payload of the list in `slot`.
    #[inline]
    pub(crate) fn order_mut(&mut self, slot: u32) -> &mut O {
        &mut self.list(slot).order
    }

    /// Adds the chunk at `base` and puts its blocks on the list in `slot`.
    pub(crate) fn add_chunk(&mut self, base: u64, slot: u32) {
        self.chunks.add(base, self.blocks_per_chunk);
        let (n, size) = (self.blocks_per_chunk as u64, self.geometry.block_size);
        // Highest address first, so blocks are handed out in address order.
        self.list(slot)
            .blocks
            .extend((0..n).rev().map(|i| base + i * size));
        self.free_blocks += self.blocks_per_chunk;
    }

    /// A block from the list in `slot`, now in use; `None` when that list is empty.
    #[inline]
    pub(crate) fn allocate(&mut self, slot: u32) -> Option<u64> {
        let block = self.list(slot).blocks.pop()?;
        self.free_blocks -= 1;
        self.live += 1;
        let (chunk, i) = self.locate(block).expect("a block of a chunk");
        chunk.set(i);
        Some(block)
    }

    /// Puts the block at `addr` on `stream`'s list (made with `make` if it has none) and
    /// returns that list's payload; `None`, changing nothing, when `addr` is not a block in use.
    #[inline]
    pub(crate) fn free(
        &mut self,
        addr: u64,
        stream: StreamId,
        make: impl FnOnce() -> O,
    ) -> Option<&mut O> {
        let (chunk, i) = self.locate(addr)?;
        if !chunk.clear(i) {
            return None;
        }
        self.live -= 1;
        let slot = self.slot_or_insert(stream, make);
        self.free_blocks += 1;
        let list = self.list(slot);
        list.blocks.push(addr);
        Some(&mut list.order)
    }

    /// The list, other than `slot`'s (if any), to take blocks from: among those with blocks,
    /// the one of highest `rank`, then with the most blocks.
    pub(crate) fn pick_victim<K: Ord>(
        &self,
        slot: Option<u32>,
        rank: impl Fn(&O) -> K,
    ) -> Option<u32> {
        self.lists
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                let l = l.as_ref()?;
                (Some(i as u32) != slot && !l.blocks.is_empty()).then_some((
                    rank(&l.order),
                    l.blocks.len(),
                    i,
                ))
            })
            .max()
            .map(|(_, _, i)| i as u32)
    }

    /// Moves half (rounded up) of the blocks of the list in `from` to the list in `to`.
    pub(crate) fn move_half(&mut self, from: u32, to: u32) {
        let moved = self.take_half(from);
        self.give(to, moved);
    }

    /// Takes half (rounded up) of the blocks of the list in `from` off this core, for
    /// [`give`](Self::give) to a sibling.
    pub(crate) fn take_half(&mut self, from: u32) -> Vec<u64> {
        let v = self.list(from);
        let keep = v.blocks.len() / 2;
        let moved = v.blocks.split_off(keep);
        self.free_blocks -= moved.len();
        moved
    }

    /// Puts `blocks` (free blocks of the shared chunks, from [`take_half`](Self::take_half))
    /// on the list in `to`.
    pub(crate) fn give(&mut self, to: u32, blocks: Vec<u64>) {
        self.free_blocks += blocks.len();
        self.list(to).blocks.extend(blocks);
    }

    /// Forgets the lists (other than `keep`'s) that hold no block, so that their payloads (and
    /// the streams they hold) go.
    pub(crate) fn forget_idle(&mut self, keep: Option<u32>) {
        for i in 0..self.lists.len() {
            let idle = Some(i as u32) != keep
                && self.lists[i].as_ref().is_some_and(|l| l.blocks.is_empty());
            if idle {
                let list = self.lists[i].take().expect("checked above");
                self.slots.remove(&list.stream);
                self.vacant.push(i as u32);
                if self.last.is_some_and(|(_, slot)| slot == i as u32) {
                    self.last = None;
                }
            }
        }
    }

    /// Every list's stream and payload.
    pub(crate) fn orders(&self) -> impl Iterator<Item = (StreamId, &O)> {
        self.lists.iter().flatten().map(|l| (l.stream, &l.order))
    }

    pub(crate) fn orders_mut(&mut self) -> impl Iterator<Item = &mut O> {
        self.lists.iter_mut().flatten().map(|l| &mut l.order)
    }

    /// Removes every chunk (of every sibling) and this core's lists; returns the chunks'
    /// bases. For when no block is in use; the siblings then [`clear`](Self::clear) theirs.
    pub(crate) fn take_chunks(&mut self) -> Vec<u64> {
        self.clear();
        self.chunks.take_all()
    }

    /// Removes every list (the blocks on them go with the chunks: see
    /// [`take_chunks`](Self::take_chunks)).
    pub(crate) fn clear(&mut self) {
        self.lists.clear();
        self.slots.clear();
        self.vacant.clear();
        self.last = None;
        self.free_blocks = 0;
        self.live = 0;
    }

    /// Blocks this core handed out less blocks freed into it (see `live`): the sum over
    /// sibling cores is the blocks in use.
    pub(crate) fn live(&self) -> isize {
        self.live
    }

    /// Blocks on this core's free lists.
    pub(crate) fn free_blocks(&self) -> usize {
        self.free_blocks
    }

    /// Every free block of this core's lists, with its list's stream.
    pub(crate) fn on_lists(&self) -> impl Iterator<Item = (u64, StreamId)> + '_ {
        self.lists
            .iter()
            .flatten()
            .flat_map(|l| l.blocks.iter().map(move |&b| (b, l.stream)))
    }

    /// Every chunk's base (of all siblings), in address order, with each of its blocks' use,
    /// in address order: `None` for a block in use, `Some(stream)` for a block on `stream`'s
    /// free list, as `on_list` (every sibling's [`on_lists`](Self::on_lists)) says. Exact only
    /// while no sibling changes (all locked).
    pub(crate) fn layout(
        &self,
        on_list: &FxHashMap<u64, StreamId>,
    ) -> Vec<(u64, Vec<Option<StreamId>>)> {
        let size = self.geometry.block_size;
        self.chunks
            .current()
            .iter()
            .map(|c| {
                let uses = (0..self.blocks_per_chunk)
                    .map(|i| {
                        if c.is_set(i) {
                            None
                        } else {
                            let stream = on_list.get(&(c.base + i as u64 * size));
                            debug_assert!(stream.is_some(), "a free block on no list");
                            stream.copied()
                        }
                    })
                    .collect();
                (c.base, uses)
            })
            .collect()
    }

    /// Each stream's free blocks on this core's lists, by stream, lists without blocks left
    /// out.
    pub(crate) fn free_by_stream(&self) -> Vec<(StreamId, usize)> {
        let mut out: Vec<(StreamId, usize)> = self
            .lists
            .iter()
            .flatten()
            .filter(|l| !l.blocks.is_empty())
            .map(|l| (l.stream, l.blocks.len()))
            .collect();
        out.sort_unstable();
        out
    }

    /// How many chunks the core and its siblings hold.
    pub(crate) fn chunk_count(&self) -> usize {
        self.chunks.count()
    }
}

#[cfg(test)]
mod tests;
