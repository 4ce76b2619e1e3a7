//! What a resource's segments did between two of its snapshots, as trace events: the
//! `segment_alloc` / `segment_free` (and, for mapped pages, `segment_map` / `segment_unmap`)
//! that PyTorch's viewer replays to draw the allocator's state at each event.
//!
//! The segments are read from the resource's own snapshot, not from its upstream calls, so the
//! events agree with the snapshot a report exports whatever the resource (pool, arena,
//! binning, fixed-size, mapped pool), including segments a resource reshapes without asking
//! its upstream (an arena's superblocks).

use std::collections::BTreeMap;

use crate::ids::StreamId;
use crate::resource::{MemorySnapshot, Segment, TraceAction};

/// A segment event to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Change {
    pub(super) action: TraceAction,
    pub(super) address: u64,
    pub(super) bytes: usize,
    pub(super) stream: StreamId,
}

/// The segments seen at the last look, with the stream each was recorded on.
#[derive(Debug, Default)]
pub(super) struct Segments {
    /// Whole segments (those that come and go whole): address → (bytes, stream).
    whole: BTreeMap<u64, (usize, StreamId)>,
    /// Runs of mapped pages of expandable segments: start → end.
    mapped: BTreeMap<u64, u64>,
    /// The stream of every mapped run: the one the first mapping was made for. The pages of a
    /// mapped pool serve every stream; PyTorch's viewer joins adjacent mapped ranges only when
    /// their streams agree, so one stream keeps its picture of the runs the snapshot's.
    mapped_stream: Option<StreamId>,
}

impl Segments {
    /// The segments of `snapshot`, taken as already there (no events for them).
    pub(super) fn baseline(snapshot: &MemorySnapshot) -> Self {
        let mut s = Segments::default();
        let fallback = StreamId(0);
        let _ = s.update(snapshot, fallback);
        s
    }

    /// The events that take the last look's segments to `snapshot`'s, releases first (a
    /// released segment holds no live block, so none is ever outside a segment), each new
    /// one on its own stream or else `stream`, the one of the call that made it. A segment
    /// whose own stream changed is released and taken again.
    pub(super) fn update(&mut self, snapshot: &MemorySnapshot, stream: StreamId) -> Vec<Change> {
        let mut whole: BTreeMap<u64, (usize, Option<StreamId>)> = BTreeMap::new();
        let mut mapped: BTreeMap<u64, u64> = BTreeMap::new();
        // Whole segments: the parts a resource cut one into (a binning resource's pieces and
        // bins) change as bins come and go, while the memory stays where it is.
        for s in snapshot.whole_extents() {
            let (start, bytes) = (s.address.addr(), s.bytes);
            if s.expandable {
                mapped.insert(start, start.saturating_add(bytes as u64));
            } else {
                whole.insert(start, (bytes, s.stream));
            }
        }
        let mut gone = Vec::new();
        let mut new = Vec::new();
        // The same segment: same range, and the same stream where the resource gives one (an
        // arena's superblock passing, empty, to another stream's arena is a new one for the
        // viewer, whose segments each belong to one stream).
        let same = |w: Option<&(usize, Option<StreamId>)>, bytes: usize, stream: StreamId| {
            w.is_some_and(|&(b, own)| b == bytes && own.is_none_or(|o| o == stream))
        };
        for (&address, &(bytes, stream)) in &self.whole {
            if !same(whole.get(&address), bytes, stream) {
                gone.push(Change {
                    action: TraceAction::SegmentFree,
                    address,
                    bytes,
                    stream,
                });
            }
        }
        self.whole.retain(|a, (b, s)| same(whole.get(a), *b, *s));
        for (address, (bytes, own)) in whole {
            if let std::collections::btree_map::Entry::Vacant(v) = self.whole.entry(address) {
                let stream = own.unwrap_or(stream);
                v.insert((bytes, stream));
                new.push(Change {
                    action: TraceAction::SegmentAlloc,
                    address,
                    bytes,
                    stream,
                });
            }
        }
        let unmapped = subtract(&self.mapped, &mapped);
        let newly_mapped = subtract(&mapped, &self.mapped);
        let on = *self.mapped_stream.get_or_insert(stream);
        let range = |action, (start, end): (u64, u64)| Change {
            action,
            address: start,
            bytes: (end - start) as usize,
            stream: on,
        };
        gone.extend(
            unmapped
                .into_iter()
                .map(|r| range(TraceAction::SegmentUnmap, r)),
        );
        new.extend(
            newly_mapped
                .into_iter()
                .map(|r| range(TraceAction::SegmentMap, r)),
        );
        if mapped.is_empty() && self.mapped.is_empty() {
            // Nothing mapped yet: the stream is the first mapping's, to come.
            self.mapped_stream = None;
        }
        self.mapped = mapped;
        gone.extend(new);
        gone
    }

    /// The stream `segment` was recorded on, if it was.
    pub(super) fn stream_of(&self, segment: &Segment) -> Option<StreamId> {
        let address = segment.address.addr();
        if segment.expandable {
            return self.mapped_stream;
        }
        self.whole
            .get(&address)
            .filter(|(bytes, _)| *bytes == segment.bytes)
            .map(|&(_, stream)| stream)
    }
}

/// The ranges of `a` that `b` does not cover (both sorted, disjoint runs).
fn subtract(a: &BTreeMap<u64, u64>, b: &BTreeMap<u64, u64>) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for (&start, &end) in a {
        let mut at = start;
        // The runs of `b` that may overlap start..end: the one starting before it, and those
        // starting inside it.
        let before = b.range(..start).next_back();
        for (&bs, &be) in before.into_iter().chain(b.range(start..end)) {
            if be <= at {
                continue;
            }
            if bs > at {
                out.push((at, bs.min(end)));
            }
            at = at.max(be);
            if at >= end {
                break;
            }
        }
        if at < end {
            out.push((at, end));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::resource::DevicePtr;

    fn snap(whole: &[(u64, usize)], mapped: &[(u64, usize)]) -> MemorySnapshot {
        let mut s = MemorySnapshot::new(Device::host().id(), "test");
        for &(a, n) in whole {
            s.segments.push(Segment::new(DevicePtr::from_raw(a), n));
        }
        for &(a, n) in mapped {
            let mut seg = Segment::new(DevicePtr::from_raw(a), n);
            seg.expandable = true;
            s.segments.push(seg);
        }
        s
    }

    fn changes(c: &[Change]) -> Vec<(&'static str, u64, usize, u64)> {
        c.iter()
            .map(|c| (c.action.torch_name(), c.address, c.bytes, c.stream.0))
            .collect()
    }

    /// The changes (as [`changes`] gives them) of `s` updated to `snap(whole, mapped)` by a
    /// call on `stream`.
    fn update(
        s: &mut Segments,
        whole: &[(u64, usize)],
        mapped: &[(u64, usize)],
        stream: u64,
    ) -> Vec<(&'static str, u64, usize, u64)> {
        changes(&s.update(&snap(whole, mapped), StreamId(stream)))
    }

    #[test]
    fn whole_segments_come_and_go_releases_first() {
        let mut s = Segments::baseline(&snap(&[(0x1000, 0x1000)], &[]));
        let c = update(&mut s, &[(0x1000, 0x1000), (0x4000, 0x2000)], &[], 3);
        assert_eq!(c, [("segment_alloc", 0x4000, 0x2000, 3)]);
        // The first one goes, one of another size comes at its address in the same call.
        let c = update(&mut s, &[(0x1000, 0x800), (0x4000, 0x2000)], &[], 5);
        assert_eq!(
            c,
            [
                ("segment_free", 0x1000, 0x1000, 0),
                ("segment_alloc", 0x1000, 0x800, 5)
            ]
        );
        let c = update(&mut s, &[(0x1000, 0x800)], &[], 9);
        assert_eq!(c, [("segment_free", 0x4000, 0x2000, 3)]);
        assert!(update(&mut s, &[(0x1000, 0x800)], &[], 9).is_empty());
    }

    #[test]
    fn a_segment_passing_to_another_stream_is_released_and_taken_again() {
        let on = |stream| {
            let mut s = snap(&[(0x1000, 0x1000)], &[]);
            s.segments[0].stream = Some(StreamId(stream));
            s
        };
        let mut s = Segments::baseline(&snap(&[], &[]));
        let c = s.update(&on(2), StreamId(9));
        assert_eq!(changes(&c), [("segment_alloc", 0x1000, 0x1000, 2)]);
        assert!(s.update(&on(2), StreamId(9)).is_empty());
        let c = s.update(&on(3), StreamId(9));
        assert_eq!(
            changes(&c),
            [
                ("segment_free", 0x1000, 0x1000, 2),
                ("segment_alloc", 0x1000, 0x1000, 3)
            ]
        );
    }

    #[test]
    fn mapped_runs_grow_and_shrink_by_the_pages_that_changed() {
        let mut s = Segments::baseline(&snap(&[], &[]));
        let c = update(&mut s, &[], &[(0x10_000, 0x2000)], 4);
        assert_eq!(c, [("segment_map", 0x10_000, 0x2000, 4)]);
        // Grows at both ends and a run apart; every range on the first mapping's stream.
        let c = update(&mut s, &[], &[(0xF_000, 0x4000), (0x20_000, 0x1000)], 7);
        assert_eq!(
            c,
            [
                ("segment_map", 0xF_000, 0x1000, 4),
                ("segment_map", 0x12_000, 0x1000, 4),
                ("segment_map", 0x20_000, 0x1000, 4)
            ]
        );
        // A hole in the middle, the far run gone.
        let c = update(&mut s, &[], &[(0xF_000, 0x1000), (0x11_000, 0x2000)], 7);
        assert_eq!(
            c,
            [
                ("segment_unmap", 0x10_000, 0x1000, 4),
                ("segment_unmap", 0x20_000, 0x1000, 4)
            ]
        );
        let seg = &snap(&[], &[(0xF_000, 0x1000)]).segments[0];
        assert_eq!(s.stream_of(seg), Some(StreamId(4)));
    }

    #[test]
    fn subtracting_runs_leaves_the_uncovered_ranges() {
        let runs = |r: &[(u64, u64)]| r.iter().copied().collect::<BTreeMap<_, _>>();
        let a = runs(&[(0, 100), (200, 300)]);
        let b = runs(&[(10, 20), (90, 210), (250, 260)]);
        assert_eq!(
            subtract(&a, &b),
            [(0, 10), (20, 90), (210, 250), (260, 300)]
        );
        assert_eq!(subtract(&b, &a), [(100, 200)]);
        assert!(subtract(&a, &a).is_empty());
    }
}
