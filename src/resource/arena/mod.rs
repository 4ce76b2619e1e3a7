//! `ArenaResource`: RMM's arena allocator — a global arena of superblocks and an arena per
//! stream — stream-ordered, scalable across threads, and awaitable.

// The public wrapper that calls these cores comes next; until then they have no caller outside
// their tests.
#[allow(dead_code)]
pub(crate) mod core;
