use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use super::handle::Stream;
use crate::backend::{AnyEvent, Completion};
use crate::error::Result;

/// A point in a [`Stream`]; a future that resolves when the device has passed it.
///
/// A cheap `Clone` handle: every clone is the same point. Awaiting an event never blocks a
/// thread: the first poll queries the device, and only if the point is not reached yet does it
/// ask the device's completion driver (see [`CompletionStrategy`](crate::CompletionStrategy))
/// to wake the task later.
///
/// # Cancel safety
/// Dropping an event future before it resolves is harmless; the event stays valid.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamalloc::{Device, Stream};
///
/// # futures::executor::block_on(async {
/// let stream = Stream::new(&Device::host())?;
/// stream.enqueue_delay(Duration::from_millis(10))?;
/// let event = stream.record()?;
/// event.clone().await?;
/// assert!(event.is_complete()?);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Event {
    inner: Arc<EventInner>,
}

struct EventInner {
    stream: Stream,
    raw: AnyEvent,
    /// Its place among the events recorded on `stream`: the completion driver wakes in this
    /// order.
    seq: u64,
    completion: Arc<Completion>,
    /// Set once the completion driver has been asked to complete `completion`.
    armed: AtomicBool,
}

impl Event {
    pub(crate) fn new(stream: Stream, raw: AnyEvent, seq: u64) -> Event {
        Event {
            inner: Arc::new(EventInner {
                stream,
                raw,
                seq,
                completion: Arc::new(Completion::default()),
                armed: AtomicBool::new(false),
            }),
        }
    }

    /// The stream this event was recorded on.
    pub fn stream(&self) -> &Stream {
        &self.inner.stream
    }

    /// Non-blocking: has the device passed this point (`cuEventQuery`)?
    ///
    /// # Errors
    /// The error the stream reported, if it failed.
    pub fn is_complete(&self) -> Result<bool> {
        if self.inner.completion.is_done() {
            return self.completion_result().map(|()| true);
        }
        self.inner.raw.query()
    }

    /// Blocks the calling thread until the device has passed this point
    /// (`cuEventSynchronize`). Do not call it on an async executor thread.
    ///
    /// # Errors
    /// The error the stream reported, if it failed.
    pub fn synchronize_blocking(&self) -> Result<()> {
        self.inner.raw.synchronize_blocking()
    }

    pub(crate) fn raw(&self) -> &AnyEvent {
        &self.inner.raw
    }

    fn completion_result(&self) -> Result<()> {
        match self.inner.completion.error() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Future for Event {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let inner = &self.inner;
        if inner.completion.is_done() {
            return Poll::Ready(self.completion_result());
        }
        match inner.raw.query() {
            Ok(true) => return Poll::Ready(Ok(())),
            Ok(false) => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
        // Register before arming, so a completion that fires at once still finds the waker.
        if inner.completion.register(cx.waker()) {
            return Poll::Ready(self.completion_result());
        }
        if !inner.armed.swap(true, Ordering::AcqRel) {
            let stream = &inner.stream;
            let device = stream.device();
            let armed = device.completion_driver().arm(
                device.raw(),
                stream.id(),
                stream.shadow(),
                &inner.raw,
                inner.seq,
                &inner.completion,
            );
            if let Err(e) = armed {
                inner.armed.store(false, Ordering::Release);
                return Poll::Ready(Err(e));
            }
        }
        Poll::Pending
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("stream", &self.inner.stream.id())
            .field("done", &self.inner.completion.is_done())
            .finish()
    }
}

// Here rather than beside the handle: recording makes an `Event`, and the handle's file then
// needs nothing of this one.
impl Stream {
    /// Records an event at the current end of this stream: it completes when all work enqueued
    /// so far has completed.
    ///
    /// # Errors
    /// A driver error when the event cannot be created or recorded.
    pub fn record(&self) -> Result<Event> {
        let (raw, seq) = self.inner.shadow.record(&self.inner.raw)?;
        Ok(Event::new(self.clone(), raw, seq))
    }

    /// Makes work enqueued on this stream from now on wait until `event` completes, without
    /// blocking the host.
    ///
    /// # Errors
    /// A driver error; waiting on an event of another device's stream is allowed by CUDA and
    /// by the host backend.
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.inner.raw.wait_event(event.raw())
    }

    /// Makes work enqueued on this stream from now on wait for everything enqueued on `other`
    /// so far, without blocking the host: [`record`](Stream::record) on `other`, then
    /// [`wait`](Stream::wait) here (PyTorch's `Stream.wait_stream`). Waiting for itself does
    /// nothing.
    ///
    /// # Stream ordering
    /// Only work enqueued on `other` before the call is waited for.
    ///
    /// # Errors
    /// A driver error when recording or waiting fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{Device, Stream};
    ///
    /// let device = Device::host();
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// b.enqueue_delay(Duration::from_millis(20))?; // b is busy
    /// a.wait_stream(&b)?;                            // a's later work runs after it
    /// let on_a = a.record()?;
    /// assert!(!on_a.is_complete()?);
    /// on_a.synchronize_blocking()?;
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        if self == other {
            return Ok(());
        }
        self.wait(&other.record()?)
    }
}
