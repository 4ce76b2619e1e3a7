//! The streams a replay runs a log's events on: one per logged stream handle, up to a cap, and
//! one shared by the events of every stream past it. On the host backend each stream is an OS
//! thread, so a log with a stream per request must not make one for each.

use rustc_hash::FxHashMap;

use crate::device::Device;
use crate::error::Result;
use crate::rmm_csv::{ReplayError, ReplayResult};
use crate::stream::Stream;

/// How many logged streams a replay gives streams of their own by default
/// ([`ReplayOptions::max_streams`](super::ReplayOptions::max_streams)); events of further
/// streams run on one shared stream.
///
/// ```
/// use streamalloc::replay::{ReplayOptions, MAX_STREAMS};
///
/// assert_eq!(ReplayOptions::default().max_streams, MAX_STREAMS);
/// ```
pub const MAX_STREAMS: usize = 1024;

/// A replay's streams, by logged handle.
#[derive(Debug)]
pub(crate) struct ReplayStreams {
    max: usize,
    own: FxHashMap<u64, Stream>,
    /// Where events of streams past `max` run; made at the first.
    shared: Option<Stream>,
}

/// Where [`ReplayStreams::get`] put an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placed {
    /// On its logged stream's stream, made earlier.
    Known,
    /// On its logged stream's stream, made just now.
    New,
    /// On the shared stream: its logged stream is past the cap.
    OverLimit,
}

impl ReplayStreams {
    /// Streams of their own for at most `max` logged streams.
    pub(crate) fn new(max: usize) -> Self {
        ReplayStreams {
            max,
            own: FxHashMap::default(),
            shared: None,
        }
    }

    /// Whether an event of `handle` would go to the shared stream.
    pub(crate) fn is_over_limit(&self, handle: u64) -> bool {
        !self.own.contains_key(&handle) && self.own.len() >= self.max
    }

    /// The stream an event of the logged stream `handle` runs on, made on `device` if it is
    /// the first, and where it went.
    ///
    /// # Errors
    /// Creating the stream failed.
    pub(crate) fn get(&mut self, handle: u64, device: &Device) -> Result<(&Stream, Placed)> {
        if self.is_over_limit(handle) {
            if self.shared.is_none() {
                self.shared = Some(Stream::new(device)?);
            }
            let shared = self.shared.as_ref().expect("made above");
            return Ok((shared, Placed::OverLimit));
        }
        Ok(match self.own.entry(handle) {
            std::collections::hash_map::Entry::Occupied(e) => (&*e.into_mut(), Placed::Known),
            std::collections::hash_map::Entry::Vacant(e) => {
                (&*e.insert(Stream::new(device)?), Placed::New)
            }
        })
    }

    /// [`get`](Self::get) for the event of `handle` on `line`, with a replay's errors: in
    /// `strict` mode a stream past the cap is refused.
    ///
    /// # Errors
    /// [`ReplayError::TooManyStreams`] (strict); [`ReplayError::Resource`] when creating the
    /// stream failed.
    pub(crate) fn place(
        &mut self,
        handle: u64,
        line: usize,
        device: &Device,
        strict: bool,
    ) -> ReplayResult<(&Stream, Placed)> {
        if strict && self.is_over_limit(handle) {
            return Err(ReplayError::TooManyStreams {
                line,
                limit: self.max,
            });
        }
        self.get(handle, device)
            .map_err(|error| ReplayError::Resource { line, error })
    }

    /// The stream events of `handle` ran on, if any did.
    pub(crate) fn of(&self, handle: u64) -> Option<&Stream> {
        self.own.get(&handle).or(self.shared.as_ref())
    }

    /// Logged streams with a stream of their own.
    pub(crate) fn len(&self) -> usize {
        self.own.len()
    }

    /// Every stream made, the shared one included.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Stream> {
        self.own.values().chain(self.shared.as_ref())
    }
}
