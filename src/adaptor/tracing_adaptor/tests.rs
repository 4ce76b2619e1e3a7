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
use crate::error::Error;
use crate::test_support::{self, free, host, recording, KIB, MIB};
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
    capture.0.lock().clone()
}

fn ours(events: Vec<Captured>) -> Vec<Captured> {
    events.into_iter().filter(|e| e.target == TARGET).collect()
}

#[test]
fn an_allocation_and_its_free_are_events_with_size_stream_pointer_and_latency() {
    let (device, s) = host();
    let mr = TracingAdaptor::new(CudaResource::new(&device).unwrap());
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
    let mr = TracingAdaptor::new(CudaResource::new(&device).unwrap());
    // SAFETY: it hands out no pointer: every answer is an error.
    let (broken, _) = unsafe { recording(&device, |_| Err(Error::InvalidArgument("nope".into()))) };
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
    let quiet = TracingAdaptor::new(CudaResource::new(&device).unwrap());
    let loud = TracingAdaptor::with_level(CudaResource::new(&device).unwrap(), Level::INFO);
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
    let inner = TracingAdaptor::new(CudaResource::new(&device).unwrap());
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
    let limited = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), MIB);
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
