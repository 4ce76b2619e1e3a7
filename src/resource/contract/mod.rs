//! The contract every resource keeps: the allocation future and its wait queue, forwarding for adaptors, size rounding, and the figures every resource reports.

pub(crate) mod allocate;
pub(crate) mod availability;
pub(crate) mod forward;
pub(crate) mod size;
pub(crate) mod stats;
