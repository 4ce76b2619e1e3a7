//! The settings of an [`ArenaResource`](super::ArenaResource): [`ArenaConfig`] and where a
//! failure is dumped ([`ArenaDump`]).

use std::path::PathBuf;

/// Where an [`ArenaResource`](super::ArenaResource) describes its state when a request fails with out-of-memory
/// ([`ArenaConfig::dump_on_failure`]): the arena's size, free, pending and live bytes, the
/// largest free block and the fragmentation (RMM's figures), then every free range of the global
/// arena and every stream arena.
///
/// Every failed [`try_allocate`](crate::MemoryResource::try_allocate) dumps, including the retries of
/// an awaited allocation that is waiting for memory; use it to debug, not in steady state.
///
/// # Examples
///
/// ```
/// use streamalloc::{ArenaConfig, ArenaDump};
///
/// let to_log = ArenaConfig::default().dump_on_failure(ArenaDump::Tracing);
/// let to_file = ArenaConfig::default()
///     .dump_on_failure(ArenaDump::File(std::env::temp_dir().join("arena_dump.log")));
/// assert_eq!(to_log.get_dump_on_failure(), Some(&ArenaDump::Tracing));
/// # let _ = to_file;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArenaDump {
    /// A `tracing` event at `WARN` level with target `streamalloc::arena`; the dump is its
    /// `dump` field.
    Tracing,
    /// Appended to this file, which is created if missing (RMM writes
    /// `rmm_arena_memory_dump.log`).
    File(PathBuf),
}

/// Settings of an [`ArenaResource`](super::ArenaResource)
/// ([`ArenaResource::with_config`](super::ArenaResource::with_config)): `Option` fields with
/// documented defaults and by-value setters.
///
/// # Examples
///
/// ```
/// use streamalloc::{ArenaConfig, ArenaResource, CudaResource, Device};
///
/// let device = Device::host();
/// let config = ArenaConfig::default().arena_size(16 << 20).size_classes(true);
/// let arena = ArenaResource::with_config(CudaResource::new(&device)?, config)?;
/// assert_eq!(arena.arena_size(), 16 << 20);
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArenaConfig {
    pub(super) arena_size: Option<usize>,
    pub(super) dump_on_failure: Option<ArenaDump>,
    pub(super) size_classes: Option<bool>,
    pub(super) per_thread_arenas: Option<bool>,
    pub(super) growth_step: Option<usize>,
    pub(super) maximum_size: Option<usize>,
}

/// The default [`ArenaConfig::growth_step`]: 2 MiB (two superblocks).
pub(crate) const ARENA_GROWTH_STEP: usize = 2 << 20;

impl ArenaConfig {
    crate::builder::option_setters! {
        /// Makes an arena of a fixed size, as RMM's: `bytes` taken from the upstream at
        /// construction, rounded down to a multiple of 64 KiB (at least 1 MiB), for the arena's
        /// whole life. Without it the arena grows on demand ([`growth_step`](Self::growth_step)).
        fn arena_size(bytes: usize) => arena_size;
    }

    /// The arena size if set; `None` (the default) means an arena that starts empty and grows
    /// on demand up to [`get_maximum_size`](Self::get_maximum_size).
    ///
    /// RMM's default, half of the device's free memory taken at construction, held 154 times
    /// the peak of live bytes on the footprint workload W4 (`benches/workloads.rs`) and leaves
    /// other users of the device half of it; pass
    /// `arena_size(percent_of_free_device_memory(&device, 50)?)` for it.
    pub fn get_arena_size(&self) -> Option<usize> {
        self.arena_size
    }

    crate::builder::option_setters! {
        /// For a growing arena (no [`arena_size`](Self::arena_size)): the least bytes it takes
        /// from the upstream when it must grow, a multiple of 64 KiB of at least 1 MiB. A request
        /// larger than the step takes an extent of its own size. Before growing, the arena gives
        /// its wholly free extents back to the upstream (none of them could serve the request).
        fn growth_step(bytes: usize) => growth_step;
    }

    /// The growth step; default 2 MiB (two superblocks).
    pub fn get_growth_step(&self) -> usize {
        self.growth_step.unwrap_or(ARENA_GROWTH_STEP)
    }

    crate::builder::option_setters! {
        /// For a growing arena: the most bytes it holds from the upstream at once (rounded down to
        /// 64 KiB); larger requests fail at once.
        fn maximum_size(bytes: usize) => maximum_size;
    }

    /// The maximum size if set; `None` (the default) means the device's total memory.
    pub fn get_maximum_size(&self) -> Option<usize> {
        self.maximum_size
    }

    crate::builder::option_setters! {
        /// Describes the arena's state in `dump` whenever a request fails with out-of-memory.
        fn dump_on_failure(dump: ArenaDump) => dump_on_failure;
    }

    /// Where failures are dumped; default `None`, no dump.
    pub fn get_dump_on_failure(&self) -> Option<&ArenaDump> {
        self.dump_on_failure.as_ref()
    }

    crate::builder::option_setters! {
        /// Rounds requests up to RMM's jemalloc-style size classes (256 B steps to 2 KiB, then four
        /// classes per doubling, up to 256 GiB) instead of to 256 bytes: more waste inside blocks,
        /// less fragmentation between them. RMM builds with them under `RMM_ARENA_USE_SIZE_CLASSES`.
        fn size_classes(on: bool) => size_classes;
    }

    /// Whether size classes are used; default `false` (256-byte rounding, as RMM's default
    /// build).
    pub fn get_size_classes(&self) -> bool {
        self.size_classes.unwrap_or(false)
    }

    crate::builder::option_setters! {
        /// Gives every (thread, stream) pair its own arena instead of every stream, for threads
        /// that share a stream. A thread's arenas keep their superblocks after the thread exits
        /// until they are wholly free and the arena is defragmented.
        fn per_thread_arenas(on: bool) => per_thread_arenas;
    }

    /// Whether arenas are per (thread, stream); default `false` (per stream).
    pub fn get_per_thread_arenas(&self) -> bool {
        self.per_thread_arenas.unwrap_or(false)
    }
}
