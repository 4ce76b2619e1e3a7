//! What each page of a mapped pool's range holds, and the pages a free left waiting for its
//! streams: the state `pages.rs` moves and the pool's `State` keeps.

use crate::stream::Event;

/// What a page of the range holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Page {
    Unmapped,
    Mapped { handle: u64, status: Status },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    /// Some live block touches it, or its release was given up because an event of a stream
    /// that freed into it reported an error (see `collect`): it stays mapped until a later
    /// free empties it again.
    InUse,
    /// Wholly free; releasable once the events of pending release `id` complete.
    Pending(u64),
    /// Wholly free and its frees have completed: releasable at once.
    Idle,
    /// Wholly free, kept under the release threshold with no event recorded yet: fenced
    /// (`fence`) only when it is to be released, so that a pool that keeps its pages mapped
    /// records no event per free. (A page whose unmap failed goes back to `Idle`, to be
    /// tried again by the next release.)
    Unfenced,
}

/// Pages emptied by one free, and the events after which they may be unmapped.
pub(super) struct PendingRelease {
    pub(super) id: u64,
    pub(super) pages: std::ops::Range<usize>,
    pub(super) events: Vec<Event>,
    /// Whether host functions after `events` will wake the wait queue (see `arm_wakeups`).
    pub(super) armed: bool,
}
