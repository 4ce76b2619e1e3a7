//! Per-device defaults: the current resource of each device, and scoped overrides of it.

pub(crate) mod registry;
pub(crate) mod scoped;
