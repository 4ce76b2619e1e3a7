//! What a mapped pool reports: its statistics and its snapshot.

use super::free_list::Owner;
use super::page_state::{Page, Status};
use super::{Inner, MappedPoolResource, MappedPoolStatistics, State};
use crate::resource::contract::stats::{Allocated, MemoryStats};
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::{Block, BlockState, MemorySnapshot, Segment};
use crate::resource::suballoc::stream_order::FreeOrder;
use crate::stream::StreamId;

impl MappedPoolResource {
    /// A snapshot of the pool's accounting.
    ///
    /// ```
    /// use streamalloc::{Device, MappedPoolResource, MemoryResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let pool = MappedPoolResource::new(&device)?;
    /// let p = pool.try_allocate(1000, &stream)?;
    /// let stats = pool.statistics();
    /// assert_eq!((stats.allocated_bytes, stats.live_allocations), (1024, 1));
    /// assert_eq!(stats.reserved_bytes, stats.granularity); // one page
    /// unsafe { pool.deallocate(p, 1000, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn statistics(&self) -> MappedPoolStatistics {
        self.inner.statistics(&self.inner.state.lock())
    }

    /// Resets the peak of the mapped bytes to what is mapped now (what
    /// [`reset_peak`](crate::MemoryResource::reset_peak) does).
    ///
    /// ```
    /// use streamalloc::{Device, MappedPoolResource, MemoryResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let pool = MappedPoolResource::new(&device)?;
    /// let p = pool.try_allocate(4 << 20, &stream)?;
    /// unsafe { pool.deallocate(p, 4 << 20, &stream) };
    /// pool.trim();
    /// assert_eq!(pool.statistics().peak_reserved_bytes, 4 << 20);
    /// pool.reset_peak_mapped();
    /// assert_eq!(pool.statistics().peak_reserved_bytes, 0);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn reset_peak_mapped(&self) {
        let mut state = self.inner.state.lock();
        state.peak_mapped_pages = state.mapped_pages;
    }
}

impl Inner {
    /// [`MemoryResource::memory_stats`](crate::MemoryResource::memory_stats).
    pub(super) fn memory_stats(&self) -> MemoryStats {
        let (stats, peak) = {
            let state = self.state.lock();
            (self.statistics(&state), state.peak_allocated)
        };
        MemoryStats {
            wait_queue: self.availability.stats(),
            ..MemoryStats::default()
        }
        .with_reserved(stats.reserved_bytes, stats.peak_reserved_bytes)
        .with_allocated(Allocated {
            bytes: stats.allocated_bytes,
            peak: Some(peak as usize),
            allocations: Some(stats.live_allocations),
        })
    }

    pub(super) fn statistics(&self, state: &State) -> MappedPoolStatistics {
        let g = self.granularity;
        let pending = state
            .pages
            .iter()
            .filter(|p| {
                matches!(
                    p,
                    Page::Mapped {
                        status: Status::Pending(_),
                        ..
                    }
                )
            })
            .count();
        // The old spellings are filled in until they go.
        #[allow(deprecated)]
        MappedPoolStatistics {
            reserved_range: self.reserved,
            reserved_bytes: state.mapped_pages * g,
            peak_reserved_bytes: state.peak_mapped_pages * g,
            mapped_bytes: state.mapped_pages * g,
            peak_mapped_bytes: state.peak_mapped_pages * g,
            allocated_bytes: state.list.live_bytes() as usize,
            live_allocations: state.list.live_allocations(),
            free_bytes: state.list.free_bytes() as usize,
            free_blocks: state.list.free_blocks(),
            largest_free_block: state.list.largest_free() as usize,
            pending_release_bytes: pending * g,
            granularity: g,
        }
    }

    /// [`MemoryResource::snapshot`]: a segment per run of mapped pages, its blocks the live
    /// allocations and free blocks of the range clipped to it. A free block is
    /// [`Free`](BlockState::Free) when every stream that freed into it has passed an event
    /// recorded after its frees (or none did), else
    /// [`FreeOnStream`](BlockState::FreeOnStream) on the first that has not.
    pub(super) fn snapshot(&self, state: &State) -> MemorySnapshot {
        let passed: Vec<bool> = state.orders.iter().map(FreeOrder::passed).collect();
        let stream_of = |o: Owner| state.orders.get(o as usize).map(|o| o.stream().id());
        let mut blocks: Vec<(u64, u64, BlockState, Option<StreamId>)> = state
            .list
            .live()
            .map(|(start, len, o)| (start, len, BlockState::Live, stream_of(o)))
            .collect();
        for (start, len, owners) in state.list.blocks() {
            let waiting = owners
                .iter()
                .find(|&o| !passed.get(o as usize).copied().unwrap_or(true));
            let (state, stream) = match waiting {
                None => (BlockState::Free, None),
                Some(o) => (BlockState::FreeOnStream, stream_of(o)),
            };
            blocks.push((start, len, state, stream));
        }
        blocks.sort_unstable_by_key(|b| b.0);
        let mut snapshot = MemorySnapshot::new(self.device.id(), "mapped-pool");
        snapshot.capacity = Some(self.capacity());
        let g = self.granularity as u64;
        let mut page = 0;
        while page < state.pages.len() {
            if state.pages[page] == Page::Unmapped {
                page += 1;
                continue;
            }
            let first = page;
            while page < state.pages.len() && state.pages[page] != Page::Unmapped {
                page += 1;
            }
            let (lo, hi) = (first as u64 * g, page as u64 * g);
            let mut segment = Segment::new(DevicePtr::from_raw(self.base + lo), (hi - lo) as usize);
            segment.expandable = true;
            let from = blocks.partition_point(|b| b.0 + b.1 <= lo);
            for &(start, len, state, stream) in blocks[from..].iter().take_while(|b| b.0 < hi) {
                let (s, e) = (start.max(lo), (start + len).min(hi));
                let mut block =
                    Block::new(DevicePtr::from_raw(self.base + s), (e - s) as usize, state);
                block.stream = stream;
                segment.blocks.push(block);
            }
            snapshot.segments.push(segment);
        }
        snapshot
    }
}
