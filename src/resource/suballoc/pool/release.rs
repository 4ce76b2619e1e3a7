//! [`ReleasePolicy`]: when a [`PoolResource`](super::PoolResource) gives memory back to its
//! upstream on its own, beyond [`trim`](super::PoolResource::trim).

use std::time::Duration;

/// When a [`PoolResource`](crate::PoolResource) gives its wholly free chunks back to its
/// upstream on its own (the upstream only ever gets whole chunks back: the pool's chunks never
/// merge or split).
///
/// The default keeps everything, as RMM's pool does: memory goes back only on
/// [`trim`](crate::PoolResource::trim), before a pool without a maximum grows (its wholly free
/// chunks could not serve the request), and before a request fails. Two limits can be set,
/// alone or together:
/// - [`keep_free`](ReleasePolicy::keep_free): at most this many free bytes stay in the pool's
///   global levels (the stream shards' own free memory, at most about two sub-chunks each,
///   is not counted). A free that takes them above it gives wholly free chunks back until
///   they are at or below it, or none is left (like a CUDA memory pool's release threshold).
///   `keep_free(0)` gives every chunk back as soon as it is wholly free: a pool without a
///   maximum then holds little more than its live blocks, at the price of an upstream
///   allocation for most requests that miss.
/// - [`idle`](ReleasePolicy::idle): when the pool has served no allocation for this long, a
///   thread of the pool's trims it (between `idle` and twice `idle` after its last
///   allocation), so that memory comes back from a pool that simply goes quiet.
///
/// # Stream ordering
/// A chunk goes back on the stream that owns its free memory (as for `trim`), so work that
/// used it is ordered before the upstream reuses it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource, ReleasePolicy, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let pool = PoolResource::new(CudaResource::new(&device)?, 0, None)?;
/// pool.set_release_policy(ReleasePolicy::default().keep_free(0))?;
/// let p = pool.try_allocate(8 << 20, &stream)?;
/// assert_eq!(pool.pool_size(), 8 << 20);
/// unsafe { pool.deallocate(p, 8 << 20, &stream) };
/// assert_eq!(pool.pool_size(), 0, "its chunk went back at once");
/// assert_eq!(pool.release_policy().get_keep_free(), Some(0));
/// assert_eq!(ReleasePolicy::default().idle(Duration::from_secs(5)).get_idle(),
///            Some(Duration::from_secs(5)));
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReleasePolicy {
    keep_free: Option<usize>,
    idle: Option<Duration>,
}

impl ReleasePolicy {
    crate::builder::option_setters! {
        /// Keep at most `bytes` free in the pool's global levels (see the type's docs).
        fn keep_free(bytes: usize) => keep_free;
        /// Trim the pool once it has served no allocation for `idle` (see the type's docs).
        fn idle(idle: Duration) => idle;
    }

    /// The free bytes kept; `None` (the default) keeps all.
    pub fn get_keep_free(&self) -> Option<usize> {
        self.keep_free
    }

    /// The idle time after which the pool trims itself; `None` (the default) never does.
    pub fn get_idle(&self) -> Option<Duration> {
        self.idle
    }
}
