//! What both modes of a replay share: the resource checked against the device, the stack the
//! events go through (the resource alone for the timed pass; the recording adaptors over it
//! for the recording pass), and what the recording pass reads from it.

use super::options::ReplayOptions;
use super::report::ReplayReport;
use crate::adaptor::{StatisticsAdaptor, TimelineAdaptor};
use crate::device::Device;
use crate::resource::{MemoryResource, MemoryStats};
use crate::rmm_csv::{Event, ReplayError, ReplayResult};
use crate::stream::Stream;

/// A mode of replay, run over the stack [`on_stack`] builds.
pub(crate) trait Replayer {
    /// Replays `events` onto `to`.
    fn replay<M: MemoryResource + ?Sized, T: MemoryResource>(
        events: impl Iterator<Item = ReplayResult<Event>>,
        to: Target<'_, M, T>,
    ) -> ReplayResult<ReplayReport>;
}

/// Where a replay's events go: `mr` (with `timeline`, the recording adaptor among it, if
/// any), on streams of `device`, as `options` say.
pub(crate) struct Target<'a, M: ?Sized, T: MemoryResource> {
    pub(crate) mr: &'a M,
    pub(crate) timeline: Option<&'a TimelineAdaptor<T>>,
    pub(crate) device: &'a Device,
    pub(crate) options: &'a ReplayOptions,
}

/// Checks that `mr` is of `device`, then replays `events` in mode `P` over a stack that records when
/// `options.record` is on (a [`TimelineAdaptor`] for the timeline, segments included, over a
/// [`StatisticsAdaptor`] whose allocated bytes stand for reserved bytes where `mr` counts
/// none), over `mr` alone otherwise.
pub(crate) fn on_stack<P: Replayer, R: MemoryResource + ?Sized>(
    events: impl Iterator<Item = ReplayResult<Event>>,
    mr: &R,
    device: &Device,
    options: &ReplayOptions,
) -> ReplayResult<ReplayReport> {
    let properties = mr.properties();
    if properties.device != device.id() {
        return Err(ReplayError::Resource {
            line: 0,
            error: crate::Error::DeviceMismatch {
                expected: properties.device,
                actual: device.id(),
                call: "replay(mr, device)",
            },
        });
    }
    if options.record {
        let recording = TimelineAdaptor::new(StatisticsAdaptor::new(mr));
        // The segments' comings and goings, for PyTorch's viewer: a recording pass is not
        // timed, so it can afford a snapshot per event.
        recording.record_segments(true);
        let to = Target {
            mr: &recording,
            timeline: Some(&recording),
            device,
            options,
        };
        P::replay(events, to)
    } else {
        let to: Target<'_, R, StatisticsAdaptor<&R>> = Target {
            mr,
            timeline: None,
            device,
            options,
        };
        P::replay(events, to)
    }
}

/// What `mr` holds from upstream now: its reserved bytes, or its allocated bytes (the
/// statistics adaptor's in a recording stack) where it counts none.
pub(crate) fn reserved_now<M: MemoryResource + ?Sized>(mr: &M) -> usize {
    let MemoryStats {
        reserved_bytes,
        allocated_bytes,
        ..
    } = mr.memory_stats();
    reserved_bytes.or(allocated_bytes).unwrap_or(0)
}

/// Names the stream `s` made for the logged stream `handle` in the recording's timeline.
pub(crate) fn name_stream<T: MemoryResource>(
    timeline: Option<&TimelineAdaptor<T>>,
    s: &Stream,
    handle: u64,
) {
    if let Some(timeline) = timeline {
        let name = if handle == 0 {
            "default stream (0)".to_owned()
        } else {
            format!("stream {handle:#x}")
        };
        timeline.name_stream(s, name);
    }
}

/// Synchronises every stream in `streams`; an error names `line`.
pub(crate) fn synchronize<'s>(
    streams: impl IntoIterator<Item = &'s Stream>,
    line: usize,
) -> ReplayResult<()> {
    for s in streams {
        s.synchronize_blocking()
            .map_err(|error| ReplayError::Resource { line, error })?;
    }
    Ok(())
}
