//! A device's settings: the host emulation's ([`HostConfig`]) and how events wake the tasks that
//! await them ([`CompletionStrategy`]), for every backend.

/// Configuration of a host-backend device ([`Device::host_with`](crate::Device::host_with)).
///
/// # Examples
///
/// ```
/// use streamalloc::{CompletionStrategy, HostConfig};
///
/// let config = HostConfig::default()
///     .capacity(64 << 20)
///     .completion_strategy(CompletionStrategy::Poller);
/// assert_eq!(config.get_capacity(), 64 << 20);
/// ```
#[derive(Debug, Clone, Default)]
pub struct HostConfig {
    capacity: Option<usize>,
    completion_strategy: Option<CompletionStrategy>,
}

/// The emulated memory of a host device when none is configured: 16 GiB.
pub const DEFAULT_HOST_CAPACITY: usize = 16 << 30;

impl HostConfig {
    crate::builder::option_setters! {
        /// Bytes of emulated device memory; allocations beyond it fail with out-of-memory.
        fn capacity(bytes: usize) => capacity;
    }

    /// The emulated memory: [`DEFAULT_HOST_CAPACITY`] unless set.
    pub fn get_capacity(&self) -> usize {
        self.capacity.unwrap_or(DEFAULT_HOST_CAPACITY)
    }

    crate::builder::option_setters! {
        /// The device's completion strategy (default [`CompletionStrategy::Poller`]).
        fn completion_strategy(strategy: CompletionStrategy) => completion_strategy;
    }

    pub(crate) fn get_completion_strategy(&self) -> CompletionStrategy {
        self.completion_strategy.unwrap_or_default()
    }
}

/// How a device's events wake the tasks that await them.
///
/// The default is [`Poller`](CompletionStrategy::Poller), chosen from measurements on an H100
/// (`benches/completion.rs`; figures in the book's completion-driver page): a task resumed
/// about 6 µs after the device passed its event under the poller against about 43 µs under
/// host functions, the poller never slowed the user's stream, and arming host functions behind
/// a busy stream made the enqueueing thread wait. The poller's price is CPU time while events
/// are pending (about 23 ms per second there); it costs nothing while none are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CompletionStrategy {
    /// A host function on a shadow stream per user stream (`cuLaunchHostFunc`): no CPU while
    /// waiting, but higher wake latency.
    HostFunction,
    /// One polling thread per device that queries pending events, with back-off (the default).
    #[default]
    Poller,
    /// The poller's thread, reading flags instead of querying events: a private shadow stream
    /// per user stream waits for the event and writes a word of pinned host memory
    /// (`cuStreamWriteValue32`), which the thread reads with a load, no driver call. Events are
    /// still queried once the thread backs off (so errors are seen), and where no flag can be
    /// had (all 4,096 of a device's in use, or a driver without stream memory operations).
    FlagWrite,
}

impl CompletionStrategy {
    pub(super) fn to_u8(self) -> u8 {
        match self {
            CompletionStrategy::HostFunction => 0,
            CompletionStrategy::Poller => 1,
            CompletionStrategy::FlagWrite => 2,
        }
    }

    pub(super) fn from_u8(v: u8) -> Self {
        match v {
            1 => CompletionStrategy::Poller,
            2 => CompletionStrategy::FlagWrite,
            _ => CompletionStrategy::HostFunction,
        }
    }
}
