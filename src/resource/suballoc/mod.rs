//! Sub-allocators: resources that carve an upstream's memory into blocks and reuse them in stream order.

pub(crate) mod arena;
pub(crate) mod base;
pub(crate) mod binning;
pub(crate) mod fixed_size;
pub(crate) mod mapped_pool;
pub(crate) mod pool;
pub(crate) mod stream_order;
