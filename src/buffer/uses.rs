//! The use state of a buffer: which stream owns it, what that owner must still wait for, and
//! where other streams last read it.
//!
//! This is the algorithm behind [`DeviceBuffer`](super::DeviceBuffer)'s automatic waits; the
//! buffer only decides *when* to call it.
//!
//! A hand-off records where the old owner's work (and every read) ends, but the new owner waits
//! for those events only just before its first use of the buffer ([`Locked::ready`]), where a
//! CUDA programmer would put the `cuStreamWaitEvent` by hand. Waiting at the hand-off itself
//! would serialize pipelines: a producer task that runs ahead hands on many batches before the
//! consumer uses the first, and the consumer's stream would queue every one of those waits ahead
//! of its work on the first batch.

use std::ops::DerefMut;

use parking_lot::{Mutex, MutexGuard};

use crate::error::Result;
use crate::stream::{Event, Stream};

/// Which stream owns a buffer, what it must wait for before it next uses it, and which reads
/// by other streams its owner is not yet ordered after.
///
/// The owner lives outside the lock: it changes only through `&mut self`
/// ([`hand_to`](Uses::hand_to)), so `&self` may lend it out for as long as the buffer is
/// borrowed (cudarc's `DeviceSlice::stream` returns a reference), while `&self` paths lock the
/// rest ([`lock`](Uses::lock)) and change it.
///
/// Invariants:
/// - `handed` and `readers` each hold at most one event per stream (the latest: events of one
///   stream complete in order, so a newer one covers an older one), and none of `owner`.
/// - While `handed` is not empty, the owner has not used the buffer since it was handed over:
///   every path that enqueues work on the owner goes through [`ready`](Locked::ready) first.
/// - Every write of the buffer by an earlier owner is ordered before one of `handed` or before
///   a point of `owner` that the owner's work from now on follows.
/// - Every read of the buffer on a stream other than `owner` that has been enqueued through the
///   buffer's API is ordered before one of `readers` or `handed`, before a point of `owner` that
///   the owner's work from now on follows, or is on one of `pending`.
/// - `pending` holds each stream at most once, never `owner`, with the number of reads begun
///   there and not yet ended (a read through cudarc never ends: it stays until settled).
#[derive(Debug)]
pub(crate) struct Uses {
    owner: Stream,
    state: Mutex<UseState>,
}

/// What [`Uses`] changes under its lock.
#[derive(Debug)]
pub(crate) struct UseState {
    /// Events the owner waits for before its first use since the hand-off that recorded them:
    /// where the earlier owners' work and the reads it was handed over after end.
    handed: Vec<Event>,
    readers: Vec<Event>,
    /// An event on the owner right after its latest use of the buffer, when that use came with
    /// one (a copy's completion event): a hand-off or a reader orders the other stream after
    /// it instead of after an event recorded then, which would also cover work the owner queued
    /// for other buffers since. Cleared by every use that comes without one
    /// ([`ready`](Locked::ready)).
    last_use: Option<Event>,
    /// Streams handed the buffer's address for reads the crate does not enqueue itself (a
    /// [`ReadGuard`](super::ReadGuard), a kernel argument). Their events are recorded lazily,
    /// when the owner next has to be ordered after its readers: by then every such read has
    /// been enqueued (the reads borrow the buffer), so forgetting a guard cannot let a write or
    /// the free overtake them.
    pending: Vec<(Stream, usize)>,
    /// `false` only in negative-control tests: hand-offs and reads skip their waits.
    handoff_waits: bool,
}

impl UseState {
    /// An event on `owner` (the buffer's) after its work on the buffer so far: the last use's,
    /// or one recorded now.
    fn after_last_use(&self, owner: &Stream) -> Result<Event> {
        match &self.last_use {
            Some(event) => Ok(event.clone()),
            None => owner.record(),
        }
    }
}

/// The use state with its lock held (or borrowed exclusively): the owner and what changes.
/// `S` is the lock's guard, or `&mut UseState` on `&mut` paths.
pub(crate) struct Locked<'a, S> {
    owner: &'a Stream,
    state: S,
}

/// Puts `event` in `events`, replacing an older event of its stream (events of one stream
/// complete in order).
fn keep_latest(events: &mut Vec<Event>, event: Event) {
    match events.iter_mut().find(|e| e.stream() == event.stream()) {
        Some(slot) => *slot = event,
        None => events.push(event),
    }
}

impl Uses {
    pub(crate) fn new(owner: Stream) -> Self {
        Uses {
            owner,
            state: Mutex::new(UseState {
                handed: Vec::new(),
                readers: Vec::new(),
                last_use: None,
                pending: Vec::new(),
                handoff_waits: true,
            }),
        }
    }

    /// The owner, for identity only (its id, its device, comparisons), borrowed for as long as
    /// `self` is. Work enqueued on it for the buffer must go through
    /// [`ready`](Locked::ready).
    pub(crate) fn owner(&self) -> &Stream {
        &self.owner
    }

    /// The use state, locked.
    pub(crate) fn lock(&self) -> Locked<'_, MutexGuard<'_, UseState>> {
        Locked {
            owner: &self.owner,
            state: self.state.lock(),
        }
    }

    /// The use state, without locking (`self` is borrowed exclusively).
    pub(crate) fn get_mut(&mut self) -> Locked<'_, &mut UseState> {
        Locked {
            owner: &self.owner,
            state: self.state.get_mut(),
        }
    }

    #[cfg(test)]
    pub(crate) fn disable_handoff_waits(&mut self) {
        self.state.get_mut().handoff_waits = false;
    }

    /// Hands ownership to `new_owner`: it is to wait for the old owner's work so far and for
    /// every outstanding read, before its first use of the buffer ([`ready`](Locked::ready)).
    /// The events are recorded now; nothing is enqueued on `new_owner`. On error the state is
    /// unchanged.
    pub(crate) fn hand_to(&mut self, new_owner: &Stream) -> Result<()> {
        self.get_mut().settle_pending()?;
        let state = self.state.get_mut();
        if !state.handoff_waits {
            // Negative control: skip the waits, but keep the old owner's last point as a read
            // so that the free stays ordered after it.
            if new_owner != &self.owner {
                let last = self.owner.record()?;
                self.owner = new_owner.clone();
                self.get_mut().add_read(last);
            }
            let state = self.state.get_mut();
            state.readers.retain(|e| e.stream() != new_owner);
            return Ok(());
        }
        if new_owner != &self.owner && state.handed.is_empty() {
            // The old owner used the buffer since it got it: its work so far is to be waited
            // for. (With a hand-off still pending it did not: the new owner inherits those
            // events instead, and waits for no unrelated work queued on the old owner since.)
            // Its last use's event where it has one: not the work it queued since.
            let last = state.after_last_use(&self.owner)?;
            state.handed.push(last);
        }
        for event in state.readers.drain(..) {
            keep_latest(&mut state.handed, event);
        }
        // The new owner's own work is ordered by the stream itself.
        state.handed.retain(|e| e.stream() != new_owner);
        state.last_use = None;
        self.owner = new_owner.clone();
        Ok(())
    }
}

impl<'a, S: DerefMut<Target = UseState>> Locked<'a, S> {
    /// The owner, for identity only: see [`Uses::owner`].
    pub(crate) fn owner(&self) -> &'a Stream {
        self.owner
    }

    /// The owner, after it has waited for the hand-off that gave it the buffer (nothing when
    /// that is done already): what every path that enqueues work on the owner uses. On error
    /// the events stay, to be waited for at the next use (extra waits are harmless).
    pub(crate) fn ready(&mut self) -> Result<&'a Stream> {
        let state = &mut *self.state;
        // The use about to be enqueued comes after the last one with an event.
        state.last_use = None;
        if !state.handed.is_empty() {
            for event in &state.handed {
                self.owner.wait(event)?;
            }
            state.handed.clear();
        }
        Ok(self.owner)
    }

    /// Notes the event recorded right after the use just enqueued on the owner (a copy's): the
    /// buffer's last use, until the next ([`ready`](Locked::ready) forgets it).
    pub(crate) fn used_until(&mut self, event: Option<Event>) {
        debug_assert!(
            event.as_ref().is_none_or(|e| e.stream() == self.owner),
            "a last use on another stream than the owner"
        );
        self.state.last_use = event;
    }

    /// Blocks this thread until the pending hand-off's events have passed, then forgets them:
    /// the fallback of a caller that cannot return the error of [`ready`](Locked::ready).
    pub(crate) fn block_for_hand_off(&mut self) -> Result<()> {
        for event in &self.state.handed {
            event.synchronize_blocking()?;
        }
        self.state.handed.clear();
        Ok(())
    }

    /// The number of outstanding reader events and pending readers (for tests and `Debug`).
    pub(crate) fn reader_count(&self) -> usize {
        self.state.readers.len() + self.state.pending.len()
    }

    /// Records that the buffer was read on `event`'s stream up to `event`.
    pub(crate) fn add_read(&mut self, event: Event) {
        debug_assert!(
            self.state
                .readers
                .iter()
                .filter(|e| e.stream() == event.stream())
                .count()
                <= 1,
            "more than one reader event for one stream"
        );
        if event.stream() == self.owner {
            return;
        }
        if let Some(slot) = self
            .state
            .readers
            .iter_mut()
            .find(|e| e.stream() == event.stream())
        {
            *slot = event;
            return;
        }
        // A new stream: drop the entries that are already complete before growing (a query is
        // cheap and keeps the list as short as the set of streams still reading).
        self.state
            .readers
            .retain(|e| !matches!(e.is_complete(), Ok(true)));
        self.state.readers.push(event);
    }

    /// Records an event on `reader` after a read that this crate enqueued there itself and adds
    /// it as a read. If the event cannot be recorded, falls back to blocking until `reader` is
    /// idle (the read is then complete and nothing need be recorded), because letting the
    /// owner free memory under a pending copy is not an option; the recording error then goes to
    /// the device's deferred errors.
    pub(crate) fn add_read_now(&mut self, reader: &Stream) -> Result<()> {
        if reader == self.owner {
            return Ok(());
        }
        match reader.record() {
            Ok(event) => {
                self.add_read(event);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(stream = %reader.id(),
                    "recording a read failed; synchronizing the reading stream instead");
                // The fallback hides the failure from the caller: the device keeps it.
                reader.device().defer_error(e);
                reader.synchronize_blocking()
            }
        }
    }

    /// Starts reads on `reader` that the caller enqueues itself: `reader` waits for the owner's
    /// work so far, and is kept as a pending reader until [`end_read`](Locked::end_read) or until
    /// the owner is next ordered after its readers, whichever comes first. On the owner itself
    /// this is the owner's use: it waits for a pending hand-off.
    pub(crate) fn begin_read(&mut self, reader: &Stream) -> Result<()> {
        if reader == self.owner {
            self.ready()?;
            return Ok(());
        }
        if self.state.handoff_waits {
            self.order_after_owner(reader)?;
        }
        match self.state.pending.iter_mut().find(|(s, _)| s == reader) {
            Some((_, open)) => *open += 1,
            None => self.state.pending.push((reader.clone(), 1)),
        }
        Ok(())
    }

    /// Ends the reads [`begin_read`](Locked::begin_read) started on `reader`: records an event
    /// there now (so later, unrelated work on `reader` is not waited for).
    pub(crate) fn end_read(&mut self, reader: &Stream) -> Result<()> {
        if reader == self.owner {
            return Ok(());
        }
        let event = reader.record()?;
        // Other reads begun on `reader` may enqueue more work after this event: the stream
        // stays pending until the last of them ends (or the owner settles it).
        if let Some(i) = self.state.pending.iter().position(|(s, _)| s == reader) {
            self.state.pending[i].1 -= 1;
            if self.state.pending[i].1 == 0 {
                self.state.pending.swap_remove(i);
            }
        }
        self.add_read(event);
        Ok(())
    }

    /// Turns every pending reader into a recorded event (or, where recording fails, waits for
    /// that stream to go idle: see [`add_read_now`](Locked::add_read_now)).
    fn settle_pending(&mut self) -> Result<()> {
        while let Some((reader, _)) = self.state.pending.last().cloned() {
            self.add_read_now(&reader)?;
            self.state.pending.pop();
        }
        Ok(())
    }

    /// Makes `stream` wait for the writes to the buffer enqueued so far: on the owner, the
    /// owner's pending hand-off; on another stream, that hand-off's events while the owner has
    /// not used the buffer since, else an event recorded on the owner now.
    pub(crate) fn order_after_owner(&mut self, stream: &Stream) -> Result<()> {
        if stream == self.owner {
            self.ready()?;
        } else if !self.state.handed.is_empty() {
            for event in &self.state.handed {
                if event.stream() != stream {
                    stream.wait(event)?;
                }
            }
        } else {
            let event = self.state.after_last_use(self.owner)?;
            stream.wait(&event)?;
        }
        Ok(())
    }

    /// Makes the owner wait for its pending hand-off and every outstanding read, then forgets
    /// them: the owner may then write or free the memory. On error nothing is forgotten (extra
    /// waits are harmless).
    pub(crate) fn order_owner_after_readers(&mut self) -> Result<()> {
        self.settle_pending()?;
        self.ready()?;
        for event in &self.state.readers {
            self.owner.wait(event)?;
        }
        self.state.readers.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
