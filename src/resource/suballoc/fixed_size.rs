//! `FixedSizeResource`: blocks of one size, stream-ordered, from chunks of an upstream resource.
//!
//! The resource (this file) is a thin wrapper: [`core`] holds the free lists and chunks, and
//! knows nothing of streams' events or of the upstream; [`shards`] splits the free lists by
//! stream, each shard behind a lock of its own.

pub(crate) mod core;
mod shards;

use std::fmt;
use std::sync::Arc;

use self::core::FixedSizeCore;
use self::shards::Shards;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::contract::availability::Availability;
use crate::resource::contract::checks::is_empty_request;
use crate::resource::contract::forward::memory_resource;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::shared::SharedResource;
use crate::resource::contract::size::align_up;
use crate::resource::contract::stats::{Allocated, MemoryStats};
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::{
    Block, BlockState, Fragmentation, FreeExtentBucket, MemorySnapshot, Segment,
};
use crate::resource::suballoc::stream_order::FreeOrder;
use crate::stream::Stream;

/// What a device mismatch of a request names.
const TRY_ALLOCATE: &str = "FixedSizeResource::try_allocate(stream)";

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
/// The free lists are split over stream shards (one per CPU, as the pool's), each behind its
/// own lock, so threads allocating on different streams rarely meet on one lock; the resource
/// still grows by one batch at a time, whichever shard runs dry.
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
/// # Snapshots
/// [`snapshot`](MemoryResource::snapshot) shows one [`Segment`](crate::Segment) per chunk
/// taken from the upstream, whose blocks never join
/// ([`coalesces`](crate::Segment::coalesces) is `false`, so the largest free extent is one
/// block). Each block is [`Live`](crate::BlockState::Live) (with no stream: the resource does
/// not keep it) or free on the free list of one stream (lists are per stream): the stream
/// that freed it, that a new chunk was taken on, or that took it over from another list. That
/// stream reuses it at once; another stream, whose own list is empty, takes half the list
/// after its stream waits (on the device) for an event of the list's stream recorded after
/// the frees. So a block is [`FreeOnStream`](crate::BlockState::FreeOnStream) on the list's
/// stream until that stream has passed such an event (recorded when another stream takes
/// from the list, and at each free after that), then [`Free`](crate::BlockState::Free): the
/// wait is then on work already done. [`fragmentation`](MemoryResource::fragmentation) is
/// read from the counts alone.
///
/// ```
/// use streamalloc::{BlockState, CudaResource, Device, FixedSizeResource, MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = FixedSizeResource::new(CudaResource::new(&device)?, 64 << 10, 4)?;
/// let p = mr.try_allocate(1000, &stream)?;
/// let q = mr.try_allocate(1000, &stream)?;
/// unsafe { mr.deallocate(p, 1000, &stream) };
/// let snap = mr.snapshot().unwrap();
/// assert_eq!((snap.segments.len(), snap.segments[0].coalesces), (1, false));
/// let (_, block) = snap.blocks().find(|(_, b)| b.address == p).unwrap();
/// assert_eq!((block.state, block.stream), (BlockState::FreeOnStream, Some(stream.id())));
/// let f = mr.fragmentation().unwrap();
/// assert_eq!((f.free_bytes(), f.largest_free_block), (3 << 16, 64 << 10));
/// unsafe { mr.deallocate(q, 1000, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
///
/// # Errors
/// [`Error::InvalidArgument`] from the constructors for a block size or count of 0 or a chunk
/// size that overflows; [`Error::OutOfMemory`] for requests larger than the block size and when
/// the upstream cannot grow the resource. `deallocate` of a pointer this resource did not hand out or already took back (a double
/// free) frees nothing (accepting it would hand one block to two users) and records an
/// [`Error::InvalidArgument`] naming the pointer on the device
/// ([`Device::take_deferred_error`](crate::Device::take_deferred_error)); two frees of one
/// block racing on two threads may both pass unnoticed (`deallocate`'s contract rules them
/// out; the check is a debugging aid).
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, FixedSizeResource, MemoryResource, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = FixedSizeResource::new(CudaResource::new(&device)?, 64 << 10, 16)?;
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

/// The state every handle of one [`FixedSizeResource`] shares.
struct Inner<R: MemoryResource> {
    upstream: R,
    device: Device,
    block_size: usize,
    blocks_per_chunk: usize,
    /// The free lists, by stream; shared (weakly) with the availability's join barrier.
    shards: Arc<Shards>,
    availability: Arc<Availability>,
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
    /// let up = CudaResource::new(&Device::host())?;
    /// let mr = FixedSizeResource::new(up.clone(), 1000, 4)?;
    /// assert_eq!(mr.block_size(), 1024);
    /// assert!(matches!(FixedSizeResource::new(up, 0, 4), Err(Error::InvalidArgument(_))));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn new(upstream: R, block_size: usize, blocks_to_preallocate: usize) -> Result<Self> {
        Self::with_shards(
            upstream,
            block_size,
            blocks_to_preallocate,
            shards::default_count(),
        )
    }

    /// [`new`](Self::new) with `shards` (a power of two) stream shards.
    fn with_shards(
        upstream: R,
        block_size: usize,
        blocks_to_preallocate: usize,
        shards: usize,
    ) -> Result<Self> {
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
        let device = crate::resource::contract::checks::upstream_device(&upstream)?;
        let availability = Availability::following(upstream.availability());
        let shards = Arc::new(Shards::new(rounded, blocks_to_preallocate, shards));
        // A free reads whether anyone waits under its shard's lock, with no fence (see
        // `Availability::nobody_to_notify`): a joining waiter takes every shard's lock.
        let swept = Arc::downgrade(&shards);
        availability.set_join_barrier(move || {
            if let Some(shards) = swept.upgrade() {
                shards.sweep();
            }
        });
        let mr = FixedSizeResource {
            inner: Arc::new(Inner {
                upstream,
                device,
                block_size: rounded,
                blocks_per_chunk: blocks_to_preallocate,
                shards,
                availability,
            }),
        };
        let home = Stream::new(&mr.inner.device)?;
        let mut shard = mr.inner.shards.lock(mr.inner.shards.index(home.id()));
        mr.inner.grow(&mut shard, &home)?;
        drop(shard);
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
        self.inner.shards.lock_all().free_blocks()
    }

    /// Blocks the resource holds from the upstream, free or in use.
    pub fn total_blocks(&self) -> usize {
        self.inner.shards.lock(0).chunk_count() * self.inner.blocks_per_chunk
    }
}

impl<R: MemoryResource> Inner<R> {
    /// Takes another batch of blocks from the upstream, on `stream`, for `stream`.
    fn grow(&self, state: &mut FixedSizeCore<FreeOrder>, stream: &Stream) -> Result<()> {
        let bytes = self.block_size * self.blocks_per_chunk;
        let base = self.upstream.try_allocate(bytes, stream)?.addr();
        let slot = state.slot_or_insert(stream.id(), || FreeOrder::new(stream));
        state.add_chunk(base, slot);
        // Upstream memory is ordered on `stream`: others must wait for it too.
        state.order_mut(slot).changed();
        Ok(())
    }

    /// Moves half of another stream's free blocks to `stream`'s list (in `slot` of `mine`,
    /// `stream`'s shard), after `stream` waits for that stream's frees; the other stream's
    /// list is in `theirs` (another shard's core), or in `mine` when `theirs` is `None`. Picks
    /// the stream cheapest to wait for, then the one with the most. Returns whether any moved.
    fn take(
        &self,
        mine: &mut FixedSizeCore<FreeOrder>,
        theirs: Option<&mut FixedSizeCore<FreeOrder>>,
        slot: u32,
        stream: &Stream,
    ) -> Result<bool> {
        let me = stream.id();
        let rank = |o: &FreeOrder| std::cmp::Reverse(o.wait_cost(me));
        match theirs {
            None => {
                let Some(victim) = mine.pick_victim(Some(slot), rank) else {
                    return Ok(false);
                };
                mine.order_mut(victim).order(stream)?;
                mine.move_half(victim, slot);
            }
            Some(theirs) => {
                let Some(victim) = theirs.pick_victim(None, rank) else {
                    return Ok(false);
                };
                theirs.order_mut(victim).order(stream)?;
                let blocks = theirs.take_half(victim);
                theirs.forget_idle(None);
                mine.give(slot, blocks);
            }
        }
        // These blocks are ordered after `stream`'s wait now: a third stream taking them from
        // `stream` must wait for an event of `stream` recorded after it.
        mine.order_mut(slot).changed();
        mine.forget_idle(Some(slot));
        Ok(true)
    }

    /// The slow path of an allocation on `stream`, whose list was empty: takes blocks from
    /// another stream of its shard, then of another shard, and only when no list has a block
    /// grows by a chunk (once for shards that run dry together). Returns the block.
    #[cold]
    fn allocate_slow(&self, bytes: usize, stream: &Stream) -> Result<u64> {
        let make = || FreeOrder::new(stream);
        let (home, n) = (self.shards.index(stream.id()), self.shards.len());
        loop {
            let chunks_seen = {
                let mut shard = self.shards.lock(home);
                let slot = shard.slot_or_insert(stream.id(), make);
                // Another thread of the shard may have freed meanwhile.
                if let Some(b) = shard.allocate(slot) {
                    return Ok(b);
                }
                if self.take(&mut shard, None, slot, stream)? {
                    return Ok(shard.allocate(slot).expect("just filled"));
                }
                shard.chunk_count()
            };
            for k in 1..n {
                let other = (home + k) & (n - 1);
                // A look first, so that empty shards cost one lock, not two.
                if self.shards.lock(other).free_blocks() == 0 {
                    continue;
                }
                let (mut shard, mut theirs) = self.shards.lock_pair(home, other);
                // The slot may have gone (`forget_idle`) while the shard was unlocked.
                let slot = shard.slot_or_insert(stream.id(), make);
                if let Some(b) = shard.allocate(slot) {
                    return Ok(b);
                }
                if self.take(&mut shard, Some(&mut theirs), slot, stream)? {
                    return Ok(shard.allocate(slot).expect("just filled"));
                }
            }
            let mut shard = self.shards.lock(home);
            let slot = shard.slot_or_insert(stream.id(), make);
            if let Some(b) = shard.allocate(slot) {
                return Ok(b);
            }
            let _growing = self.shards.grow.lock();
            if shard.chunk_count() != chunks_seen {
                // Another shard grew since this one looked: take from it instead.
                continue;
            }
            match self.grow(&mut shard, stream) {
                // `grow` fills this stream's slot.
                Ok(()) => return Ok(shard.allocate(slot).expect("just filled")),
                Err(e) if e.is_out_of_memory() => {
                    // No stream had a free block when looked at and the upstream has no
                    // chunk: nothing is free, nothing pending.
                    let held = shard.chunk_count() * self.blocks_per_chunk;
                    let figures = Fragmentation {
                        reserved_bytes: held * self.block_size,
                        live_bytes: held * self.block_size,
                        ..Fragmentation::default()
                    };
                    let details = figures.out_of_memory_details(stream.id());
                    return Err(Error::out_of_memory_with(bytes, self.device.id(), details));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Gives every chunk back to the upstream when no block is in use; says whether it did.
    fn release_all(&self) -> bool {
        let mut state = self.shards.lock_all();
        if state.live() != 0 {
            return false;
        }
        // Every block is on some list. The chunks go back on one stream that first waits for
        // each stream that freed blocks.
        let Some(release_on) = state.some_stream() else {
            return state.chunk_count() == 0;
        };
        for order in state.orders_mut() {
            if order.stream() != &release_on {
                if let Err(error) = order.order(&release_on) {
                    tracing::error!(%error, "ordering a fixed-size resource's release; leaking its chunks");
                    return false;
                }
            }
        }
        let bytes = self.block_size * self.blocks_per_chunk;
        for base in state.take_chunks() {
            // SAFETY: the chunk came from `upstream.try_allocate(bytes, ..)` in `grow`; no block
            // of it is in use, and `release_on` waited for every stream that freed one.
            unsafe {
                self.upstream
                    .deallocate(DevicePtr::from_raw(base), bytes, &release_on)
            };
        }
        true
    }
}

memory_resource!(shared [R: MemoryResource] FixedSizeResource<R>);

// SAFETY: a pointer it hands out is a block of one of its chunks, each an allocation of the
// upstream held until the resource drops it: blocks are `block_size` bytes (a multiple of 256,
// at least the request, which is refused above it) at 256-aligned offsets of a 256-aligned
// chunk, and the free list hands each out once until it is freed. The properties are the
// upstream's.
unsafe impl<R: MemoryResource> crate::resource::suballoc::base::SubAllocator for Inner<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if is_empty_request(&self.device, bytes, stream, TRY_ALLOCATE)? {
            return Ok(DevicePtr::NULL);
        }
        if bytes > self.block_size {
            return Err(Error::too_large(bytes, self.block_size, self.device.id()));
        }
        let block = {
            let mut shard = self.shards.lock(self.shards.index(stream.id()));
            let slot = shard.slot_or_insert(stream.id(), || FreeOrder::new(stream));
            shard.allocate(slot)
        };
        let block = match block {
            Some(b) => b,
            None => self.allocate_slow(bytes, stream)?,
        };
        Ok(DevicePtr::from_raw(block))
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if ptr.is_null() {
            return;
        }
        let quiet = {
            let mut shard = self.shards.lock(self.shards.index(stream.id()));
            let Some(order) = shard.free(ptr.addr(), stream.id(), || FreeOrder::new(stream)) else {
                // Nothing is freed, and the caller hears of it through the device's deferred
                // errors (a panic here could abort a `Drop`).
                drop(shard);
                self.device.defer_error(Error::invalid(format!(
                    "{ptr} ({bytes} bytes) is not a block of this fixed-size resource in use (double free?)"
                )));
                return;
            };
            order.changed();
            // Read under the shard's lock, which the join barrier takes: no fence.
            self.availability.nobody_to_notify()
        };
        if !quiet {
            self.availability.notify();
        }
    }

    fn wait_queue(&self) -> &Availability {
        &self.availability
    }

    fn capacity_limit(&self) -> Option<usize> {
        Some(self.block_size)
    }

    /// Reserved: the blocks held from the upstream (they go back only when the resource is
    /// dropped, so the peak is the figure now); allocated: the blocks in use.
    fn memory_stats(&self) -> MemoryStats {
        let (chunks, live) = {
            let state = self.shards.lock_all();
            (state.chunk_count(), state.live())
        };
        let reserved = chunks * self.blocks_per_chunk * self.block_size;
        self.upstream
            .memory_stats()
            .with_reserved(reserved, reserved)
            .with_allocated(Allocated {
                bytes: live * self.block_size,
                peak: None,
                allocations: Some(live),
            })
    }

    /// One segment per chunk taken from the upstream, whose blocks never join
    /// ([`Segment::coalesces`] is `false`): each block is [`Live`](BlockState::Live) (its
    /// stream is not kept), [`FreeOnStream`](BlockState::FreeOnStream) on the stream whose
    /// free list holds it — the stream that freed it, or that a fresh chunk was taken for, or
    /// that took it over from another stream's list — or [`Free`](BlockState::Free) once that
    /// stream has passed an event recorded after its frees. The list's stream reuses it at
    /// once; another takes it (with half of that list) after waiting for that event.
    fn snapshot(&self) -> Option<MemorySnapshot> {
        let (layout, passed) = {
            let state = self.shards.lock_all();
            (state.layout(), state.passed_lists())
        };
        let mut snap = MemorySnapshot::new(self.device.id(), "fixed-size");
        let size = self.block_size;
        for (base, uses) in layout {
            let base = DevicePtr::from_raw(base);
            let mut segment = Segment::new(base, size * uses.len());
            segment.coalesces = false;
            segment.blocks = uses
                .into_iter()
                .enumerate()
                .map(|(i, stream)| {
                    let at = base.offset(i * size);
                    match stream {
                        None => Block::new(at, size, BlockState::Live),
                        Some(s) if passed.contains(&s) => Block::new(at, size, BlockState::Free),
                        Some(s) => Block::new(at, size, BlockState::FreeOnStream).on_stream(s),
                    }
                })
                .collect();
            snap.segments.push(segment);
        }
        Some(snap)
    }

    /// The figures of [`snapshot`](Forward::snapshot), from the counts alone (no block list):
    /// every free extent is one block.
    fn fragmentation(&self) -> Option<Fragmentation> {
        let (chunks, live, mut free_by_stream, passed) = {
            let state = self.shards.lock_all();
            let passed = state.passed_lists();
            (
                state.chunk_count(),
                state.live(),
                state.free_by_stream(),
                passed,
            )
        };
        let size = self.block_size;
        let free_blocks: usize = free_by_stream.iter().map(|&(_, n)| n).sum();
        // Lists whose stream has passed its frees are free for every stream.
        let free_now: usize = free_by_stream
            .iter()
            .filter(|(s, _)| passed.contains(s))
            .map(|&(_, n)| n)
            .sum();
        free_by_stream.retain(|(s, _)| !passed.contains(s));
        let mut f = Fragmentation {
            reserved_bytes: chunks * self.blocks_per_chunk * size,
            live_bytes: live * size,
            free_now_bytes: free_now * size,
            largest_free_now: if free_now > 0 { size } else { 0 },
            free_on_stream: free_by_stream.iter().map(|&(s, n)| (s, n * size)).collect(),
            live_by_stream: if live > 0 {
                vec![(None, live * size)]
            } else {
                Vec::new()
            },
            largest_free_by_stream: free_by_stream.iter().map(|&(s, _)| (s, size)).collect(),
            ..Fragmentation::default()
        };
        if free_blocks > 0 {
            f.largest_free_block = size;
            f.free_extents = vec![FreeExtentBucket {
                min_bytes: 1 << (usize::BITS - 1 - size.leading_zeros()),
                count: free_blocks,
                bytes: free_blocks * size,
            }];
        }
        Some(f)
    }

    /// While a block is in use, a free brings one back; else only the upstream could give the
    /// resource a new chunk.
    fn may_regain_memory(&self, bytes: usize) -> bool {
        let _ = bytes;
        self.shards.lock_all().live() > 0
            || self
                .upstream
                .may_regain_memory(self.block_size.saturating_mul(self.blocks_per_chunk))
    }
}

impl<R: MemoryResource> fmt::Debug for FixedSizeResource<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.shards.lock_all();
        f.debug_struct("FixedSizeResource")
            .field("device", &self.inner.device.id())
            .field("block_size", &self.inner.block_size)
            .field("free_blocks", &state.free_blocks())
            .field("live_blocks", &state.live())
            .finish()
    }
}

impl<R: MemoryResource> Drop for Inner<R> {
    /// Returns the chunks to the upstream; with blocks still in use they are leaked, never
    /// freed under memory someone still uses, and the device records an [`Error::Leaked`].
    fn drop(&mut self) {
        if !self.release_all() {
            let allocations = self.shards.lock_all().live();
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
mod shard_tests;
#[cfg(test)]
mod tests;
