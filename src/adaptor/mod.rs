//! Adaptors: resources that wrap an upstream resource to add a behaviour (limits, statistics,
//! logging, …). One file per adaptor; each is generic over its upstream, with the type-erased
//! [`SharedResource`](crate::SharedResource) as the default. Each file holds only its own
//! behaviour: the handle, its `Clone` and what is forwarded unchanged to the upstream are
//! written once, in `resource/forward.rs`.

mod aligned;
mod failure_callback;
mod limiting;
pub(crate) mod logging;
mod prefetch;
mod statistics;
mod timeline;
mod tracing_adaptor;
mod tracking;

pub use aligned::AlignedAdaptor;
pub use failure_callback::{AllocationFailure, FailureCallbackAdaptor};
pub use limiting::LimitingAdaptor;
pub use logging::{LoggingAdaptor, LoggingAdaptorBuilder};
pub use prefetch::PrefetchAdaptor;
pub use statistics::{Counter, Counters, StatisticsAdaptor};
pub use timeline::TimelineAdaptor;
pub use tracing_adaptor::TracingAdaptor;
pub use tracking::{Allocation, LeakReport, TrackingAdaptor, TrackingIssue, MAX_TRACKING_ISSUES};
