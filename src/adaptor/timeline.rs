//! `TimelineAdaptor`: records a running program's allocations and frees into a [`Timeline`].

mod segments;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::ids::StreamId;
use crate::resource::contract::forward::{memory_resource, Forward};
use crate::resource::{
    BlockState, DevicePtr, MemoryResource, MemorySnapshot, SharedResource, Timeline, TraceAction,
};
use crate::stream::Stream;
use parking_lot::Mutex;
use segments::Segments;

/// Records every allocation, free and out-of-memory refusal through it into a [`Timeline`], so
/// that a running program gets the same reports as a replay: an HTML page
/// ([`HtmlReport`](crate::report::html::HtmlReport)) or PyTorch's trace
/// (`report::torch::write_torch_snapshot`).
///
/// - A successful allocation is [`TraceAction::Alloc`] of the requested bytes on its stream; a
///   free is [`TraceAction::Free`]; an allocation the upstream refused for lack of memory is
///   [`TraceAction::Oom`] (null address). An awaited allocation that waits is refused, and
///   recorded, at each try that finds no memory.
/// - Reserved bytes come from the upstream's
///   [`memory_stats`](MemoryResource::memory_stats)`().reserved_bytes` (0 where it keeps none),
///   read when live bytes reach a new peak, on a refusal, and at least every
///   [`RESERVED_SAMPLE_EVERY`](TimelineAdaptor::RESERVED_SAMPLE_EVERY) events, so that the peak's point carries them while most
///   events read nothing from the upstream.
/// - The timeline is bounded ([`Timeline::with_limits`]): a long run keeps its latest events
///   and a downsampled series that keeps the peak.
///
/// - With [`record_segments`](TimelineAdaptor::record_segments) on, the upstream's segments
///   coming and going: [`TraceAction::SegmentAlloc`] / [`SegmentFree`](TraceAction::SegmentFree)
///   (and [`SegmentMap`](TraceAction::SegmentMap) / [`SegmentUnmap`](TraceAction::SegmentUnmap)
///   for a mapped pool's pages), before the allocation that needed them and after the free that
///   let them go.
/// - Its [`snapshot`](MemoryResource::snapshot) is the upstream's, each live block it recorded
///   given the bytes its caller asked for and its stream where the upstream keeps none, and
///   each segment the stream it was recorded on (the stream of the request that made the
///   upstream take it).
/// - With [`snapshot_peaks`](TimelineAdaptor::snapshot_peaks) on, it keeps the upstream's
///   snapshot near the peak ([`peak_snapshot`](TimelineAdaptor::peak_snapshot)): the two
///   together are a [`ReportSection`](crate::report::html::ReportSection).
///
/// Each event takes a lock (after the upstream's call), so the adaptor serialises the record,
/// not the allocations. A clone shares the timeline.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource, Stream, TimelineAdaptor};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, Some(1 << 20))?;
/// let mr = TimelineAdaptor::new(pool);
///
/// let p = mr.try_allocate(4096, &stream)?;
/// assert!(mr.try_allocate(2 << 20, &stream).is_err()); // recorded as out of memory
/// unsafe { mr.deallocate(p, 4096, &stream) };
///
/// let t = mr.timeline();
/// assert_eq!((t.recorded_events(), t.live_bytes(), t.peak_live_bytes()), (3, 0, 4096));
/// assert_eq!(t.series()[0].reserved_bytes, 1 << 20); // the pool's first chunk
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub struct TimelineAdaptor<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R> {
    upstream: R,
    record: Mutex<Record>,
    /// Whether to keep a snapshot near the peak ([`TimelineAdaptor::snapshot_peaks`]).
    snapshot_peaks: AtomicBool,
}

struct Record {
    timeline: Timeline,
    /// Events since reserved bytes were last read.
    since_sample: u64,
    /// The upstream's snapshot near the peak, and the live bytes when it was taken.
    peak: Option<(MemorySnapshot, usize)>,
    /// The time to record events at instead of the clock's ([`TimelineAdaptor::set_time`]).
    time: Option<Duration>,
    /// The live allocations recorded: address → (bytes asked for, stream).
    live: HashMap<u64, (usize, StreamId)>,
    /// The upstream's segments at the last look, when they are recorded
    /// ([`TimelineAdaptor::record_segments`]).
    segments: Option<Segments>,
}

impl<R: MemoryResource> TimelineAdaptor<R> {
    /// Reserved bytes are read from the upstream at least once every this many events.
    pub const RESERVED_SAMPLE_EVERY: u64 = 64;

    /// Records what goes through `upstream` into a [`Timeline::new`] (the latest 100,000
    /// events, 2,048 series points).
    pub fn new(upstream: R) -> Self {
        TimelineAdaptor::with_timeline(upstream, Timeline::new())
    }

    /// Records into a timeline keeping the latest `max_events` events and about `max_points`
    /// series points ([`Timeline::with_limits`]).
    pub fn with_limits(upstream: R, max_events: usize, max_points: usize) -> Self {
        TimelineAdaptor::with_timeline(upstream, Timeline::with_limits(max_events, max_points))
    }

    fn with_timeline(upstream: R, timeline: Timeline) -> Self {
        TimelineAdaptor {
            inner: Arc::new(Inner {
                upstream,
                record: Mutex::new(Record {
                    timeline,
                    since_sample: u64::MAX,
                    peak: None,
                    time: None,
                    live: HashMap::new(),
                    segments: None,
                }),
                snapshot_peaks: AtomicBool::new(false),
            }),
        }
    }

    /// A copy of the timeline so far.
    pub fn timeline(&self) -> Timeline {
        self.inner.record.lock().timeline.clone()
    }

    /// Keeps (`true`) or stops keeping the upstream's [`snapshot`](MemoryResource::snapshot)
    /// near the peak, for [`peak_snapshot`](TimelineAdaptor::peak_snapshot). A snapshot is
    /// taken when live bytes pass the last snapshot's by more than 1/16, so the one kept has
    /// at least 16/17 of the peak's live bytes, and a run takes a few hundred at most (one
    /// per 6% of growth), not one per allocation. Off by default: a snapshot walks every
    /// block of the upstream.
    pub fn snapshot_peaks(&self, on: bool) {
        self.inner.snapshot_peaks.store(on, Ordering::Relaxed);
    }

    /// Records (`true`) or stops recording the upstream's segments coming and going, as
    /// [`TraceAction::SegmentAlloc`] / [`SegmentFree`](TraceAction::SegmentFree) events, and a
    /// mapped pool's pages as [`SegmentMap`](TraceAction::SegmentMap) /
    /// [`SegmentUnmap`](TraceAction::SegmentUnmap): what PyTorch's viewer needs to draw the
    /// allocator's state at each event. The segments it holds when turned on are taken as
    /// there from the start.
    ///
    /// Off by default: each allocation and free then takes the upstream's
    /// [`snapshot`](MemoryResource::snapshot) (which walks its blocks) to see what changed.
    /// Reading the snapshot, rather than the upstream's upstream calls, keeps the events true to
    /// the segments the upstream's snapshot shows, whatever the resource.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource, Stream};
    /// use streamalloc::{TimelineAdaptor, TraceAction};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = TimelineAdaptor::new(PoolResource::new(CudaResource::new(&device)?, 0, None)?);
    /// mr.record_segments(true);
    /// let p = mr.try_allocate(4096, &stream)?;
    /// unsafe { mr.deallocate(p, 4096, &stream) };
    /// let actions: Vec<_> = mr.timeline().events().map(|e| e.action).collect();
    /// assert_eq!(actions[..2], [TraceAction::SegmentAlloc, TraceAction::Alloc]);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn record_segments(&self, on: bool) {
        let mut record = self.inner.record.lock();
        if on == record.segments.is_some() {
            return;
        }
        record.segments = match (on, self.inner.upstream.snapshot()) {
            (true, Some(snapshot)) => Some(Segments::baseline(&snapshot)),
            _ => None,
        };
    }

    /// The upstream's snapshot near the peak (see
    /// [`snapshot_peaks`](TimelineAdaptor::snapshot_peaks)); `None` before one was taken or
    /// when the upstream gives none.
    pub fn peak_snapshot(&self) -> Option<MemorySnapshot> {
        self.inner
            .record
            .lock()
            .peak
            .as_ref()
            .map(|(s, _)| s.clone())
    }

    /// Records the next events at `time` instead of the time since the timeline began: a
    /// replay gives each event's logged time.
    pub(crate) fn set_time(&self, time: Duration) {
        self.inner.record.lock().time = Some(time);
    }

    /// Names `stream` in the timeline (and so in reports).
    pub fn name_stream(&self, stream: &Stream, name: impl Into<String>) {
        self.inner
            .record
            .lock()
            .timeline
            .name_stream(stream.id(), name);
    }
}

impl Record {
    /// Records `action` at the time set for events, or now.
    fn event(&mut self, action: TraceAction, ptr: DevicePtr, bytes: usize, stream: StreamId) {
        match self.time {
            Some(time) => self.timeline.record_at(time, action, ptr, bytes, stream),
            None => self.timeline.record(action, ptr, bytes, stream),
        }
    }
}

impl<R: MemoryResource> Inner<R> {
    /// Records how the upstream's segments changed since the last look, when they are
    /// recorded; `stream` is the call's that changed them.
    fn segments_changed(&self, record: &mut Record, stream: StreamId) {
        let Some(segments) = record.segments.as_mut() else {
            return;
        };
        let Some(snapshot) = self.upstream.snapshot() else {
            return;
        };
        for c in segments.update(&snapshot, stream) {
            record.event(c.action, DevicePtr::from_raw(c.address), c.bytes, c.stream);
        }
    }

    fn record(&self, action: TraceAction, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        let mut record = self.record.lock();
        match action {
            TraceAction::Alloc => {
                record.live.insert(ptr.addr(), (bytes, stream.id()));
            }
            TraceAction::Free => {
                record.live.remove(&ptr.addr());
            }
            _ => {}
        }
        if action != TraceAction::Free {
            // The segments an allocation (or a refusal's release) brought come before it.
            self.segments_changed(&mut record, stream.id());
        }
        let t = &record.timeline;
        let new_peak = action == TraceAction::Alloc
            && t.live_bytes().saturating_add(bytes) > t.peak_live_bytes();
        record.since_sample = record.since_sample.saturating_add(1);
        if new_peak
            || action == TraceAction::Oom
            || record.since_sample >= TimelineAdaptor::<R>::RESERVED_SAMPLE_EVERY
        {
            let reserved = self.upstream.memory_stats().reserved_bytes.unwrap_or(0);
            record.timeline.set_reserved(reserved);
            record.since_sample = 0;
        }
        record.event(action, ptr, bytes, stream.id());
        let live = record.timeline.live_bytes();
        if action == TraceAction::Alloc
            && self.snapshot_peaks.load(Ordering::Relaxed)
            && record
                .peak
                .as_ref()
                .is_none_or(|&(_, at)| live > at.saturating_add(at / 16))
        {
            if let Some(snapshot) = self.upstream.snapshot() {
                record.peak = Some((snapshot, live));
            }
        }
    }
}

memory_resource!(shared [R: MemoryResource] TimelineAdaptor<R>);

// SAFETY: every pointer it hands out is one the upstream returned for the same request (it
// only observes the call), and its properties are the upstream's: the upstream's promise holds.
unsafe impl<R: MemoryResource> Forward for Inner<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let result = self.upstream.try_allocate(bytes, stream);
        match &result {
            Ok(ptr) => self.record(TraceAction::Alloc, *ptr, bytes, stream),
            Err(e) if e.is_out_of_memory() => {
                self.record(TraceAction::Oom, DevicePtr::NULL, bytes, stream)
            }
            Err(_) => {}
        }
        result
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // Recorded before the memory can be reused: another thread's allocation of the same
        // address then comes after this free in the trace.
        self.record(TraceAction::Free, ptr, bytes, stream);
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.upstream.deallocate(ptr, bytes, stream) };
        // The segments the free let go come after it.
        let mut record = self.record.lock();
        self.segments_changed(&mut record, stream.id());
    }

    fn snapshot(&self) -> Option<MemorySnapshot> {
        let mut snap = self.upstream.snapshot()?;
        let record = self.record.lock();
        for seg in &mut snap.segments {
            if seg.stream.is_none() {
                seg.stream = record.segments.as_ref().and_then(|s| s.stream_of(seg));
            }
            for block in seg
                .blocks
                .iter_mut()
                .filter(|b| b.state == BlockState::Live)
            {
                // A recorded allocation and a live block at one address are one allocation.
                if let Some(&(bytes, stream)) = record.live.get(&block.address.addr()) {
                    if bytes <= block.bytes {
                        block.requested = block.requested.or(Some(bytes));
                    }
                    block.stream = block.stream.or(Some(stream));
                }
            }
        }
        Some(snap)
    }
}

impl<R: MemoryResource> fmt::Debug for TimelineAdaptor<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let record = self.inner.record.lock();
        f.debug_struct("TimelineAdaptor")
            .field("events", &record.timeline.recorded_events())
            .field("live", &record.timeline.live_bytes())
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

#[cfg(test)]
mod tests;
