//! The wait path of an [`Allocate`]: queueing, the head's retries, deadlines and deadlock
//! checks, out of line from the fast path of its first poll (in `memory_resource.rs`).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_timer::Delay;
use std::future::Future;

use super::availability::WaitEnd;
use super::memory_resource::{
    can_wait, check_resource, held, never_fitting, Allocate, MemoryResource, Wait,
};
use crate::error::{Error, Result};
use crate::resource::device_ptr::DevicePtr;

impl<R: MemoryResource + ?Sized> Allocate<'_, R> {
    /// Whether a request of this size may wait for memory on this resource.
    fn can_wait(&self) -> bool {
        can_wait(self.mr, self.bytes)
    }

    /// The queue head's attempt: `None` to go on waiting, or the outcome. Out of memory ends
    /// the wait when nothing can come back for the request
    /// ([`may_regain_memory`](MemoryResource::may_regain_memory)); the attempt is repeated
    /// once first, in case the last free landed between the two.
    fn retry(&self) -> Option<Result<DevicePtr>> {
        let out_of_memory = |r: &Result<DevicePtr>| matches!(r, Err(e) if e.is_out_of_memory());
        let first = self.mr.try_allocate(self.bytes, self.stream);
        if !out_of_memory(&first) {
            return Some(first);
        }
        if self.mr.may_regain_memory(self.bytes) {
            return self.would_deadlock().map(Err);
        }
        let second = self.mr.try_allocate(self.bytes, self.stream);
        if out_of_memory(&second) && self.mr.may_regain_memory(self.bytes) {
            return self.would_deadlock().map(Err);
        }
        Some(second)
    }

    /// [`Error::WouldDeadlock`] when the head's wait could never end: the resource is full to
    /// its [`capacity_limit`](MemoryResource::capacity_limit) for this request (so only a free
    /// of its own can help, whatever its upstream does), and every byte it has allocated is
    /// held by tasks waiting here. Conservative: see "Deadlock detection" on [`Allocate`].
    fn would_deadlock(&self) -> Option<Error> {
        let availability = self.mr.availability()?;
        let limit = self.mr.capacity_limit()?;
        let allocated = self.mr.memory_stats().allocated_bytes?;
        if allocated == 0 || allocated.saturating_add(self.bytes) <= limit {
            return None;
        }
        let held = availability.held_by_waiters()?;
        // The counts are a lower bound of what each waiting task holds, and the resource
        // counts at least what was asked for: equality means nobody else holds anything.
        (held.bytes >= allocated).then(|| Error::WouldDeadlock {
            requested: self.bytes,
            allocated,
            limit,
            held_by_waiters: held.bytes,
            waiting_tasks: held.tasks,
            device: self.stream.device().id(),
        })
    }

    /// An out-of-memory outcome for a request above the capacity limit, made
    /// [`Error::TooLarge`] whatever the resource said: the caller should hear that waiting
    /// cannot help, not how much is free now.
    fn never_fitting(&self, done: Result<DevicePtr>) -> Result<DevicePtr> {
        never_fitting(self.mr, done)
    }

    fn timed_out(&self, since: Instant) -> Error {
        Error::Timeout {
            requested: self.bytes,
            waited: since.elapsed(),
            device: self.stream.device().id(),
        }
    }

    /// Leaves the wait queue (if queued), counting how the wait ended.
    fn leave_queue(&mut self, end: WaitEnd) {
        if let Some(wait) = self.wait.take() {
            self.leave(&wait, end);
        }
    }

    /// Leaves the wait queue that `wait` is in, counting how the wait ended.
    #[cold]
    pub(super) fn leave(&self, wait: &Wait, end: WaitEnd) {
        if let Some(a) = self.mr.availability() {
            a.finish(&wait.waiter, end, wait.since.elapsed());
        }
    }

    /// A first poll whose attempt failed: waits if it is out of memory and may wait.
    #[cold]
    #[inline(never)]
    pub(super) fn poll_failed(
        &mut self,
        cx: &mut Context<'_>,
        e: Error,
    ) -> Poll<Result<DevicePtr>> {
        if e.is_out_of_memory() && self.can_wait() {
            return self.poll_wait(cx, true);
        }
        Poll::Ready(self.never_fitting(Err(e)))
    }

    /// Every poll but a first one served at once. `out_of_memory`: this is the first poll,
    /// nobody was queued, and the fast path's attempt found no memory (the request may wait).
    /// Otherwise a first poll here found waiters ahead of it.
    #[cold]
    #[inline(never)]
    pub(super) fn poll_wait(
        &mut self,
        cx: &mut Context<'_>,
        out_of_memory: bool,
    ) -> Poll<Result<DevicePtr>> {
        let this = self;
        let just_queued = this.wait.is_none();
        if just_queued {
            if !out_of_memory {
                // Behind other waiters, but checked as the fast path would be first: a request
                // that is wrong on its face fails now instead of waiting its turn.
                if let Err(e) =
                    check_resource(this.mr, this.stream, "MemoryResource::allocate(stream)")
                {
                    return Poll::Ready(Err(e));
                }
                if this.bytes == 0 || !this.can_wait() {
                    let done = this.mr.try_allocate(this.bytes, this.stream);
                    return Poll::Ready(this.never_fitting(done));
                }
            }
            let Some(availability) = this.mr.availability() else {
                unreachable!("can_wait")
            };
            let timer = this
                .deadline
                .map(|d| Delay::new(d.saturating_duration_since(Instant::now())));
            this.wait = Some(Box::new(Wait {
                waiter: availability.push(cx.waker(), this.priority),
                since: Instant::now(),
                timer,
            }));
        }
        let availability = this.mr.availability().expect("queued on it");
        let wait = this.wait.as_mut().expect("queued above");
        wait.waiter.set_waker(cx.waker());
        // Takes the turn it was told of (one not taken for long passes to the next waiter).
        if availability.take_turn(&wait.waiter) {
            // Queued before retrying: a free from now on finds this waiter and wakes it.
            if let Some(done) = this.retry() {
                // Only a request that got memory passed the waiters behind it over.
                this.leave_queue(if done.is_ok() {
                    WaitEnd::Served
                } else {
                    WaitEnd::Failed
                });
                return Poll::Ready(held(this.mr, this.bytes, done));
            }
        } else if just_queued {
            // The head checks for a deadlock when its retry fails; a waiter that joins behind
            // it may be the last holder to start waiting, so it checks once as it joins.
            if let Some(e) = this.would_deadlock() {
                this.leave_queue(WaitEnd::Failed);
                return Poll::Ready(Err(e));
            }
        }
        let wait = this.wait.as_mut().expect("still queued");
        if let Some(timer) = &mut wait.timer {
            if Pin::new(timer).poll(cx).is_ready() {
                let since = wait.since;
                this.leave_queue(WaitEnd::TimedOut);
                return Poll::Ready(Err(this.timed_out(since)));
            }
        }
        Poll::Pending
    }
}
