//! PyTorch's memory-snapshot format (a pickle with `segments` and `device_traces`), which
//! pytorch.org/memory_viz opens.
//!
//! [`write_torch_snapshot`] writes what `torch.cuda.memory._dump_snapshot()` writes, from a
//! [`MemorySnapshot`] of any resource and, optionally, a [`Timeline`] of its allocations and
//! frees. Drop the file on pytorch.org/memory_viz (it is read in the browser, not uploaded),
//! or load it in Python with `pickle.load` and PyTorch's `torch.cuda._memory_viz` tools.

mod pickle;

use std::backtrace::{Backtrace, BacktraceStatus};
use std::io::{self, BufWriter, Write};

use crate::resource::{Block, BlockState, MemorySnapshot, Segment, Timeline, TraceAction};
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
///   (the device's ordinal), `address`, `total_size`, `allocated_size` (live bytes),
///   `active_size` (live and pending bytes), `requested_size`, `stream`, `segment_type`
///   (`"large"` from 1 MiB), `segment_pool_id` (`(0, 0)`), `is_expandable` (`False`),
///   `frames` (`[]`) and `blocks`.
/// - `blocks`: they cover the segment from its start to its end without a gap, as the
///   viewer needs (it computes each block's address by adding up the sizes before it): a
///   range no [`Block`] describes becomes an `"inactive"` block, a block reaching out of
///   its segment is clipped. Each has `address`, `size`, `requested_size` (the
///   [`Block::requested`] bytes, else the size; 0 for a free block), `state`, `frames` and
///   our `stream` (`None` when the block has none). States:
///   [`Live`](BlockState::Live) → `"active_allocated"`; [`Pending`](BlockState::Pending) →
///   `"active_pending_free"` (PyTorch's state for a block freed by its user that no request
///   may take yet because a stream still uses it: the viewer draws it red); [`Free`](BlockState::Free)
///   and [`FreeOnStream`](BlockState::FreeOnStream) → `"inactive"` (PyTorch's free blocks are
///   free on their stream too).
/// - `frames`: a live block's allocation site ([`Block::site`], set by a
///   [`TrackingAdaptor::with_backtraces`](crate::TrackingAdaptor::with_backtraces)) as
///   `{filename, line, name}` dicts, innermost first, read from the backtrace's text (best
///   effort: a frame without a location has filename `"??"` and line 0; the tracking
///   adaptor's own frames are left out). Empty without a site.
/// - `device_traces`: a list per device ordinal up to the snapshot's (the viewer offers a
///   device by its index in this list); the lower ones are empty. The snapshot's device gets
///   `trace`'s kept events, oldest first, each `{action, addr, size, stream, time_us,
///   frames: []}`: [`Alloc`](TraceAction::Alloc) → `alloc`;
///   [`Free`](TraceAction::Free) → `free_requested` then `free_completed` (the viewer needs
///   the pair, and shows it as one `free`); `segment_alloc`, `segment_free`; and
///   [`Oom`](TraceAction::Oom) → `oom` with `device_free` (0: not known here) instead of
///   `addr`. `time_us` is microseconds since the timeline began.
/// - `streamalloc`: our own key, which PyTorch's tools ignore: the `resource`'s name, the
///   `device` (`"host:0"`, `"cuda:1"`), `capacity` (or `None`) and `dropped_events`.
///
/// Integers are exact at any width (64-bit addresses and `usize::MAX` sizes come back from
/// Python's `pickle` unchanged); the viewer reads them as JavaScript numbers, exact below
/// 2^53, which covers every real device address.
///
/// Streams are our [`StreamId`](crate::StreamId) numbers; the viewer renames them 1, 2, …
/// in the order it meets them (0 stays the default stream).
///
/// A trace should come from the same resource as the snapshot, up to the moment the
/// snapshot was taken: the viewer's "Allocator State History" replays the trace backwards
/// from the snapshot's blocks and expects each freed block to lie in a segment it knows.
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
    let ordinal = snapshot.device.ordinal;
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
    let mut p = Pickler::new(BufWriter::new(w))?;
    let mut segments: Vec<&Segment> = snapshot.segments.iter().collect();
    segments.sort_by_key(|s| s.address);
    p.dict(|d| {
        d.entry("segments", |p| {
            p.list(segments, |p, s| write_segment(p, s, ordinal))
        })?;
        d.entry("device_traces", |p| {
            p.list(0..=ordinal, |p, i| {
                let events = trace.filter(|_| i == ordinal).into_iter();
                p.list(
                    events.flat_map(|t| t.events()).flat_map(torch_entries),
                    write_entry,
                )
            })
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

/// A block as the viewer needs it: a range of its segment, tiled without gaps.
struct Piece<'a> {
    address: u128,
    size: u128,
    block: Option<&'a Block>,
}

/// `segment`'s blocks clipped to it, in address order, with the ranges no block covers as
/// free pieces, so that the pieces tile the segment.
fn tile(segment: &Segment) -> Vec<Piece<'_>> {
    let start = u128::from(segment.address.addr());
    let end = start + segment.bytes as u128;
    let mut blocks: Vec<&Block> = segment.blocks.iter().collect();
    blocks.sort_by_key(|b| b.address);
    let mut pieces = Vec::with_capacity(blocks.len() + 1);
    let mut cursor = start;
    for b in blocks {
        let b_start = u128::from(b.address.addr()).max(cursor);
        let b_end = (u128::from(b.address.addr()) + b.bytes as u128).min(end);
        if b_end <= b_start {
            continue; // outside the segment, or under a block before it
        }
        if b_start > cursor {
            pieces.push(Piece {
                address: cursor,
                size: b_start - cursor,
                block: None,
            });
        }
        pieces.push(Piece {
            address: b_start,
            size: b_end - b_start,
            block: Some(b),
        });
        cursor = b_end;
    }
    if cursor < end {
        pieces.push(Piece {
            address: cursor,
            size: end - cursor,
            block: None,
        });
    }
    pieces
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
    /// draws `size - requested_size` as rounding loss).
    fn requested(&self) -> u128 {
        match self.block {
            Some(b) if !b.state.is_free() => b
                .requested
                .map_or(self.size, |r| (r as u128).min(self.size)),
            _ => 0,
        }
    }
}

fn write_segment<W: Write>(p: &mut Pickler<W>, s: &Segment, ordinal: u32) -> io::Result<()> {
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
        d.entry("stream", |p| p.uint(s.stream.map_or(0, |s| s.0)))?;
        d.entry("segment_type", |p| {
            p.name(if s.bytes >= LARGE_SEGMENT {
                "large"
            } else {
                "small"
            })
        })?;
        d.entry("segment_pool_id", |p| p.int_tuple(&[0, 0]))?;
        d.entry("is_expandable", |p| p.bool(false))?;
        d.entry("frames", |p| {
            p.list(std::iter::empty::<()>(), |_, _| Ok(()))
        })?;
        d.entry("blocks", |p| p.list(&pieces, write_block))
    })
}

fn write_block<W: Write>(p: &mut Pickler<W>, b: &Piece<'_>) -> io::Result<()> {
    p.dict(|d| {
        d.entry("address", |p| int(p, b.address))?;
        d.entry("size", |p| int(p, b.size))?;
        d.entry("requested_size", |p| int(p, b.requested()))?;
        d.entry("state", |p| p.name(torch_state(b.state())))?;
        d.entry("stream", |p| match b.block.and_then(|b| b.stream) {
            Some(s) => p.uint(s.0),
            None => p.none(),
        })?;
        d.entry("frames", |p| {
            let frames = match b.block {
                Some(b) if b.state == BlockState::Live => {
                    b.site.as_deref().map(frames).unwrap_or_default()
                }
                _ => Vec::new(),
            };
            p.list(&frames, write_frame)
        })
    })
}

/// A piece's bounds fit in 65 bits: written exact.
fn int<W: Write>(p: &mut Pickler<W>, v: u128) -> io::Result<()> {
    p.int(i128::try_from(v).unwrap_or(i128::MAX))
}

/// One frame of an allocation site, as PyTorch's `Frame` dict.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    name: String,
    filename: String,
    line: u64,
}

/// A frame, written once per file and fetched from the pickle's memo after: the same frames
/// (the program's entry, its runtime) appear in every site.
fn write_frame<W: Write>(p: &mut Pickler<W>, f: &Frame) -> io::Result<()> {
    let key = format!("{}\0{}\0{}", f.name, f.filename, f.line);
    p.memoized(&key, |p| {
        p.dict(|d| {
            d.entry("filename", |p| p.str(&f.filename))?;
            d.entry("line", |p| p.uint(f.line))?;
            d.entry("name", |p| p.str(&f.name))
        })
    })
}

/// The frames of a captured backtrace, innermost first, without the tracking adaptor's own.
fn frames(bt: &Backtrace) -> Vec<Frame> {
    if bt.status() != BacktraceStatus::Captured {
        return Vec::new();
    }
    let mut frames = parse_frames(&bt.to_string());
    // The adaptor's frames, and the std helpers between them (`bool::then` around the
    // capture), up to the last of the adaptor's: the caller comes first.
    const TRACKING: &str = "streamalloc::adaptor::tracking";
    let helper = |n: &str| {
        [
            "core::", "std::", "alloc::", "<core::", "<std::", "<alloc::",
        ]
        .iter()
        .any(|p| n.starts_with(p))
    };
    let own = frames
        .iter()
        .take_while(|f| f.name.contains(TRACKING) || helper(&f.name))
        .enumerate()
        .filter(|(_, f)| f.name.contains(TRACKING))
        .last()
        .map_or(0, |(i, _)| i + 1);
    frames.drain(..own);
    frames
}

/// Reads std's backtrace text: `  N: name` starts a frame (an inlined one has no number),
/// `at path:line:column` gives its location.
fn parse_frames(text: &str) -> Vec<Frame> {
    let mut frames: Vec<Frame> = Vec::new();
    let mut located = true;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(at) = line.strip_prefix("at ") {
            if let (false, Some(f)) = (located, frames.last_mut()) {
                let mut parts = at.rsplitn(3, ':');
                let (col, line, file) = (parts.next(), parts.next(), parts.next());
                match (file, line.and_then(|l| l.parse().ok())) {
                    (Some(file), Some(line)) if col.is_some_and(|c| c.parse::<u64>().is_ok()) => {
                        f.filename = file.to_owned();
                        f.line = line;
                    }
                    _ => f.filename = at.to_owned(),
                }
                located = true;
            }
            continue;
        }
        let name = match line.split_once(": ") {
            Some((n, name)) if n.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => line,
        };
        frames.push(Frame {
            name: name.to_owned(),
            filename: "??".to_owned(),
            line: 0,
        });
        located = false;
    }
    frames
}

/// A trace event as PyTorch's trace entries (a free is two).
#[derive(Debug, Clone, Copy)]
struct Entry {
    action: &'static str,
    event: crate::resource::TraceEvent,
}

fn torch_entries(e: &crate::resource::TraceEvent) -> impl Iterator<Item = Entry> + use<> {
    let event = *e;
    let (first, second) = match e.action {
        TraceAction::Free => ("free_requested", Some("free_completed")),
        action => (action.torch_name(), None),
    };
    std::iter::once(first)
        .chain(second)
        .map(move |action| Entry { action, event })
}

fn write_entry<W: Write>(p: &mut Pickler<W>, e: Entry) -> io::Result<()> {
    let ev = e.event;
    p.dict(|d| {
        d.entry("action", |p| p.name(e.action))?;
        if ev.action == TraceAction::Oom {
            d.entry("device_free", |p| p.int(0))?;
        } else {
            d.entry("addr", |p| p.uint(ev.address.addr()))?;
        }
        d.entry("size", |p| p.uint(ev.bytes as u64))?;
        d.entry("stream", |p| p.uint(ev.stream.0))?;
        d.entry("time_us", |p| {
            p.uint(u64::try_from(ev.time.as_micros()).unwrap_or(u64::MAX))
        })?;
        d.entry("frames", |p| {
            p.list(std::iter::empty::<()>(), |_, _| Ok(()))
        })
    })
}

#[cfg(test)]
mod tests;
