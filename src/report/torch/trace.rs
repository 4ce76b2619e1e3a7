//! A [`Timeline`]'s events as PyTorch's trace entries (`device_traces`).

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};

use super::frames::{write_frame, Frame};
use super::pickle::Pickler;
use crate::resource::{Timeline, TraceAction, TraceEvent};

/// One trace entry: an event, under one of PyTorch's actions (a free is two entries), with
/// the frames of its allocation site when known.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry<'a> {
    pub(super) action: &'static str,
    pub(super) event: &'a TraceEvent,
    pub(super) frames: &'a [Frame],
}

/// `trace`'s events as entries, oldest first.
///
/// - A free is `free_requested` then `free_completed` (our frees are stream-ordered: the
///   memory is the freeing stream's at once, as a PyTorch free without `record_stream` is),
///   except the last free of a block the snapshot shows [`Pending`](crate::BlockState::Pending)
///   (`pending`): its memory has not come back yet, so its free is requested only, as PyTorch
///   shows a block `active_pending_free`.
/// - The allocation of a block live in the snapshot takes its site's frames (`sites`, by
///   address), as PyTorch's `alloc` entries carry the allocation's stack.
pub(super) fn entries<'a>(
    trace: &'a Timeline,
    pending: &HashSet<u64>,
    sites: &'a HashMap<u64, Vec<Frame>>,
) -> Vec<Entry<'a>> {
    let events: Vec<&TraceEvent> = trace.events().collect();
    // Walked from the end: the first alloc or free met at an address is its latest.
    let mut later: HashSet<u64> = HashSet::new();
    let mut out: Vec<Entry<'a>> = Vec::with_capacity(events.len() + events.len() / 2);
    for event in events.into_iter().rev() {
        let addr = event.address.addr();
        let latest =
            matches!(event.action, TraceAction::Alloc | TraceAction::Free) && later.insert(addr);
        let entry = |action| Entry {
            action,
            event,
            frames: &[],
        };
        match event.action {
            TraceAction::Free => {
                if !(latest && pending.contains(&addr)) {
                    out.push(entry("free_completed"));
                }
                out.push(entry("free_requested"));
            }
            TraceAction::Alloc => {
                let frames = sites.get(&addr).filter(|_| latest);
                out.push(Entry {
                    frames: frames.map_or(&[], Vec::as_slice),
                    ..entry("alloc")
                });
            }
            action => out.push(entry(action.torch_name())),
        }
    }
    out.reverse();
    out
}

/// Writes one entry: PyTorch's `TraceEntry` keys.
pub(super) fn write_entry<W: Write>(p: &mut Pickler<W>, e: &Entry<'_>) -> io::Result<()> {
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
        d.entry("frames", |p| p.list(e.frames, write_frame))
    })
}
