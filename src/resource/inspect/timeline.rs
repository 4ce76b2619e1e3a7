//! A bounded record of allocations and frees over time: the trace behind a report's timeline
//! and PyTorch's `device_traces`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::ids::StreamId;
use crate::resource::device_ptr::DevicePtr;

/// What a [`TraceEvent`] records (PyTorch's trace actions, in its words where it has them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TraceAction {
    /// An allocation (`alloc`).
    Alloc,
    /// A free (`free_requested`; stream-ordered, so also `free_completed` for PyTorch).
    Free,
    /// The resource took a segment from upstream (`segment_alloc`).
    SegmentAlloc,
    /// The resource gave a segment back (`segment_free`).
    SegmentFree,
    /// The resource mapped pages into an expandable segment, growing it (`segment_map`).
    SegmentMap,
    /// The resource unmapped pages of an expandable segment, shrinking it (`segment_unmap`).
    SegmentUnmap,
    /// An allocation failed for lack of memory (`oom`).
    Oom,
}

impl TraceAction {
    /// PyTorch's name for the action.
    pub fn torch_name(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::Free => "free_requested",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Oom => "oom",
        }
    }
}

/// One event of a [`Timeline`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TraceEvent {
    /// Its number, from 0, counting every event recorded (dropped ones included).
    pub seq: u64,
    /// When, since the timeline began (or as the recorder gave it).
    pub time: Duration,
    /// What happened.
    pub action: TraceAction,
    /// The address (null for a failed allocation).
    pub address: DevicePtr,
    /// The bytes.
    pub bytes: usize,
    /// The stream.
    pub stream: StreamId,
}

/// The state after one event, as a [`Timeline`] keeps it (see [`Timeline::series`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SeriesPoint {
    /// The event's number.
    pub seq: u64,
    /// Its time.
    pub time: Duration,
    /// Live bytes, all streams.
    pub live_bytes: usize,
    /// Reserved bytes, as last given to [`Timeline::set_reserved`].
    pub reserved_bytes: usize,
    /// Live bytes per stream, in the order of [`Timeline::streams`] (shorter when streams came
    /// later: the missing ones held nothing).
    pub live_by_stream: Vec<usize>,
}

/// Streams a timeline draws apart; the rest share its last column.
pub const TIMELINE_STREAMS: usize = 32;

/// A bounded record of allocations and frees: the latest events (PyTorch's `device_traces`)
/// and a downsampled series of live bytes per stream and reserved bytes (a report's timeline).
///
/// Memory stays bounded whatever the length of the run: at most `max_events` events (older
/// ones are dropped and counted), at most `max_points` series points (when full, neighbouring
/// points are merged, keeping the one with more live bytes, so the peak survives), and at most
/// [`TIMELINE_STREAMS`] stream columns (later streams share the last one).
///
/// # Examples
///
/// ```
/// use streamalloc::{DevicePtr, StreamId, Timeline, TraceAction};
///
/// let mut t = Timeline::with_limits(2, 16);
/// let s = StreamId(7);
/// t.name_stream(s, "copy stream");
/// t.set_reserved(1 << 20);
/// t.record(TraceAction::Alloc, DevicePtr::from_raw(0x1000), 4096, s);
/// t.record(TraceAction::Alloc, DevicePtr::from_raw(0x2000), 8192, s);
/// t.record(TraceAction::Free, DevicePtr::from_raw(0x1000), 4096, s);
/// assert_eq!(t.live_bytes(), 8192);
/// assert_eq!(t.peak_live_bytes(), 12288);
/// assert_eq!((t.events().count(), t.dropped_events()), (2, 1));
/// assert_eq!(t.series().last().unwrap().live_by_stream, [8192]);
/// assert_eq!(t.streams().next(), Some((s, "copy stream")));
/// ```
#[derive(Debug, Clone)]
pub struct Timeline {
    start: Instant,
    events: VecDeque<TraceEvent>,
    max_events: usize,
    dropped: u64,
    seq: u64,
    /// The latest event's time: later events are never recorded before it.
    last_time: Duration,
    streams: Vec<(StreamId, String)>,
    live_by_stream: Vec<usize>,
    live: usize,
    peak_live: usize,
    reserved: usize,
    /// Points of closed windows, one per window: its peak.
    closed: Vec<SeriesPoint>,
    /// The open window's peak and latest point, and its events so far.
    open_max: Option<SeriesPoint>,
    open_last: Option<SeriesPoint>,
    open_count: u64,
    max_points: usize,
    /// Events per window; doubles each time the closed points are merged in pairs.
    stride: u64,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::new()
    }
}

impl Timeline {
    /// A timeline keeping the latest 100,000 events and 2,048 series points.
    pub fn new() -> Self {
        Timeline::with_limits(100_000, 2048)
    }

    /// A timeline keeping the latest `max_events` events and about `max_points` (at least 4)
    /// series points.
    pub fn with_limits(max_events: usize, max_points: usize) -> Self {
        Timeline {
            start: Instant::now(),
            events: VecDeque::new(),
            max_events,
            dropped: 0,
            seq: 0,
            last_time: Duration::ZERO,
            streams: Vec::new(),
            live_by_stream: Vec::new(),
            live: 0,
            peak_live: 0,
            reserved: 0,
            closed: Vec::new(),
            open_max: None,
            open_last: None,
            open_count: 0,
            max_points: max_points.max(4),
            stride: 1,
        }
    }

    /// Records an event now.
    pub fn record(
        &mut self,
        action: TraceAction,
        address: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) {
        let time = self.start.elapsed();
        self.record_at(time, action, address, bytes, stream);
    }

    /// Records an event at `time` (a replay gives the logged time). `Alloc` adds `bytes` to
    /// the stream's live bytes, `Free` takes them off (saturating); the others change nothing
    /// live.
    ///
    /// Times never go back: an event given a time before the previous event's is recorded at
    /// the previous one's. Events are kept in the order they happened, and readers (PyTorch's
    /// viewer, a report's time axis) take that order as time's; a log written by several
    /// threads has times a few microseconds out of order, which would otherwise draw its
    /// events backwards.
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{DevicePtr, StreamId, Timeline, TraceAction};
    ///
    /// let mut t = Timeline::new();
    /// let (p, s) = (DevicePtr::from_raw(0x1000), StreamId(1));
    /// t.record_at(Duration::from_micros(20), TraceAction::Alloc, p, 64, s);
    /// t.record_at(Duration::from_micros(15), TraceAction::Free, p, 64, s);
    /// let times: Vec<_> = t.events().map(|e| e.time.as_micros()).collect();
    /// assert_eq!(times, [20, 20]);
    /// ```
    pub fn record_at(
        &mut self,
        time: Duration,
        action: TraceAction,
        address: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) {
        let time = time.max(self.last_time);
        self.last_time = time;
        let column = self.column(stream);
        match action {
            TraceAction::Alloc => {
                self.live = self.live.saturating_add(bytes);
                self.live_by_stream[column] = self.live_by_stream[column].saturating_add(bytes);
            }
            TraceAction::Free => {
                self.live = self.live.saturating_sub(bytes);
                self.live_by_stream[column] = self.live_by_stream[column].saturating_sub(bytes);
            }
            _ => {}
        }
        self.peak_live = self.peak_live.max(self.live);
        if self.max_events > 0 {
            if self.events.len() == self.max_events {
                self.events.pop_front();
                self.dropped += 1;
            }
            self.events.push_back(TraceEvent {
                seq: self.seq,
                time,
                action,
                address,
                bytes,
                stream,
            });
        } else {
            self.dropped += 1;
        }
        self.sample(time);
        self.seq += 1;
    }

    /// The bytes the resource holds now; the next points of the series carry it.
    pub fn set_reserved(&mut self, bytes: usize) {
        self.reserved = bytes;
    }

    /// Names `stream` in reports ("stream 0x5560f474fff0" for a replayed log's handle, say).
    pub fn name_stream(&mut self, stream: StreamId, name: impl Into<String>) {
        let column = self.column(stream);
        if self.streams[column].0 == stream {
            self.streams[column].1 = name.into();
        }
    }

    /// The streams with a column of their own, in the order they came, with their names (the
    /// last column also holds every stream after the first [`TIMELINE_STREAMS`] − 1, named
    /// "other streams").
    pub fn streams(&self) -> impl Iterator<Item = (StreamId, &str)> {
        self.streams.iter().map(|(s, n)| (*s, n.as_str()))
    }

    /// The latest events, oldest first.
    pub fn events(&self) -> impl Iterator<Item = &TraceEvent> {
        self.events.iter()
    }

    /// Events recorded but no longer kept.
    pub fn dropped_events(&self) -> u64 {
        self.dropped
    }

    /// Events recorded, kept or not.
    pub fn recorded_events(&self) -> u64 {
        self.seq
    }

    /// The series, oldest first: one point per window of events, the one with the most live
    /// bytes of its window (so the peak is always a point), then the state after the latest
    /// event. At most `max_points` + 2 points.
    pub fn series(&self) -> Vec<SeriesPoint> {
        let mut points = self.closed.clone();
        points.extend(self.open_max.clone());
        if let Some(last) = &self.open_last {
            if points.last().is_none_or(|p| p.seq != last.seq) {
                points.push(last.clone());
            }
        }
        points
    }

    /// Live bytes now.
    pub fn live_bytes(&self) -> usize {
        self.live
    }

    /// The most live bytes at any point.
    pub fn peak_live_bytes(&self) -> usize {
        self.peak_live
    }

    /// Reserved bytes, as last set.
    pub fn reserved_bytes(&self) -> usize {
        self.reserved
    }

    fn column(&mut self, stream: StreamId) -> usize {
        if let Some(i) = self.streams.iter().position(|(s, _)| *s == stream) {
            return i;
        }
        if self.streams.len() < TIMELINE_STREAMS {
            self.streams.push((stream, stream.to_string()));
            self.live_by_stream.push(0);
            return self.streams.len() - 1;
        }
        let last = TIMELINE_STREAMS - 1;
        self.streams[last].1 = "other streams".to_owned();
        last
    }

    fn sample(&mut self, time: Duration) {
        let point = SeriesPoint {
            seq: self.seq,
            time,
            live_bytes: self.live,
            reserved_bytes: self.reserved,
            live_by_stream: self.live_by_stream.clone(),
        };
        if self
            .open_max
            .as_ref()
            .is_none_or(|m| point.live_bytes >= m.live_bytes)
        {
            self.open_max = Some(point.clone());
        }
        self.open_last = Some(point);
        self.open_count += 1;
        if self.open_count < self.stride {
            return;
        }
        // The window closes: its peak stands for it.
        self.closed.extend(self.open_max.take());
        self.open_last = None;
        self.open_count = 0;
        if self.closed.len() >= self.max_points {
            self.stride *= 2;
            self.closed = std::mem::take(&mut self.closed)
                .chunks(2)
                .filter_map(|pair| pair.iter().max_by_key(|p| p.live_bytes).cloned())
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records `action` of `bytes` at one address on stream `stream`.
    fn event(t: &mut Timeline, action: TraceAction, bytes: usize, stream: u64) {
        t.record(action, DevicePtr::from_raw(0x1000), bytes, StreamId(stream));
    }

    fn alloc(t: &mut Timeline, bytes: usize, stream: u64) {
        event(t, TraceAction::Alloc, bytes, stream);
    }

    fn free(t: &mut Timeline, bytes: usize, stream: u64) {
        event(t, TraceAction::Free, bytes, stream);
    }

    #[test]
    fn the_series_stays_bounded_and_keeps_the_peak_and_the_end() {
        let mut t = Timeline::with_limits(10, 16);
        for i in 0..10_000usize {
            alloc(&mut t, 1, (i % 3) as u64);
            if i == 7_777 {
                alloc(&mut t, 1_000_000, 0);
                free(&mut t, 1_000_000, 0);
            }
        }
        let series = t.series();
        assert!(series.len() <= 18, "{} points", series.len());
        let peak = series.iter().map(|p| p.live_bytes).max().unwrap();
        assert_eq!(peak, t.peak_live_bytes());
        assert_eq!(peak, 1_000_000 + 7_778);
        let last = series.last().unwrap();
        assert_eq!(
            (last.seq, last.live_bytes),
            (t.recorded_events() - 1, 10_000)
        );
        assert!(series.windows(2).all(|w| w[0].seq < w[1].seq));
        assert_eq!(t.events().count(), 10);
        assert_eq!(t.dropped_events(), t.recorded_events() - 10);
    }

    #[test]
    fn streams_past_the_limit_share_the_last_column() {
        let mut t = Timeline::new();
        for s in 0..(TIMELINE_STREAMS as u64 + 10) {
            alloc(&mut t, 100, s);
        }
        free(&mut t, 100, TIMELINE_STREAMS as u64 + 5);
        let names: Vec<_> = t.streams().map(|(_, n)| n.to_owned()).collect();
        assert_eq!(names.len(), TIMELINE_STREAMS);
        assert_eq!(names.last().unwrap(), "other streams");
        let last = t.series().pop().unwrap();
        assert_eq!(last.live_by_stream[TIMELINE_STREAMS - 1], 100 * 10);
        assert_eq!(last.live_bytes, 100 * (TIMELINE_STREAMS + 9));
    }

    #[test]
    fn frees_never_take_live_bytes_below_zero() {
        let mut t = Timeline::new();
        free(&mut t, usize::MAX, 1);
        alloc(&mut t, usize::MAX, 1);
        alloc(&mut t, usize::MAX, 2);
        assert_eq!(t.live_bytes(), usize::MAX);
        assert_eq!(
            t.series().last().unwrap().live_by_stream,
            [usize::MAX, usize::MAX]
        );
    }
}
