//! Streams and their events, and a round-robin set of streams. Events resolve through the
//! device's completion driver (see [`CompletionStrategy`](crate::device::CompletionStrategy)).

#[cfg(feature = "cuda-driver")]
mod cudarc;
mod event;
mod handle;
mod stream_pool;

pub(crate) use crate::ids::StreamId;
pub use event::Event;
pub use handle::Stream;
pub use stream_pool::StreamPool;

#[cfg(test)]
mod tests;
