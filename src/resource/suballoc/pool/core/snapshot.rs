//! A read-only walk of the core's chunks and their blocks, for snapshots of the pool
//! ([`MemoryResource::snapshot`](crate::MemoryResource::snapshot)): nothing here runs on the
//! allocation or free paths.

use super::slab::NIL;
use super::state::PoolCore;
use super::types::StreamKey;

/// A block of a [`CoreChunk`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CoreBlock {
    pub(crate) start: u64,
    pub(crate) size: u64,
    /// The stream that owns the block when free, or that it was allocated for.
    pub(crate) stream: StreamKey,
    pub(crate) free: bool,
}

/// A chunk of the core, with the blocks that tile it in address order.
#[derive(Clone, Debug)]
pub(crate) struct CoreChunk {
    pub(crate) base: u64,
    /// The bytes the core uses of it (the chunk's size rounded down to 256).
    pub(crate) size: u64,
    pub(crate) blocks: Vec<CoreBlock>,
}

impl PoolCore {
    /// Every chunk in address order, each with its blocks in address order. O(blocks).
    pub(crate) fn chunks_and_blocks(&self) -> Vec<CoreChunk> {
        self.chunks
            .iter()
            .map(|(&base, chunk)| {
                let mut blocks = Vec::new();
                let mut idx = chunk.first;
                while idx != NIL {
                    let b = &self.blocks[idx as usize];
                    let (free, stream) = if b.is_free() {
                        (true, self.stream(b.stream).key)
                    } else {
                        (false, b.allocated_for())
                    };
                    blocks.push(CoreBlock {
                        start: b.start,
                        size: b.size,
                        stream,
                        free,
                    });
                    idx = b.next_phys;
                }
                CoreChunk {
                    base,
                    size: chunk.size,
                    blocks,
                }
            })
            .collect()
    }

    /// The largest run of address-adjacent free blocks of any streams in one chunk: the
    /// largest block the core holds once every stream's free memory is merged into one
    /// stream's ([`merge_stream`](Self::merge_stream)). O(blocks).
    pub(crate) fn largest_free_extent(&self) -> usize {
        let mut largest = 0;
        for chunk in self.chunks.values() {
            let mut run = 0;
            let mut idx = chunk.first;
            while idx != NIL {
                let b = &self.blocks[idx as usize];
                run = if b.is_free() { run + b.size } else { 0 };
                largest = largest.max(run);
                idx = b.next_phys;
            }
        }
        largest as usize
    }

    /// Notes that the allocated block at `addr` was allocated for `stream` (after a take
    /// served it from another stream's free block).
    pub(crate) fn set_allocated_for(&mut self, addr: u64, stream: StreamKey) {
        if let Some(idx) = self.live.get(addr) {
            self.blocks[idx as usize].set_allocated_for(stream);
        }
    }
}
