//! `PoolResource`: a coalescing, stream-ordered sub-allocator over any upstream resource.

pub(crate) mod core;

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use self::core::{align_up, PoolCore, StreamKey, ALIGN};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::stream_order::FreeOrder;
use crate::resource::{
    check_stream, Availability, DevicePtr, MemoryResource, Properties, SharedResource,
};
use crate::stream::Stream;

/// A coalescing pool sub-allocator over any upstream resource (RMM's `pool_memory_resource`),
/// stream-ordered, fast, and awaitable.
///
/// The pool takes memory from its upstream in chunks and hands out pieces of them; metadata
/// lives in host memory, and every operation is O(1) (a TLSF-style size-class index with
/// bitmaps per stream), never a scan of the free blocks.
///
/// # Growth
/// `PoolResource::new(upstream, initial_size, maximum_size)` takes `initial_size` at once. When
/// a request does not fit, the pool grows as RMM's does: with a maximum, by
/// `max(request, remaining / 2)` while the request fits the remaining room; without one, by
/// `max(request, pool size)` (roughly doubling). If the upstream refuses, the attempt is halved
/// down to the request before the pool gives up with [`Error::OutOfMemory`]. Unlike RMM's pool,
/// [`trim`](PoolResource::trim) returns wholly free chunks to the upstream.
///
/// # Stream ordering
/// A block freed on stream S is reusable at once by later work on S. Another stream T takes
/// memory freed on S only after T waits for an event recorded on S after the free. That event
/// is recorded lazily — when T actually needs S's memory, not on every free (which is what
/// costs RMM's pool ~0.4 µs per free) — and one event covers every free on S before it; a
/// stream that has waited on it does not wait again until S frees more. T first takes just
/// the piece it needs from one of S's blocks; only when no single stream has a block big
/// enough does T take over every other stream's free memory at once, so that it coalesces.
/// Memory freed on a stream that then goes quiet is therefore never stranded there (RMM issues
/// #2039, #850). The pool keeps a handle to each stream that owns free memory in it, so such a
/// stream outlives its last user while its free blocks are in the pool.
///
/// # Awaiting memory
/// The pool has a wait queue ([`Availability`]): an awaited [`allocate`](MemoryResource::allocate)
/// that finds the pool at its maximum (or the upstream exhausted) waits for a free instead of
/// failing. With a maximum, requests larger than it fail at once.
///
/// # Errors
/// [`Error::InvalidArgument`] from `new` when a size is not a multiple of 256 or the initial
/// size exceeds the maximum; [`Error::OutOfMemory`] with the request and the pool's free bytes
/// when neither the pool nor its upstream can serve a request.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let pool = PoolResource::new(CudaResource::new(&device), 1 << 20, Some(16 << 20))?;
/// let p = pool.allocate(1000, &stream).await?;
/// assert!(p.is_aligned(256));
/// assert_eq!(pool.pool_size(), 1 << 20);
/// unsafe { pool.deallocate(p, 1000, &stream) };
/// assert_eq!(pool.statistics().free_bytes, 1 << 20);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub struct PoolResource<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R: MemoryResource> {
    upstream: R,
    device: Device,
    maximum: Option<usize>,
    state: Mutex<State>,
    availability: Arc<Availability>,
}

struct State {
    core: PoolCore,
    /// Upstream chunk base → the size asked of the upstream. RMM's growth halves without
    /// rounding (5120, 2560, 1280, 640), so a chunk can be larger than the 256-byte multiple
    /// the core uses of it; it goes back upstream with the size it came with.
    chunks: FxHashMap<u64, usize>,
    /// The sum of `chunks`: RMM's `pool_size`.
    upstream_bytes: usize,
    /// What the pool needs to hand a stream's free memory to another stream, indexed by the
    /// stream's slot in the core: `slots[i]` is `Some` exactly when core slot `i` is in use.
    /// (Indexing by slot, which the core's operations return, keeps hash lookups off the free
    /// path.)
    slots: Vec<Option<FreeOrder>>,
}

/// A snapshot of a pool's accounting ([`PoolResource::statistics`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatistics {
    /// Bytes held from the upstream (every chunk, allocated or free).
    pub pool_size: usize,
    /// Bytes free in the pool.
    pub free_bytes: usize,
    /// The largest single free block.
    pub largest_free_block: usize,
    /// How many free blocks there are.
    pub free_blocks: usize,
    /// How many allocations are live.
    pub live_allocations: usize,
    /// How many chunks the pool holds from its upstream.
    pub upstream_chunks: usize,
}

fn key(stream: &Stream) -> StreamKey {
    StreamKey(stream.id().0)
}

fn check_size(what: &str, bytes: usize) -> Result<()> {
    if bytes % ALIGN == 0 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} ({bytes}) must be a multiple of {ALIGN} bytes"
        )))
    }
}

impl<R: MemoryResource> PoolResource<R> {
    /// A pool over `upstream` that takes `initial_size` bytes now and grows up to
    /// `maximum_size` (unbounded when `None`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a size is not a multiple of 256 or
    /// `initial_size > maximum_size`; the upstream's error when the initial chunk cannot be
    /// allocated.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, Error, PoolResource};
    /// let mr = CudaResource::new(&Device::host());
    /// assert!(matches!(PoolResource::new(mr.clone(), 1000, None), Err(Error::InvalidArgument(_))));
    /// assert!(matches!(PoolResource::new(mr, 1 << 20, Some(1 << 10)), Err(Error::InvalidArgument(_))));
    /// ```
    pub fn new(upstream: R, initial_size: usize, maximum_size: Option<usize>) -> Result<Self> {
        check_size("the initial pool size", initial_size)?;
        if let Some(max) = maximum_size {
            check_size("the maximum pool size", max)?;
            if initial_size > max {
                return Err(Error::invalid(format!(
                    "the initial pool size ({initial_size}) exceeds the maximum ({max})"
                )));
            }
        }
        let id = upstream.properties().device;
        let device = Device::from_id(id)
            .ok_or_else(|| Error::invalid(format!("the upstream's device {id} is gone")))?;
        let availability = Arc::new(Availability::new());
        if let Some(up) = upstream.availability() {
            up.add_follower(&availability);
        }
        let pool = PoolResource {
            inner: Arc::new(Inner {
                upstream,
                device,
                maximum: maximum_size,
                state: Mutex::new(State {
                    core: PoolCore::new(),
                    chunks: FxHashMap::default(),
                    upstream_bytes: 0,
                    slots: Vec::new(),
                }),
                availability,
            }),
        };
        if initial_size > 0 {
            let home = Stream::new(&pool.inner.device)?;
            let mut state = pool.inner.state.lock();
            pool.expand(&mut state, initial_size, initial_size, &home)?;
        }
        Ok(pool)
    }

    /// Bytes held from the upstream: every chunk, allocated or free (RMM's `pool_size`).
    pub fn pool_size(&self) -> usize {
        self.inner.state.lock().upstream_bytes
    }

    /// The maximum pool size, if any.
    pub fn maximum_size(&self) -> Option<usize> {
        self.inner.maximum
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &R {
        &self.inner.upstream
    }

    /// A snapshot of the pool's accounting.
    pub fn statistics(&self) -> PoolStatistics {
        let state = self.inner.state.lock();
        let core = &state.core;
        PoolStatistics {
            pool_size: state.upstream_bytes,
            free_bytes: core.free_bytes(),
            largest_free_block: core.largest_free_block(),
            free_blocks: core.free_block_count(),
            live_allocations: core.allocation_count(),
            upstream_chunks: core.chunk_count(),
        }
    }

    /// Returns every wholly free chunk to the upstream; returns the bytes released. RMM's pool
    /// never shrinks.
    ///
    /// # Stream ordering
    /// Free memory is first gathered on one stream (the one that owns the most), which waits
    /// for an event of each other stream that owns free memory, so that blocks freed on
    /// different streams coalesce; each chunk then goes back to the upstream on that stream,
    /// so work that used it is ordered before the upstream reuses it. Other streams that
    /// allocate from the pool afterwards wait once for that stream, as for any memory that
    /// crosses streams.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, HostConfig, MemoryResource, PoolResource, Stream};
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// let stream = Stream::new(&device)?;
    /// let pool = PoolResource::new(CudaResource::new(&device), 0, None)?;
    /// let p = pool.try_allocate(1 << 20, &stream)?;
    /// unsafe { pool.deallocate(p, 1 << 20, &stream) };
    /// assert_eq!(pool.trim(), 1 << 20);
    /// assert_eq!(pool.pool_size(), 0);
    /// stream.synchronize_blocking()?;
    /// assert_eq!(device.host_controls().unwrap().allocated_bytes(), 0);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn trim(&self) -> usize {
        self.inner.release_empty_chunks()
    }

    /// Takes at least `min_size` more bytes from the upstream, trying `try_size` first and
    /// halving on failure (RMM's `try_to_expand`); the chunk is owned by `stream`.
    fn expand(
        &self,
        state: &mut State,
        mut try_size: usize,
        min_size: usize,
        stream: &Stream,
    ) -> Result<()> {
        loop {
            match self.inner.upstream.try_allocate(try_size, stream) {
                Ok(p) => {
                    state
                        .core
                        .add_chunk(p.addr(), try_size / ALIGN * ALIGN, key(stream));
                    // The upstream memory is ordered on `stream`: another stream must wait
                    // for it before taking any of it.
                    state.changed(stream);
                    state.chunks.insert(p.addr(), try_size);
                    state.upstream_bytes += try_size;
                    return Ok(());
                }
                Err(e) if e.is_out_of_memory() && try_size > min_size => {
                    try_size = (try_size / 2).max(min_size);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// RMM's growth rule: how much to ask the upstream for to serve `size` more bytes; 0 when
    /// the maximum leaves no room.
    fn size_to_grow(&self, size: usize, pool_size: usize) -> usize {
        match self.inner.maximum {
            Some(max) => {
                let remaining = align_up(max.saturating_sub(pool_size)).unwrap_or(0);
                if size <= remaining {
                    size.max(align_up(remaining / 2).unwrap_or(0))
                } else {
                    0
                }
            }
            None => size.max(pool_size),
        }
    }

    fn out_of_memory(&self, requested: usize, state: &State) -> Error {
        Error::OutOfMemory {
            requested,
            available: Some(state.core.free_bytes()),
            device: self.inner.device.id(),
        }
    }

    /// Serves `size` (aligned) for `stream` from memory other streams freed, after making
    /// `stream` wait for an event that covers their frees.
    ///
    /// First from one other stream that alone has a block big enough: the piece is carved
    /// from its block, and the rest stays with it. Among several such streams the cheapest is
    /// taken: one whose covering event `stream` has already waited on, then one whose latest
    /// event still covers its frees (nothing to record), then the one with the most free bytes.
    /// Failing that, against fragmentation, every other stream's free memory becomes
    /// `stream`'s at once (it may coalesce into a block big enough).
    fn steal(&self, state: &mut State, size: usize, stream: &Stream) -> Result<Option<u64>> {
        let me = key(stream);
        let victim = state
            .core
            .streams_with_block(size, me)
            .max_by_key(|&(victim, slot, bytes)| {
                let cost = state.slots[slot as usize]
                    .as_ref()
                    .expect("a stream with free blocks has a slot")
                    .wait_cost(stream.id());
                (std::cmp::Reverse(cost), bytes, std::cmp::Reverse(victim))
            })
            .map(|(victim, slot, _)| (victim, slot));
        if let Some((victim, slot)) = victim {
            state.order_after(slot, stream)?;
            let p = state.core.allocate(size, victim);
            debug_assert!(p.is_some(), "the victim had a block that fits");
            state.forget_idle_streams(Some(me));
            return Ok(p);
        }
        let others: Vec<(StreamKey, u32)> = (0..state.core.stream_slot_bound() as u32)
            .filter_map(|slot| {
                let s = state.slots[slot as usize].as_ref()?;
                let k = key(s.stream());
                (k != me && state.core.free_bytes_of(k) > 0).then_some((k, slot))
            })
            .collect();
        let free_elsewhere: usize = others
            .iter()
            .map(|&(k, _)| state.core.free_bytes_of(k))
            .sum();
        if free_elsewhere + state.core.free_bytes_of(me) < size {
            return Ok(None);
        }
        for (victim, slot) in others {
            state.order_after(slot, stream)?;
            let vacated = state.core.merge_stream(victim, me);
            debug_assert_eq!(vacated, Some(slot));
            state.slots[slot as usize] = None;
            // The merged blocks are `stream`'s now, ordered after its wait: a third stream
            // must wait for an event of `stream` recorded after this point.
            state.changed(stream);
        }
        state.forget_idle_streams(Some(me));
        Ok(state.core.allocate(size, me))
    }
}

impl State {
    /// The pool's data for `stream`, which must own a slot in the core; made on first use.
    fn slot_at(&mut self, slot: u32, stream: &Stream) -> &mut FreeOrder {
        let slot = slot as usize;
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || None);
        }
        let entry = self.slots[slot].get_or_insert_with(|| FreeOrder::new(stream));
        debug_assert!(entry.stream() == stream, "slot {slot} holds another stream");
        entry
    }

    /// Notes that `stream`'s free memory changed in a way other streams must be ordered after.
    fn changed(&mut self, stream: &Stream) {
        let slot = self
            .core
            .stream_slot(key(stream))
            .expect("the stream was just given memory");
        self.slot_at(slot, stream).changed();
    }

    /// Makes `waiter` wait, if it must, for the frees of the stream in `slot`.
    fn order_after(&mut self, slot: u32, waiter: &Stream) -> Result<()> {
        self.slots[slot as usize]
            .as_mut()
            .expect("a stream with free blocks has a slot")
            .order(waiter)
    }

    /// Moves all free memory to the stream that owns the most, after it waits for each other
    /// owner, so that blocks freed on different streams coalesce (for [`PoolResource::trim`]).
    fn gather_free(&mut self) -> Result<()> {
        let owners: Vec<(usize, u32)> = (0..self.core.stream_slot_bound() as u32)
            .filter_map(|slot| {
                let s = self.slots[slot as usize].as_ref()?;
                let bytes = self.core.free_bytes_of(key(s.stream()));
                (bytes > 0).then_some((bytes, slot))
            })
            .collect();
        let Some(&(_, target)) = owners.iter().max() else {
            return Ok(());
        };
        let target = self.stream_of(target).expect("an owner has a slot").clone();
        for (_, slot) in owners {
            let Some(victim) = self.stream_of(slot).map(key) else {
                continue;
            };
            if victim == key(&target) {
                continue;
            }
            self.order_after(slot, &target)?;
            self.core.merge_stream(victim, key(&target));
            self.slots[slot as usize] = None;
            self.changed(&target);
        }
        Ok(())
    }

    /// Drops the handles of streams (other than `keep`) that own no free memory any more, so
    /// the pool does not keep them alive.
    fn forget_idle_streams(&mut self, keep: Option<StreamKey>) {
        for slot in self.core.remove_idle_streams(keep) {
            self.slots[slot as usize] = None;
        }
    }

    /// The stream of the core's slot `slot`.
    fn stream_of(&self, slot: u32) -> Option<&Stream> {
        self.slots
            .get(slot as usize)?
            .as_ref()
            .map(FreeOrder::stream)
    }
}

impl<R: MemoryResource> MemoryResource for PoolResource<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        check_stream(&self.inner.device, stream)?;
        let Some(size) = align_up(bytes) else {
            return Err(Error::OutOfMemory {
                requested: bytes,
                available: None,
                device: self.inner.device.id(),
            });
        };
        let mut state = self.inner.state.lock();
        if let Some(p) = state.core.allocate(size, key(stream)) {
            return Ok(DevicePtr::from_raw(p));
        }
        if let Some(p) = self.steal(&mut state, size, stream)? {
            return Ok(DevicePtr::from_raw(p));
        }
        let grow = self.size_to_grow(size, state.upstream_bytes);
        if grow == 0 {
            return Err(self.out_of_memory(bytes, &state));
        }
        match self.expand(&mut state, grow, size, stream) {
            Ok(()) => {}
            Err(e) if e.is_out_of_memory() => return Err(self.out_of_memory(bytes, &state)),
            Err(e) => return Err(e),
        }
        let p = state
            .core
            .allocate(size, key(stream))
            .expect("a fresh chunk serves the request");
        Ok(DevicePtr::from_raw(p))
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if ptr.is_null() {
            return;
        }
        {
            let mut state = self.inner.state.lock();
            let slot = state.core.free(ptr.addr(), bytes, key(stream));
            state.slot_at(slot, stream).changed();
        }
        self.inner.availability.notify();
    }

    fn availability(&self) -> Option<&Availability> {
        Some(&self.inner.availability)
    }

    fn capacity_limit(&self) -> Option<usize> {
        let up = self.inner.upstream.capacity_limit();
        match (self.inner.maximum, up) {
            (Some(m), Some(u)) => Some(m.min(u)),
            (m, u) => m.or(u),
        }
    }

    fn properties(&self) -> Properties {
        self.inner.upstream.properties()
    }
}

impl<R: MemoryResource> Clone for PoolResource<R> {
    fn clone(&self) -> Self {
        PoolResource {
            inner: self.inner.clone(),
        }
    }
}

impl<R: MemoryResource> fmt::Debug for PoolResource<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolResource")
            .field("device", &self.inner.device.id())
            .field("maximum", &self.inner.maximum)
            .field("statistics", &self.statistics())
            .finish()
    }
}

impl<R: MemoryResource> Inner<R> {
    /// Gives every wholly free chunk back to the upstream, on the stream that owns its free
    /// memory; returns the bytes released.
    fn release_empty_chunks(&self) -> usize {
        let released = {
            let mut state = self.state.lock();
            if let Err(error) = state.gather_free() {
                // What was gathered before the failure is still released below.
                tracing::error!(%error, "gathering the pool's free memory on one stream");
            }
            let chunks = state.core.release_empty_chunks();
            let state = &mut *state;
            let released: Vec<_> = chunks
                .into_iter()
                .map(|(base, _, owner)| {
                    let size = state
                        .chunks
                        .remove(&base)
                        .expect("every core chunk is recorded");
                    state.upstream_bytes -= size;
                    let stream = state
                        .core
                        .stream_slot(owner)
                        .and_then(|slot| state.stream_of(slot))
                        .cloned();
                    (base, size, stream)
                })
                .collect();
            state.forget_idle_streams(None);
            released
        };
        let mut bytes = 0;
        for (base, size, stream) in released {
            let Some(stream) = stream else {
                // Every chunk is owned by the stream it was allocated for, which has a slot
                // while it owns free memory; this is a bookkeeping bug, so leak, never free.
                tracing::error!(
                    base,
                    size,
                    "pool chunk without an owning stream; leaking it"
                );
                continue;
            };
            // SAFETY: the chunk came from `upstream.try_allocate(size, ..)` (`expand`), the core
            // no longer hands out any of it, and every block of it was freed on `stream` or
            // merged into it after a wait, so all work using it is ordered before this point.
            unsafe {
                self.upstream
                    .deallocate(DevicePtr::from_raw(base), size, &stream)
            };
            bytes += size;
        }
        bytes
    }
}

impl<R: MemoryResource> Drop for Inner<R> {
    /// Returns every wholly free chunk to the upstream. Chunks with live allocations are leaked
    /// (with an error event), never freed under memory someone still uses.
    fn drop(&mut self) {
        self.release_empty_chunks();
        let live = self.state.get_mut().core.allocation_count();
        if live > 0 {
            tracing::error!(
                live,
                "pool dropped with live allocations; their chunks are leaked"
            );
        }
    }
}

#[cfg(test)]
mod tests;
