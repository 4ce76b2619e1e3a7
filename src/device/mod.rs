//! Devices: which backend, which ordinal, how much memory, their settings ([`HostConfig`],
//! [`CompletionStrategy`]), the host backend's controls and fault injection ([`HostControls`],
//! [`FaultPoint`]), and the completion driver that turns their events into wake-ups.
//!
//! The device sits on the backend and below streams: the driver arms on a stream's id and its
//! backend streams, never on a [`Stream`](crate::Stream).

mod config;
#[cfg(feature = "cuda-driver")]
pub(crate) mod cudarc;
pub(crate) mod notify;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;

pub use crate::backend::host::{FaultPoint, HostControls};
pub use crate::backend::{MemoryInfo, PrefetchTarget};
pub(crate) use crate::ids::DeviceId;
pub use config::{CompletionStrategy, HostConfig, DEFAULT_HOST_CAPACITY};

use crate::backend::host::HostBackend;
use crate::backend::AnyBackend;
use crate::error::{Error, Result};
use crate::ids::BackendKind;
use notify::CompletionDriver;

/// A device: a CUDA GPU or the host emulation of one. A cheap `Clone` handle.
///
/// Every stream, event and resource belongs to one device. Handles to the same device compare
/// equal.
///
/// # Examples
///
/// ```
/// use streamalloc::{BackendKind, Device};
///
/// let device = Device::host();
/// assert_eq!(device.backend(), BackendKind::Host);
/// let info = device.memory_info()?;
/// assert!(info.free <= info.total);
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

/// How many untaken deferred errors a device keeps ([`Device::take_deferred_error`]).
pub const DEFERRED_ERRORS_KEPT: usize = crate::backend::SINK_KEPT;

struct DeviceInner {
    /// Dropped (stopped) before the backend: it queries the backend's events.
    driver: CompletionDriver,
    backend: AnyBackend,
    /// Fault injection and accounting: host devices only.
    host_controls: Option<HostControls>,
    /// Total memory, asked of the backend once: it does not change while the device lives.
    total_memory: OnceLock<usize>,
    /// Every stream made on this device, weakly (the dead ones are dropped as new ones come),
    /// for a device-wide synchronize.
    streams: Mutex<Vec<Weak<dyn TrackedStream>>>,
}

/// What a device-wide synchronize needs of a stream. The stream layer, above the device,
/// implements it, so that the device can reach its streams without depending on that layer.
pub(crate) trait TrackedStream: Send + Sync {
    /// Blocks until the stream's work so far has completed.
    fn synchronize_blocking(&self) -> Result<()>;

    /// Records an event at the stream's end now; the future resolves when it completes.
    #[allow(clippy::type_complexity)]
    fn record(
        self: Arc<Self>,
    ) -> Result<std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>>;
}

impl Device {
    fn from_backend(
        backend: AnyBackend,
        strategy: CompletionStrategy,
        host_controls: Option<HostControls>,
    ) -> Device {
        let device = Device {
            inner: Arc::new(DeviceInner {
                driver: CompletionDriver::new(strategy),
                host_controls,
                backend,
                total_memory: OnceLock::new(),
                streams: Mutex::new(Vec::new()),
            }),
        };
        let mut live = live_devices().lock();
        live.retain(|_, d| d.strong_count() > 0);
        live.insert(device.id(), Arc::downgrade(&device.inner));
        device
    }

    /// The live device with this id, for layers that only know a resource's
    /// [`Properties::device`](crate::Properties::device).
    pub(crate) fn from_id(id: DeviceId) -> Option<Device> {
        let inner = live_devices().lock().get(&id)?.upgrade()?;
        Some(Device { inner })
    }

    /// The shared host-backend device `host:0` (16 GiB of emulated memory).
    ///
    /// ```
    /// # use streamalloc::Device;
    /// assert_eq!(Device::host(), Device::host());
    /// assert_eq!(Device::host().id().to_string(), "host:0");
    /// ```
    pub fn host() -> Device {
        static HOST: OnceLock<Device> = OnceLock::new();
        HOST.get_or_init(|| Device::host_with_ordinal(HostConfig::default(), 0))
            .clone()
    }

    /// A new, independent host-backend device with its own memory budget and fault injection.
    ///
    /// ```
    /// use streamalloc::{Device, HostConfig};
    ///
    /// let device = Device::host_with(HostConfig::default().capacity(1 << 20));
    /// assert_eq!(device.memory_info()?.total, 1 << 20);
    /// assert_ne!(device, streamalloc::Device::host());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn host_with(config: HostConfig) -> Device {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let ordinal = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Device::host_with_ordinal(config, ordinal)
    }

    fn host_with_ordinal(config: HostConfig, ordinal: u32) -> Device {
        let strategy = config.get_completion_strategy();
        let backend = HostBackend::new(config.get_capacity(), ordinal);
        let controls = backend.controls();
        Device::from_backend(AnyBackend::Host(backend), strategy, Some(controls))
    }

    /// The CUDA device with this ordinal, with its primary context.
    ///
    /// # Errors
    /// [`Error::DriverUnavailable`] when `libcuda` cannot be loaded or initialised (or the crate
    /// was built without a CUDA feature), [`Error::NoSuchDevice`] for an ordinal past the count.
    ///
    /// ```
    /// # use streamalloc::Device;
    /// // On a machine without a driver this is an error, never a panic.
    /// match Device::cuda(0) {
    ///     Ok(d) => println!("found {}", d.name()),
    ///     Err(e) => println!("no GPU: {e}"),
    /// }
    /// ```
    pub fn cuda(ordinal: usize) -> Result<Device> {
        #[cfg(feature = "cuda-driver")]
        {
            static DEVICES: OnceLock<Mutex<Vec<Option<Device>>>> = OnceLock::new();
            let count = crate::backend::cuda::device_count()?;
            if ordinal >= count {
                return Err(Error::NoSuchDevice { ordinal, count });
            }
            let mut devices = DEVICES.get_or_init(|| Mutex::new(vec![None; count])).lock();
            if let Some(d) = &devices[ordinal] {
                return Ok(d.clone());
            }
            let backend = crate::backend::cuda::CudaBackend::new(ordinal)?;
            let d = Device::from_backend(
                AnyBackend::Cuda(backend),
                CompletionStrategy::default(),
                None,
            );
            devices[ordinal] = Some(d.clone());
            Ok(d)
        }
        #[cfg(not(feature = "cuda-driver"))]
        {
            let _ = ordinal;
            Err(Error::DriverUnavailable(
                "streamalloc was built without the `cuda` feature".into(),
            ))
        }
    }

    /// How many CUDA devices the driver reports; 0 when there is no driver.
    ///
    /// ```
    /// let n = streamalloc::Device::cuda_device_count();
    /// assert_eq!(n > 0, streamalloc::Device::cuda(0).is_ok());
    /// ```
    pub fn cuda_device_count() -> usize {
        #[cfg(feature = "cuda-driver")]
        {
            crate::backend::cuda::device_count().unwrap_or(0)
        }
        #[cfg(not(feature = "cuda-driver"))]
        {
            0
        }
    }

    /// The id of this device.
    pub fn id(&self) -> DeviceId {
        self.inner.backend.id()
    }

    /// The backend this device runs on.
    pub fn backend(&self) -> BackendKind {
        self.id().backend
    }

    /// A human-readable name (the GPU's marketing name, or `host emulation`).
    pub fn name(&self) -> String {
        self.inner.backend.name()
    }

    /// Free and total memory of the device (`cuMemGetInfo`).
    ///
    /// # Errors
    /// A driver error when the query fails.
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        self.inner.backend.memory_info()
    }

    /// Total memory of the device, queried once and then cached.
    ///
    /// Resources that hand out device memory report it as their
    /// [`capacity_limit`](crate::MemoryResource::capacity_limit), so a request larger than the
    /// device fails at once instead of waiting for memory that can never come.
    ///
    /// ```
    /// let device = streamalloc::Device::host();
    /// assert_eq!(device.total_memory()?, device.memory_info()?.total);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    ///
    /// # Errors
    /// A driver error when the first query fails.
    pub fn total_memory(&self) -> Result<usize> {
        if let Some(&total) = self.inner.total_memory.get() {
            return Ok(total);
        }
        let total = self.memory_info()?.total;
        Ok(*self.inner.total_memory.get_or_init(|| total))
    }

    /// How this device's events wake the tasks that await them.
    pub fn completion_strategy(&self) -> CompletionStrategy {
        self.inner.driver.strategy()
    }

    /// Chooses how this device's events wake awaiting tasks, for events armed from now on.
    ///
    /// ```
    /// use streamalloc::{CompletionStrategy, Device, HostConfig};
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// device.set_completion_strategy(CompletionStrategy::Poller);
    /// assert_eq!(device.completion_strategy(), CompletionStrategy::Poller);
    /// ```
    pub fn set_completion_strategy(&self, strategy: CompletionStrategy) {
        self.inner.driver.set_strategy(strategy)
    }

    /// Resolves once the work enqueued so far on every stream of this device has completed
    /// (PyTorch's `torch.cuda.synchronize`, without blocking a thread): an event is recorded on
    /// each live stream when the future is first polled, and all of them are awaited.
    ///
    /// "Every stream" is every stream this crate has a handle to: those of [`Stream::new`],
    /// the default streams, streams adopted from other libraries, and those that resources
    /// keep. (On CUDA, work other libraries enqueue on streams of their own is not waited for;
    /// [`synchronize_blocking`](Device::synchronize_blocking) has the same reach.)
    ///
    /// [`Stream::new`]: crate::Stream::new
    ///
    /// # Errors
    /// The first error of a stream that failed or whose event could not be recorded; the
    /// other streams are still waited for. A [per-thread default
    /// stream](crate::Stream::per_thread_default) of another thread cannot be reached from this
    /// one: [`Error::WrongThread`] while a handle to it lives.
    ///
    /// # Cancel safety
    /// Dropping the future leaves every stream untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{Device, HostConfig, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host_with(HostConfig::default());
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// a.enqueue_delay(Duration::from_millis(10))?;
    /// b.enqueue_delay(Duration::from_millis(20))?;
    /// let (on_a, on_b) = (a.record()?, b.record()?);
    /// device.synchronize().await?;
    /// assert!(on_a.is_complete()? && on_b.is_complete()?);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn synchronize(&self) -> Result<()> {
        let mut first_error = None;
        let mut events = Vec::new();
        for stream in self.live_streams() {
            match stream.record() {
                Ok(event) => events.push(event),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        for event in events {
            if let Err(e) = event.await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Blocks the calling thread until the work enqueued so far on every stream of this device
    /// has completed; the reach of [`synchronize`](Device::synchronize). Do not call it on an
    /// async executor thread.
    ///
    /// # Errors
    /// The first error a stream reported; the other streams are still waited for. As
    /// [`synchronize`](Device::synchronize), a per-thread default stream of another thread is
    /// [`Error::WrongThread`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{Device, HostConfig, Stream};
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// let s = Stream::new(&device)?;
    /// s.enqueue_delay(Duration::from_millis(10))?;
    /// let done = s.record()?;
    /// device.synchronize_blocking()?;
    /// assert!(done.is_complete()?);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn synchronize_blocking(&self) -> Result<()> {
        let mut first_error = None;
        for stream in self.live_streams() {
            if let Err(e) = stream.synchronize_blocking() {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Keeps a weak handle to a new stream of this device, for
    /// [`synchronize`](Device::synchronize); forgets the dead ones on the way.
    pub(crate) fn track_stream(&self, stream: Weak<dyn TrackedStream>) {
        let mut streams = self.inner.streams.lock();
        streams.retain(|s| s.strong_count() > 0);
        streams.push(stream);
    }

    /// The streams of this device that are alive now.
    fn live_streams(&self) -> Vec<Arc<dyn TrackedStream>> {
        self.inner
            .streams
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Fault injection and accounting; `Some` on the host backend only.
    ///
    /// ```
    /// # use streamalloc::{Device, HostConfig};
    /// let device = Device::host_with(HostConfig::default());
    /// assert!(device.host_controls().is_some());
    /// ```
    pub fn host_controls(&self) -> Option<&HostControls> {
        self.inner.host_controls.as_ref()
    }

    /// Takes the oldest error not taken yet that was met where it could not be returned: a
    /// stream-ordered free that failed or freed memory twice, a copy whose future was dropped
    /// before it failed, a host function that panicked, a pool dropped with allocations still
    /// out.
    ///
    /// The device keeps the [`DEFERRED_ERRORS_KEPT`] oldest untaken errors; later ones are
    /// still counted by [`deferred_error_count`](Device::deferred_error_count) (and logged
    /// through `tracing`), so none goes unnoticed.
    ///
    /// ```
    /// # use streamalloc::{Device, HostConfig};
    /// assert!(Device::host_with(HostConfig::default()).take_deferred_error().is_none());
    /// ```
    pub fn take_deferred_error(&self) -> Option<Error> {
        self.inner.backend.errors().pop()
    }

    /// How many errors this device has deferred since it was created, taken or not.
    ///
    /// ```
    /// # use streamalloc::{Device, HostConfig};
    /// assert_eq!(Device::host_with(HostConfig::default()).deferred_error_count(), 0);
    /// ```
    pub fn deferred_error_count(&self) -> u64 {
        self.inner.backend.errors().total()
    }

    /// Records an error met where it could not be returned (in a `Drop`, on a stream's worker),
    /// in the one store the backend's own threads report into too.
    pub(crate) fn defer_error(&self, error: Error) {
        tracing::error!(device = %self.id(), %error, "deferred error");
        self.inner.backend.errors().keep(error);
    }

    pub(crate) fn raw(&self) -> &AnyBackend {
        &self.inner.backend
    }

    /// The device's completion driver, which arms on this device's backend
    /// ([`raw`](Device::raw)).
    pub(crate) fn completion_driver(&self) -> &CompletionDriver {
        &self.inner.driver
    }
}

/// Every device created so far that is still alive, by id.
fn live_devices() -> &'static Mutex<HashMap<DeviceId, Weak<DeviceInner>>> {
    static LIVE: OnceLock<Mutex<HashMap<DeviceId, Weak<DeviceInner>>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

impl Default for Device {
    /// CUDA device 0 when a driver and a device are present, else [`Device::host`]. Says which
    /// through a `tracing` event.
    fn default() -> Device {
        match Device::cuda(0) {
            Ok(d) => {
                tracing::info!(device = %d.id(), name = %d.name(), "using CUDA device");
                d
            }
            Err(e) => {
                tracing::info!(reason = %e, "no CUDA device; using the host backend");
                Device::host()
            }
        }
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for Device {}

impl std::hash::Hash for Device {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id().hash(state)
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device").field("id", &self.id()).finish()
    }
}
