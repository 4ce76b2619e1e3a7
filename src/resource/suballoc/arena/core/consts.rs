//! The arena's sizes: superblocks and the global arena's pages. Both cores and the wrapper
//! count in them; they depend on nothing.

/// The smallest superblock: RMM's `superblock::minimum_size`, 1 MiB. Requests above it are
/// served by the global arena directly.
pub(crate) const SUPERBLOCK_SIZE: usize = 1 << 20;
/// The global arena's unit: 64 KiB.
pub(crate) const PAGE_SIZE: usize = 64 << 10;
/// Pages in the smallest superblock.
pub(crate) const SUPERBLOCK_PAGES: u64 = (SUPERBLOCK_SIZE / PAGE_SIZE) as u64;
