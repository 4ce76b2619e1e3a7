//! Shared test support: the resource acceptance suite (a port of RMM's `mr_ref_tests`) and a
//! small deterministic random number generator. Included by `tests/host` and `tests/cuda`.

#![allow(dead_code)]

pub mod arena_suite;
pub mod buffer_suite;
pub mod completion_suite;
pub mod container_suite;
pub mod deferred_suite;
pub mod fault_suite;
pub mod hold;
pub mod host_data_suite;
pub mod huge_sizes;
pub mod multi_device_suite;
pub mod pool_suite;
pub mod pressure_suite;
mod rng;
pub mod snapshot_arena_suite;
pub mod snapshot_pool_suite;
pub mod stress;
pub mod suite;
pub mod sync_suite;
pub mod teardown_suite;

pub use rng::SplitMix64;
