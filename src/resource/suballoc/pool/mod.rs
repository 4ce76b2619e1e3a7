//! `PoolResource`: a coalescing, stream-ordered sub-allocator over any upstream resource.

mod allocated_peak;
pub(crate) mod core;
mod inner;
mod level;
mod mapped_level;
mod pool_resource;
mod release;
mod shards;
mod statistics;

pub use self::pool_resource::PoolResource;
pub use self::release::ReleasePolicy;
pub use self::statistics::PoolStatistics;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod footprint_tests;

#[cfg(test)]
mod release_tests;

#[cfg(test)]
mod wake_tests;
