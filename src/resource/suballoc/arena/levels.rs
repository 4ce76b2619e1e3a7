//! The arena's levels and how a request moves between them: a small request from its stream
//! arena, which grows by a superblock of the global arena; a large one from the global arena in
//! whole pages; on exhaustion, wholly free superblocks go back (defragment) and a small request
//! may borrow from another stream's arena. Each move across streams waits on the fences of the
//! streams that freed the memory ([`OrderCounters::wait_fences`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::config::ArenaDump;
use super::core::consts::{PAGE_SIZE, SUPERBLOCK_PAGES};
use super::core::{align_to_size_class, align_up, GlobalArena, Use};
use super::extents::{Extents, GLOBAL, LARGE_AREA};
use super::slots::{cache_forget, Registry, SlotState, Slots};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::contract::availability::Availability;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::device_ptr::DevicePtr;
use crate::resource::suballoc::stream_order::{Fence, OrderCounters};
use crate::stream::Stream;

/// The state every handle of one [`ArenaResource`](super::ArenaResource) shares.
pub(super) struct Inner<R: MemoryResource> {
    /// Process-unique, never 0: keys the thread-local arena cache.
    pub(super) uid: u64,
    pub(super) upstream: R,
    pub(super) device: Device,
    /// The arena's memory: upstream allocations mapped to the global arena's pages.
    pub(super) extents: Extents,
    /// How a growing arena grows; `None` for an arena of a fixed size.
    pub(super) growth: Option<Growth>,
    /// The largest request that can ever succeed.
    pub(super) capacity: usize,
    pub(super) size_classes: bool,
    pub(super) per_thread: bool,
    pub(super) dump: Option<ArenaDump>,
    pub(super) global: Mutex<GlobalArena<Fence>>,
    pub(super) slots: Slots,
    pub(super) registry: RwLock<Registry>,
    /// The stream a fixed arena was allocated on; it gives the arena's extents back.
    pub(super) home: Stream,
    pub(super) availability: Arc<Availability>,
    /// The events and waits inserted to order streams after each other's frees.
    pub(super) counters: OrderCounters,
    /// Bytes a growing arena holds in extents for superblocks: the next such growth takes an
    /// eighth of that, from the growth step up to [`MAX_GROWTH`], so that an arena that needs
    /// hundreds of megabytes of small blocks grows tens of times, not once per step (each
    /// growth is a `cuMemAlloc`, tens of microseconds on a GPU; RMM's replay log took 227 of
    /// them in its first 1,768 events), while one that gave its extents back grows by little
    /// again (an eighth keeps a repeat of the same requests from holding more).
    pub(super) superblocks_held: AtomicUsize,
}

/// The most a growing arena takes for superblocks at once.
pub(super) const MAX_GROWTH: usize = 32 << 20;

/// How a growing arena grows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Growth {
    /// The least bytes taken from the upstream at a time (a multiple of [`PAGE_SIZE`]).
    pub(super) step: usize,
    /// The most bytes held from the upstream at once.
    pub(super) maximum: usize,
}

impl<R: MemoryResource> Inner<R> {
    /// `bytes` as the arena rounds it: to 256 or to a size class; `None` when that overflows
    /// or there is no class.
    pub(super) fn round(&self, bytes: usize) -> Option<usize> {
        if self.size_classes {
            align_to_size_class(bytes)
        } else {
            align_up(bytes)
        }
    }

    /// The address of global page `page`.
    ///
    /// # Panics
    /// When the arena does not hold `page`.
    pub(super) fn page_addr(&self, page: u64) -> u64 {
        self.extents
            .by_page(page, |e| e.page_addr(page))
            .unwrap_or_else(|| panic!("page {page} is not held by this arena"))
    }

    /// The page of `addr`.
    ///
    /// # Panics
    /// When `addr` lies outside the arena.
    pub(super) fn page_of(&self, addr: u64) -> u64 {
        self.extents
            .by_addr(addr, |e| e.page_of(addr))
            .unwrap_or_else(|| panic!("{addr:#x} is not allocated from this arena"))
    }

    /// Marks the pages of `[base, base + bytes)`, which lie in one extent, as lent to `owner`.
    pub(super) fn set_owner(&self, base: u64, bytes: u64, owner: u32) {
        self.extents
            .by_addr(base, |e| {
                let first = e.page_of(base);
                for page in first..first + bytes / PAGE_SIZE as u64 {
                    e.owner(page).store(owner, Ordering::Release);
                }
            })
            .unwrap_or_else(|| panic!("{base:#x} is not allocated from this arena"));
    }

    /// Grows the arena for a request of `pages` pages that found no fit: gives back every
    /// wholly free extent first (none can serve it, or the request would have found it), then
    /// takes an extent from the upstream on `stream`, so that it is ready for `stream` at once
    /// and other streams wait for `stream` before they use it: one growth step for superblocks,
    /// exactly `pages` for a large request (`large`), in the large area.
    /// Returns the pages it took for the request (first page, pages, their fences), already
    /// handed out (lent as a superblock, or a large block of `stream`); `None` when it did not
    /// grow: for an arena of a fixed size, or when the maximum or the upstream's out-of-memory
    /// stops it.
    pub(super) fn grow(
        &self,
        pages: u64,
        large: bool,
        stream: &Stream,
    ) -> Result<Option<(u64, u64, Vec<Fence>)>> {
        let Some(growth) = self.growth else {
            return Ok(None);
        };
        self.release_free_extents();
        let need = pages as usize * PAGE_SIZE;
        let held = self.extents.held();
        let room = growth.maximum.saturating_sub(held);
        if need > room {
            return Ok(None);
        }
        let bytes = if large {
            need
        } else {
            let grown = self.superblocks_held.load(Ordering::Relaxed) / 8;
            let step =
                grown.clamp(growth.step, MAX_GROWTH.max(growth.step)) / PAGE_SIZE * PAGE_SIZE;
            need.max(step).min(room / PAGE_SIZE * PAGE_SIZE)
        };
        let base = match self.upstream.try_allocate(bytes, stream) {
            Ok(p) => p.addr(),
            Err(e) if e.is_out_of_memory() => return Ok(None),
            Err(e) => return Err(e),
        };
        if !large {
            self.superblocks_held.fetch_add(bytes, Ordering::Relaxed);
        }
        let record = self.record_of(stream);
        // Whoever takes these pages on another stream waits for the allocation on `stream`.
        record.note_free();
        let mut global = self.global.lock();
        let first = self.extents.add(base, bytes, large);
        global.add_range(first, (bytes / PAGE_SIZE) as u64, vec![Fence(record)]);
        // Taken for the caller under the lock that added it: released, another request could
        // take it (or another `grow` give the still wholly free extent back) before the caller
        // looks again, and the caller would fail with the arena just grown.
        let (c, tag) = if large {
            (global.find(Use::Large, pages), stream.id().0)
        } else {
            (global.find_below(Use::Superblock, 0, LARGE_AREA), 0)
        };
        // The fresh extent serves the request it was grown for; were it not found, the caller
        // goes on as if the arena had not grown (the extent stays free for everyone).
        let Some(c) = c else {
            return Ok(None);
        };
        let fences = global.fences(&c).to_vec();
        global.take(c, tag);
        Ok(Some((c.start, c.pages, fences)))
    }

    /// Gives every wholly free extent of a growing arena back to the upstream, on the home
    /// stream after it waits for every stream that freed memory into it. Returns the bytes given
    /// back. The caller has moved wholly free superblocks to the global arena first.
    pub(super) fn release_free_extents(&self) -> usize {
        if self.growth.is_none() {
            return 0;
        }
        let mut released = Vec::new();
        {
            let mut global = self.global.lock();
            for (base, bytes, first, pages) in self.extents.list() {
                if let Some(fences) = global.remove_free_range(first, pages) {
                    self.extents.remove(first);
                    if first < LARGE_AREA {
                        self.superblocks_held.fetch_sub(bytes, Ordering::Relaxed);
                    }
                    released.push((base, bytes, fences));
                }
            }
        }
        let home = self.record_of(&self.home);
        let mut total = 0;
        for (base, bytes, fences) in released {
            if let Err(e) = self.counters.wait_fences(&home, &fences) {
                tracing::error!(error = %e, "cannot order an arena extent's release after its frees; leaking it");
                self.device.defer_error(e);
                continue;
            }
            // SAFETY: the extent came from `upstream.try_allocate(bytes, ..)` (`grow`), nothing
            // in it is live (it was one free range), it is no longer in the arena, and `home`
            // now waits for every stream that freed memory into it.
            unsafe {
                self.upstream
                    .deallocate(DevicePtr::from_raw(base), bytes, &self.home)
            };
            total += bytes;
        }
        total
    }

    /// Serves a request of at most one superblock from `stream`'s arena.
    pub(super) fn allocate_small(
        &self,
        size: u64,
        bytes: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        let key = self.key(stream);
        // A superblock `grow` took for this request, to add to the stream's arena.
        let mut grown: Option<(u64, u64, Vec<Fence>)> = None;
        for attempt in 0..3 {
            loop {
                let index = self.arena_slot(stream, key);
                let mut state = self.slots.get(index).state.lock();
                if state.key != Some(key) {
                    // The cached arena was retired; look again.
                    drop(state);
                    cache_forget(self.uid, stream.id().0);
                    continue;
                }
                if let Some((start, pages, fences)) = grown.take() {
                    let me = state.record.as_ref().expect("a live arena has a stream");
                    if let Err(e) = self.counters.wait_fences(me, &fences) {
                        self.global.lock().return_superblock(start, pages, fences);
                        return Err(e);
                    }
                    let (base, bytes) = (self.page_addr(start), pages * PAGE_SIZE as u64);
                    self.set_owner(base, bytes, index);
                    state.core.add_superblock(base, bytes);
                }
                if let Some(p) = state.core.allocate(size) {
                    return Ok(DevicePtr::from_raw(p));
                }
                if let Some(p) = self.refill(index, &mut state, size)? {
                    return Ok(DevicePtr::from_raw(p));
                }
                break;
            }
            // Exhausted: gather every wholly free superblock and retry; still exhausted (another
            // request may have taken what that gathered), grow by a superblock of our own.
            match attempt {
                0 => {
                    self.defragment();
                }
                1 => match self.grow(SUPERBLOCK_PAGES, false, stream)? {
                    Some(superblock) => grown = Some(superblock),
                    None => break,
                },
                _ => {}
            }
        }
        if let Some(p) = self.borrow(size, stream)? {
            return Ok(DevicePtr::from_raw(p));
        }
        Err(self.out_of_memory(bytes, size as usize, stream))
    }

    /// Grows the arena in `slot` (`state`) for `size` bytes: with its pending frees when they
    /// could serve it, else with a superblock from the global arena, else with any pending
    /// frees. Returns the block, or `None` when none of that serves it.
    fn refill(&self, slot: u32, state: &mut SlotState, size: u64) -> Result<Option<u64>> {
        if state.core.pending_bytes() >= size {
            self.reclaim(state)?;
            if let Some(p) = state.core.allocate(size) {
                return Ok(Some(p));
            }
        }
        {
            let mut global = self.global.lock();
            // A growing arena lends superblocks from its superblock area only.
            let limit = if self.growth.is_some() {
                LARGE_AREA
            } else {
                u64::MAX
            };
            if let Some(c) = global.find_below(Use::Superblock, 0, limit) {
                let me = state.record.as_ref().expect("a live arena has a stream");
                self.counters.wait_fences(me, global.fences(&c))?;
                global.take(c, 0);
                drop(global);
                let (base, bytes) = (self.page_addr(c.start), c.pages * PAGE_SIZE as u64);
                self.set_owner(base, bytes, slot);
                state.core.add_superblock(base, bytes);
                let p = state.core.allocate(size);
                debug_assert!(p.is_some(), "a fresh superblock serves a small request");
                return Ok(p);
            }
        }
        if state.core.pending_bytes() > 0 {
            self.reclaim(state)?;
            return Ok(state.core.allocate(size));
        }
        Ok(None)
    }

    /// Makes the pending frees of the arena in `state` reusable, after `stream` (the arena's)
    /// waits for the streams that freed them.
    fn reclaim(&self, state: &mut SlotState) -> Result<()> {
        let me = state.record.as_ref().expect("a live arena has a stream");
        self.counters
            .wait_fences(me, &state.core.pending_fences())?;
        state.core.reclaim_pending();
        Ok(())
    }

    /// The last resort of a small request: a free block of any stream arena, after `stream`
    /// waits for that arena's stream. The block stays in that arena's superblock.
    fn borrow(&self, size: u64, stream: &Stream) -> Result<Option<u64>> {
        let me = self.record_of(stream);
        let used = self.registry.read().used;
        for index in 0..used {
            let mut state = self.slots.get(index).state.lock();
            let Some(record) = state.record.clone() else {
                continue;
            };
            if state.core.pending_bytes() >= size {
                // Memory other streams freed into this arena serves no one until the arena's
                // stream waits for them: wait now, so that a borrower can have it too (after
                // waiting on an event of that stream recorded after this wait).
                self.reclaim(&mut state)?;
            }
            if let Some(p) = state.core.allocate(size) {
                let home = record.stream_id();
                if let Err(e) = self.counters.wait_fences(&me, &[Fence(record)]) {
                    state.core.free(p, size);
                    return Err(e);
                }
                if home != stream.id() {
                    state.core.mark_borrowed(p, Fence(me));
                }
                return Ok(Some(p));
            }
        }
        Ok(None)
    }

    /// Serves a request of more than one superblock from the global arena, in whole pages.
    pub(super) fn allocate_large(
        &self,
        size: u64,
        bytes: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        let pages = size.div_ceil(PAGE_SIZE as u64);
        let me = self.record_of(stream);
        for attempt in 0..2 {
            {
                let mut global = self.global.lock();
                if let Some(c) = global.find(Use::Large, pages) {
                    self.counters.wait_fences(&me, global.fences(&c))?;
                    global.take(c, stream.id().0);
                    return Ok(DevicePtr::from_raw(self.page_addr(c.start)));
                }
            }
            if attempt == 0 {
                self.defragment();
            }
        }
        if let Some((start, _, fences)) = self.grow(pages, true, stream)? {
            if let Err(e) = self.counters.wait_fences(&me, &fences) {
                self.global.lock().free_large(start, pages, Fence(me));
                return Err(e);
            }
            return Ok(DevicePtr::from_raw(self.page_addr(start)));
        }
        Err(self.out_of_memory(bytes, size as usize, stream))
    }

    /// Moves every wholly free superblock of every stream arena to the global arena and
    /// retires the arenas left without superblocks; returns the bytes moved.
    pub(super) fn defragment(&self) -> usize {
        let mut registry = self.registry.write();
        let mut returned = Vec::new();
        for index in 0..registry.used {
            let slot = self.slots.get(index);
            let mut state = slot.state.lock();
            let Some(record) = state.record.clone() else {
                continue;
            };
            for r in state.core.release_free_superblocks(&Fence(record)) {
                self.set_owner(r.base, r.size, GLOBAL);
                returned.push(r);
            }
            if state.core.superblock_count() == 0 {
                slot.home.store(0, Ordering::Release);
                state.record = None;
                let key = state.key.take().expect("a live slot has a key");
                registry.arenas.remove(&key);
                registry.vacant.push(index);
            }
        }
        let mut global = self.global.lock();
        let mut moved = 0;
        for r in returned {
            moved += r.size as usize;
            global.return_superblock(self.page_of(r.base), r.size / PAGE_SIZE as u64, r.fences);
        }
        moved
    }
}

impl<R: MemoryResource> Drop for Inner<R> {
    /// Gives the arena back to the upstream, ordered after every free, if nothing is live;
    /// else leaks it rather than free memory someone still uses, and the device records an
    /// [`Error::Leaked`].
    ///
    /// The extents are given back on `home`, which only this resource holds: once it drops,
    /// no device-wide synchronize reaches that stream's work (it covers the streams the crate
    /// holds), so a stream-ordered upstream free would still be queued after one. The drop
    /// therefore waits for `home` to pass the frees before it returns (a `CudaResource`
    /// upstream waits for it in each free anyway, as RMM's arena does when it frees its
    /// upstream blocks).
    fn drop(&mut self) {
        self.defragment();
        let mut live = 0;
        self.for_each_arena(|_, core| live += core.live_count());
        let global = self.global.get_mut();
        live += global.large_count();
        if live > 0 || global.free_pages() != global.pages() {
            let stats = self.statistics();
            self.device.defer_error(Error::Leaked {
                what: "ArenaResource",
                allocations: stats.live_allocations,
                bytes: stats.live_bytes,
                device: self.device.id(),
            });
            return;
        }
        let fences: Vec<Fence> = global
            .free_ranges()
            .iter()
            .flat_map(|(_, _, f)| f.iter().cloned())
            .collect();
        let home = self.record_of(&self.home);
        if let Err(e) = self.counters.wait_fences(&home, &fences) {
            tracing::error!(error = %e, "cannot order the arena's release after its frees; leaking it");
            self.device.defer_error(e);
            return;
        }
        let extents = self.extents.list();
        if extents.is_empty() {
            return;
        }
        for (base, bytes, _, _) in extents {
            // SAFETY: each extent came from `upstream.try_allocate(bytes, ..)` (construction or
            // `grow`), nothing in it is live, and `home` now waits for every stream that freed
            // memory in it, so all work that used it is ordered before this point of `home`.
            unsafe {
                self.upstream
                    .deallocate(DevicePtr::from_raw(base), bytes, &self.home)
            };
        }
        if let Err(e) = self.home.synchronize_blocking() {
            tracing::error!(error = %e, "cannot wait for the arena's release");
            self.device.defer_error(e);
        }
    }
}
