//! A picture of a resource's memory: its segments (what it holds from upstream) and the blocks
//! in them (live, free, pending), with the fragmentation figures read from it.
//!
//! [`MemoryResource::snapshot`](crate::MemoryResource::snapshot) takes one; the sub-allocators
//! (pool, arena, binning, fixed-size, mapped pool) answer it, every adaptor passes it through,
//! and a [`TrackingAdaptor`](crate::TrackingAdaptor) adds where each live block was allocated.
//! [`MemorySnapshot::fragmentation`] reads the figures users ask for when a request fails
//! although memory looks free; `streamalloc::report` draws a snapshot (HTML) or exports it in
//! PyTorch's memory-snapshot format.

use std::backtrace::Backtrace;
use std::sync::Arc;

use crate::device::DeviceId;
use crate::ids::StreamId;
use crate::resource::device_ptr::DevicePtr;

/// What a block of a [`Segment`] is doing at the moment of a [`MemorySnapshot`].
///
/// Stream-ordered allocators keep memory freed on a stream for that stream first: a block freed
/// on stream S serves S's next request at once, and a request on another stream only once the
/// device has passed S's work up to the free (an event). The states tell these apart, so that
/// memory that is free but not usable *now* by a given stream does not read as fragmentation
/// or as lost.
///
/// # Examples
///
/// ```
/// use streamalloc::BlockState;
///
/// assert!(BlockState::Free.is_free() && BlockState::FreeOnStream.is_free());
/// assert!(!BlockState::Live.is_free() && !BlockState::Pending.is_free());
/// assert_eq!(BlockState::FreeOnStream.to_string(), "free on its stream");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BlockState {
    /// Allocated and not yet freed.
    Live,
    /// Free, and usable now by a request on any stream.
    Free,
    /// Free on the block's [`stream`](Block::stream): usable now by a request on that stream;
    /// a request on another stream must first wait for the free's event.
    FreeOnStream,
    /// Freed stream-ordered, but not yet usable by any request: the memory comes back when the
    /// block's stream reaches the free (a driver pool's `cuMemFreeAsync`, a page waiting to be
    /// unmapped).
    Pending,
}

impl BlockState {
    /// Whether the block is free ([`Free`](BlockState::Free) or
    /// [`FreeOnStream`](BlockState::FreeOnStream)).
    pub fn is_free(self) -> bool {
        matches!(self, BlockState::Free | BlockState::FreeOnStream)
    }

    /// A short lower-case name, as reports print it.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::Live => "live",
            BlockState::Free => "free",
            BlockState::FreeOnStream => "free on its stream",
            BlockState::Pending => "pending",
        }
    }
}

impl std::fmt::Display for BlockState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A block of a [`Segment`]: an allocation, or a free or pending range.
///
/// # Examples
///
/// ```
/// use streamalloc::{Block, BlockState, DevicePtr, StreamId};
///
/// let b = Block::new(DevicePtr::from_raw(0x1000), 512, BlockState::Live).on_stream(StreamId(2));
/// assert_eq!((b.end(), b.stream), (0x1200, Some(StreamId(2))));
/// assert!(b.site.is_none() && b.requested.is_none());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Block {
    /// The block's first address.
    pub address: DevicePtr,
    /// Its size in bytes, as the resource holds it (rounded up).
    pub bytes: usize,
    /// What it is doing.
    pub state: BlockState,
    /// The stream it belongs to: the stream it was allocated on (live), or freed on (free on
    /// its stream, pending); `None` when the resource does not keep it or the block is usable
    /// by every stream.
    pub stream: Option<StreamId>,
    /// For a live block, the bytes its caller asked for, when known.
    pub requested: Option<usize>,
    /// For a live block, where it was allocated, when a
    /// [`TrackingAdaptor::with_backtraces`](crate::TrackingAdaptor::with_backtraces) is over
    /// the resource.
    pub site: Option<Arc<Backtrace>>,
}

impl Block {
    /// A block with no stream, request size or site.
    pub fn new(address: DevicePtr, bytes: usize, state: BlockState) -> Self {
        Block {
            address,
            bytes,
            state,
            stream: None,
            requested: None,
            site: None,
        }
    }

    crate::builder::option_setters! {
        /// The block, on `stream`.
        fn on_stream(stream: StreamId) => stream;
        /// The block, with the bytes its caller asked for.
        fn with_requested(requested: usize) => requested;
    }

    /// The address one past the block (saturating).
    pub fn end(&self) -> u64 {
        self.address.addr().saturating_add(self.bytes as u64)
    }
}

/// A range a resource holds from its upstream (a pool's chunk, an arena's superblock, a mapped
/// pool's mapped range), with its blocks in address order.
///
/// # Examples
///
/// ```
/// use streamalloc::{Block, BlockState, DevicePtr, Segment};
///
/// let base = DevicePtr::from_raw(0x10000);
/// let mut s = Segment::new(base, 4096);
/// s.blocks.push(Block::new(base, 1024, BlockState::Live));
/// s.blocks.push(Block::new(base.offset(1024), 3072, BlockState::Free));
/// assert_eq!((s.live_bytes(), s.free_bytes()), (1024, 3072));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Segment {
    /// The segment's first address.
    pub address: DevicePtr,
    /// Its size in bytes.
    pub bytes: usize,
    /// The stream the resource got it for, when it keeps one.
    pub stream: Option<StreamId>,
    /// Whether address-adjacent free blocks of this segment can be joined to serve one request
    /// (a pool's or an arena's can; a fixed-size resource's blocks cannot).
    pub coalesces: bool,
    /// Whether the segment is a run of pages mapped into a reserved address range, which grows
    /// and shrinks page by page (a mapped pool's; PyTorch's expandable segments) rather than
    /// coming and going whole.
    pub expandable: bool,
    /// Where a resource shows one segment cut into parts, the address of the segment this one
    /// is a part of: a binning resource's bins are blocks of its upstream's segments, shown as
    /// segments of their own with the upstream's pieces around them. The parts tile the
    /// segment and keep its `expandable`; [`MemorySnapshot::whole_segments`] joins them again.
    pub cut_from: Option<DevicePtr>,
    /// The blocks, in address order. They need not cover the whole segment: a range no block
    /// covers is not described (counted neither live nor free).
    pub blocks: Vec<Block>,
}

impl Segment {
    /// A segment with no blocks, whose free blocks coalesce.
    pub fn new(address: DevicePtr, bytes: usize) -> Self {
        Segment {
            address,
            bytes,
            stream: None,
            coalesces: true,
            expandable: false,
            cut_from: None,
            blocks: Vec::new(),
        }
    }

    /// Bytes in live blocks.
    pub fn live_bytes(&self) -> usize {
        self.bytes_in(|s| s == BlockState::Live)
    }

    /// Bytes in free blocks ([`BlockState::is_free`]).
    pub fn free_bytes(&self) -> usize {
        self.bytes_in(BlockState::is_free)
    }

    fn bytes_in(&self, f: impl Fn(BlockState) -> bool) -> usize {
        self.blocks
            .iter()
            .filter(|b| f(b.state))
            .fold(0usize, |sum, b| sum.saturating_add(b.bytes))
    }
}

/// A resource's memory at one moment: its segments and their blocks
/// ([`MemoryResource::snapshot`](crate::MemoryResource::snapshot)).
///
/// # Examples
///
/// ```
/// use streamalloc::{Block, BlockState, Device, DevicePtr, MemorySnapshot, Segment, StreamId};
///
/// let mut snap = MemorySnapshot::new(Device::host().id(), "example");
/// let base = DevicePtr::from_raw(0x10000);
/// let mut seg = Segment::new(base, 8192);
/// seg.blocks.push(Block::new(base, 4096, BlockState::Live).on_stream(StreamId(1)));
/// seg.blocks.push(Block::new(base.offset(4096), 4096, BlockState::Free));
/// snap.segments.push(seg);
/// assert_eq!(snap.reserved_bytes(), 8192);
/// assert_eq!(snap.fragmentation().largest_free_block, 4096);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MemorySnapshot {
    /// The device the memory is on.
    pub device: DeviceId,
    /// What took it: the resource's name (`"pool"`, `"arena"`, …).
    pub resource: String,
    /// The segments, in address order.
    pub segments: Vec<Segment>,
    /// The most the resource may hold (a pool's maximum), when it has one.
    pub capacity: Option<usize>,
}

impl MemorySnapshot {
    /// An empty snapshot of `resource` on `device`.
    pub fn new(device: DeviceId, resource: impl Into<String>) -> Self {
        MemorySnapshot {
            device,
            resource: resource.into(),
            segments: Vec::new(),
            capacity: None,
        }
    }

    /// Bytes held from upstream: the segments' sizes.
    pub fn reserved_bytes(&self) -> usize {
        self.segments
            .iter()
            .fold(0usize, |sum, s| sum.saturating_add(s.bytes))
    }

    /// Bytes in live blocks.
    pub fn live_bytes(&self) -> usize {
        self.segments
            .iter()
            .fold(0usize, |sum, s| sum.saturating_add(s.live_bytes()))
    }

    /// Every block, with its segment, in address order.
    pub fn blocks(&self) -> impl Iterator<Item = (&Segment, &Block)> {
        self.segments
            .iter()
            .flat_map(|s| s.blocks.iter().map(move |b| (s, b)))
    }

    /// Sorts segments and their blocks by address (resources that gather them out of order
    /// call it before returning).
    pub fn sort(&mut self) {
        self.segments.sort_unstable_by_key(|s| s.address);
        for s in &mut self.segments {
            s.blocks.sort_unstable_by_key(|b| b.address);
        }
    }

    /// The segments as their memory came from the upstream or the device, in address order:
    /// the parts cut from one segment ([`Segment::cut_from`]) joined into it again, with its
    /// address and every part's blocks, no stream of its own (its parts may be different
    /// streams'; one that came and went with them would make the segment seem to change), and
    /// free neighbours that join (what joins inside a part, a bin's slots, is the part's to
    /// say). So formats whose segments come and go whole (PyTorch's) see none of the cutting.
    ///
    /// ```
    /// use streamalloc::{Block, BlockState, Device, DevicePtr, MemorySnapshot, Segment};
    ///
    /// let base = DevicePtr::from_raw(0x10000);
    /// let mut snap = MemorySnapshot::new(Device::host().id(), "binning");
    /// for (offset, bytes, state) in [(0, 1024, BlockState::Free), (1024, 3072, BlockState::Live)] {
    ///     let mut part = Segment::new(base.offset(offset), bytes);
    ///     part.cut_from = Some(base);
    ///     part.blocks.push(Block::new(base.offset(offset), bytes, state));
    ///     snap.segments.push(part);
    /// }
    /// let whole = snap.whole_segments();
    /// assert_eq!((whole.len(), whole[0].address, whole[0].bytes), (1, base, 4096));
    /// assert_eq!(whole[0].cut_from, None);
    /// assert_eq!((whole[0].live_bytes(), whole[0].free_bytes()), (3072, 1024));
    /// ```
    pub fn whole_segments(&self) -> Vec<Segment> {
        self.joined()
            .into_iter()
            .map(|(mut whole, parts)| {
                whole.blocks = parts
                    .iter()
                    .flat_map(|p| p.blocks.iter().cloned())
                    .collect();
                whole
            })
            .collect()
    }

    /// [`whole_segments`](Self::whole_segments) without their blocks: what a comparison of
    /// two snapshots' segments reads, at no copy of the blocks.
    pub(crate) fn whole_extents(&self) -> impl Iterator<Item = Segment> + '_ {
        self.joined().into_iter().map(|(whole, _)| whole)
    }

    /// Each whole segment, without blocks, with the parts it joins (itself where uncut), in
    /// address order.
    fn joined(&self) -> Vec<(Segment, Vec<&Segment>)> {
        let mut parts: Vec<&Segment> = self.segments.iter().collect();
        parts.sort_by_key(|s| (s.cut_from.unwrap_or(s.address), s.address));
        let mut joined: Vec<(Segment, Vec<&Segment>)> = Vec::with_capacity(parts.len());
        for part in parts {
            let from = part.cut_from;
            let end = part.address.addr().saturating_add(part.bytes as u64);
            match joined.last_mut() {
                Some((whole, of)) if from.is_some() && of[0].cut_from == from => {
                    let bytes = end.saturating_sub(whole.address.addr()) as usize;
                    whole.bytes = whole.bytes.max(bytes);
                    of.push(part);
                }
                _ => {
                    let mut whole = Segment::new(from.unwrap_or(part.address), part.bytes);
                    whole.expandable = part.expandable;
                    match from {
                        // Cut: from its start to the part's end.
                        Some(from) => whole.bytes = end.saturating_sub(from.addr()) as usize,
                        // Not cut: the segment itself (its size exact, even at the top of
                        // the address space, where its end does not fit).
                        None => {
                            whole.stream = part.stream;
                            whole.coalesces = part.coalesces;
                        }
                    }
                    joined.push((whole, vec![part]));
                }
            }
        }
        joined
    }
}
