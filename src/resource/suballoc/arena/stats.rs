//! What an arena reports: [`ArenaStatistics`], and the dump of its state on out-of-memory
//! ([`ArenaDump`]).

use std::fmt::Write as _;
use std::io::Write as _;

use super::config::ArenaDump;
use super::core::consts::PAGE_SIZE;
use super::levels::Inner;
use crate::error::Error;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::inspect::Fragmentation;
use crate::resource::suballoc::stream_order::Fence;
use crate::stream::Stream;
use crate::stream::StreamId;

/// A snapshot of an arena's accounting
/// ([`ArenaResource::statistics`](super::ArenaResource::statistics)).
///
/// `free_bytes + pending_bytes + live_bytes == reserved_bytes` always holds.
///
/// # Examples
///
/// ```
/// use streamalloc::{ArenaResource, CudaResource, Device, MemoryResource, Stream};
///
/// let device = Device::host();
/// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
/// let arena = ArenaResource::new(CudaResource::new(&device)?, Some(4 << 20))?;
/// let p = arena.try_allocate(1 << 20, &a)?; // a whole superblock of `a`'s arena
/// b.wait(&a.record()?)?;
/// unsafe { arena.deallocate(p, 1 << 20, &b) }; // freed on another stream than its arena's
/// let stats = arena.statistics();
/// assert_eq!((stats.pending_bytes, stats.live_allocations), (1 << 20, 0));
/// assert_eq!(stats.events_recorded, 0); // nothing crossed streams yet
/// let q = arena.try_allocate(1 << 20, &a)?; // `a` waits for `b`, then reuses the block
/// assert_eq!((q, arena.statistics().events_recorded), (p, 1));
/// unsafe { arena.deallocate(q, 1 << 20, &a) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaStatistics {
    /// The bytes taken from the upstream.
    pub reserved_bytes: usize,
    /// The old spelling of `reserved_bytes`, kept for one release.
    #[deprecated(note = "renamed `reserved_bytes`, as in `MemoryStats`")]
    #[doc(hidden)]
    pub arena_size: usize,
    /// Bytes free for reuse: in the global arena and in the stream arenas.
    pub free_bytes: usize,
    /// Of those, the bytes free in the global arena.
    pub global_free_bytes: usize,
    /// The largest free block, in the global arena or any stream arena.
    pub largest_free_block: usize,
    /// Bytes freed on another stream than the arena they lie in, not reusable until that
    /// arena's stream waits for the freeing stream (or they go back to the global arena).
    pub pending_bytes: usize,
    /// Bytes of live allocations, as rounded (to 256 bytes or a size class; large ones to
    /// whole pages of 64 KiB).
    pub live_bytes: usize,
    /// How many allocations are live.
    pub live_allocations: usize,
    /// How many stream arenas there are.
    pub stream_arenas: usize,
    /// How many superblocks the stream arenas hold.
    pub superblocks: usize,
    /// Events recorded so that memory freed on one stream could be used on another.
    pub events_recorded: u64,
    /// Stream waits inserted for the same purpose (events already complete need none).
    pub stream_waits: u64,
}

impl<R: MemoryResource> Inner<R> {
    pub(super) fn statistics(&self) -> ArenaStatistics {
        // The old spelling is filled in until it goes.
        #[allow(deprecated)]
        let mut stats = ArenaStatistics {
            reserved_bytes: self.extents.held(),
            arena_size: self.extents.held(),
            free_bytes: 0,
            global_free_bytes: 0,
            largest_free_block: 0,
            pending_bytes: 0,
            live_bytes: 0,
            live_allocations: 0,
            stream_arenas: 0,
            superblocks: 0,
            events_recorded: self.counters.events_recorded(),
            stream_waits: self.counters.stream_waits(),
        };
        self.for_each_arena(|_, core| {
            stats.free_bytes += core.free_bytes() as usize;
            stats.largest_free_block = stats.largest_free_block.max(core.largest_free() as usize);
            stats.pending_bytes += core.pending_bytes() as usize;
            stats.live_bytes += core.live_bytes() as usize;
            stats.live_allocations += core.live_count();
            stats.stream_arenas += 1;
            stats.superblocks += core.superblock_count();
        });
        let global = self.global.lock();
        let page = PAGE_SIZE;
        stats.global_free_bytes = global.free_pages() as usize * page;
        stats.free_bytes += stats.global_free_bytes;
        stats.largest_free_block = stats
            .largest_free_block
            .max(global.largest_free_pages() as usize * page);
        stats.live_bytes += global.large_pages() as usize * page;
        stats.live_allocations += global.large_count();
        stats
    }

    /// The out-of-memory error for a request of `bytes` (`rounded` as a block), after the
    /// configured dump, with the arena's [`OutOfMemoryDetails`](crate::OutOfMemoryDetails): the largest free block (any
    /// arena's, since a small request may borrow one), free bytes (pending included), the bytes
    /// held from the upstream, and the pending frees by freeing stream.
    pub(super) fn out_of_memory(&self, bytes: usize, rounded: usize, stream: &Stream) -> Error {
        let stats = self.statistics();
        if let Some(dump) = &self.dump {
            self.write_dump(dump, bytes, rounded, stream);
        }
        let mut pending: Vec<(Option<StreamId>, usize)> = Vec::new();
        self.for_each_arena(|_, core| {
            for (Fence(order), n) in core.pending_by_fence() {
                let id = Some(order.stream_id());
                match pending.iter_mut().find(|(s, _)| *s == id) {
                    Some((_, total)) => *total += n as usize,
                    None => pending.push((id, n as usize)),
                }
            }
        });
        pending.sort_unstable();
        let figures = Fragmentation {
            reserved_bytes: stats.reserved_bytes,
            live_bytes: stats.live_bytes,
            free_now_bytes: stats.free_bytes,
            pending_bytes: pending,
            largest_free_block: stats.largest_free_block,
            ..Fragmentation::default()
        };
        let details = figures.out_of_memory_details(stream.id());
        Error::out_of_memory_with(bytes, self.device.id(), details)
            .never_fitting(Some(self.capacity))
    }

    fn write_dump(&self, dump: &ArenaDump, bytes: usize, rounded: usize, stream: &Stream) {
        let text = self.dump_text(bytes, rounded, stream);
        match dump {
            ArenaDump::Tracing => {
                tracing::warn!(target: "streamalloc::arena", requested = bytes, dump = %text, "arena out of memory");
            }
            ArenaDump::File(path) => {
                let written = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .and_then(|mut f| f.write_all(text.as_bytes()));
                if let Err(e) = written {
                    tracing::warn!(path = %path.display(), error = %e, "cannot write the arena dump");
                }
            }
        }
    }

    /// RMM's `dump_memory_log`, with the stream arenas too.
    fn dump_text(&self, bytes: usize, rounded: usize, stream: &Stream) -> String {
        const LIMIT: usize = 100;
        let stats = self.statistics();
        let mut out = String::new();
        let fragmentation = if stats.free_bytes == 0 {
            0.0
        } else {
            (1.0 - stats.largest_free_block as f64 / stats.free_bytes as f64) * 100.0
        };
        let _ = writeln!(
            out,
            "arena out of memory: {bytes} bytes ({rounded} as a block) requested on {}",
            stream.id()
        );
        let _ = writeln!(
            out,
            "  arena size: {} bytes in {} extents; free {} (global {}), pending {}, live {} in {} allocations",
            stats.reserved_bytes,
            self.extents.list().len(),
            stats.free_bytes,
            stats.global_free_bytes,
            stats.pending_bytes,
            stats.live_bytes,
            stats.live_allocations
        );
        let _ = writeln!(
            out,
            "  largest free block: {} bytes; fragmentation: {fragmentation:.2}%",
            stats.largest_free_block
        );
        {
            let global = self.global.lock();
            let ranges = global.free_ranges();
            let _ = writeln!(
                out,
                "  global arena: {} free ranges, {} large blocks ({} bytes), {} bytes lent as superblocks",
                ranges.len(),
                global.large_count(),
                global.large_pages() as usize * PAGE_SIZE,
                global.lent_pages() as usize * PAGE_SIZE
            );
            for (i, (start, pages, fences)) in ranges.iter().take(LIMIT).enumerate() {
                let _ = writeln!(
                    out,
                    "    free range {i}: {:#x}, {} bytes, freed on {} streams",
                    self.page_addr(*start),
                    *pages as usize * PAGE_SIZE,
                    fences.len()
                );
            }
            if ranges.len() > LIMIT {
                let _ = writeln!(out, "    ... {} more", ranges.len() - LIMIT);
            }
        }
        let _ = writeln!(out, "  stream arenas: {}", stats.stream_arenas);
        let mut listed = 0;
        self.for_each_arena(|key, core| {
            listed += 1;
            if listed > LIMIT {
                return;
            }
            let thread = key.thread.map(|t| format!(" {t:?}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "    {}{thread}: {} superblocks ({} bytes), free {} in {} blocks (largest {}), live {} in {} blocks, pending {}",
                key.stream,
                core.superblock_count(),
                core.superblock_bytes(),
                core.free_bytes(),
                core.free_block_count(),
                core.largest_free(),
                core.live_bytes(),
                core.live_count(),
                core.pending_bytes()
            );
        });
        if listed > LIMIT {
            let _ = writeln!(out, "    ... {} more", listed - LIMIT);
        }
        out
    }
}
