use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use tracing::Level;

use crate::error::Result;
use crate::resource::contract::forward::{memory_resource, Forward};
use crate::resource::{DevicePtr, MemoryResource, SharedResource};
use crate::stream::Stream;

/// The target of every span and event of a [`TracingAdaptor`].
const TARGET: &str = "streamalloc::memory";

/// Expands `$mac!(target: TARGET, <level>, $args)` for a level known only at run time (the
/// `tracing` macros take a constant level).
macro_rules! at_level {
    ($level:expr, $mac:ident!($($args:tt)*)) => {
        match $level {
            Level::ERROR => tracing::$mac!(target: TARGET, Level::ERROR, $($args)*),
            Level::WARN => tracing::$mac!(target: TARGET, Level::WARN, $($args)*),
            Level::INFO => tracing::$mac!(target: TARGET, Level::INFO, $($args)*),
            Level::DEBUG => tracing::$mac!(target: TARGET, Level::DEBUG, $($args)*),
            Level::TRACE => tracing::$mac!(target: TARGET, Level::TRACE, $($args)*),
        }
    };
}

/// Reports every allocation and free through [`tracing`]: a span around the upstream call and
/// an event with its size, stream, pointer, latency and outcome.
///
/// Spans and events have the target `streamalloc::memory` and the adaptor's level (`TRACE`
/// unless set with [`with_level`](TracingAdaptor::with_level)), so a filter such as
/// `streamalloc::memory=trace` selects them. When no subscriber wants them, the adaptor costs
/// one check per call and does not read the clock. A clone shares the upstream.
///
/// | span / event | fields |
/// |---|---|
/// | `allocate` span | `bytes`, `stream` |
/// | `allocate` event | `bytes`, `stream`, `device`, `ptr`, `elapsed_ns`, `outcome` (`ok`, `out_of_memory` or `error`), `error` on failure |
/// | `deallocate` span | `bytes`, `stream` |
/// | `deallocate` event | `bytes`, `stream`, `device`, `ptr`, `elapsed_ns` |
///
/// `stream` is the [`StreamId`](crate::StreamId) number, `ptr` is hexadecimal (`0x0` for a
/// failed or 0-byte allocation), `elapsed_ns` is the time the upstream took. Events and logs of
/// the upstream (a pool's growth, a nested adaptor's events) happen inside the span.
///
/// # Awaiting memory
/// The adaptor forwards the upstream's [`availability`](MemoryResource::availability) and
/// [`capacity_limit`](MemoryResource::capacity_limit), so awaited allocations wait through it
/// as on the upstream. Each attempt of a waiting allocation is a `try_allocate` and has its own
/// span and event: a request that waited shows `out_of_memory` events, then an `ok` one.
///
/// # Stream ordering
/// The events say when the host made each call; the device reaches the stream-ordered free
/// later.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, Stream, TracingAdaptor};
///
/// let subscriber = tracing_subscriber::fmt()
///     .with_max_level(tracing::Level::DEBUG)
///     .finish();
/// tracing::subscriber::with_default(subscriber, || {
///     let device = Device::host();
///     let stream = Stream::new(&device)?;
///     let mr = TracingAdaptor::with_level(CudaResource::new(&device)?, tracing::Level::DEBUG);
///     // DEBUG streamalloc::memory: allocate bytes=4096 stream=.. ptr=0x.. elapsed_ns=.. outcome="ok"
///     let p = mr.try_allocate(4096, &stream)?;
///     unsafe { mr.deallocate(p, 4096, &stream) };
///     Ok::<(), streamalloc::Error>(())
/// })?;
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub struct TracingAdaptor<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R> {
    upstream: R,
    level: Level,
}

impl<R: MemoryResource> TracingAdaptor<R> {
    /// Traces `upstream`'s allocations and frees at level `TRACE`.
    pub fn new(upstream: R) -> Self {
        Self::with_level(upstream, Level::TRACE)
    }

    /// Traces `upstream`'s allocations and frees at `level`.
    pub fn with_level(upstream: R, level: Level) -> Self {
        TracingAdaptor {
            inner: Arc::new(Inner { upstream, level }),
        }
    }

    /// The level of the spans and events.
    pub fn level(&self) -> Level {
        self.inner.level
    }
}

fn outcome(result: &Result<DevicePtr>) -> &'static str {
    match result {
        Ok(_) => "ok",
        // Either kind of out-of-memory: not now, or never (`Error::TooLarge`).
        Err(e) if e.is_out_of_memory() => "out_of_memory",
        Err(_) => "error",
    }
}

fn nanos(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl<R: MemoryResource> Inner<R> {
    fn enabled(&self) -> bool {
        // The global max level first: one atomic load, where `enabled!` asks the dispatcher
        // (a thread-local lookup), which cost about 15 ns per call with no subscriber at all.
        tracing::level_enabled!(self.level) && at_level!(self.level, enabled!())
    }

    /// `try_allocate` with its span and event, out of line so that the untraced path stays
    /// a check and a call.
    #[cold]
    #[inline(never)]
    fn traced_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let level = self.level;
        let sid = stream.id().0;
        let span = at_level!(level, span!("allocate", bytes, stream = sid));
        let _entered = span.enter();
        let start = Instant::now();
        let result = self.upstream.try_allocate(bytes, stream);
        let elapsed_ns = nanos(start);
        let device = stream.device().id();
        let outcome = outcome(&result);
        let ptr = *result.as_ref().unwrap_or(&DevicePtr::NULL);
        // `None` records no field: an error is named only when there is one.
        let error = result.as_ref().err().map(tracing::field::display);
        #[rustfmt::skip]
        at_level!(level, event!(bytes, stream = sid, %device, ptr = %ptr, elapsed_ns, outcome, error, "allocate"));
        result
    }

    /// `deallocate` with its span and event, out of line like
    /// [`traced_allocate`](Self::traced_allocate).
    ///
    /// # Safety
    /// As [`MemoryResource::deallocate`].
    #[cold]
    #[inline(never)]
    unsafe fn traced_deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        let level = self.level;
        let sid = stream.id().0;
        let span = at_level!(level, span!("deallocate", bytes, stream = sid));
        let _entered = span.enter();
        let start = Instant::now();
        // SAFETY: forwarded from the caller's contract; the pointer is the upstream's own.
        unsafe { self.upstream.deallocate(ptr, bytes, stream) };
        let elapsed_ns = nanos(start);
        let device = stream.device().id();
        #[rustfmt::skip]
        at_level!(level, event!(bytes, stream = sid, %device, ptr = %ptr, elapsed_ns, "deallocate"));
    }
}

memory_resource!(shared [R: MemoryResource] TracingAdaptor<R>);

// SAFETY: every pointer it hands out is one the upstream returned for the same request (it
// only observes the call), and its properties are the upstream's: the upstream's promise holds.
unsafe impl<R: MemoryResource> Forward for Inner<R> {
    #[inline]
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if self.enabled() {
            self.traced_allocate(bytes, stream)
        } else {
            self.upstream.try_allocate(bytes, stream)
        }
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract; the pointer is the upstream's own.
        unsafe {
            if self.enabled() {
                self.traced_deallocate(ptr, bytes, stream)
            } else {
                self.upstream.deallocate(ptr, bytes, stream)
            }
        }
    }
}

impl<R: MemoryResource> fmt::Debug for TracingAdaptor<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TracingAdaptor")
            .field("level", &format_args!("{}", self.inner.level))
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

#[cfg(test)]
mod tests;
