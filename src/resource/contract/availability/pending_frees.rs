//! Stream-ordered frees that give memory back only when the device passes them (a driver
//! pool's `cuMemFreeAsync`): counted until then, and their completion wakes the waiters.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use futures::task::ArcWake;

use super::Availability;
use crate::stream::{Event, Stream};

/// The frees of a resource whose memory comes back only when the device reaches them, and the
/// [`Availability`] their completion fires.
///
/// A free is counted at once ([`freed`](PendingFrees::freed)), which is what makes
/// [`may_regain_memory`](crate::MemoryResource::may_regain_memory) true while it is pending.
/// Watching it costs an event record and an arm of the completion driver, so it is done only
/// when someone waits: at the free if a request waits already (here or at a resource stacked
/// on this one), else when a request that failed asks whether memory may come back
/// ([`may_regain`](PendingFrees::may_regain)), which records one event per stream that freed
/// since (covering all its frees before it). The completion then subtracts the bytes and
/// notifies, from the completion driver: no synchronize by the user.
#[derive(Debug, Default)]
pub(crate) struct PendingFrees {
    availability: Availability,
    /// Bytes freed whose completion has not been seen.
    bytes: AtomicUsize,
    /// Streams with frees no event watches yet, with their bytes (one entry per stream). Holds
    /// the streams until someone waits or the resource goes.
    unwatched: parking_lot::Mutex<Vec<(Stream, usize)>>,
    /// Events watching frees. Dropped here, on a user thread, once complete: never in the
    /// completion callback, which must make no driver calls.
    watched: parking_lot::Mutex<Vec<(Event, Arc<Watch>)>>,
}

/// One watched event: when it completes, its bytes are back.
#[derive(Debug)]
struct Watch {
    frees: Weak<PendingFrees>,
    bytes: usize,
    fired: AtomicBool,
}

impl Watch {
    fn fire(&self) {
        if self.fired.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(frees) = self.frees.upgrade() {
            frees.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
            frees.availability.notify();
        }
    }
}

impl ArcWake for Watch {
    /// Called by the completion driver once the event is complete (only a flag, a counter and
    /// wake-ups: no driver call).
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.fire();
    }
}

impl PendingFrees {
    pub(crate) fn availability(&self) -> &Availability {
        &self.availability
    }

    /// `bytes` were freed on `stream`, after everything already enqueued there.
    pub(crate) fn freed(self: &Arc<Self>, bytes: usize, stream: &Stream) {
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        // The check for waiters is made under the lock that `may_regain` takes: a waiter counts
        // itself before it takes that lock, so either this check sees it (and watches the free)
        // or its `may_regain` comes after and finds the free parked here. Checked before the
        // lock, a waiter could count itself, retry, find nothing parked, and wait for ever
        // while this free was parked unwatched.
        let mut unwatched = self.unwatched.lock();
        if self.availability.anyone_waiting() {
            drop(unwatched);
            self.watch(stream, bytes);
        } else {
            match unwatched.iter_mut().find(|(s, _)| s.id() == stream.id()) {
                Some((_, n)) => *n += bytes,
                None => unwatched.push((stream.clone(), bytes)),
            }
        }
    }

    /// Whether a free is still pending; watches the unwatched ones first, so that their
    /// completion notifies. A slow path: asked after a request failed.
    pub(crate) fn may_regain(self: &Arc<Self>) -> bool {
        let unwatched = std::mem::take(&mut *self.unwatched.lock());
        for (stream, bytes) in unwatched {
            self.watch(&stream, bytes);
        }
        self.watched
            .lock()
            .retain(|(_, w)| !w.fired.load(Ordering::Acquire));
        self.bytes.load(Ordering::Acquire) > 0
    }

    /// Records an event on `stream` (after its frees) and has the completion driver fire the
    /// watch of `bytes` when the device passes it.
    fn watch(self: &Arc<Self>, stream: &Stream, bytes: usize) {
        let watch = Arc::new(Watch {
            frees: Arc::downgrade(self),
            bytes,
            fired: AtomicBool::new(false),
        });
        let mut event = match stream.record() {
            Ok(e) => e,
            Err(e) => {
                // Without an event nothing would ever say the free is done: count it as done
                // (a waiter then fails rather than hangs) and report why.
                stream.device().defer_error(e);
                watch.fire();
                return;
            }
        };
        let waker = futures::task::waker(watch.clone());
        match Pin::new(&mut event).poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(r) => {
                if let Err(e) = r {
                    stream.device().defer_error(e);
                }
                watch.fire();
            }
            Poll::Pending => {
                let mut watched = self.watched.lock();
                watched.retain(|(_, w)| !w.fired.load(Ordering::Acquire));
                watched.push((event, watch));
            }
        }
    }
}
