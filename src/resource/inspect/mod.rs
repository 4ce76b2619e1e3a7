//! Seeing a resource's memory: snapshots of its segments and blocks, fragmentation, and timelines of its events.

pub(crate) mod fragmentation;
pub(crate) mod snapshot;
pub(crate) mod timeline;

pub use fragmentation::{Fragmentation, FreeExtentBucket};
pub use snapshot::{Block, BlockState, MemorySnapshot, Segment};
pub use timeline::{SeriesPoint, Timeline, TraceAction, TraceEvent, TIMELINE_STREAMS};
