//! The crate's error type.

use std::time::Duration;

use crate::ids::{DeviceId, StreamId};

/// The result type of every fallible operation in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `streamalloc`.
///
/// Out-of-memory is always its own variant, distinct from every other failure, so a caller can
/// tell "wait or shed load" apart from "something is broken":
///
/// ```
/// use streamalloc::Error;
///
/// fn should_retry(e: &Error) -> bool {
///     e.is_out_of_memory()
/// }
/// # let device = streamalloc::Device::host();
/// let e = Error::out_of_memory(1 << 50, Some(0), device.id());
/// assert!(should_retry(&e));
/// assert!(e.to_string().contains("1125899906842624"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The resource cannot serve `requested` bytes now.
    ///
    /// Resources that know their state (a [`PoolResource`](crate::PoolResource), say) attach
    /// [`OutOfMemoryDetails`]: the largest block the requester could use, free and reserved
    /// bytes, and what is still pending in stream-ordered frees.
    #[error("out of memory on {device}: requested {requested} bytes{}{}",
        fmt_available(*.available), fmt_details(.details.as_deref()))]
    #[non_exhaustive]
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
        /// Bytes the resource reported as still available, when it knows.
        available: Option<usize>,
        /// The device the resource allocates on.
        device: DeviceId,
        /// What the resource knew about its state when it refused, when it says
        /// (boxed: the error stays small on the fast path).
        details: Option<Box<OutOfMemoryDetails>>,
    },
    /// The request is larger than the resource could ever serve (its
    /// [`capacity_limit`](crate::MemoryResource::capacity_limit): a pool's maximum, a budget,
    /// a block size, the device's memory): waiting or retrying cannot help. Out-of-memory too
    /// ([`is_out_of_memory`](Error::is_out_of_memory)), told apart from a request that does
    /// not fit *now* ([`Error::OutOfMemory`]).
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, Error, MemoryResource, PoolResource, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let pool = PoolResource::new(CudaResource::new(&device)?, 0, Some(1 << 20))?;
    /// let e = pool.try_allocate(2 << 20, &stream).unwrap_err();
    /// assert!(matches!(e, Error::TooLarge { requested, maximum, .. }
    ///     if requested == 2 << 20 && maximum == 1 << 20));
    /// assert!(e.is_out_of_memory());
    /// assert!(e.to_string().contains("can never fit"), "{e}");
    /// # Ok::<(), Error>(())
    /// ```
    #[error("out of memory on {device}: requested {requested} bytes, which can never fit (the resource serves at most {maximum} bytes)")]
    #[non_exhaustive]
    TooLarge {
        /// Bytes asked for.
        requested: usize,
        /// The largest request the resource could ever serve.
        maximum: usize,
        /// The device the resource allocates on.
        device: DeviceId,
    },
    /// An awaited allocation did not complete before its deadline.
    #[error("allocation of {requested} bytes on {device} timed out after {waited:?}")]
    #[non_exhaustive]
    Timeout {
        /// Bytes asked for.
        requested: usize,
        /// How long the request waited.
        waited: Duration,
        /// The device the resource allocates on.
        device: DeviceId,
    },
    /// An argument is out of range or inconsistent with another.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A copy between host and device data whose sides do not fit: the host side is shorter
    /// than the device data it should receive, or longer than the device memory it should fill.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Error, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::new(100, &stream, CudaResource::new(&device)?).await?;
    /// let e = buf.copy_to_host(vec![0u8; 96]).await.unwrap_err(); // 96 bytes < 100
    /// assert!(matches!(e, Error::LengthMismatch { device_len: 100, host_len: 96, .. }), "{e}");
    /// # Ok::<(), Error>(())
    /// # }).unwrap();
    /// ```
    #[error(
        "{call} of {element}: the device side holds {device_len} {unit}, the host side \
         {host_len} {unit}"
    )]
    #[non_exhaustive]
    LengthMismatch {
        /// The operation, e.g. `copy_to_host`.
        call: &'static str,
        /// The host side's element type (`u8` for a buffer's bytes), as `std::any::type_name`
        /// names it.
        element: &'static str,
        /// The length of the device side, in `unit`s.
        device_len: usize,
        /// The length of the host side, in `unit`s.
        host_len: usize,
        /// `"bytes"` for untyped buffers, `"elements"` for typed containers.
        unit: &'static str,
    },
    /// Memory that the host or the device cannot access was asked to serve as host data that
    /// the device copies directly (a [`PinnedHostVec`](crate::PinnedHostVec) from a resource of
    /// device memory, say).
    #[error("{what} needs memory that the host and the device can both access; the resource's memory on {device} is host-accessible: {host_accessible}, device-accessible: {device_accessible}")]
    #[non_exhaustive]
    NotHostAccessible {
        /// What asked, e.g. `PinnedHostVec`.
        what: &'static str,
        /// Whether host code can access the resource's memory.
        host_accessible: bool,
        /// Whether device code (and the copy engines) can access it.
        device_accessible: bool,
        /// The device of the resource.
        device: DeviceId,
    },
    /// The operation is not available on this backend or device.
    #[error("unsupported on {device}: {what}")]
    #[non_exhaustive]
    Unsupported {
        /// What was asked for.
        what: String,
        /// The device it was asked of.
        device: DeviceId,
    },
    /// The CUDA driver library could not be found or initialised.
    #[error("CUDA driver unavailable: {0}")]
    DriverUnavailable(String),
    /// There is no device with this ordinal.
    #[error("no CUDA device {ordinal} (found {count})")]
    #[non_exhaustive]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// A driver call failed with a code other than out-of-memory.
    #[error("{call} failed on {device}: {name} ({code})")]
    #[non_exhaustive]
    Driver {
        /// The driver entry point, e.g. `cuEventRecord`.
        call: &'static str,
        /// The driver's numeric result code.
        code: i32,
        /// The driver's name for it, e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: String,
        /// The device it happened on.
        device: DeviceId,
    },
    /// Writing a file or other I/O stream failed (an allocation log, for example). Reading an
    /// allocation log fails with [`ReplayError`](crate::replay::ReplayError) instead.
    #[error("{context}: {message}")]
    #[non_exhaustive]
    Io {
        /// What was being done, with the path where there is one.
        context: String,
        /// The I/O error's kind.
        kind: std::io::ErrorKind,
        /// The I/O error's message.
        message: String,
    },
    /// A blocking call would have had to wait on the thread of a current-thread async runtime
    /// (tokio's `current_thread` flavor), which nothing else can run on meanwhile: the memory
    /// it waits for could never come back. Await the async form instead.
    #[error("{call} of {requested} bytes on {device} would block a current-thread runtime's only thread; await the async form instead")]
    #[non_exhaustive]
    BlockingInAsyncContext {
        /// The blocking call, e.g. `allocate_blocking`.
        call: &'static str,
        /// Bytes asked for.
        requested: usize,
        /// The device of the resource.
        device: DeviceId,
    },
    /// A resource was dropped while allocations from it were still out, so it leaked the
    /// memory under them rather than free memory someone may still use. Reported through
    /// [`Device::take_deferred_error`](crate::Device::take_deferred_error), since a drop
    /// cannot return an error.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, Error, HostConfig, MemoryResource, PoolResource, Stream};
    ///
    /// let device = Device::host_with(HostConfig::default());
    /// let stream = Stream::new(&device)?;
    /// let pool = PoolResource::new(CudaResource::new(&device)?, 0, None)?;
    /// let _leaked = pool.try_allocate(1000, &stream)?;
    /// drop(pool);
    /// let err = device.take_deferred_error().unwrap();
    /// assert!(matches!(err, Error::Leaked { allocations: 1, bytes: 1024, .. }), "{err}");
    /// # Ok::<(), Error>(())
    /// ```
    #[error("{what} on {device} dropped with {allocations} allocations ({bytes} bytes) still out; their memory is leaked")]
    Leaked {
        /// The resource, e.g. `PoolResource`.
        what: &'static str,
        /// How many allocations were still out.
        allocations: usize,
        /// Their bytes, as the resource rounded them.
        bytes: usize,
        /// The device the resource allocates on.
        device: DeviceId,
    },
    /// A resource or stream was used with a device it does not belong to.
    #[error("device mismatch in {call}: expected {expected}, got {actual}")]
    #[non_exhaustive]
    DeviceMismatch {
        /// The device of the resource (or buffer) called.
        expected: DeviceId,
        /// The device of the stream, buffer or resource passed in.
        actual: DeviceId,
        /// The call and the argument of the other device, e.g.
        /// `PoolResource::try_allocate(stream)`.
        call: &'static str,
    },
    /// A stream was used on a thread that cannot use it: a per-thread default stream
    /// ([`Stream::per_thread_default`](crate::Stream::per_thread_default)) belongs to the
    /// thread that got it. Its driver handle (`CU_STREAM_PER_THREAD`) names the stream of
    /// whichever thread uses it, so work enqueued through it elsewhere would land on another
    /// stream under the same [`StreamId`], out of order with everything keyed on that id.
    /// Each thread gets its own with `Stream::per_thread_default`.
    ///
    /// ```
    /// use streamalloc::{Device, Error, Stream};
    ///
    /// let mine = Stream::per_thread_default(&Device::host())?;
    /// let refused = std::thread::spawn(move || mine.record().map(drop)).join().unwrap();
    /// assert!(matches!(refused, Err(Error::WrongThread { .. })), "{refused:?}");
    /// # Ok::<(), Error>(())
    /// ```
    #[error("the per-thread default stream of {device} belongs to thread '{home_name}' ({home:?}); thread '{current_name}' ({current:?}) cannot use it (there the same handle names that thread's own stream)")]
    #[non_exhaustive]
    WrongThread {
        /// The thread the stream belongs to.
        home: std::thread::ThreadId,
        /// Its name, or `<unnamed>`.
        home_name: String,
        /// The thread that tried to use it.
        current: std::thread::ThreadId,
        /// Its name, or `<unnamed>`.
        current_name: String,
        /// The stream's device.
        device: DeviceId,
    },
    /// An awaited allocation would wait for ever: every byte allocated from the bounded
    /// resource is held by tasks that are themselves waiting on it, so nothing can come back.
    /// Reported only where deadlock detection is on
    /// ([`Availability::set_deadlock_detection`](crate::Availability::set_deadlock_detection):
    /// off by default, since memory a task hands to another would be counted as the first
    /// task's). What is detected, and what is not, is in the book's "Awaiting memory" chapter
    /// and on [`Allocate`](crate::Allocate).
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{CudaResource, Device, Error, LimitingAdaptor, MemoryResource, Stream};
    ///
    /// # let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    /// # rt.block_on(rt.spawn(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mr = LimitingAdaptor::new(CudaResource::new(&device)?, 4096);
    /// mr.availability().unwrap().set_deadlock_detection(true);
    /// let held = mr.allocate(4096, &stream).await?; // this task holds the whole budget...
    /// let more = mr.allocate(1024, &stream).timeout(Duration::from_secs(5)).await;
    /// let Err(e @ Error::WouldDeadlock { requested: 1024, held_by_waiters: 4096, .. }) = more
    /// else { panic!("{more:?}") };                  // ...and waits for more: never served
    /// assert!(e.to_string().contains("deadlock"), "{e}");
    /// unsafe { mr.deallocate(held, 4096, &stream) };
    /// # Ok::<(), Error>(())
    /// # })).unwrap().unwrap();
    /// ```
    #[error("{requested} bytes on {device} would wait for ever (deadlock): all {allocated} bytes allocated from the resource (limit {limit}) are held by the {waiting_tasks} tasks waiting on it, which hold {held_by_waiters} bytes")]
    #[non_exhaustive]
    WouldDeadlock {
        /// Bytes asked for.
        requested: usize,
        /// Bytes allocated from the resource now, as it counts them.
        allocated: usize,
        /// The most the resource can hold ([`capacity_limit`](crate::MemoryResource::capacity_limit)).
        limit: usize,
        /// Bytes the waiting tasks hold (as they asked for them).
        held_by_waiters: usize,
        /// How many tasks wait on the resource, the requester included.
        waiting_tasks: usize,
        /// The device the resource allocates on.
        device: DeviceId,
    },
}

/// What a resource knew about its memory when it refused a request: the numbers that tell
/// fragmentation ("enough free bytes, no block large enough") apart from exhaustion, and memory
/// that is only waiting for another stream to pass its frees.
///
/// Every field is optional: a resource fills in what it knows. The sub-allocators read them
/// from their fragmentation figures as counted for the requesting stream
/// ([`Fragmentation::out_of_memory_details`](crate::Fragmentation::out_of_memory_details)), so
/// each field means the same whichever resource refused.
///
/// ```
/// use streamalloc::{Device, Error, OutOfMemoryDetails, StreamId};
///
/// let mut details = OutOfMemoryDetails::default();
/// details.largest_free_block = Some(4096);
/// details.free_bytes = Some(8192);
/// details.reserved_bytes = Some(1 << 20);
/// details.pending_frees = vec![(StreamId(3), 65536)];
/// let e = Error::out_of_memory_with(1 << 16, Device::host().id(), details);
/// assert!(matches!(&e, Error::OutOfMemory { details: Some(d), .. }
///     if d.largest_free_block == Some(4096)));
/// let text = e.to_string();
/// assert!(text.contains("largest free block 4096"), "{text}");
/// assert!(text.contains("65536 bytes pending on stream#3"), "{text}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutOfMemoryDetails {
    /// The largest free extent: the largest request the free memory could serve, after the
    /// waits for other streams' frees that the resource inserts itself.
    pub largest_free_block: Option<usize>,
    /// Free bytes the resource holds (usable now or not).
    pub free_bytes: Option<usize>,
    /// Bytes the resource has taken from its upstream (or the device).
    pub reserved_bytes: Option<usize>,
    /// Bytes freed in stream order that the requester cannot use yet, per freeing stream.
    pub pending_frees: Vec<(StreamId, usize)>,
}

impl std::fmt::Display for OutOfMemoryDetails {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if let Some(b) = self.largest_free_block {
            parts.push(format!("largest free block {b}"));
        }
        if let Some(b) = self.free_bytes {
            parts.push(format!("{b} bytes free"));
        }
        if let Some(b) = self.reserved_bytes {
            parts.push(format!("{b} bytes reserved"));
        }
        for (stream, b) in &self.pending_frees {
            parts.push(format!("{b} bytes pending on {stream}"));
        }
        f.write_str(&parts.join(", "))
    }
}

fn fmt_available(available: Option<usize>) -> String {
    match available {
        Some(a) => format!(" ({a} available)"),
        None => String::new(),
    }
}

fn fmt_details(details: Option<&OutOfMemoryDetails>) -> String {
    match details {
        Some(d) if *d != OutOfMemoryDetails::default() => format!(" [{d}]"),
        _ => String::new(),
    }
}

impl Error {
    /// True for [`Error::OutOfMemory`] and [`Error::TooLarge`]: the resource cannot serve
    /// the request (now, or ever).
    ///
    /// ```
    /// # use streamalloc::{Device, Error};
    /// assert!(!Error::InvalidArgument("x".into()).is_out_of_memory());
    /// assert!(Error::too_large(1 << 30, 1 << 20, Device::host().id()).is_out_of_memory());
    /// ```
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory { .. } | Error::TooLarge { .. })
    }

    /// True for [`Error::TooLarge`]: the request can never fit, so waiting or retrying is
    /// pointless.
    ///
    /// ```
    /// # use streamalloc::{Device, Error};
    /// let device = Device::host().id();
    /// assert!(Error::too_large(1 << 30, 1 << 20, device).never_fits());
    /// assert!(!Error::out_of_memory(1 << 30, Some(0), device).never_fits());
    /// ```
    pub fn never_fits(&self) -> bool {
        matches!(self, Error::TooLarge { .. })
    }

    /// [`Error::TooLarge`], for resources written outside the crate.
    ///
    /// ```
    /// # use streamalloc::{Device, Error};
    /// let e = Error::too_large(4096, 1024, Device::host().id());
    /// assert!(matches!(e, Error::TooLarge { requested: 4096, maximum: 1024, .. }));
    /// ```
    pub fn too_large(requested: usize, maximum: usize, device: DeviceId) -> Self {
        Error::TooLarge {
            requested,
            maximum,
            device,
        }
    }

    /// `self`, made [`Error::TooLarge`] when it is an out-of-memory error for a request above
    /// `limit` (a resource's [`capacity_limit`](crate::MemoryResource::capacity_limit)).
    pub(crate) fn never_fitting(self, limit: Option<usize>) -> Self {
        match (self, limit) {
            (
                Error::OutOfMemory {
                    requested, device, ..
                },
                Some(maximum),
            ) if requested > maximum => Error::too_large(requested, maximum, device),
            (e, _) => e,
        }
    }

    /// [`Error::OutOfMemory`], for resources written outside the crate (a
    /// [`CallbackResource`](crate::CallbackResource)'s closure, say): struct variants are
    /// `#[non_exhaustive]`, so they are built through functions.
    ///
    /// ```
    /// # use streamalloc::{Device, Error};
    /// let e = Error::out_of_memory(4096, None, Device::host().id());
    /// assert!(matches!(e, Error::OutOfMemory { requested: 4096, available: None, .. }));
    /// ```
    pub fn out_of_memory(requested: usize, available: Option<usize>, device: DeviceId) -> Self {
        Error::OutOfMemory {
            requested,
            available,
            device,
            details: None,
        }
    }

    /// [`Error::OutOfMemory`] with the resource's [`OutOfMemoryDetails`]; `available` is taken
    /// from `details.free_bytes`.
    ///
    /// ```
    /// # use streamalloc::{Device, Error, OutOfMemoryDetails};
    /// let mut details = OutOfMemoryDetails::default();
    /// details.free_bytes = Some(512);
    /// let e = Error::out_of_memory_with(4096, Device::host().id(), details);
    /// assert!(matches!(e, Error::OutOfMemory { requested: 4096, available: Some(512), .. }));
    /// ```
    pub fn out_of_memory_with(
        requested: usize,
        device: DeviceId,
        details: OutOfMemoryDetails,
    ) -> Self {
        Error::OutOfMemory {
            requested,
            available: details.free_bytes,
            device,
            details: Some(Box::new(details)),
        }
    }

    /// The [`OutOfMemoryDetails`] of an [`Error::OutOfMemory`], when the resource gave them.
    ///
    /// ```
    /// # use streamalloc::{Device, Error};
    /// assert!(Error::out_of_memory(1, None, Device::host().id()).out_of_memory_details().is_none());
    /// ```
    pub fn out_of_memory_details(&self) -> Option<&OutOfMemoryDetails> {
        match self {
            Error::OutOfMemory { details, .. } => details.as_deref(),
            _ => None,
        }
    }

    pub(crate) fn io(context: impl Into<String>, error: &std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            kind: error.kind(),
            message: error.to_string(),
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }

    #[cfg_attr(not(feature = "cuda-driver"), allow(dead_code))] // only the CUDA backend refuses
    pub(crate) fn unsupported(what: impl Into<String>, device: DeviceId) -> Self {
        Error::Unsupported {
            what: what.into(),
            device,
        }
    }
}
