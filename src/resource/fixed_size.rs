//! `FixedSizeResource`: blocks of one size, stream-ordered, from chunks of an upstream resource.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::forward::{memory_resource, Forward};
use crate::resource::stream_order::FreeOrder;
use crate::resource::{
    align_up, check_stream, Availability, DevicePtr, MemoryResource, SharedResource,
};
use crate::stream::{Stream, StreamId};

/// RMM's default block size for a fixed-size resource.
const DEFAULT_BLOCK_SIZE: usize = 1 << 20;
/// RMM's default number of blocks taken from the upstream at once.
const DEFAULT_BLOCKS_TO_PREALLOCATE: usize = 128;

/// Blocks of one size (RMM's `fixed_size_memory_resource`): every request up to the block size
/// gets a whole block, from per-stream free lists that grow by a fixed number of blocks at a
/// time from the upstream. Allocation and free are a list pop and push: the fastest resource
/// for requests of one size class, and the bins of a
/// [`BinningResource`](crate::BinningResource).
///
/// The resource takes `block_size × blocks_to_preallocate` bytes from the upstream at
/// construction and again each time it runs out; it never gives them back while it lives
/// (like RMM's), and returns them when dropped.
///
/// # Stream ordering
/// A block freed on stream S is reusable at once by S. Another stream T takes blocks freed on
/// S only after T waits for an event recorded on S after those frees; the event is recorded
/// when blocks actually cross streams (not on every free) and covers every free before it, and
/// T then takes half of S's free blocks at once, so the next few allocations on T need no wait.
///
/// # Awaiting memory
/// The resource has a wait queue ([`Availability`]): when its blocks are all in use and the
/// upstream refuses to grow it, an awaited [`allocate`](MemoryResource::allocate) waits for a
/// free. Requests larger than the block size fail at once
/// ([`capacity_limit`](MemoryResource::capacity_limit) is the block size).
///
/// # Errors
/// [`Error::InvalidArgument`] from the constructors for a block size or count of 0 or a chunk
/// size that overflows; [`Error::OutOfMemory`] for requests larger than the block size and when
/// the upstream cannot grow the resource.
///
/// # Panics
/// `deallocate` panics on a pointer this resource did not hand out or already took back (a
/// double free): that is a bug in the caller, and silently accepting it would hand one block to
/// two users.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, FixedSizeResource, MemoryResource, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = FixedSizeResource::new(CudaResource::new(&device), 64 << 10, 16)?;
/// let p = mr.allocate(1000, &stream).await?;       // a whole 64 KiB block
/// assert_eq!(mr.free_blocks(), 15);
/// unsafe { mr.deallocate(p, 1000, &stream) };
/// assert!(mr.try_allocate(128 << 10, &stream).unwrap_err().is_out_of_memory());
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub struct FixedSizeResource<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R: MemoryResource> {
    upstream: R,
    device: Device,
    block_size: usize,
    blocks_per_chunk: usize,
    geometry: Geometry,
    state: Mutex<State>,
    availability: Arc<Availability>,
}

struct State {
    /// Each stream's free blocks, by slot; `None` for a vacant slot.
    lists: Vec<Option<FreeList>>,
    /// Stream → its slot in `lists`.
    slots: FxHashMap<StreamId, u32>,
    /// The last stream looked up and its slot: saves the map lookup for runs on one stream.
    /// Never stale: cleared when that slot is vacated.
    last: Option<(StreamId, u32)>,
    /// Vacant slots of `lists`.
    vacant: Vec<u32>,
    /// Every upstream chunk, sorted by base, with a bit per block that is in use: a free finds
    /// its block's bit with a binary search over the chunks, which is how a foreign pointer or
    /// a double free is caught without a hash per operation.
    chunks: Vec<Chunk>,
    /// Blocks in use.
    live: usize,
    /// Blocks on all free lists.
    free_blocks: usize,
}

struct FreeList {
    order: FreeOrder,
    blocks: Vec<u64>,
}

struct Chunk {
    base: u64,
    /// Bit `i` is set while block `i` is in use.
    in_use: Box<[u64]>,
}

/// Where a block lies: `(chunk index, block index)`, when `addr` is a block of these chunks.
#[inline]
fn locate(chunks: &[Chunk], geometry: &Geometry, addr: u64) -> Option<(usize, usize)> {
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

/// The sizes `locate` needs, with a shift in place of a division for power-of-two blocks.
struct Geometry {
    block_size: u64,
    block_shift: Option<u32>,
    chunk_bytes: u64,
}

impl<R: MemoryResource> FixedSizeResource<R> {
    /// A resource of `block_size`-byte blocks (rounded up to a multiple of 256) over
    /// `upstream`, taking `blocks_to_preallocate` blocks at a time; the first batch is taken
    /// now.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `block_size` or `blocks_to_preallocate` is 0 or their
    /// product overflows; the upstream's error when the first batch cannot be allocated.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, Error, FixedSizeResource};
    /// let up = CudaResource::new(&Device::host());
    /// let mr = FixedSizeResource::new(up.clone(), 1000, 4)?;
    /// assert_eq!(mr.block_size(), 1024);
    /// assert!(matches!(FixedSizeResource::new(up, 0, 4), Err(Error::InvalidArgument(_))));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn new(upstream: R, block_size: usize, blocks_to_preallocate: usize) -> Result<Self> {
        if block_size == 0 || blocks_to_preallocate == 0 {
            return Err(Error::invalid(format!(
                "a fixed-size resource needs a block size and a block count above 0 (got \
                 {block_size} and {blocks_to_preallocate})"
            )));
        }
        let rounded = align_up(block_size)
            .filter(|&b| b.checked_mul(blocks_to_preallocate).is_some())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{blocks_to_preallocate} blocks of {block_size} bytes overflow"
                ))
            })?;
        let id = upstream.properties().device;
        let device = Device::from_id(id)
            .ok_or_else(|| Error::invalid(format!("the upstream's device {id} is gone")))?;
        let availability = Arc::new(Availability::new());
        if let Some(up) = upstream.availability() {
            up.add_follower(&availability);
        }
        let mr = FixedSizeResource {
            inner: Arc::new(Inner {
                upstream,
                device,
                block_size: rounded,
                blocks_per_chunk: blocks_to_preallocate,
                geometry: Geometry {
                    block_size: rounded as u64,
                    block_shift: rounded.is_power_of_two().then(|| rounded.trailing_zeros()),
                    chunk_bytes: (rounded * blocks_to_preallocate) as u64,
                },
                state: Mutex::new(State {
                    lists: Vec::new(),
                    slots: FxHashMap::default(),
                    last: None,
                    vacant: Vec::new(),
                    chunks: Vec::new(),
                    live: 0,
                    free_blocks: 0,
                }),
                availability,
            }),
        };
        let home = Stream::new(&mr.inner.device)?;
        mr.inner.grow(&mut mr.inner.state.lock(), &home)?;
        Ok(mr)
    }

    /// RMM's defaults: blocks of 1 MiB, 128 at a time.
    ///
    /// # Errors
    /// As [`new`](FixedSizeResource::new).
    pub fn with_defaults(upstream: R) -> Result<Self> {
        Self::new(upstream, DEFAULT_BLOCK_SIZE, DEFAULT_BLOCKS_TO_PREALLOCATE)
    }

    /// The size of every block, a multiple of 256.
    pub fn block_size(&self) -> usize {
        self.inner.block_size
    }

    /// How many blocks the resource takes from the upstream at a time.
    pub fn blocks_to_preallocate(&self) -> usize {
        self.inner.blocks_per_chunk
    }

    /// Blocks on the free lists, of all streams.
    pub fn free_blocks(&self) -> usize {
        self.inner.state.lock().free_blocks
    }

    /// Blocks the resource holds from the upstream, free or in use.
    pub fn total_blocks(&self) -> usize {
        self.inner.state.lock().chunks.len() * self.inner.blocks_per_chunk
    }
}

impl<R: MemoryResource> Inner<R> {
    /// Takes another batch of blocks from the upstream, on `stream`, for `stream`.
    fn grow(&self, state: &mut State, stream: &Stream) -> Result<()> {
        let bytes = self.block_size * self.blocks_per_chunk;
        let base = self.upstream.try_allocate(bytes, stream)?.addr();
        let at = state.chunks.partition_point(|c| c.base < base);
        state.chunks.insert(
            at,
            Chunk {
                base,
                in_use: vec![0; self.blocks_per_chunk.div_ceil(64)].into_boxed_slice(),
            },
        );
        let slot = state.slot_or_insert(stream);
        let list = state.list(slot);
        // Highest address first, so blocks are handed out in address order.
        list.blocks.extend(
            (0..self.blocks_per_chunk as u64)
                .rev()
                .map(|i| base + i * self.block_size as u64),
        );
        // Upstream memory is ordered on `stream`: others must wait for it too.
        list.order.changed();
        state.free_blocks += self.blocks_per_chunk;
        Ok(())
    }

    /// Moves half of another stream's free blocks to `stream`'s list, after `stream` waits for
    /// that stream's frees; picks the stream cheapest to wait for, then the one with the most.
    /// Returns whether any moved.
    fn take(&self, state: &mut State, slot: u32, stream: &Stream) -> Result<bool> {
        let me = stream.id();
        let victim = state
            .lists
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                let l = l.as_ref()?;
                (i as u32 != slot && !l.blocks.is_empty()).then_some((
                    std::cmp::Reverse(l.order.wait_cost(me)),
                    l.blocks.len(),
                    i,
                ))
            })
            .max()
            .map(|(_, _, i)| i);
        let Some(victim) = victim else {
            return Ok(false);
        };
        let moved = {
            let v = state.lists[victim].as_mut().expect("chosen above");
            v.order.order(stream)?;
            let keep = v.blocks.len() / 2;
            v.blocks.split_off(keep)
        };
        let list = state.list(slot);
        list.blocks.extend(moved);
        // These blocks are ordered after `stream`'s wait now: a third stream taking them from
        // `stream` must wait for an event of `stream` recorded after it.
        list.order.changed();
        state.forget_idle(slot);
        Ok(true)
    }

    /// Gives every chunk back to the upstream when no block is in use; says whether it did.
    fn release_all(&self) -> bool {
        let mut state = self.state.lock();
        if state.live != 0 {
            return false;
        }
        // Every block is on some list. The chunks go back on one stream that first waits for
        // each stream that freed blocks.
        let Some(release_on) = state
            .lists
            .iter()
            .flatten()
            .map(|l| l.order.stream().clone())
            .next()
        else {
            return state.chunks.is_empty();
        };
        for list in state.lists.iter_mut().flatten() {
            if list.order.stream() != &release_on {
                if let Err(error) = list.order.order(&release_on) {
                    tracing::error!(%error, "ordering a fixed-size resource's release; leaking its chunks");
                    return false;
                }
            }
        }
        let bytes = self.block_size * self.blocks_per_chunk;
        for Chunk { base, .. } in state.chunks.drain(..) {
            // SAFETY: the chunk came from `upstream.try_allocate(bytes, ..)` in `grow`; no block
            // of it is in use, and `release_on` waited for every stream that freed one.
            unsafe {
                self.upstream
                    .deallocate(DevicePtr::from_raw(base), bytes, &release_on)
            };
        }
        state.lists.clear();
        state.slots.clear();
        state.vacant.clear();
        state.last = None;
        state.free_blocks = 0;
        true
    }
}

impl State {
    #[inline]
    fn slot_or_insert(&mut self, stream: &Stream) -> u32 {
        match self.last {
            Some((s, slot)) if s == stream.id() => slot,
            _ => self.slot_or_insert_slow(stream),
        }
    }

    #[cold]
    fn slot_or_insert_slow(&mut self, stream: &Stream) -> u32 {
        // The fast path already found `last` to be another stream.
        if let Some(&slot) = self.slots.get(&stream.id()) {
            self.last = Some((stream.id(), slot));
            return slot;
        }
        let list = FreeList {
            order: FreeOrder::new(stream),
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
        self.slots.insert(stream.id(), slot);
        self.last = Some((stream.id(), slot));
        slot
    }

    #[inline]
    fn list(&mut self, slot: u32) -> &mut FreeList {
        self.lists[slot as usize]
            .as_mut()
            .expect("a vacant fixed-size list")
    }

    /// Forgets the lists (other than `keep`) that hold no block, so the resource does not keep
    /// their streams alive.
    fn forget_idle(&mut self, keep: u32) {
        for i in 0..self.lists.len() {
            let idle =
                i as u32 != keep && self.lists[i].as_ref().is_some_and(|l| l.blocks.is_empty());
            if idle {
                let list = self.lists[i].take().expect("checked above");
                self.slots.remove(&list.order.stream().id());
                self.vacant.push(i as u32);
                if self.last.is_some_and(|(_, slot)| slot == i as u32) {
                    self.last = None;
                }
            }
        }
    }
}

memory_resource!(shared [R: MemoryResource] FixedSizeResource<R>);

impl<R: MemoryResource> Forward for Inner<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        check_stream(&self.device, stream)?;
        if bytes > self.block_size {
            return Err(Error::OutOfMemory {
                requested: bytes,
                available: Some(self.block_size),
                device: self.device.id(),
            });
        }
        let mut state = self.state.lock();
        let slot = state.slot_or_insert(stream);
        let block = match state.list(slot).blocks.pop() {
            Some(b) => b,
            None => {
                if !self.take(&mut state, slot, stream)? {
                    match self.grow(&mut state, stream) {
                        Ok(()) => {}
                        Err(e) if e.is_out_of_memory() => {
                            return Err(Error::OutOfMemory {
                                requested: bytes,
                                available: Some(0),
                                device: self.device.id(),
                            })
                        }
                        Err(e) => return Err(e),
                    }
                }
                // `take` keeps this stream's slot, and `grow` fills that same slot.
                state.list(slot).blocks.pop().expect("just filled")
            }
        };
        state.free_blocks -= 1;
        state.live += 1;
        let (c, i) = locate(&state.chunks, &self.geometry, block).expect("a block of a chunk");
        state.chunks[c].in_use[i / 64] |= 1 << (i % 64);
        Ok(DevicePtr::from_raw(block))
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if ptr.is_null() {
            return;
        }
        {
            let mut state = self.state.lock();
            let bit = locate(&state.chunks, &self.geometry, ptr.addr()).and_then(|(c, i)| {
                let word = &mut state.chunks[c].in_use[i / 64];
                let mask = 1 << (i % 64);
                let was = *word & mask != 0;
                *word &= !mask;
                was.then_some(())
            });
            assert!(
                bit.is_some(),
                "{ptr} ({bytes} bytes) is not a block of this fixed-size resource in use (double free?)"
            );
            state.live -= 1;
            let slot = state.slot_or_insert(stream);
            let list = state.list(slot);
            list.blocks.push(ptr.addr());
            list.order.changed();
            state.free_blocks += 1;
        }
        self.availability.notify();
    }

    fn availability(&self) -> Option<&Availability> {
        Some(&self.availability)
    }

    fn capacity_limit(&self) -> Option<usize> {
        Some(self.block_size)
    }

    /// While a block is in use, a free brings one back; else only the upstream could give the
    /// resource a new chunk.
    fn may_regain_memory(&self, bytes: usize) -> bool {
        let _ = bytes;
        self.state.lock().live > 0
            || self
                .upstream
                .may_regain_memory(self.block_size.saturating_mul(self.blocks_per_chunk))
    }
}

impl<R: MemoryResource> fmt::Debug for FixedSizeResource<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.state.lock();
        f.debug_struct("FixedSizeResource")
            .field("device", &self.inner.device.id())
            .field("block_size", &self.inner.block_size)
            .field("free_blocks", &state.free_blocks)
            .field("live_blocks", &state.live)
            .finish()
    }
}

impl<R: MemoryResource> Drop for Inner<R> {
    /// Returns the chunks to the upstream; with blocks still in use they are leaked, never
    /// freed under memory someone still uses, and the device records an [`Error::Leaked`].
    fn drop(&mut self) {
        if !self.release_all() {
            let allocations = self.state.get_mut().live;
            self.device.defer_error(Error::Leaked {
                what: "FixedSizeResource",
                allocations,
                bytes: allocations * self.block_size,
                device: self.device.id(),
            });
        }
    }
}

#[cfg(test)]
mod tests;
