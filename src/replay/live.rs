//! The one reading of a log's live set: which logged pointers are allocated, and what each
//! `allocate` and `free` means given them. Every pass over a log (the scan and the replay)
//! asks it, so that they agree on every event.
//!
//! The rules, decided here only:
//! - an allocation of a pointer that is live already is inconsistent (a free is missing);
//! - allocations logged with the null pointer (0 bytes as a rule) cannot be told apart: each
//!   free of the null pointer takes the latest of them;
//! - a free of the null pointer with none of them live is a no-op, as `free(nullptr)` is in RMM;
//! - a free of a pointer whose allocation was refused in this pass is no second failure;
//! - any other free of a pointer that is not live is inconsistent.

use rustc_hash::{FxHashMap, FxHashSet};

use super::failure::ReplayFailureKind;
use crate::resource::DevicePtr;
use crate::rmm_csv::Event;

/// A live allocation: as logged, with what the pass keeps for it (`value`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held<T> {
    /// The pointer as logged.
    pub(crate) logged: DevicePtr,
    /// The size as logged at the allocation.
    pub(crate) bytes: usize,
    /// The allocation's line.
    pub(crate) line: usize,
    pub(crate) value: T,
}

impl<T> Held<T> {
    /// The free `e` of this allocation logs another size.
    pub(crate) fn size_mismatch(&self, e: &Event) -> Option<ReplayFailureKind> {
        (self.bytes != e.bytes).then_some(ReplayFailureKind::SizeMismatch {
            allocated: self.bytes,
        })
    }
}

/// The logged pointers live at a point of a log, and their bytes.
#[derive(Debug)]
pub(crate) struct LiveSet<T> {
    live: FxHashMap<DevicePtr, Held<T>>,
    /// Allocations of the null pointer, latest last.
    null: Vec<Held<T>>,
    /// Logged pointers whose allocation was refused in this pass.
    refused: FxHashSet<DevicePtr>,
    bytes: usize,
    peak: usize,
    peak_line: usize,
}

impl<T> Default for LiveSet<T> {
    fn default() -> Self {
        LiveSet {
            live: FxHashMap::default(),
            null: Vec::new(),
            refused: FxHashSet::default(),
            bytes: 0,
            peak: 0,
            peak_line: 0,
        }
    }
}

impl<T> LiveSet<T> {
    /// Whether the allocation `e` can be made: not when its pointer is live already.
    pub(crate) fn check_allocate(&self, e: &Event) -> Result<(), ReplayFailureKind> {
        // The null pointer is never in `live`: its allocations go to `null`.
        match self.live.get(&e.ptr) {
            Some(held) => Err(ReplayFailureKind::PointerAlreadyLive {
                allocated_at: held.line,
            }),
            None => Ok(()),
        }
    }

    /// The allocation `e` was made: its pointer is live, with `value`.
    pub(crate) fn allocated(&mut self, e: &Event, value: T) {
        self.refused.remove(&e.ptr);
        let held = Held {
            logged: e.ptr,
            bytes: e.bytes,
            line: e.line,
            value,
        };
        self.restore(held);
        if self.bytes > self.peak {
            self.peak = self.bytes;
            self.peak_line = e.line;
        }
    }

    /// The allocation `e` was refused: its free is no second failure.
    pub(crate) fn refused(&mut self, e: &Event) {
        if !e.ptr.is_null() {
            self.refused.insert(e.ptr);
        }
    }

    /// The free `e`: the allocation it ends, taken out of the set; `None` when it ends none and
    /// that is no failure (see the module's rules).
    ///
    /// # Errors
    /// [`ReplayFailureKind::UnknownPointer`] for a free of a pointer that is not live.
    pub(crate) fn free(&mut self, e: &Event) -> Result<Option<Held<T>>, ReplayFailureKind> {
        let held = if e.ptr.is_null() {
            self.null.pop()
        } else {
            self.live.remove(&e.ptr)
        };
        match held {
            Some(held) => {
                self.bytes = self.bytes.saturating_sub(held.bytes);
                Ok(Some(held))
            }
            None if e.ptr.is_null() || self.refused.remove(&e.ptr) => Ok(None),
            None => Err(ReplayFailureKind::UnknownPointer),
        }
    }

    /// Puts an allocation (back) in the set.
    pub(crate) fn restore(&mut self, held: Held<T>) {
        self.bytes = self.bytes.saturating_add(held.bytes);
        if held.logged.is_null() {
            self.null.push(held);
        } else {
            self.live.insert(held.logged, held);
        }
    }

    /// Takes every allocation left, in log order.
    pub(crate) fn drain(&mut self) -> Vec<Held<T>> {
        let mut left: Vec<Held<T>> = self
            .live
            .drain()
            .map(|(_, held)| held)
            .chain(self.null.drain(..))
            .collect();
        left.sort_unstable_by_key(|held| held.line);
        self.bytes = 0;
        left
    }

    /// The most logged bytes live at once so far (saturating).
    pub(crate) fn peak(&self) -> usize {
        self.peak
    }

    /// The line of the allocation that first reached [`peak`](Self::peak) (0: none).
    pub(crate) fn peak_line(&self) -> usize {
        self.peak_line
    }
}
