use std::fmt;

use crate::backend::MemPoolConfig;
use crate::device::Device;
use crate::error::Result;
use crate::resource::contract::forward::memory_resource;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::leaf::cuda_async_view::CudaAsyncViewResource;
use crate::stream::Stream;

/// Which OS handle a [`CudaAsyncResource`]'s memory can be exported as, for IPC
/// (`CUmemAllocationHandleType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ExportHandleType {
    /// No export (the default).
    #[default]
    None,
    /// A POSIX file descriptor.
    PosixFileDescriptor,
    /// A Windows NT handle.
    Win32,
    /// A Windows KMT handle.
    Win32Kmt,
    /// A fabric handle (multi-node NVLink).
    Fabric,
}

impl ExportHandleType {
    pub(crate) fn bits(self) -> u32 {
        match self {
            ExportHandleType::None => 0,
            ExportHandleType::PosixFileDescriptor => 1,
            ExportHandleType::Win32 => 2,
            ExportHandleType::Win32Kmt => 4,
            ExportHandleType::Fabric => 8,
        }
    }
}

/// Stream-ordered allocation from a driver memory pool of its own: `cuMemAllocFromPoolAsync` /
/// `cuMemFreeAsync` (RMM's `cuda_async_memory_resource`).
///
/// The pool keeps freed memory cached across synchronizations (release threshold `u64::MAX`
/// unless set), so after warm-up allocations do not reach the OS. Clones share the pool, which
/// is destroyed with the last clone (and the last [`CudaAsyncViewResource`] over it).
///
/// It is a [`CudaAsyncViewResource`] of the pool it owns: it allocates, frees and compares
/// as that view does (an owner and a view of its pool are one resource), and adds the pool's
/// creation and management.
///
/// # Stream ordering
/// Memory is usable on the allocating stream at once; a free is reusable by work ordered after
/// it, as the driver's pool guarantees.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaAsyncResource, Device, MemoryResource, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = CudaAsyncResource::builder(&device).initial_pool_size(1 << 20).build()?;
/// let p = mr.try_allocate(1 << 16, &stream)?;
/// unsafe { mr.deallocate(p, 1 << 16, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Clone)]
pub struct CudaAsyncResource {
    /// A view of the pool this resource created: the last handle to it destroys the pool.
    view: CudaAsyncViewResource,
}

// Here rather than beside the view, which then needs nothing of this file.
impl CudaAsyncViewResource {
    /// A view of `owner`'s pool. The view keeps the pool alive.
    pub fn of(owner: &CudaAsyncResource) -> Self {
        owner.view().clone()
    }
}

/// Settings of a [`CudaAsyncResource`]; `Option` fields with documented defaults.
#[derive(Debug, Clone)]
pub struct CudaAsyncResourceBuilder {
    device: Device,
    initial_pool_size: Option<usize>,
    release_threshold: Option<u64>,
    export_handle_type: Option<ExportHandleType>,
}

impl CudaAsyncResourceBuilder {
    crate::builder::option_setters! {
        /// Primes the pool with this many bytes (allocated and freed once at construction).
        /// Default: no priming.
        fn initial_pool_size(bytes: usize) => initial_pool_size;
        /// Bytes the pool keeps cached when the device synchronizes
        /// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`). Default `u64::MAX`: keep everything.
        fn release_threshold(bytes: u64) => release_threshold;
        /// The OS handle type memory may be exported as. Default [`ExportHandleType::None`].
        fn export_handle_type(kind: ExportHandleType) => export_handle_type;
    }

    /// Creates the pool.
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) when the device has no memory pools or
    /// cannot export the handle type; out-of-memory when priming fails; driver errors.
    pub fn build(self) -> Result<CudaAsyncResource> {
        let config = MemPoolConfig {
            release_threshold: self.release_threshold.unwrap_or(u64::MAX),
            export_handle_types: self.export_handle_type.unwrap_or_default().bits(),
        };
        let pool = self.device.raw().create_mempool(&config)?;
        let mr = CudaAsyncResource {
            view: CudaAsyncViewResource::over(&self.device, pool),
        };
        if let Some(bytes) = self.initial_pool_size.filter(|&b| b > 0) {
            let stream = Stream::new(&self.device)?;
            let p = mr.try_allocate(bytes, &stream)?;
            // SAFETY: just allocated from this resource on `stream`; nothing uses it.
            unsafe { mr.deallocate(p, bytes, &stream) };
            stream.synchronize_blocking()?;
        }
        Ok(mr)
    }
}

impl CudaAsyncResource {
    /// A resource over a new driver pool of `device` with the default settings.
    ///
    /// # Errors
    /// As [`CudaAsyncResourceBuilder::build`].
    pub fn new(device: &Device) -> Result<Self> {
        Self::builder(device).build()
    }

    /// Settings for a new pool of `device`.
    pub fn builder(device: &Device) -> CudaAsyncResourceBuilder {
        CudaAsyncResourceBuilder {
            device: device.clone(),
            initial_pool_size: None,
            release_threshold: None,
            export_handle_type: None,
        }
    }

    /// The driver's pool handle (`CUmemoryPool` as an integer on CUDA).
    pub fn pool_handle(&self) -> u64 {
        self.view.pool_handle()
    }

    /// Bytes the pool now holds from the device, in use or cached
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    ///
    /// # Errors
    /// Driver errors.
    pub fn reserved_bytes(&self) -> Result<usize> {
        self.view.pool().reserved()
    }

    /// Returns cached memory to the device until the pool holds at most `keep` bytes
    /// (`cuMemPoolTrimTo`).
    ///
    /// # Errors
    /// Driver errors.
    pub fn trim_to(&self, keep: usize) -> Result<()> {
        self.view.pool().trim_to(keep)
    }

    /// The view of the pool this resource owns.
    pub(crate) fn view(&self) -> &CudaAsyncViewResource {
        &self.view
    }
}

memory_resource!(delegate [] CudaAsyncResource, |this| this.view);

impl fmt::Debug for CudaAsyncResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.view.debug_as("CudaAsyncResource", f)
    }
}

impl PartialEq for CudaAsyncResource {
    /// Equal when they allocate from the same driver pool (clones are equal; two constructions
    /// are not).
    fn eq(&self, other: &Self) -> bool {
        self.view.pool_handle() == other.view.pool_handle()
            && self.view.device() == other.view.device()
    }
}
