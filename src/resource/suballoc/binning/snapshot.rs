//! The binning resource's [`MemorySnapshot`]: the upstream's, with each bin's segments in place
//! of the upstream's live blocks that hold them, so that no byte is counted twice. Every part
//! of a cut upstream segment says so ([`Segment::cut_from`]), so that exports whose segments
//! come and go whole (PyTorch's) join them again.

use crate::device::DeviceId;
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::{Block, BlockState, MemorySnapshot, Segment};

/// Nests `bins` (the bins' segments) into `upstream`'s snapshot: a live block of the upstream
/// that holds bin segments (a bin's chunk, taken from the same upstream) is cut there, the bin
/// segments take the place of what they cover, and what the bin segments leave of the block
/// stays live. The upstream segment is cut with it (its pieces keep its stream and whether it
/// coalesces: nothing free joins across a live chunk anyway). Bin segments outside every
/// upstream segment (a bin over another resource, or an upstream without a snapshot) are added
/// as they are; those that overlap an upstream segment without lying inside one of its live
/// blocks (or overlap a bin segment placed before them) are the upstream's own memory seen
/// again, through a bin served by the upstream or a view of it, and are dropped.
pub(super) fn nest(
    device: DeviceId,
    upstream: Option<MemorySnapshot>,
    mut bins: Vec<Segment>,
) -> MemorySnapshot {
    bins.sort_unstable_by_key(|s| s.address);
    let mut placed = vec![false; bins.len()];
    let mut snap = MemorySnapshot::new(device, "binning");
    let Some(upstream) = upstream else {
        snap.segments = bins;
        return snap;
    };
    snap.device = upstream.device;
    snap.capacity = upstream.capacity;
    let end_of = |s: &Segment| s.address.addr().saturating_add(s.bytes as u64);
    let held: Vec<(u64, u64)> = upstream
        .segments
        .iter()
        .map(|u| (u.address.addr(), end_of(u)))
        .collect();
    for u in upstream.segments {
        let u_end = end_of(&u);
        let piece = |at: u64| {
            let mut s = Segment::new(DevicePtr::from_raw(at), 0);
            s.stream = u.stream;
            s.coalesces = u.coalesces;
            s.expandable = u.expandable;
            s.cut_from = Some(u.address);
            s
        };
        let mut current = piece(u.address.addr());
        let close = |current: &mut Segment, end: u64, out: &mut Vec<Segment>, next: u64| {
            let done = std::mem::replace(current, piece(next));
            let bytes = end.saturating_sub(done.address.addr()) as usize;
            if bytes > 0 || !done.blocks.is_empty() {
                out.push(Segment { bytes, ..done });
            }
        };
        for b in &u.blocks {
            let first = bins.partition_point(|s| s.address < b.address);
            let inside: Vec<usize> = (first..bins.len())
                .take_while(|&i| bins[i].address.addr() < b.end())
                .filter(|&i| end_of(&bins[i]) <= b.end())
                .collect();
            if b.state != BlockState::Live || inside.is_empty() {
                current.blocks.push(b.clone());
                continue;
            }
            let mut at = b.address.addr();
            let rest = |from: u64, to: u64| {
                let mut r = Block::new(DevicePtr::from_raw(from), (to - from) as usize, b.state);
                r.stream = b.stream;
                r
            };
            for i in inside {
                let start = bins[i].address.addr();
                if start < at {
                    continue; // overlaps the bin segment placed before it: dropped below
                }
                if start > at {
                    current.blocks.push(rest(at, start));
                }
                let bin_end = end_of(&bins[i]);
                close(&mut current, start, &mut snap.segments, bin_end);
                snap.segments.push(Segment {
                    cut_from: Some(u.address),
                    expandable: u.expandable,
                    ..bins[i].clone()
                });
                placed[i] = true;
                at = bin_end;
            }
            if at < b.end() {
                current.blocks.push(rest(at, b.end()));
            }
        }
        close(&mut current, u_end, &mut snap.segments, u_end);
    }
    let overlaps_upstream = |s: &Segment| {
        let (start, end) = (s.address.addr(), end_of(s));
        held.iter()
            .any(|&(a, b)| start < b && a < end.max(start + 1))
    };
    snap.segments.extend(
        bins.into_iter()
            .zip(placed)
            .filter(|(s, placed)| !placed && !overlaps_upstream(s))
            .map(|(s, _)| s),
    );
    snap.sort();
    snap
}
