use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_timer::Delay;

use crate::error::{Error, Result};
use crate::resource::contract::availability::{WaitEnd, Waiter};
use crate::resource::{check_resource, DevicePtr, MemoryResource};
use crate::stream::Stream;
use crate::sync::Arc;

/// The future of [`MemoryResource::allocate`].
///
/// Its first poll is the synchronous fast path, [`MemoryResource::try_allocate`]: when memory
/// is there it resolves at once, with no allocation or lock of its own. When the resource is
/// out of memory, the request could ever fit
/// ([`capacity_limit`](MemoryResource::capacity_limit)) and the resource signals
/// [`availability`](MemoryResource::availability), the future joins the resource's wait
/// queue and resolves when memory comes back (see [`Availability`](crate::Availability) for the
/// fairness policy). It waits only while memory may come back for it
/// ([`may_regain_memory`](MemoryResource::may_regain_memory): an allocation is outstanding, a
/// free pending); otherwise it resolves to the out-of-memory error at once. A request behind
/// other waiters is checked as [`try_allocate`](MemoryResource::try_allocate) would check it
/// (its stream's device, its size against the capacity limit) before it joins the queue.
///
/// It works under any executor (tokio, `futures::executor::block_on`, …); deadlines use a
/// runtime-independent timer.
///
/// # Errors
/// [`Error::TooLarge`] at once, with the maximum, when the request is above the resource's
/// [`capacity_limit`](MemoryResource::capacity_limit) (whatever out-of-memory error the
/// resource itself gave); [`Error::OutOfMemory`] at once when nothing can come back for it or
/// the resource cannot make it wait; [`Error::DeviceMismatch`] before any wait when the
/// stream is of another device; [`Error::Timeout`] when a [`deadline`](Allocate::deadline) passes first;
/// [`Error::WouldDeadlock`] when it would wait for ever (below); any other error of
/// `try_allocate`.
///
/// # Deadlock detection
/// Off by default; a resource's wait queue turns it on with
/// [`Availability::set_deadlock_detection`](crate::Availability::set_deadlock_detection)
/// (the "reported wrongly" case below is why it is not on for everyone: a producer that hands
/// its buffers to a consumer and waits for more would be told it deadlocks). With it on, a
/// request that would wait for ever because every byte of a bounded resource is held by
/// tasks that are themselves waiting on it gets [`Error::WouldDeadlock`] instead (the head of
/// the queue checks when its retry fails, any other waiter once as it joins the queue).
/// Exactly, it is reported when all of these hold:
/// - the resource has a [`capacity_limit`](MemoryResource::capacity_limit) and reports its
///   allocated bytes ([`memory_stats`](MemoryResource::memory_stats)), and the request does not
///   fit beside them (`allocated + requested > limit`): only a free of the resource's own can
///   help, not its upstream;
/// - every waiter in the queue runs in a tokio task;
/// - the bytes those tasks got from awaited allocations of this resource
///   ([`allocate`](MemoryResource::allocate), `DeviceBuffer::new`, `DeviceVec::new`, …) since
///   the last time memory came back to it add up to all it has allocated.
///
/// Not detected (it waits, as before): holders outside tokio tasks (threads, `block_on`);
/// memory from [`try_allocate`](MemoryResource::try_allocate) or allocated before the last
/// free, growth or trim of the resource (each one forgets the counts, since it may have
/// returned any of them); sizes the resource rounds up (a [`LimitingAdaptor`] charges 256-byte
/// units: a task holding 1000 bytes counts 1000, the resource 1024, and the two no longer
/// match); waits spread over several resources (a cycle through two pools); a resource full
/// below its limit (fragmentation) or blocked by its upstream.
///
/// Reported wrongly (the limits of attributing memory to the task that awaited it): a task
/// that waits here while *another part of itself* (a branch of `join!`/`select!`) would free
/// what it holds, or while memory it allocated has been handed to another task or thread that
/// will free it. Such programs should not rely on a wait for memory they hold themselves;
/// the error says how much the waiters hold.
///
/// Cost, with detection on (off, nothing is counted): an awaited allocation that succeeds
/// inside a tokio task on a resource with a wait queue counts its bytes in its worker thread's own shard (a lock no other thread takes,
/// while there are no more threads than shards) and sets a shared flag if it is clear; the next
/// free after it clears the flag with one compare-exchange. No lock is shared between workers;
/// only a deadlock check sums the shards. Outside tasks, a thread-local read.
/// [`try_allocate`](MemoryResource::try_allocate) pays nothing.
///
/// [`LimitingAdaptor`]: crate::LimitingAdaptor
///
/// # Cancel safety
/// Dropping it before it resolves leaves nothing allocated, nothing reserved, and no waiter in
/// the queue; if it was the oldest waiter, the next one is woken in its place. Forgetting it
/// (`mem::forget`) while it waits leaks only its small waiter record: if it was told to retry,
/// its turn passes to the next waiter after a second (see
/// [`Availability`](crate::Availability)'s fairness), so later requests are not held.
#[must_use = "futures do nothing unless awaited"]
pub struct Allocate<'a, R: MemoryResource + ?Sized> {
    mr: &'a R,
    bytes: usize,
    stream: &'a Stream,
    deadline: Option<Instant>,
    priority: i32,
    wait: Option<Wait>,
}

/// The state of a request that is queued.
struct Wait {
    waiter: Arc<Waiter>,
    since: Instant,
    timer: Option<Delay>,
}

impl<'a, R: MemoryResource + ?Sized> Allocate<'a, R> {
    pub(crate) fn new(mr: &'a R, bytes: usize, stream: &'a Stream) -> Self {
        Allocate {
            mr,
            bytes,
            stream,
            deadline: None,
            priority: 0,
            wait: None,
        }
    }

    /// The number of bytes requested.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Gives up with [`Error::Timeout`] if the memory is not there by `deadline`.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use streamalloc::{CudaResource, Device, LimitingAdaptor, MemoryResource, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 1024);
    /// let held = mr.allocate(1024, &stream).await?;
    /// let err = mr.allocate(256, &stream).deadline(Instant::now() + Duration::from_millis(10)).await;
    /// assert!(matches!(err, Err(streamalloc::Error::Timeout { requested: 256, .. })));
    /// unsafe { mr.deallocate(held, 1024, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Gives up with [`Error::Timeout`] if the memory is not there within `timeout`, counted
    /// from this call.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.deadline(Instant::now() + timeout)
    }

    /// Serves this request before waiting requests of lower priority: higher is first, the
    /// default is 0, and requests of one priority are served in arrival order.
    ///
    /// A request that finds waiters of equal or higher priority queues behind them (it does
    /// not take the fast path past them); one that finds only waiters of lower priority
    /// passes them and tries at once. Priority is strict, with no ageing: a request waits for
    /// as long as requests of higher priority keep arriving and waiting before it, so a large
    /// low-priority request under a steady stream of high-priority ones may wait until the
    /// stream stops (or its [`deadline`](Allocate::deadline) passes). While a large request of
    /// high priority waits at the head, requests of lower priority behind it wait too, even
    /// those that would fit. Set before the first poll; a request already queued keeps its
    /// place.
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{CudaResource, Device, LimitingAdaptor, MemoryResource, Stream};
    ///
    /// # let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    /// # rt.block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 1024);
    /// let held = mr.allocate(1024, &stream).await?;
    /// let (m, s) = (mr.clone(), stream.clone());
    /// let queue = mr.availability().unwrap();
    /// let waiting = |n| async move {
    ///     while queue.stats().waiting < n {
    ///         tokio::time::sleep(Duration::from_millis(1)).await;
    ///     }
    /// };
    /// let low = tokio::spawn(async move { m.allocate(1024, &s).await });
    /// waiting(1).await;                                    // `low` waits first...
    /// let (m, s) = (mr.clone(), stream.clone());
    /// let high = tokio::spawn(async move { m.allocate(1024, &s).priority(1).await });
    /// waiting(2).await;
    /// unsafe { mr.deallocate(held, 1024, &stream) };
    /// let p = high.await.unwrap()?;                        // ...but `high` is served first
    /// assert!(!low.is_finished());
    /// unsafe { mr.deallocate(p, 1024, &stream) };
    /// let p = low.await.unwrap()?;
    /// unsafe { mr.deallocate(p, 1024, &stream) };
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

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
        if let (Some(wait), Some(a)) = (self.wait.take(), self.mr.availability()) {
            a.finish(&wait.waiter, end, wait.since.elapsed());
        }
    }
}

/// Whether a request of `bytes` may wait for memory on `mr`: `mr` signals availability and
/// the request is within its capacity limit.
fn can_wait<R: MemoryResource + ?Sized>(mr: &R, bytes: usize) -> bool {
    mr.availability().is_some() && mr.capacity_limit().is_none_or(|limit| bytes <= limit)
}

/// An out-of-memory outcome for a request above the capacity limit, made
/// [`Error::TooLarge`] whatever the resource said.
fn never_fitting<R: MemoryResource + ?Sized>(mr: &R, done: Result<DevicePtr>) -> Result<DevicePtr> {
    done.map_err(|e| e.never_fitting(mr.capacity_limit()))
}

/// `done`, with its bytes counted as held by the current tokio task when it is an allocation
/// from a resource that makes requests wait (for deadlock detection). Outside a task, or for
/// a resource that never makes requests wait, one thread-local read.
#[inline]
pub(crate) fn held<R: MemoryResource + ?Sized>(
    mr: &R,
    bytes: usize,
    done: Result<DevicePtr>,
) -> Result<DevicePtr> {
    if let (Ok(_), Some(a)) = (&done, mr.availability()) {
        if bytes > 0 {
            a.record_held(bytes);
        }
    }
    done
}

/// The fast path of every allocation future (an [`Allocate`]'s first poll, a buffer's
/// constructor): `Some(outcome)` when the request is decided without waiting, `None` when it is
/// out of memory and may wait for more.
#[inline]
pub(crate) fn try_without_waiting<R: MemoryResource + ?Sized>(
    mr: &R,
    bytes: usize,
    stream: &Stream,
) -> Option<Result<DevicePtr>> {
    match mr.try_allocate(bytes, stream) {
        Err(e) if e.is_out_of_memory() && can_wait(mr, bytes) => None,
        done => Some(never_fitting(mr, done)),
    }
}

impl<R: MemoryResource + ?Sized> Future for Allocate<'_, R> {
    type Output = Result<DevicePtr>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<DevicePtr>> {
        let this = &mut *self;
        let just_queued = this.wait.is_none();
        if this.wait.is_none() {
            // Waiters go first, unless all are of lower priority: then this request becomes
            // the head when it queues, and tries at once below.
            let queued = this.mr.availability().is_some_and(|a| a.has_waiters());
            if !queued {
                if let Some(done) = try_without_waiting(this.mr, this.bytes, this.stream) {
                    return Poll::Ready(held(this.mr, this.bytes, done));
                }
            } else {
                // Behind other waiters, but checked as the fast path would be first: a request
                // that is wrong on its face fails now instead of waiting its turn.
                if let Err(e) = check_resource(this.mr, this.stream) {
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
            this.wait = Some(Wait {
                waiter: availability.push(cx.waker(), this.priority),
                since: Instant::now(),
                timer,
            });
        }
        let availability = this.mr.availability().expect("queued on it");
        let wait = this.wait.as_mut().expect("queued above");
        wait.waiter.set_waker(cx.waker());
        // Takes the turn it was told of (one not taken for long passes to the next waiter).
        if availability.take_turn(&wait.waiter) {
            // Queued before retrying: a free from now on finds this waiter and wakes it.
            if let Some(done) = this.retry() {
                this.leave_queue(WaitEnd::Done);
                return Poll::Ready(held(this.mr, this.bytes, done));
            }
        } else if just_queued {
            // The head checks for a deadlock when its retry fails; a waiter that joins behind
            // it may be the last holder to start waiting, so it checks once as it joins.
            if let Some(e) = this.would_deadlock() {
                this.leave_queue(WaitEnd::Done);
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

impl<R: MemoryResource + ?Sized> Drop for Allocate<'_, R> {
    fn drop(&mut self) {
        self.leave_queue(WaitEnd::Cancelled);
    }
}

impl<R: MemoryResource + ?Sized> fmt::Debug for Allocate<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocate")
            .field("bytes", &self.bytes)
            .field("stream", &self.stream.id())
            .field("priority", &self.priority)
            .field("waiting", &self.wait.is_some())
            .finish()
    }
}
