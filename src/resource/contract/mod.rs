//! The contract every resource keeps: the allocation future and its wait queue, forwarding for adaptors, size rounding, and the figures every resource reports.

mod allocate_wait;
pub(crate) mod availability;
pub(crate) mod checks;
pub(crate) mod forward;
pub(crate) mod memory_resource;
pub(crate) mod properties;
pub(crate) mod shared;
pub(crate) mod size;
pub(crate) mod stats;

#[cfg(test)]
mod wait_tests;

#[cfg(test)]
mod ageing_tests;

// The watchdog these tests runs on a timer, which the loom models leave out.
#[cfg(all(test, not(loom)))]
mod forget_tests;

#[cfg(test)]
mod equality_tests;

#[cfg(test)]
mod stats_tests;

#[cfg(test)]
mod too_large_tests;
