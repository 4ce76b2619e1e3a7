use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::backend::{AnyEvent, Completion};
use crate::error::Result;
use crate::stream::Stream;

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
