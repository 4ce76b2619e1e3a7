use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use tracing::Level;

use crate::error::{Error, Result};
use crate::resource::ResourceIdentity;
use crate::resource::{Availability, DevicePtr, MemoryResource, Properties, SharedResource};
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
///     let mr = TracingAdaptor::with_level(CudaResource::new(&device), tracing::Level::DEBUG);
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

    /// The wrapped resource.
    pub fn upstream(&self) -> &R {
        &self.inner.upstream
    }

    fn enabled(&self) -> bool {
        // The global max level first: one atomic load, where `enabled!` asks the dispatcher
        // (a thread-local lookup), which cost about 15 ns per call with no subscriber at all.
        tracing::level_enabled!(self.inner.level) && at_level!(self.inner.level, enabled!())
    }

    /// `try_allocate` with its span and event, out of line so that the untraced path stays
    /// a check and a call.
    #[cold]
    #[inline(never)]
    fn traced_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let upstream = &self.inner.upstream;
        let level = self.inner.level;
        let sid = stream.id().0;
        let span = at_level!(level, span!("allocate", bytes, stream = sid));
        let _entered = span.enter();
        let start = Instant::now();
        let result = upstream.try_allocate(bytes, stream);
        let elapsed_ns = nanos(start);
        let device = stream.device().id();
        let outcome = outcome(&result);
        match &result {
            Ok(ptr) => at_level!(
                level,
                event!(
                    bytes,
                    stream = sid,
                    %device,
                    ptr = %ptr,
                    elapsed_ns,
                    outcome,
                    "allocate"
                )
            ),
            Err(error) => at_level!(
                level,
                event!(
                    bytes,
                    stream = sid,
                    %device,
                    ptr = %DevicePtr::NULL,
                    elapsed_ns,
                    outcome,
                    %error,
                    "allocate"
                )
            ),
        }
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
        let upstream = &self.inner.upstream;
        let level = self.inner.level;
        let sid = stream.id().0;
        let span = at_level!(level, span!("deallocate", bytes, stream = sid));
        let _entered = span.enter();
        let start = Instant::now();
        // SAFETY: forwarded from the caller's contract; the pointer is the upstream's own.
        unsafe { upstream.deallocate(ptr, bytes, stream) };
        let elapsed_ns = nanos(start);
        let device = stream.device().id();
        at_level!(
            level,
            event!(
                bytes,
                stream = sid,
                %device,
                ptr = %ptr,
                elapsed_ns,
                "deallocate"
            )
        );
    }
}

fn outcome(result: &Result<DevicePtr>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(Error::OutOfMemory { .. }) => "out_of_memory",
        Err(_) => "error",
    }
}

fn nanos(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl<R: MemoryResource> MemoryResource for TracingAdaptor<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if self.enabled() {
            self.traced_allocate(bytes, stream)
        } else {
            self.inner.upstream.try_allocate(bytes, stream)
        }
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract; the pointer is the upstream's own.
        unsafe {
            if self.enabled() {
                self.traced_deallocate(ptr, bytes, stream)
            } else {
                self.inner.upstream.deallocate(ptr, bytes, stream)
            }
        }
    }

    fn availability(&self) -> Option<&Availability> {
        self.inner.upstream.availability()
    }

    fn may_regain_memory(&self, bytes: usize) -> bool {
        self.inner.upstream.may_regain_memory(bytes)
    }

    fn identity(&self) -> ResourceIdentity {
        ResourceIdentity::of_shared(&self.inner)
    }

    fn capacity_limit(&self) -> Option<usize> {
        self.inner.upstream.capacity_limit()
    }

    fn properties(&self) -> Properties {
        self.inner.upstream.properties()
    }
}

impl<R: MemoryResource> Clone for TracingAdaptor<R> {
    fn clone(&self) -> Self {
        TracingAdaptor {
            inner: self.inner.clone(),
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
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use parking_lot::Mutex;
    use tracing::field::{Field, Visit};
    use tracing::{Event, Subscriber};
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::Layer;

    use super::*;
    use crate::adaptor::test_support::{self, free, host, recording, KIB, MIB};
    use crate::{CudaResource, LimitingAdaptor};

    /// One event as a capturing layer saw it.
    #[derive(Debug, Clone)]
    struct Captured {
        target: String,
        level: Level,
        /// The spans the event happened in, outermost first.
        scope: Vec<String>,
        fields: BTreeMap<String, String>,
    }

    impl Captured {
        fn field(&self, name: &str) -> &str {
            self.fields
                .get(name)
                .unwrap_or_else(|| panic!("no field {name} in {self:?}"))
        }
    }

    struct Fields<'a>(&'a mut BTreeMap<String, String>);

    impl Visit for Fields<'_> {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().into(), value.into());
        }

        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.0.insert(field.name().into(), format!("{value:?}"));
        }
    }

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<Captured>>>);

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            let mut fields = BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            self.0.lock().push(Captured {
                target: event.metadata().target().into(),
                level: *event.metadata().level(),
                scope: ctx
                    .event_scope(event)
                    .map(|scope| scope.from_root().map(|s| s.name().into()).collect())
                    .unwrap_or_default(),
                fields,
            });
        }
    }

    /// Runs `f` with a subscriber that captures events at `max` and below; returns them.
    fn capture(max: LevelFilter, f: impl FnOnce()) -> Vec<Captured> {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::registry().with(capture.clone().with_filter(max));
        tracing::subscriber::with_default(subscriber, f);
        let events = capture.0.lock().clone();
        events
    }

    fn ours(events: Vec<Captured>) -> Vec<Captured> {
        events.into_iter().filter(|e| e.target == TARGET).collect()
    }

    #[test]
    fn an_allocation_and_its_free_are_events_with_size_stream_pointer_and_latency() {
        let (device, s) = host();
        let mr = TracingAdaptor::new(CudaResource::new(&device));
        let mut p = DevicePtr::NULL;
        let events = ours(capture(LevelFilter::TRACE, || {
            p = mr.try_allocate(1000, &s).unwrap();
            free(&mr, p, 1000, &s);
        }));
        assert_eq!(events.len(), 2, "{events:?}");
        let (a, d) = (&events[0], &events[1]);
        let sid = s.id().0.to_string();
        assert_eq!(a.level, Level::TRACE);
        assert_eq!(a.scope, ["allocate"]);
        assert_eq!(a.field("message"), "allocate");
        assert_eq!(a.field("bytes"), "1000");
        assert_eq!(a.field("stream"), sid);
        assert_eq!(a.field("device"), device.id().to_string());
        assert_eq!(a.field("ptr"), p.to_string());
        assert_eq!(a.field("outcome"), "ok");
        a.field("elapsed_ns").parse::<u64>().unwrap();
        assert!(!a.fields.contains_key("error"));

        assert_eq!(d.scope, ["deallocate"]);
        assert_eq!(d.field("message"), "deallocate");
        assert_eq!(d.field("bytes"), "1000");
        assert_eq!(d.field("stream"), sid);
        assert_eq!(d.field("ptr"), p.to_string());
        d.field("elapsed_ns").parse::<u64>().unwrap();
    }

    #[test]
    fn failures_say_what_went_wrong_and_return_the_error() {
        let (device, s) = host();
        let mr = TracingAdaptor::new(CudaResource::new(&device));
        let (broken, _) = recording(&device, |_| Err(Error::InvalidArgument("nope".into())));
        let broken = TracingAdaptor::new(broken);
        let mut errors = Vec::new();
        let events = ours(capture(LevelFilter::TRACE, || {
            errors.push(mr.try_allocate(1 << 50, &s).unwrap_err());
            errors.push(broken.try_allocate(KIB, &s).unwrap_err());
        }));
        assert!(errors[0].is_out_of_memory());
        assert_eq!(errors[1], Error::InvalidArgument("nope".into()));
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0].field("outcome"), "out_of_memory");
        assert_eq!(events[0].field("error"), errors[0].to_string());
        assert_eq!(events[0].field("ptr"), "0x0");
        assert_eq!(events[1].field("outcome"), "error");
        assert_eq!(events[1].field("error"), errors[1].to_string());
    }

    #[test]
    fn the_level_is_the_adaptors() {
        let (device, s) = host();
        let quiet = TracingAdaptor::new(CudaResource::new(&device));
        let loud = TracingAdaptor::with_level(CudaResource::new(&device), Level::INFO);
        assert_eq!(loud.level(), Level::INFO);
        let events = ours(capture(LevelFilter::DEBUG, || {
            let p = quiet.try_allocate(KIB, &s).unwrap();
            free(&quiet, p, KIB, &s);
            let p = loud.try_allocate(KIB, &s).unwrap();
            free(&loud, p, KIB, &s);
        }));
        assert_eq!(
            events.len(),
            2,
            "only the INFO adaptor's events: {events:?}"
        );
        assert!(events.iter().all(|e| e.level == Level::INFO));
    }

    /// Nested adaptors: the inner one's events happen inside the outer one's span.
    #[test]
    fn upstream_events_nest_in_the_span() {
        let (device, s) = host();
        let inner = TracingAdaptor::new(CudaResource::new(&device));
        let outer = TracingAdaptor::with_level(inner, Level::DEBUG);
        let events = ours(capture(LevelFilter::TRACE, || {
            let p = outer.try_allocate(MIB, &s).unwrap();
            free(&outer, p, MIB, &s);
        }));
        let levels: Vec<_> = events.iter().map(|e| e.level).collect();
        assert_eq!(
            levels,
            [Level::TRACE, Level::DEBUG, Level::TRACE, Level::DEBUG]
        );
        // The inner adaptor's events happen inside the outer adaptor's span.
        let scopes: Vec<_> = events.iter().map(|e| e.scope.join("/")).collect();
        assert_eq!(
            scopes,
            [
                "allocate/allocate",
                "allocate",
                "deallocate/deallocate",
                "deallocate"
            ]
        );
    }

    /// Without a subscriber the adaptor just forwards.
    #[test]
    fn without_a_subscriber_it_forwards() {
        let (device, s) = host();
        let limited = LimitingAdaptor::new(CudaResource::new(&device), MIB);
        let mr = TracingAdaptor::new(limited.clone());
        let p = mr.try_allocate(KIB, &s).unwrap();
        assert_eq!(limited.allocated_bytes(), KIB);
        free(&mr.clone(), p, KIB, &s);
        assert_eq!(mr.upstream().allocated_bytes(), 0);
        assert_eq!(mr.capacity_limit(), Some(MIB));
        assert_eq!(mr.properties(), limited.properties());
        assert!(format!("{mr:?}").contains("TRACE"));
    }

    /// Awaiting through the adaptor, traced: the waiting request's attempts show as
    /// `out_of_memory` events, then one `ok`.
    #[test]
    fn a_waiting_allocation_resumes_after_a_free() {
        let events = ours(capture(LevelFilter::TRACE, || {
            test_support::a_waiting_allocation_resumes_after_a_free(4 * KIB, 4 * KIB, KIB, |l| {
                TracingAdaptor::new(l)
            });
        }));
        let kib = KIB.to_string();
        let outcomes: Vec<_> = events
            .iter()
            .filter(|e| e.field("message") == "allocate" && e.field("bytes") == kib)
            .map(|e| e.field("outcome"))
            .collect();
        assert!(outcomes.len() >= 2, "{outcomes:?}");
        let (last, before) = outcomes.split_last().unwrap();
        assert_eq!(*last, "ok");
        assert!(before.iter().all(|&o| o == "out_of_memory"), "{outcomes:?}");
    }
}
