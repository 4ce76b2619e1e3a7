//! Fragmentation figures read from a [`MemorySnapshot`].

use std::collections::BTreeMap;
use std::fmt;

use super::snapshot::{Block, BlockState, MemorySnapshot};
use crate::error::OutOfMemoryDetails;
use crate::ids::StreamId;

/// Free extents of sizes in `[min_bytes, 2 × min_bytes)`: one bucket of
/// [`Fragmentation::free_extents`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeExtentBucket {
    /// The bucket's smallest size, a power of two.
    pub min_bytes: usize,
    /// Extents in the bucket.
    pub count: usize,
    /// Their bytes.
    pub bytes: usize,
}

/// What the free memory of a resource can serve, from a [`MemorySnapshot`]
/// ([`MemorySnapshot::fragmentation`], or
/// [`MemoryResource::fragmentation`](crate::MemoryResource::fragmentation)).
///
/// A *free extent* is a run of address-adjacent free blocks in one segment whose blocks
/// coalesce (one free block where they do not): what one request can get. Figures that say
/// *now* count only memory a request gets without waiting for another stream's event; the
/// others include memory freed on another stream, usable once the device passes the free.
/// A wholly free pool whose blocks were freed on several streams thus reads as one extent of
/// its whole size, usable after events: not as fragmentation.
///
/// # Examples
///
/// ```
/// use streamalloc::{Block, BlockState, Device, DevicePtr, MemorySnapshot, Segment, StreamId};
///
/// // 12 KiB, one segment: 4 KiB freed on stream 1, 4 KiB free for all, 4 KiB freed on stream 2.
/// let base = DevicePtr::from_raw(0x10000);
/// let mut seg = Segment::new(base, 3 * 4096);
/// seg.blocks.push(Block::new(base, 4096, BlockState::FreeOnStream).on_stream(StreamId(1)));
/// seg.blocks.push(Block::new(base.offset(4096), 4096, BlockState::Free));
/// seg.blocks.push(Block::new(base.offset(8192), 4096, BlockState::FreeOnStream).on_stream(StreamId(2)));
/// let mut snap = MemorySnapshot::new(Device::host().id(), "example");
/// snap.segments.push(seg);
///
/// let f = snap.fragmentation();
/// assert_eq!(f.largest_free_block, 3 * 4096); // after the two frees' events
/// assert_eq!(f.largest_free_now, 4096);        // any stream, without waiting
/// assert_eq!(f.largest_free_for(StreamId(1)), 2 * 4096);
/// assert_eq!(f.free_bytes(), 3 * 4096);
/// assert_eq!(f.free_on_stream, [(StreamId(1), 4096), (StreamId(2), 4096)]);
/// assert_eq!(f.fragmentation_ratio(), 0.0);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Fragmentation {
    /// Bytes held from upstream (the segments).
    pub reserved_bytes: usize,
    /// Bytes in live blocks.
    pub live_bytes: usize,
    /// Free bytes any stream can use now ([`BlockState::Free`]).
    pub free_now_bytes: usize,
    /// Free bytes only their stream can use now ([`BlockState::FreeOnStream`]), per stream in
    /// stream order. A block with no stream counts as free now.
    pub free_on_stream: Vec<(StreamId, usize)>,
    /// Bytes in stream-ordered frees no stream has reached yet ([`BlockState::Pending`]), per
    /// stream (`None`: not known) in stream order.
    pub pending_bytes: Vec<(Option<StreamId>, usize)>,
    /// Live bytes per stream (`None`: not known) in stream order.
    pub live_by_stream: Vec<(Option<StreamId>, usize)>,
    /// The largest free extent, free on any stream: the largest request the free memory can
    /// serve, at most after waiting for other streams' frees.
    pub largest_free_block: usize,
    /// The largest extent of memory free for every stream: what a request on any stream gets
    /// now.
    pub largest_free_now: usize,
    /// For each stream with memory free on it: the largest extent of its own free memory and
    /// memory free for every stream, what a request on it gets now; in stream order.
    pub largest_free_by_stream: Vec<(StreamId, usize)>,
    /// Free extents (as for `largest_free_block`) by size, powers of two, smallest first;
    /// empty buckets left out.
    pub free_extents: Vec<FreeExtentBucket>,
}

impl MemorySnapshot {
    /// The fragmentation figures of this snapshot (see [`Fragmentation`]).
    pub fn fragmentation(&self) -> Fragmentation {
        Fragmentation::of(self)
    }
}

impl Fragmentation {
    /// Reads the figures of `snapshot`.
    pub fn of(snapshot: &MemorySnapshot) -> Self {
        let mut f = Fragmentation {
            reserved_bytes: snapshot.reserved_bytes(),
            ..Fragmentation::default()
        };
        let mut free_on: BTreeMap<StreamId, usize> = BTreeMap::new();
        let mut pending: BTreeMap<Option<StreamId>, usize> = BTreeMap::new();
        let mut live: BTreeMap<Option<StreamId>, usize> = BTreeMap::new();
        let mut histogram: BTreeMap<u32, FreeExtentBucket> = BTreeMap::new();
        for (_, b) in snapshot.blocks() {
            let add = |m: &mut usize| *m = m.saturating_add(b.bytes);
            match (b.state, b.stream) {
                (BlockState::Live, s) => add(live.entry(s).or_default()),
                (BlockState::Free, _) | (BlockState::FreeOnStream, None) => {
                    add(&mut f.free_now_bytes)
                }
                (BlockState::FreeOnStream, Some(s)) => add(free_on.entry(s).or_default()),
                (BlockState::Pending, s) => add(pending.entry(s).or_default()),
            }
        }
        f.live_bytes = live.values().fold(0usize, |a, &b| a.saturating_add(b));
        for extent in extents(snapshot, |_| true) {
            f.largest_free_block = f.largest_free_block.max(extent);
            let class = usize::BITS - 1 - extent.leading_zeros();
            let bucket = histogram.entry(class).or_insert(FreeExtentBucket {
                min_bytes: 1 << class,
                count: 0,
                bytes: 0,
            });
            bucket.count += 1;
            bucket.bytes = bucket.bytes.saturating_add(extent);
        }
        f.largest_free_now = extents(snapshot, is_free_now).max().unwrap_or(0);
        f.largest_free_by_stream = free_on
            .keys()
            .map(|&s| {
                let usable = |b: &Block| is_free_now(b) || b.stream == Some(s);
                (s, extents(snapshot, usable).max().unwrap_or(0))
            })
            .collect();
        f.free_on_stream = free_on.into_iter().collect();
        f.pending_bytes = pending.into_iter().collect();
        f.live_by_stream = live.into_iter().collect();
        f.free_extents = histogram.into_values().collect();
        f
    }

    /// All free bytes: free now and free on a stream.
    pub fn free_bytes(&self) -> usize {
        self.free_on_stream
            .iter()
            .fold(self.free_now_bytes, |a, &(_, b)| a.saturating_add(b))
    }

    /// What a request on `stream` gets now: the largest extent of memory free for every stream
    /// or on `stream`.
    pub fn largest_free_for(&self, stream: StreamId) -> usize {
        self.largest_free_by_stream
            .iter()
            .find(|&&(s, _)| s == stream)
            .map_or(self.largest_free_now, |&(_, b)| b)
    }

    /// `1 − largest_free_block / free bytes`: 0 when all free memory is one extent (or there
    /// is none), towards 1 as it splits into many small ones.
    pub fn fragmentation_ratio(&self) -> f64 {
        let free = self.free_bytes();
        if free == 0 {
            0.0
        } else {
            1.0 - self.largest_free_block as f64 / free as f64
        }
    }
}

impl Fragmentation {
    /// What a request on `stream` that found no memory is told
    /// ([`Error::OutOfMemory`](crate::Error::OutOfMemory)'s details), read from these figures
    /// alone, so that every resource words its out-of-memory errors alike: the largest free
    /// extent (what the resource could serve after waiting for other streams' frees), the
    /// free bytes (pending ones included), the reserved bytes, and, per other stream, the
    /// bytes it freed that `stream` cannot use yet (free on that stream, or pending).
    ///
    /// ```
    /// use streamalloc::{Fragmentation, StreamId};
    ///
    /// let mut f = Fragmentation::default();
    /// f.reserved_bytes = 1 << 20;
    /// f.free_now_bytes = 4096;
    /// f.free_on_stream = vec![(StreamId(1), 8192), (StreamId(2), 16384)];
    /// f.pending_bytes = vec![(Some(StreamId(1)), 512)];
    /// f.largest_free_block = 16384;
    /// let d = f.out_of_memory_details(StreamId(1));
    /// assert_eq!(d.free_bytes, Some(4096 + 8192 + 16384 + 512));
    /// // Stream 1's free memory is its own to use; its pending free is not, yet.
    /// assert_eq!(d.pending_frees, [(StreamId(1), 512), (StreamId(2), 16384)]);
    /// assert_eq!((d.largest_free_block, d.reserved_bytes), (Some(16384), Some(1 << 20)));
    /// ```
    pub fn out_of_memory_details(&self, stream: StreamId) -> OutOfMemoryDetails {
        let mut pending: BTreeMap<StreamId, usize> = BTreeMap::new();
        let mut pending_total = 0usize;
        for &(s, bytes) in &self.pending_bytes {
            pending_total = pending_total.saturating_add(bytes);
            if let Some(s) = s {
                let b = pending.entry(s).or_default();
                *b = b.saturating_add(bytes);
            }
        }
        for &(s, bytes) in self.free_on_stream.iter().filter(|&&(s, _)| s != stream) {
            let b = pending.entry(s).or_default();
            *b = b.saturating_add(bytes);
        }
        OutOfMemoryDetails {
            largest_free_block: Some(self.largest_free_block),
            free_bytes: Some(self.free_bytes().saturating_add(pending_total)),
            reserved_bytes: Some(self.reserved_bytes),
            pending_frees: pending.into_iter().collect(),
        }
    }
}

fn is_free_now(b: &Block) -> bool {
    b.state == BlockState::Free || (b.state == BlockState::FreeOnStream && b.stream.is_none())
}

/// The sizes of the free extents made of free blocks that `usable` accepts.
fn extents<'a>(
    snapshot: &'a MemorySnapshot,
    usable: impl Fn(&Block) -> bool + 'a,
) -> impl Iterator<Item = usize> + 'a {
    snapshot.segments.iter().flat_map(move |segment| {
        let mut runs = Vec::new();
        let mut run: Option<(u64, usize)> = None; // (end, bytes)
        for b in &segment.blocks {
            if !(b.state.is_free() && usable(b)) || b.bytes == 0 {
                runs.extend(run.take().map(|(_, bytes)| bytes));
                continue;
            }
            run = match run {
                Some((end, bytes)) if segment.coalesces && end == b.address.addr() => {
                    Some((b.end(), bytes.saturating_add(b.bytes)))
                }
                other => {
                    runs.extend(other.map(|(_, bytes)| bytes));
                    Some((b.end(), b.bytes))
                }
            };
        }
        runs.extend(run.map(|(_, bytes)| bytes));
        runs
    })
}

impl fmt::Display for Fragmentation {
    /// One line: reserved, live, free (now, on streams), pending, largest extents.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pending = self
            .pending_bytes
            .iter()
            .fold(0usize, |a, &(_, b)| a.saturating_add(b));
        write!(
            f,
            "reserved {} B, live {} B, free {} B ({} B for every stream, {} B on {} streams), \
             pending {} B; largest free extent {} B ({} B now)",
            self.reserved_bytes,
            self.live_bytes,
            self.free_bytes(),
            self.free_now_bytes,
            self.free_bytes() - self.free_now_bytes,
            self.free_on_stream.len(),
            pending,
            self.largest_free_block,
            self.largest_free_now
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::resource::device_ptr::DevicePtr;
    use crate::resource::inspect::Segment;

    fn block(at: u64, bytes: usize, state: BlockState, stream: Option<u64>) -> Block {
        let mut b = Block::new(DevicePtr::from_raw(at), bytes, state);
        b.stream = stream.map(StreamId);
        b
    }

    fn snapshot(segments: Vec<(u64, usize, bool, Vec<Block>)>) -> MemorySnapshot {
        let mut s = MemorySnapshot::new(Device::host().id(), "test");
        for (at, bytes, coalesces, blocks) in segments {
            let mut seg = Segment::new(DevicePtr::from_raw(at), bytes);
            seg.coalesces = coalesces;
            seg.blocks = blocks;
            s.segments.push(seg);
        }
        s
    }

    #[test]
    fn a_wholly_free_pool_split_over_streams_is_one_extent() {
        // 64 MiB freed as 8 blocks on 4 streams: one extent, not fragmentation.
        let mib = 1 << 20;
        let blocks = (0..8)
            .map(|i| {
                let at = 0x1000_0000 + (i * 8 * mib) as u64;
                block(at, 8 * mib, BlockState::FreeOnStream, Some(i as u64 % 4))
            })
            .collect();
        let f = snapshot(vec![(0x1000_0000, 64 * mib, true, blocks)]).fragmentation();
        assert_eq!(f.largest_free_block, 64 * mib);
        assert_eq!(f.largest_free_now, 0);
        assert_eq!(f.largest_free_for(StreamId(0)), 8 * mib);
        assert_eq!(f.free_bytes(), 64 * mib);
        assert_eq!(f.free_on_stream.len(), 4);
        assert_eq!(f.fragmentation_ratio(), 0.0);
        assert_eq!(f.free_extents.len(), 1);
        assert_eq!(
            (f.free_extents[0].min_bytes, f.free_extents[0].count),
            (64 * mib, 1)
        );
    }

    #[test]
    fn extents_break_at_live_blocks_gaps_segments_and_fixed_blocks() {
        let f = snapshot(vec![
            (
                0x1000,
                0x1000,
                true,
                vec![
                    block(0x1000, 0x100, BlockState::Free, None),
                    block(0x1100, 0x100, BlockState::Live, Some(1)),
                    block(0x1200, 0x200, BlockState::Free, None),
                    // a gap at 0x1400..0x1500 that no block describes
                    block(0x1500, 0x300, BlockState::Free, None),
                    block(0x1800, 0x100, BlockState::Pending, Some(2)),
                ],
            ),
            (
                0x2000,
                0x400,
                false,
                vec![
                    block(0x2000, 0x200, BlockState::Free, None),
                    block(0x2200, 0x200, BlockState::Free, None),
                ],
            ),
        ])
        .fragmentation();
        assert_eq!(f.largest_free_block, 0x300);
        assert_eq!(f.largest_free_now, 0x300);
        assert_eq!(f.free_now_bytes, 0x100 + 0x200 + 0x300 + 0x400);
        assert_eq!(f.live_by_stream, [(Some(StreamId(1)), 0x100)]);
        assert_eq!(f.pending_bytes, [(Some(StreamId(2)), 0x100)]);
        let counts: Vec<_> = f
            .free_extents
            .iter()
            .map(|b| (b.min_bytes, b.count))
            .collect();
        assert_eq!(counts, [(0x100, 1), (0x200, 4)]); // 0x300 is in [0x200, 0x400)
        assert!((f.fragmentation_ratio() - 0.7).abs() < 1e-9, "{f}"); // 1 - 0x300 / 0xa00
    }

    #[test]
    fn empty_and_zero_sized_blocks_read_as_nothing_free() {
        let f = snapshot(vec![(
            0x1000,
            0,
            true,
            vec![block(0x1000, 0, BlockState::Free, None)],
        )])
        .fragmentation();
        assert_eq!((f.largest_free_block, f.free_bytes()), (0, 0));
        assert!(f.free_extents.is_empty());
        assert_eq!(Fragmentation::default().fragmentation_ratio(), 0.0);
    }
}
