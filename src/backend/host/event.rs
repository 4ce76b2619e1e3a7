//! Host events: positions in a host stream's queue.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::backend::seam::BackendEvent;
use crate::error::Result;

use super::queue::Queue;

/// A position in a host stream's queue.
pub(crate) struct HostEvent {
    pub(super) queue: Arc<Queue>,
    pub(super) position: u64,
}

impl fmt::Debug for HostEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostEvent")
            .field("position", &self.position)
            .finish()
    }
}

impl BackendEvent for HostEvent {
    fn query(&self) -> Result<bool> {
        self.queue.memory.note_call();
        if self.queue.completed.load(Ordering::Acquire) < self.position {
            return Ok(false);
        }
        self.queue.fault_at(self.position).map(|()| true)
    }

    fn synchronize_blocking(&self) -> Result<()> {
        self.queue.memory.note_call();
        self.queue.wait_for(self.position);
        self.queue.fault_at(self.position)
    }
}
