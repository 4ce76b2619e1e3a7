//! Leaf resources: each allocates from the driver (or the host backend) directly.

pub(crate) mod callback;
pub(crate) mod cuda;
pub(crate) mod cuda_async;
pub(crate) mod cuda_async_managed;
pub(crate) mod cuda_async_view;
pub(crate) mod host;
pub(crate) mod managed;
pub(crate) mod pinned_host;
pub(crate) mod raw;
