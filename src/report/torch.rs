//! PyTorch's memory-snapshot format (a pickle with `segments` and `device_traces`), which
//! pytorch.org/memory_viz opens.
//!
//! [`write_torch_snapshot`] writes what `torch.cuda.memory._dump_snapshot()` writes, from a
//! [`MemorySnapshot`] of any resource and, optionally, a [`Timeline`] of its allocations and
//! frees. Drop the file on pytorch.org/memory_viz (it is read in the browser, not uploaded),
//! or load it in Python with `pickle.load` and PyTorch's `torch.cuda._memory_viz` tools.

mod frames;
mod pickle;
mod trace;

use std::collections::{HashMap, HashSet};
use std::io::{self, BufWriter, Write};

use crate::ids::{BackendKind, DeviceId, StreamId};
use crate::resource::{Block, BlockState, MemorySnapshot, Segment, Timeline, TraceAction};
use frames::{frames, write_frame, Frame};
use pickle::Pickler;

/// The highest device ordinal [`write_torch_snapshot`] accepts: `device_traces` holds one
/// list per ordinal up to the snapshot's, so an absurd ordinal would make an absurd file.
pub const MAX_TORCH_DEVICE_ORDINAL: u32 = 65_535;

/// PyTorch's threshold between its small and large pools: segments from 1 MiB up are
/// `"large"`.
const LARGE_SEGMENT: usize = 1 << 20;

/// Writes `snapshot` (and `trace`, when given) in PyTorch's memory-snapshot format: a pickle
/// of the dict `torch.cuda.memory._snapshot()` returns, which pytorch.org/memory_viz opens.
///
/// # What goes where
/// - `segments`: one dict per [`Segment`], in address order, with PyTorch's keys: `device`
///   (see below), `address`, `total_size`, `allocated_size` (live bytes), `active_size` (live
///   and pending bytes), `requested_size` (the bytes live blocks' callers asked for),
///   `stream`, `segment_type` (`"large"` from 1 MiB), `segment_pool_id` (`(0, 0)`),
///   `is_expandable` ([`Segment::expandable`]: a mapped pool's runs of pages), `frames`
///   (`[]`) and `blocks`.
/// - A segment's `stream` is [`Segment::stream`]; where the resource keeps none, the stream of
///   its first live block in address order, else 0. PyTorch's segments each belong to one
///   stream; ours are shared, and a [`TimelineAdaptor`](crate::TimelineAdaptor) gives each
///   the stream of the request that made the resource take it (its first allocation's).
/// - `blocks`: they cover the segment from its start to its end without a gap, as the
///   viewer needs (it computes each block's address by adding up the sizes before it): a
///   range no [`Block`] describes becomes an `"inactive"` block, a block reaching out of
///   its segment is clipped, and neighbouring free blocks of a segment whose free blocks
///   coalesce ([`Segment::coalesces`]) are one block, as PyTorch's allocator merges them.
///   Each has `address`, `size`, `requested_size` (the [`Block::requested`] bytes, else the
///   size; 0 for a free block), `state`, `frames` and our `stream` (`None` when the block
///   has none, or is free blocks of several streams merged). States:
///   [`Live`](BlockState::Live) → `"active_allocated"`; [`Pending`](BlockState::Pending) →
///   `"active_pending_free"` (PyTorch's state for a block freed by its user that no request
///   may take yet because a stream still uses it: the viewer draws it red); [`Free`](BlockState::Free)
///   and [`FreeOnStream`](BlockState::FreeOnStream) → `"inactive"` (a PyTorch free block is
///   free on its segment's stream, usable at once by that stream: a block free on its stream
///   is one; `active_pending_free` would tell the viewer no stream may use it).
/// - `frames`: a live block's allocation site ([`Block::site`], set by a
///   [`TrackingAdaptor::with_backtraces`](crate::TrackingAdaptor::with_backtraces)) as
///   `{filename, line, name}` dicts, innermost first, read from the backtrace's text (best
///   effort: a frame without a location has filename `"??"` and line 0; the tracking
///   adaptor's own frames are left out). Empty without a site.
/// - `device`: the CUDA device's ordinal; 0 for a host-backend device, the only device of
///   its file (a host device's ordinal tells emulated devices apart, it indexes nothing).
/// - `device_traces`: a list per device index up to the snapshot's (the viewer offers a
///   device by its index in this list); the lower ones are empty. The snapshot's device gets
///   `trace`'s kept events, oldest first, each `{action, addr, size, stream, time_us,
///   frames}`: [`Alloc`](crate::TraceAction::Alloc) → `alloc` (the bytes asked for; its frames are
///   its block's site while the block is live in the snapshot); [`Free`](crate::TraceAction::Free) →
///   `free_requested` then `free_completed` (the viewer needs the pair, and shows it as one
///   `free`), `free_requested` alone for the last free of a block still pending in the
///   snapshot; `segment_alloc`, `segment_free`, `segment_map`, `segment_unmap` (recorded by
///   [`TimelineAdaptor::record_segments`](crate::TimelineAdaptor::record_segments), which a
///   recording replay turns on); and [`Oom`](crate::TraceAction::Oom) → `oom` with `device_free`
///   (0: not known here) instead of `addr`. `time_us` is microseconds since the timeline
///   began, never decreasing ([`Timeline::record_at`]).
/// - `allocator_settings`: PyTorch's keys, with the values of an allocator configured by
///   nothing (no `PYTORCH_CUDA_ALLOC_CONF`, no split limit), `expandable_segments` true where
///   a segment is expandable.
/// - `external_annotations`: `[]`.
/// - `streamalloc`: our own key, which PyTorch's tools ignore: the `resource`'s name, the
///   `device` (`"host:0"`, `"cuda:1"`), `capacity` (or `None`) and `dropped_events`.
///
/// Integers are exact at any width (64-bit addresses and `usize::MAX` sizes come back from
/// Python's `pickle` unchanged); the viewer reads them as JavaScript numbers, exact below
/// 2^53, which covers every real device address.
///
/// Streams are our [`StreamId`] numbers; the viewer renames them 1, 2, …
/// in the order it meets them (0 stays the default stream).
///
/// A trace should come from the same resource as the snapshot, up to the moment the
/// snapshot was taken: the viewer's "Allocator State History" replays the trace backwards
/// from the snapshot's blocks and segments and expects each block to lie in a segment alive
/// at that event.
///
/// # Errors
/// The writer's errors; `InvalidInput` for a device ordinal above
/// [`MAX_TORCH_DEVICE_ORDINAL`] or a name longer than 4 GiB.
///
/// # Examples
///
/// ```
/// use streamalloc::report::torch::write_torch_snapshot;
/// use streamalloc::{Block, BlockState, Device, DevicePtr, MemorySnapshot, Segment, StreamId};
/// use streamalloc::{Timeline, TraceAction};
///
/// let mut snap = MemorySnapshot::new(Device::host().id(), "pool");
/// let base = DevicePtr::from_raw(0x7f00_0000_0000);
/// let mut seg = Segment::new(base, 2 << 20);
/// seg.blocks.push(Block::new(base, 4096, BlockState::Live).on_stream(StreamId(1)));
/// snap.segments.push(seg); // the rest of the segment is written as one inactive block
///
/// let mut trace = Timeline::new();
/// trace.record(TraceAction::Alloc, base, 4096, StreamId(1));
///
/// let mut pickle = Vec::new(); // or a std::fs::File: drop it on pytorch.org/memory_viz
/// write_torch_snapshot(&mut pickle, &snap, Some(&trace))?;
/// assert_eq!(&pickle[..2], b"\x80\x04"); // pickle protocol 4
/// assert_eq!(pickle.last(), Some(&b'.'));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn write_torch_snapshot<W: Write>(
    w: W,
    snapshot: &MemorySnapshot,
    trace: Option<&Timeline>,
) -> io::Result<()> {
    let ordinal = torch_device(snapshot.device);
    if ordinal > MAX_TORCH_DEVICE_ORDINAL {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "device {} has ordinal {ordinal}: at most {MAX_TORCH_DEVICE_ORDINAL} fits a \
                 PyTorch snapshot's device_traces",
                snapshot.device
            ),
        ));
    }
    // PyTorch's segments are whole allocations from the device: parts a resource cut one
    // into are joined again (and come in address order).
    let whole = snapshot.whole_segments();
    let segments: Vec<&Segment> = whole.iter().collect();
    let live = |b: &&Block| b.state == BlockState::Live;
    // Each live block's frames, parsed once: its block and its `alloc` entry show them.
    let sites: HashMap<u64, Vec<Frame>> = snapshot
        .blocks()
        .map(|(_, b)| b)
        .filter(live)
        .filter_map(|b| Some((b.address.addr(), frames(b.site.as_deref()?))))
        .filter(|(_, f)| !f.is_empty())
        .collect();
    let pending: HashSet<u64> = snapshot
        .blocks()
        .filter(|(_, b)| b.state == BlockState::Pending)
        .map(|(_, b)| b.address.addr())
        .collect();
    let entries = trace.map(|t| trace::entries(t, &pending, &sites));
    let streams = trace.map(SegmentStreams::of).unwrap_or_default();
    let expandable = snapshot.segments.iter().any(|s| s.expandable);
    let mut p = Pickler::new(BufWriter::new(w))?;
    p.dict(|d| {
        d.entry("segments", |p| {
            p.list(segments, |p, s| {
                let stream = streams.get(s);
                write_segment(p, s, stream, ordinal, &sites)
            })
        })?;
        d.entry("device_traces", |p| {
            p.list(0..=ordinal, |p, i| {
                let mine = entries.as_deref().filter(|_| i == ordinal);
                p.list(mine.unwrap_or_default(), trace::write_entry)
            })
        })?;
        d.entry("allocator_settings", |p| allocator_settings(p, expandable))?;
        d.entry("external_annotations", |p| {
            p.list(std::iter::empty::<()>(), |_, _| Ok(()))
        })?;
        d.entry("streamalloc", |p| {
            p.dict(|d| {
                d.entry("resource", |p| p.str(&snapshot.resource))?;
                d.entry("device", |p| p.str(&snapshot.device.to_string()))?;
                d.entry("capacity", |p| match snapshot.capacity {
                    Some(c) => p.uint(c as u64),
                    None => p.none(),
                })?;
                d.entry("dropped_events", |p| {
                    p.uint(trace.map_or(0, Timeline::dropped_events))
                })
            })
        })
    })?;
    p.finish()?.flush()
}

/// The device index PyTorch's keys take: a CUDA device's ordinal; 0 for a host device, the
/// one device of its file (host ordinals tell emulated devices apart, they index nothing).
fn torch_device(device: DeviceId) -> u32 {
    match device.backend {
        BackendKind::Cuda => device.ordinal,
        BackendKind::Host => 0,
    }
}

/// PyTorch's `allocator_settings` for an allocator nothing configured: no
/// `PYTORCH_CUDA_ALLOC_CONF`, no split limit (-1), no collection threshold, no rounding.
fn allocator_settings<W: Write>(p: &mut Pickler<W>, expandable: bool) -> io::Result<()> {
    p.dict(|d| {
        d.entry("PYTORCH_CUDA_ALLOC_CONF", |p| p.str(""))?;
        d.entry("max_split_size", |p| p.int(-1))?;
        d.entry("garbage_collection_threshold", |p| p.float(0.0))?;
        d.entry("expandable_segments", |p| p.bool(expandable))?;
        d.entry("pinned_num_register_threads", |p| p.int(1))?;
        d.entry("release_lock_on_cudamalloc", |p| p.bool(false))?;
        d.entry("pinned_use_cuda_host_register", |p| p.bool(false))?;
        d.entry("roundup_power2_divisions", |p| {
            p.dict(|d| {
                // PyTorch's keys: the powers of two from 1 to 32768, as strings.
                const KEYS: [&str; 16] = [
                    "1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024", "2048",
                    "4096", "8192", "16384", "32768",
                ];
                KEYS.iter().try_for_each(|k| d.entry(k, |p| p.int(0)))
            })
        })
    })
}

/// A block as the viewer needs it: a range of its segment, tiled without gaps.
struct Piece<'a> {
    address: u128,
    size: u128,
    /// The block it shows; `None` for a range no block describes, or free blocks merged.
    block: Option<&'a Block>,
    stream: Option<StreamId>,
}

/// `segment`'s blocks clipped to it, in address order, with the ranges no block covers as
/// free pieces, so that the pieces tile the segment; neighbouring free pieces are one where
/// the segment's free blocks coalesce.
fn tile(segment: &Segment) -> Vec<Piece<'_>> {
    let start = u128::from(segment.address.addr());
    let end = start + segment.bytes as u128;
    let mut blocks: Vec<&Block> = segment.blocks.iter().collect();
    blocks.sort_by_key(|b| b.address);
    let mut pieces: Vec<Piece<'_>> = Vec::with_capacity(blocks.len() + 1);
    let mut cursor = start;
    let gap = |address, size| Piece {
        address,
        size,
        block: None,
        stream: None,
    };
    for b in blocks {
        let b_start = u128::from(b.address.addr()).max(cursor);
        let b_end = (u128::from(b.address.addr()) + b.bytes as u128).min(end);
        if b_end <= b_start {
            continue; // outside the segment, or under a block before it
        }
        if b_start > cursor {
            pieces.push(gap(cursor, b_start - cursor));
        }
        pieces.push(Piece {
            address: b_start,
            size: b_end - b_start,
            block: Some(b),
            stream: b.stream,
        });
        cursor = b_end;
    }
    if cursor < end {
        pieces.push(gap(cursor, end - cursor));
    }
    if !segment.coalesces {
        return pieces;
    }
    let mut merged: Vec<Piece<'_>> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        match merged.last_mut() {
            Some(last) if last.state().is_free() && piece.state().is_free() => {
                last.size += piece.size;
                // A gap has no stream: the merged block keeps one only if every part has it.
                last.stream = last.stream.filter(|&s| piece.stream == Some(s));
                last.block = None;
            }
            _ => merged.push(piece),
        }
    }
    merged
}

fn torch_state(state: BlockState) -> &'static str {
    match state {
        BlockState::Live => "active_allocated",
        BlockState::Pending => "active_pending_free",
        BlockState::Free | BlockState::FreeOnStream => "inactive",
    }
}

impl Piece<'_> {
    fn state(&self) -> BlockState {
        self.block.map_or(BlockState::Free, |b| b.state)
    }

    /// The bytes asked for: PyTorch's `requested_size`, never above the size (the viewer
    /// draws `size - requested_size` as rounding loss); a pending block's too, which the
    /// viewer draws as a block.
    fn requested(&self) -> u128 {
        match self.block {
            Some(b) if !b.state.is_free() => b
                .requested
                .map_or(self.size, |r| (r as u128).min(self.size)),
            _ => 0,
        }
    }
}

/// The streams the trace's segment events gave the segments: PyTorch's viewer steps back
/// through those events from the snapshot's segments, and joins mapped ranges only where
/// their streams agree, so a segment must be shown on the stream its events name.
#[derive(Default)]
struct SegmentStreams {
    /// Each whole segment's latest `segment_alloc`, by address.
    whole: HashMap<u64, StreamId>,
    /// The stream of the mapped ranges' events (one for all of them).
    mapped: Option<StreamId>,
}

impl SegmentStreams {
    fn of(trace: &Timeline) -> Self {
        let mut streams = SegmentStreams::default();
        for e in trace.events() {
            match e.action {
                TraceAction::SegmentAlloc => {
                    streams.whole.insert(e.address.addr(), e.stream);
                }
                TraceAction::SegmentMap | TraceAction::SegmentUnmap => {
                    streams.mapped.get_or_insert(e.stream);
                }
                _ => {}
            }
        }
        streams
    }

    fn get(&self, s: &Segment) -> Option<StreamId> {
        if s.expandable {
            self.mapped
        } else {
            self.whole.get(&s.address.addr()).copied()
        }
    }
}

/// The stream a segment is shown on: the one its trace events gave it; else its own; else
/// its first live block's (the segment belongs to the stream whose allocation it holds
/// first); else 0, PyTorch's default.
fn segment_stream(s: &Segment, traced: Option<StreamId>, pieces: &[Piece<'_>]) -> u64 {
    let first_live = || {
        pieces
            .iter()
            .filter(|b| b.state() == BlockState::Live)
            .find_map(|b| b.stream)
    };
    traced.or(s.stream).or_else(first_live).map_or(0, |s| s.0)
}

fn write_segment<W: Write>(
    p: &mut Pickler<W>,
    s: &Segment,
    traced: Option<StreamId>,
    ordinal: u32,
    sites: &HashMap<u64, Vec<Frame>>,
) -> io::Result<()> {
    let pieces = tile(s);
    let sum = |f: &dyn Fn(&Piece) -> u128| pieces.iter().map(f).sum::<u128>();
    let allocated = sum(&|b| {
        if b.state() == BlockState::Live {
            b.size
        } else {
            0
        }
    });
    let active = sum(&|b| if b.state().is_free() { 0 } else { b.size });
    let requested = sum(&|b| {
        if b.state() == BlockState::Live {
            b.requested()
        } else {
            0
        }
    });
    p.dict(|d| {
        d.entry("device", |p| p.uint(ordinal.into()))?;
        d.entry("address", |p| p.uint(s.address.addr()))?;
        d.entry("total_size", |p| p.uint(s.bytes as u64))?;
        d.entry("allocated_size", |p| int(p, allocated))?;
        d.entry("active_size", |p| int(p, active))?;
        d.entry("requested_size", |p| int(p, requested))?;
        d.entry("stream", |p| p.uint(segment_stream(s, traced, &pieces)))?;
        d.entry("segment_type", |p| {
            p.name(if s.bytes >= LARGE_SEGMENT {
                "large"
            } else {
                "small"
            })
        })?;
        d.entry("segment_pool_id", |p| p.int_tuple(&[0, 0]))?;
        d.entry("is_expandable", |p| p.bool(s.expandable))?;
        d.entry("frames", |p| {
            p.list(std::iter::empty::<()>(), |_, _| Ok(()))
        })?;
        d.entry("blocks", |p| {
            p.list(&pieces, |p, b| write_block(p, b, sites))
        })
    })
}

fn write_block<W: Write>(
    p: &mut Pickler<W>,
    b: &Piece<'_>,
    sites: &HashMap<u64, Vec<Frame>>,
) -> io::Result<()> {
    p.dict(|d| {
        d.entry("address", |p| int(p, b.address))?;
        d.entry("size", |p| int(p, b.size))?;
        d.entry("requested_size", |p| int(p, b.requested()))?;
        d.entry("state", |p| p.name(torch_state(b.state())))?;
        d.entry("stream", |p| match b.stream {
            Some(s) => p.uint(s.0),
            None => p.none(),
        })?;
        d.entry("frames", |p| {
            let frames = match b.block {
                Some(blk) if blk.state == BlockState::Live => sites.get(&blk.address.addr()),
                _ => None,
            };
            p.list(frames.map_or(&[][..], Vec::as_slice), write_frame)
        })
    })
}

/// A piece's bounds fit in 65 bits: written exact.
fn int<W: Write>(p: &mut Pickler<W>, v: u128) -> io::Result<()> {
    p.int(i128::try_from(v).unwrap_or(i128::MAX))
}

#[cfg(test)]
mod tests;
