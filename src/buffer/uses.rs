//! The use state of a buffer: which stream owns it and where other streams last read it.
//!
//! This is the algorithm behind [`DeviceBuffer`](super::DeviceBuffer)'s automatic waits; the
//! buffer only decides *when* to call it.

use crate::error::Result;
use crate::stream::{Event, Stream};

/// Which stream owns a buffer and which reads by other streams its owner is not yet ordered
/// after.
///
/// Invariants:
/// - `readers` holds at most one event per stream (the latest: events of one stream complete in
///   order, so a newer one covers an older one).
/// - No event in `readers` is of `owner`: the owner's own work is ordered by the stream itself.
/// - Every read of the buffer on a stream other than `owner` that has been enqueued through the
///   buffer's API is ordered before one of `readers`, before a point of `owner` that the owner's
///   work from now on follows, or is on one of `pending`.
/// - `pending` holds each stream at most once, never `owner`, with the number of reads begun
///   there and not yet ended (a read through cudarc never ends: it stays until settled).
#[derive(Debug)]
pub(crate) struct Uses {
    owner: Stream,
    readers: Vec<Event>,
    /// Streams handed the buffer's address for reads the crate does not enqueue itself (a
    /// [`ReadGuard`](super::ReadGuard), a kernel argument). Their events are recorded lazily,
    /// when the owner next has to be ordered after its readers: by then every such read has
    /// been enqueued (the reads borrow the buffer), so forgetting a guard cannot let a write or
    /// the free overtake them.
    pending: Vec<(Stream, usize)>,
    /// `false` only in negative-control tests: hand-offs and reads skip their waits.
    handoff_waits: bool,
}

impl Uses {
    pub(crate) fn new(owner: Stream) -> Self {
        Uses {
            owner,
            readers: Vec::new(),
            pending: Vec::new(),
            handoff_waits: true,
        }
    }

    pub(crate) fn owner(&self) -> &Stream {
        &self.owner
    }

    /// The number of outstanding reader events and pending readers (for tests and `Debug`).
    pub(crate) fn reader_count(&self) -> usize {
        self.readers.len() + self.pending.len()
    }

    #[cfg(test)]
    pub(crate) fn disable_handoff_waits(&mut self) {
        self.handoff_waits = false;
    }

    /// Records that the buffer was read on `event`'s stream up to `event`.
    pub(crate) fn add_read(&mut self, event: Event) {
        debug_assert!(
            self.readers
                .iter()
                .filter(|e| e.stream() == event.stream())
                .count()
                <= 1,
            "more than one reader event for one stream"
        );
        if event.stream() == &self.owner {
            return;
        }
        if let Some(slot) = self
            .readers
            .iter_mut()
            .find(|e| e.stream() == event.stream())
        {
            *slot = event;
            return;
        }
        // A new stream: drop the entries that are already complete before growing (a query is
        // cheap and keeps the list as short as the set of streams still reading).
        self.readers
            .retain(|e| !matches!(e.is_complete(), Ok(true)));
        self.readers.push(event);
    }

    /// Records an event on `reader` after a read that this crate enqueued there itself and adds
    /// it as a read. If the event cannot be recorded, falls back to blocking until `reader` is
    /// idle (the read is then complete and nothing need be recorded), because letting the
    /// owner free memory under a pending copy is not an option; the recording error then goes to
    /// the device's deferred errors.
    pub(crate) fn add_read_now(&mut self, reader: &Stream) -> Result<()> {
        if reader == &self.owner {
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
    /// work so far, and is kept as a pending reader until [`end_read`](Uses::end_read) or until
    /// the owner is next ordered after its readers, whichever comes first.
    pub(crate) fn begin_read(&mut self, reader: &Stream) -> Result<()> {
        if reader == &self.owner {
            return Ok(());
        }
        if self.handoff_waits {
            self.order_after_owner(reader)?;
        }
        match self.pending.iter_mut().find(|(s, _)| s == reader) {
            Some((_, open)) => *open += 1,
            None => self.pending.push((reader.clone(), 1)),
        }
        Ok(())
    }

    /// Ends the reads [`begin_read`](Uses::begin_read) started on `reader`: records an event
    /// there now (so later, unrelated work on `reader` is not waited for).
    pub(crate) fn end_read(&mut self, reader: &Stream) -> Result<()> {
        if reader == &self.owner {
            return Ok(());
        }
        let event = reader.record()?;
        // Other reads begun on `reader` may enqueue more work after this event: the stream
        // stays pending until the last of them ends (or the owner settles it).
        if let Some(i) = self.pending.iter().position(|(s, _)| s == reader) {
            self.pending[i].1 -= 1;
            if self.pending[i].1 == 0 {
                self.pending.swap_remove(i);
            }
        }
        self.add_read(event);
        Ok(())
    }

    /// Turns every pending reader into a recorded event (or, where recording fails, waits for
    /// that stream to go idle: see [`add_read_now`](Uses::add_read_now)).
    fn settle_pending(&mut self) -> Result<()> {
        while let Some((reader, _)) = self.pending.last().cloned() {
            self.add_read_now(&reader)?;
            self.pending.pop();
        }
        Ok(())
    }

    /// Makes `stream` wait for the owner's work enqueued so far; nothing when `stream` is the
    /// owner.
    pub(crate) fn order_after_owner(&self, stream: &Stream) -> Result<()> {
        if stream != &self.owner {
            let event = self.owner.record()?;
            stream.wait(&event)?;
        }
        Ok(())
    }

    /// Makes the owner wait for every outstanding read, then forgets them: the owner may then
    /// write or free the memory. On error nothing is forgotten (extra waits are harmless).
    pub(crate) fn order_owner_after_readers(&mut self) -> Result<()> {
        self.settle_pending()?;
        for event in &self.readers {
            self.owner.wait(event)?;
        }
        self.readers.clear();
        Ok(())
    }

    /// Hands ownership to `new_owner`: it waits for the old owner's work so far and for every
    /// outstanding read. On error the state is unchanged.
    pub(crate) fn hand_to(&mut self, new_owner: &Stream) -> Result<()> {
        self.settle_pending()?;
        if !self.handoff_waits {
            // Negative control: skip the waits, but keep the old owner's last point as a read
            // so that the free stays ordered after it.
            if new_owner != &self.owner {
                let last = self.owner.record()?;
                self.owner = new_owner.clone();
                self.add_read(last);
            }
            self.readers.retain(|e| e.stream() != new_owner);
            return Ok(());
        }
        self.order_after_owner(new_owner)?;
        for event in &self.readers {
            if event.stream() != new_owner {
                new_owner.wait(event)?;
            }
        }
        self.readers.clear();
        self.owner = new_owner.clone();
        Ok(())
    }
}
