//! [`Stream`]: the handle, its work and its checks.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::backend::{AnyStream, DefaultStream};
use crate::device::notify::ShadowStream;
use crate::device::{Device, TrackedStream};
use crate::error::Result;
use crate::ids::StreamId;

/// An owned, ordered queue of device work on one device. A cheap `Clone` handle: clones are the
/// same stream, which is destroyed when the last handle (and the last event on it) is dropped.
///
/// # Stream ordering
/// Work enqueued on a stream runs in the order it was enqueued. Work on two streams is
/// unordered unless one [`wait`](Stream::wait)s for an [`Event`](crate::Event) of the other.
///
/// # Examples
///
/// ```
/// use streamalloc::{Device, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let a = Stream::new(&device)?;
/// let b = Stream::new(&device)?;
/// let done_on_a = a.record()?;
/// b.wait(&done_on_a)?;          // b's later work runs after a's work so far
/// b.synchronize().await?;       // resumes once b is idle; blocks no thread
/// assert!(done_on_a.is_complete()?);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Stream {
    pub(super) inner: Arc<StreamInner>,
}

pub(crate) struct StreamInner {
    pub(super) id: StreamId,
    pub(super) device: Device,
    pub(super) raw: AnyStream,
    /// The private stream on which the completion driver's host functions run.
    pub(super) shadow: ShadowStream,
}

impl Stream {
    /// Creates a stream on `device` (non-blocking with respect to the legacy default stream).
    ///
    /// # Errors
    /// A driver error when the stream cannot be created; on the host backend,
    /// [`Error::Io`](crate::Error::Io) when its worker thread cannot be started.
    pub fn new(device: &Device) -> Result<Stream> {
        let raw = device.raw().create_stream()?;
        Ok(Stream::wrap(device, raw))
    }

    pub(super) fn wrap(device: &Device, raw: AnyStream) -> Stream {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let inner = Arc::new(StreamInner {
            id: StreamId(NEXT.fetch_add(1, Ordering::Relaxed)),
            device: device.clone(),
            raw,
            shadow: ShadowStream::default(),
        });
        // For `Device::synchronize`: the device keeps a weak handle to each of its streams.
        let weak: Weak<StreamInner> = Arc::downgrade(&inner);
        device.track_stream(weak);
        Stream { inner }
    }

    /// The device's legacy default stream (`CU_STREAM_LEGACY`, RMM's `cuda_stream_legacy`), for
    /// interop with libraries that enqueue work on it.
    ///
    /// Every call while a handle lives returns the same stream (equal, same [`id`](Stream::id)).
    /// Nothing is created on CUDA, and dropping the last handle destroys nothing: the stream
    /// belongs to the device's context. On CUDA it synchronizes with the context's blocking
    /// streams; the streams of [`Stream::new`] are non-blocking, so only explicit
    /// [`wait`](Stream::wait)s order them against it. The host backend emulates it with one
    /// queue per device, kept while a handle lives.
    ///
    /// Events, waits, awaiting, buffer hand-offs and every resource work with it as with an
    /// owned stream.
    ///
    /// # Errors
    /// Never on CUDA; the host backend cannot fail either (a worker thread that cannot be
    /// spawned panics, as for [`Stream::new`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let legacy = Stream::legacy_default(&device)?;
    /// assert_eq!(legacy, Stream::legacy_default(&device)?); // the same stream
    /// let mine = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::new(64, &legacy, CudaResource::new(&device)?).await?;
    /// buf.fill(3)?;                  // on the legacy stream
    /// buf.set_stream(&mine)?;        // `mine` waits for it
    /// assert_eq!(buf.copy_to_host(vec![0u8; 64]).await?, vec![3; 64]);
    /// legacy.synchronize().await?;
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn legacy_default(device: &Device) -> Result<Stream> {
        static LEGACY: Mutex<Vec<Weak<StreamInner>>> = Mutex::new(Vec::new());
        let mut cache = LEGACY.lock();
        cached_default(&mut cache, device, DefaultStream::Legacy)
    }

    /// The calling thread's per-thread default stream of the device (`CU_STREAM_PER_THREAD`,
    /// RMM's `cuda_stream_per_thread`), for interop with libraries built with
    /// `--default-stream per-thread`.
    ///
    /// Each thread gets its own stream: calls on one thread while a handle lives return the
    /// same stream, calls on two threads return two. Nothing is created on CUDA, and dropping
    /// the last handle destroys nothing.
    ///
    /// The handle belongs to the thread that obtained it. On CUDA it names the per-thread
    /// stream *of the thread that uses it*, so work enqueued through it elsewhere would land on
    /// another stream under the same [`id`](Stream::id), out of order with everything the
    /// crate orders by stream (pool reuse, buffer hand-offs and reads). So every operation that
    /// reaches the driver through it (records, waits, copies, fills, host functions,
    /// synchronizing, and the allocations, frees and buffer operations on it) fails on another
    /// thread with [`Error::WrongThread`](crate::Error::WrongThread), which names both threads;
    /// the host backend's emulation does the same. The handle itself may travel (it is `Send`
    /// like every `Stream`), and so may its events, which any thread may query and await. A
    /// buffer it owns dropped on another thread is not freed there: its memory is leaked and
    /// the error deferred to the device ([`Device::take_deferred_error`]). Don't let a task
    /// that moves between executor threads use it; each thread gets its own with this call.
    ///
    /// # Errors
    /// As [`legacy_default`](Stream::legacy_default).
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{Device, Stream};
    ///
    /// let device = Device::host();
    /// let mine = Stream::per_thread_default(&device)?;
    /// assert_eq!(mine, Stream::per_thread_default(&device)?);
    /// let d = device.clone();
    /// let other = std::thread::spawn(move || Stream::per_thread_default(&d).unwrap().id())
    ///     .join()
    ///     .unwrap();
    /// assert_ne!(mine.id(), other);
    ///
    /// let moved = mine.clone();
    /// let refused = std::thread::spawn(move || moved.record().map(drop)).join().unwrap();
    /// assert!(matches!(refused, Err(streamalloc::Error::WrongThread { .. })));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn per_thread_default(device: &Device) -> Result<Stream> {
        thread_local! {
            static PER_THREAD: RefCell<Vec<Weak<StreamInner>>> = const { RefCell::new(Vec::new()) };
        }
        PER_THREAD
            .with(|cache| cached_default(&mut cache.borrow_mut(), device, DefaultStream::PerThread))
    }

    /// This stream's process-unique id.
    pub fn id(&self) -> StreamId {
        self.inner.id
    }

    /// The device this stream belongs to.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Checks that the stream belongs to `device`, as every resource and container requires
    /// of the streams it is given; the error names `call`, the call (and argument) given this
    /// stream.
    #[inline]
    pub(crate) fn check_on(&self, device: &Device, call: &'static str) -> Result<()> {
        if self.device() == device {
            Ok(())
        } else {
            Err(crate::error::Error::DeviceMismatch {
                expected: device.id(),
                actual: self.device().id(),
                call,
            })
        }
    }

    /// The driver's handle for this stream (`CUstream` as an integer on CUDA), for logs and
    /// interop with other CUDA libraries.
    pub fn raw_handle(&self) -> u64 {
        self.inner.raw.raw_handle()
    }

    /// Resolves once all work enqueued so far has completed. Blocks no thread.
    ///
    /// # Errors
    /// A driver error when recording fails or the stream reports a failure.
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves leaves the stream untouched.
    pub async fn synchronize(&self) -> Result<()> {
        self.record()?.await
    }

    /// Blocks the calling thread until all work enqueued so far has completed
    /// (`cuStreamSynchronize`). Do not call it on an async executor thread.
    ///
    /// # Errors
    /// A driver error reported by the stream.
    pub fn synchronize_blocking(&self) -> Result<()> {
        self.inner.raw.synchronize_blocking()
    }

    /// Runs `f` on a backend thread once the stream reaches this point (`cuLaunchHostFunc`).
    /// Later work on this stream waits for `f` to return, so keep it short.
    ///
    /// On CUDA, `f` runs inside a host function, where the driver forbids every CUDA call.
    /// This crate checks for it: inside `f`, its operations that would call the driver fail
    /// with [`Error::Unsupported`](crate::Error::Unsupported), and dropping a handle whose drop
    /// would (a buffer, a stream, a resource) leaks what it holds and defers the error to the
    /// device. So send what `f` should release elsewhere (a channel) rather than dropping it
    /// there. Driver calls `f` makes through other libraries (cudarc, FFI) are theirs to
    /// refuse. On the host backend `f` runs on the stream's worker and may do anything.
    ///
    /// # Errors
    /// A driver error when the callback cannot be enqueued.
    ///
    /// ```
    /// # use streamalloc::{Device, Stream};
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    ///
    /// let stream = Stream::new(&Device::host())?;
    /// let ran = Arc::new(AtomicBool::new(false));
    /// let flag = ran.clone();
    /// stream.launch_host_fn(move || flag.store(true, Ordering::SeqCst))?;
    /// stream.synchronize_blocking()?;
    /// assert!(ran.load(Ordering::SeqCst));
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn launch_host_fn(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        self.inner.raw.host_fn(Box::new(f))
    }

    /// Enqueues an operation that occupies the stream for `duration`: a stand-in for a
    /// long-running kernel in tests of ordering. On the host backend the stream's worker sleeps;
    /// on CUDA a one-thread kernel spins on the GPU's global timer.
    ///
    /// # Errors
    /// A driver error when the spin kernel cannot be loaded or launched.
    ///
    /// ```
    /// # use streamalloc::{Device, Stream};
    /// use std::time::Duration;
    ///
    /// let stream = Stream::new(&Device::host())?;
    /// stream.enqueue_delay(Duration::from_millis(20))?;
    /// let event = stream.record()?;
    /// assert!(!event.is_complete()?);
    /// event.synchronize_blocking()?;
    /// assert!(event.is_complete()?);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn enqueue_delay(&self, duration: Duration) -> Result<()> {
        self.inner.raw.delay(duration)
    }

    pub(crate) fn raw(&self) -> &AnyStream {
        &self.inner.raw
    }

    pub(crate) fn shadow(&self) -> &ShadowStream {
        &self.inner.shadow
    }
}

impl TrackedStream for StreamInner {
    fn synchronize_blocking(&self) -> Result<()> {
        self.raw.synchronize_blocking()
    }

    fn record(self: Arc<Self>) -> Result<Pin<Box<dyn Future<Output = Result<()>> + Send>>> {
        let event = Stream { inner: self }.record()?;
        Ok(Box::pin(event))
    }
}

/// The default stream of `kind` for `device` from `cache`, or a new handle to it, cached. The
/// cache holds weak references (a strong one would keep the device alive for ever) and drops
/// the dead ones as it goes.
fn cached_default(
    cache: &mut Vec<Weak<StreamInner>>,
    device: &Device,
    kind: DefaultStream,
) -> Result<Stream> {
    let mut found = None;
    cache.retain(|weak| match weak.upgrade() {
        Some(inner) => {
            if found.is_none() && &inner.device == device {
                found = Some(inner);
            }
            true
        }
        None => false,
    });
    if let Some(inner) = found {
        return Ok(Stream { inner });
    }
    let stream = Stream::wrap(device, device.raw().default_stream(kind)?);
    cache.push(Arc::downgrade(&stream.inner));
    Ok(stream)
}

impl PartialEq for Stream {
    fn eq(&self, other: &Stream) -> bool {
        self.inner.id == other.inner.id
    }
}

impl Eq for Stream {}

impl std::hash::Hash for Stream {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.id.hash(state)
    }
}

/// A stream prints as its id and device, as error messages name it.
///
/// ```
/// # use streamalloc::{Device, Stream};
/// let device = Device::host();
/// let s = Stream::new(&device)?;
/// assert_eq!(s.to_string(), format!("{} on host:0", s.id()));
/// assert_eq!(format!("{s:?}"), format!("Stream({} on host:0)", s.id()));
/// # Ok::<(), streamalloc::Error>(())
/// ```
impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.inner.id, self.inner.device.id())
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({self})")
    }
}
