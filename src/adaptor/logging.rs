use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::SystemTime;

use clock::{Clock, StampReader, Stamps};

use parking_lot::Mutex;

use crate::device::{Device, DeviceId};
use crate::error::{Error, Result};
use crate::resource::contract::forward::{memory_resource, Forward};
use crate::resource::{DevicePtr, MemoryResource, SharedResource};
use crate::stream::Stream;

use crate::rmm_csv::{write_header, Action, LineFormatter, Record, MAX_LINE};

/// The environment variable [`LoggingAdaptor::from_env`] reads the log file's path from (RMM's
/// is `RMM_LOG_FILE`).
pub const LOG_FILE_ENV: &str = "STREAMALLOC_LOG_FILE";

/// Logs every allocation and free to a CSV file or writer in RMM's format, byte for byte
/// (RMM's `logging_resource_adaptor`), so logs written here replay in RMM's `REPLAY_BENCHMARK`
/// (with [`streams_as_default`](LoggingAdaptorBuilder::streams_as_default)) and RMM's logs
/// replay here ([`replay`](crate::replay)).
///
/// The first line is [`LOG_HEADER`](crate::replay::LOG_HEADER), `Thread,Time,Action,Pointer,Size,Stream`; then one line per
/// call:
///
/// | column | content |
/// |---|---|
/// | `Thread` | the OS thread id of the caller, in decimal (Linux's `gettid`, as spdlog's `%t`) |
/// | `Time` | the time of day, `HH:MM:SS.ffffff` (spdlog's `%H:%M:%S.%f`) |
/// | `Action` | `allocate`, `allocate failure` or `free` |
/// | `Pointer` | as C's `%p` prints it: `0x7f3a5c000000`, or `(nil)` for the null pointer (failures, 0 bytes) |
/// | `Size` | the requested bytes, in decimal |
/// | `Stream` | [`Stream::raw_handle`] as C++ streams print a pointer: `0x55d0c2a3e610`, or `0` (see [`LoggingAdaptorBuilder::streams_as_default`]) |
///
/// ```text
/// Thread,Time,Action,Pointer,Size,Stream
/// 81234,14:02:07.120931,allocate,0x7f3a5c000000,1048576,0x55d0c2a3e610
/// 81234,14:02:07.121007,allocate failure,(nil),1125899906842624,0x55d0c2a3e610
/// 81234,14:02:07.121044,free,0x7f3a5c000000,1048576,0x55d0c2a3e610
/// ```
///
/// As in RMM, an allocation is logged after the upstream returns and a free before it reaches
/// the upstream, so in the file a free of an address always comes before its next allocation,
/// whichever threads made them. Lines are recorded under one lock, and the time is read under
/// it, so times never go backwards down the file. Where a platform has no OS thread id to read
/// (outside Linux), `Thread` is a number unique to the thread within the process.
///
/// The time is the clock's time of day in UTC, where RMM prints local time: the standard
/// library cannot read the local time zone. By default a call reads the CPU's time-stamp
/// counter where the kernel keeps the system's time by it (Linux's clocksource `tsc`), or
/// could (`tsc` available and the CPU's counter invariant): a third of a `clock_gettime`'s
/// cost. The writer turns it into [`SystemTime`]'s time of day. Elsewhere a call reads
/// [`SystemTime::now`]. Give [`LoggingAdaptorBuilder::clock`] a clock
/// shifted by your UTC offset for local times. RMM's parser ignores the column.
///
/// # Flushing
/// Buffered by default, off the hot path: a call records the raw fields of its line (a few
/// words, under the lock that orders the lines) and a writer thread of the adaptor formats
/// them and writes them, a batch of 1,024 at a time. Lines reach the file or writer on
/// [`flush`](Self::flush) (which returns once every line logged before it is written and the
/// writer flushed), when the last clone of the adaptor is dropped (which waits for the writer
/// thread to write the rest and flush), and otherwise as batches fill. If the writer falls
/// 64 batches behind, callers wait for it, so memory stays bounded. With
/// [`LoggingAdaptorBuilder::auto_flush`] (RMM's `auto_flush`) there is no writer thread: each
/// call formats, writes and flushes its own line before it returns.
///
/// What a panic or an exit loses: a panic that unwinds drops the adaptor like any value, and
/// the drop writes everything. Lines still buffered are lost when the process ends without
/// dropping the adaptor (`std::process::exit`, an abort, a panic with `panic = "abort"`, an
/// adaptor leaked or kept in a `static`), as a `BufWriter`'s are; call
/// [`flush`](Self::flush) before such an exit, or use `auto_flush` when every line must
/// survive a crash.
///
/// # Awaiting memory
/// The adaptor forwards the upstream's [`availability`](MemoryResource::availability) and
/// [`capacity_limit`](MemoryResource::capacity_limit), so awaited allocations wait through it as
/// on the upstream. Each attempt is a `try_allocate` and is logged: a request that waited shows
/// as `allocate failure` lines, then an `allocate`.
///
/// # Stream ordering
/// A line records when the host made the call; the device reaches a stream-ordered free
/// later. The `Stream` column says which stream it is ordered on.
///
/// # Errors
/// Opening the file and writing the header are errors of the constructors ([`Error::Io`]). A
/// line that cannot be written cannot fail the allocation or free it describes: the first such
/// error is kept ([`write_error`](Self::write_error), returned by [`flush`](Self::flush)) and
/// logged through `tracing` at `ERROR`, and the adaptor stops logging, since the file may end
/// in a partial line. Allocations and frees go on as before. Buffered, a write fails on the
/// writer thread, so the error shows once that batch is written (at the latest at the next
/// [`flush`](Self::flush)). The last drop cannot return an error: one that `flush` and
/// `write_error` never handed out (a failed write nobody asked about, the final flush, a
/// writer that panicked on the last lines) goes to the upstream device's deferred errors
/// ([`Device::take_deferred_error`]).
///
/// # Examples
///
/// ```
/// use streamalloc::replay::{parse_log_file, Action};
/// use streamalloc::{CudaResource, Device, LoggingAdaptor, MemoryResource, Stream};
///
/// let path = std::env::temp_dir().join(format!("streamalloc-doc-{}.csv", std::process::id()));
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = LoggingAdaptor::to_file(CudaResource::new(&device)?, &path)?;
/// let p = mr.try_allocate(4096, &stream)?;
/// unsafe { mr.deallocate(p, 4096, &stream) };
/// mr.flush()?;
///
/// let text = std::fs::read_to_string(&path).unwrap();
/// assert!(text.starts_with("Thread,Time,Action,Pointer,Size,Stream\n"));
/// let events = parse_log_file(&path)?;
/// assert_eq!(events.len(), 2);
/// assert_eq!((events[0].action, events[0].bytes, events[0].ptr), (Action::Allocate, 4096, p));
/// assert_eq!(events[1].action, Action::Free);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LoggingAdaptor<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

struct Inner<R> {
    upstream: R,
    /// The upstream's device, whose deferred errors get what the last drop cannot return.
    device: DeviceId,
    /// Where the lines go; its lock orders them (and the clock reads).
    output: Mutex<Output>,
    /// What the caller and the writer thread share: the first error, and whether logging
    /// stopped.
    status: Arc<Status>,
    auto_flush: bool,
    streams_as_default: bool,
    /// What a line's time is read from.
    stamps: Stamps,
    path: Option<PathBuf>,
}

/// How many records the hot path gathers before it hands them to the writer thread, and how
/// many such batches may wait for it before a caller blocks (bounded memory: 64 Ki records,
/// 3 MiB, when the writer falls behind).
const BATCH: usize = 1024;
const BATCHES_IN_FLIGHT: usize = 64;

enum Output {
    /// `auto_flush`: each line is formatted, written and flushed by the caller, under the
    /// lock, so it is in the file when the call returns.
    Direct(Sink),
    /// Buffered: records gather here and go to the writer thread in batches, sent under the
    /// lock so that batches keep the order of the lines.
    Batched {
        records: Vec<Record>,
        to_writer: SyncSender<Message>,
        /// Emptied batches coming back from the writer, to be filled again.
        recycled: Receiver<Vec<Record>>,
        writer: Option<JoinHandle<()>>,
    },
}

enum Message {
    Records(Vec<Record>),
    /// Write these, then flush, then answer.
    Flush(Vec<Record>, SyncSender<()>),
}

#[derive(Default)]
struct Status {
    /// Set once a write has failed: the hot path then records nothing.
    stopped: AtomicBool,
    /// The first write error.
    error: Mutex<Option<Error>>,
    /// Whether `flush` or `write_error` has handed the error out; if not, the last drop
    /// defers it to the device.
    reported: AtomicBool,
}

impl Status {
    /// The first write error, as the caller is told it.
    fn report(&self) -> Option<Error> {
        let error = self.error.lock().clone();
        if error.is_some() {
            self.reported.store(true, Relaxed);
        }
        error
    }
}

struct Sink {
    /// `None` once a write has failed (logging stopped).
    out: Option<BufWriter<Box<dyn Write + Send>>>,
    status: Arc<Status>,
    format: LineFormatter,
    /// Turns the records' stamps into times.
    stamps: StampReader,
    /// The last counter stamp's time ([`Conversion::unix_nanos`](clock::Conversion::unix_nanos)).
    last_nanos: u64,
    /// The text of a batch, kept to reuse its allocation.
    text: Vec<u8>,
}

impl Sink {
    fn write_records(&mut self, records: &[Record]) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        self.text.clear();
        self.text.reserve(records.len() * MAX_LINE);
        let conversion = self.stamps.now();
        for record in records {
            let nanos = conversion.unix_nanos(record.stamp, &mut self.last_nanos);
            self.format.line(&mut self.text, record, nanos);
        }
        if let Err(e) = out.write_all(&self.text) {
            self.fail(&e);
        }
    }

    fn flush(&mut self) -> Result<()> {
        if let Some(out) = self.out.as_mut() {
            if let Err(e) = out.flush() {
                self.fail(&e);
            }
        }
        self.status.error.lock().clone().map_or(Ok(()), Err)
    }

    /// Records the error and stops logging; the buffered rest is discarded, not flushed.
    fn fail(&mut self, e: &io::Error) {
        let error = Error::io("writing the allocation log", e);
        tracing::error!(%error, "the allocation log stops here");
        if let Some(out) = self.out.take() {
            drop(out.into_parts());
        }
        self.status.stopped.store(true, Relaxed);
        self.status.error.lock().get_or_insert(error);
    }

    /// The writer thread: formats and writes the batches in the order they were sent, flushes
    /// when asked and when every sender is gone (the adaptor's last drop).
    fn run(mut self, from_callers: Receiver<Message>, recycle: SyncSender<Vec<Record>>) {
        for message in from_callers {
            match message {
                Message::Records(mut records) => {
                    self.write_records(&records);
                    records.clear();
                    // The hot path may have enough batches already: then this one goes.
                    let _ = recycle.try_send(records);
                }
                Message::Flush(records, done) => {
                    self.write_records(&records);
                    let _ = self.flush();
                    let _ = done.send(());
                }
            }
        }
        // Errors were logged where they happened.
        let _ = self.flush();
    }
}

/// The log's writer thread has gone (it panicked in the user's writer): lines were lost.
struct WriterGone;

impl Output {
    /// Hands the records gathered so far to the writer thread and waits until they and all
    /// before them are written and flushed. Called with the lock held; returns what to wait on.
    /// `Err` when the writer thread is gone (it panicked in the user's writer).
    fn start_flush(&mut self) -> std::result::Result<Option<Receiver<()>>, WriterGone> {
        match self {
            Output::Direct(sink) => {
                let _ = sink.flush();
                Ok(None)
            }
            Output::Batched {
                records, to_writer, ..
            } => {
                let (done_tx, done_rx) = mpsc::sync_channel(1);
                let batch = std::mem::take(records);
                to_writer
                    .send(Message::Flush(batch, done_tx))
                    .map_err(|_| WriterGone)?;
                Ok(Some(done_rx))
            }
        }
    }
}

impl<R> Drop for Inner<R> {
    /// Writes the rest and flushes; an error no caller was told of (a write that failed, the
    /// final flush, a writer that panicked) goes to the device's deferred errors, since a drop
    /// cannot return it.
    fn drop(&mut self) {
        match self.output.get_mut() {
            Output::Direct(sink) => {
                // An error is kept in `status`, reported below.
                let _ = sink.flush();
            }
            Output::Batched {
                records,
                to_writer,
                writer,
                ..
            } => {
                if !records.is_empty() {
                    let _ = to_writer.send(Message::Records(std::mem::take(records)));
                }
                // Closing the channel (replacing the only sender) ends the writer's loop
                // after it has written everything sent; it flushes then.
                let (closed, _) = mpsc::sync_channel(0);
                drop(std::mem::replace(to_writer, closed));
                if let Some(writer) = writer.take() {
                    if writer.join().is_err() {
                        self.writer_gone();
                    }
                }
            }
        }
        if self.status.reported.load(Relaxed) {
            return;
        }
        let error = self.status.error.lock().take();
        if let (Some(error), Some(device)) = (error, Device::from_id(self.device)) {
            device.defer_error(error);
        }
    }
}

/// Options of a [`LoggingAdaptor`]: auto-flush and the clock.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use streamalloc::{CudaResource, Device, LoggingAdaptor};
///
/// let device = Device::host();
/// // Local times for a zone two hours east of UTC, and every line flushed as it is written.
/// let offset = Duration::from_secs(2 * 3600);
/// let mr = LoggingAdaptor::builder()
///     .auto_flush(true)
///     .clock(move || SystemTime::now() + offset)
///     .build_to_writer(CudaResource::new(&device)?, std::io::sink())?;
/// assert!(mr.auto_flush());
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Default)]
pub struct LoggingAdaptorBuilder {
    auto_flush: Option<bool>,
    streams_as_default: Option<bool>,
    clock: Option<Clock>,
}

impl LoggingAdaptorBuilder {
    /// The default options: buffered, UTC time of day from [`SystemTime::now`].
    pub fn new() -> Self {
        Self::default()
    }

    crate::builder::option_setters! {
        /// Flush after every line (default `false`): slower, but nothing is lost if the process
        /// dies.
        fn auto_flush(auto_flush: bool) => auto_flush;
        /// Write `0`, the default stream, in the `Stream` column of every line (default `false`:
        /// each stream's [`raw_handle`](Stream::raw_handle)). RMM's replay benchmark refuses logs
        /// with other streams ("Non-default streams not currently supported"), and a
        /// [`Stream`] is never the default stream, so this is the way to a log that replays in
        /// RMM. The [`replay`](crate::replay) here takes both.
        fn streams_as_default(streams_as_default: bool) => streams_as_default;
    }

    /// The clock whose time of day (in UTC) fills the `Time` column, called for every line
    /// (default [`SystemTime::now`]'s time, read by the time-stamp counter where the kernel
    /// keeps time by it: see [`LoggingAdaptor`]).
    pub fn clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Some(Box::new(clock));
        self
    }

    /// Logs `upstream` to the file at `path`, created or truncated (as RMM does).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be created or the header cannot be written.
    pub fn build_to_file<R: MemoryResource>(
        self,
        upstream: R,
        path: impl AsRef<Path>,
    ) -> Result<LoggingAdaptor<R>> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|e| {
            Error::io(
                format!("creating the allocation log {}", path.display()),
                &e,
            )
        })?;
        self.build(upstream, Box::new(file), Some(path.to_owned()))
    }

    /// Logs `upstream` to `writer`.
    ///
    /// # Errors
    /// [`Error::Io`] when the header cannot be written.
    pub fn build_to_writer<R: MemoryResource>(
        self,
        upstream: R,
        writer: impl Write + Send + 'static,
    ) -> Result<LoggingAdaptor<R>> {
        self.build(upstream, Box::new(writer), None)
    }

    /// Logs `upstream` to the file named by the environment variable [`LOG_FILE_ENV`]
    /// (`STREAMALLOC_LOG_FILE`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the variable is unset or empty; as
    /// [`build_to_file`](Self::build_to_file) otherwise.
    pub fn build_from_env<R: MemoryResource>(self, upstream: R) -> Result<LoggingAdaptor<R>> {
        self.build_from_var(upstream, std::env::var_os(LOG_FILE_ENV))
    }

    /// [`build_from_env`](Self::build_from_env) with the variable's value read already, so
    /// tests need not set the process's environment (which other threads may be reading).
    pub(crate) fn build_from_var<R: MemoryResource>(
        self,
        upstream: R,
        value: Option<std::ffi::OsString>,
    ) -> Result<LoggingAdaptor<R>> {
        match value {
            Some(path) if !path.is_empty() => self.build_to_file(upstream, PathBuf::from(path)),
            unset_or_empty => Err(Error::invalid(format!(
                "LoggingAdaptor::from_env: {LOG_FILE_ENV} is {}; set it to the path of the \
                 allocation log, or give the path to LoggingAdaptor::to_file",
                if unset_or_empty.is_none() {
                    "not set"
                } else {
                    "empty"
                }
            ))),
        }
    }

    fn build<R: MemoryResource>(
        self,
        upstream: R,
        writer: Box<dyn Write + Send>,
        path: Option<PathBuf>,
    ) -> Result<LoggingAdaptor<R>> {
        let auto_flush = self.auto_flush.unwrap_or(false);
        let mut out = BufWriter::new(writer);
        let header =
            write_header(&mut out).and_then(|()| if auto_flush { out.flush() } else { Ok(()) });
        if let Err(e) = header {
            let what = path.as_ref().map_or_else(
                || "writing the allocation log's header".to_owned(),
                |p| format!("writing the header of the allocation log {}", p.display()),
            );
            return Err(Error::io(what, &e));
        }
        let status = Arc::new(Status::default());
        let stamps = Stamps::new(self.clock);
        let sink = Sink {
            out: Some(out),
            status: Arc::clone(&status),
            format: LineFormatter::default(),
            stamps: stamps.reader(),
            last_nanos: 0,
            text: Vec::new(),
        };
        let output = if auto_flush {
            Output::Direct(sink)
        } else {
            let (to_writer, from_callers) = mpsc::sync_channel(BATCHES_IN_FLIGHT);
            let (recycle, recycled) = mpsc::sync_channel(2);
            let writer = std::thread::Builder::new()
                .name("streamalloc-log".into())
                .spawn(move || sink.run(from_callers, recycle))
                .map_err(|e| Error::io("starting the allocation log's writer thread", &e))?;
            Output::Batched {
                records: Vec::with_capacity(BATCH),
                to_writer,
                recycled,
                writer: Some(writer),
            }
        };
        Ok(LoggingAdaptor {
            inner: Arc::new(Inner {
                device: upstream.properties().device,
                upstream,
                output: Mutex::new(output),
                status,
                auto_flush,
                streams_as_default: self.streams_as_default.unwrap_or(false),
                stamps,
                path,
            }),
        })
    }
}

impl fmt::Debug for LoggingAdaptorBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoggingAdaptorBuilder")
            .field("auto_flush", &self.auto_flush)
            .field("streams_as_default", &self.streams_as_default)
            .field("clock", &self.clock.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl LoggingAdaptor {
    /// Options for a logging adaptor: auto-flush, the clock.
    pub fn builder() -> LoggingAdaptorBuilder {
        LoggingAdaptorBuilder::new()
    }
}

impl<R: MemoryResource> LoggingAdaptor<R> {
    /// Logs `upstream` to the file at `path`, created or truncated, buffered.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be created or the header cannot be written.
    pub fn to_file(upstream: R, path: impl AsRef<Path>) -> Result<Self> {
        LoggingAdaptorBuilder::new().build_to_file(upstream, path)
    }

    /// Logs `upstream` to `writer`, buffered.
    ///
    /// # Errors
    /// [`Error::Io`] when the header cannot be written.
    pub fn to_writer(upstream: R, writer: impl Write + Send + 'static) -> Result<Self> {
        LoggingAdaptorBuilder::new().build_to_writer(upstream, writer)
    }

    /// Logs `upstream` to the file named by `STREAMALLOC_LOG_FILE` ([`LOG_FILE_ENV`]), as RMM's
    /// default constructor reads `RMM_LOG_FILE`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the variable is unset or empty; [`Error::Io`] when the
    /// file cannot be created or the header cannot be written.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, Error, LoggingAdaptor};
    ///
    /// let device = Device::host();
    /// if std::env::var_os("STREAMALLOC_LOG_FILE").is_none() {
    ///     let e = LoggingAdaptor::from_env(CudaResource::new(&device).unwrap()).unwrap_err();
    ///     assert!(matches!(e, Error::InvalidArgument(_)));
    ///     assert!(e.to_string().contains("STREAMALLOC_LOG_FILE is not set"));
    /// }
    /// ```
    pub fn from_env(upstream: R) -> Result<Self> {
        LoggingAdaptorBuilder::new().build_from_env(upstream)
    }

    /// The log file's path, when logging to a file.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// Whether every line is flushed as it is written.
    pub fn auto_flush(&self) -> bool {
        self.inner.auto_flush
    }

    /// Writes the buffered lines out to the file or writer and flushes it.
    ///
    /// # Errors
    /// [`Error::Io`] when flushing fails now or a write failed before (logging stopped then).
    pub fn flush(&self) -> Result<()> {
        let done = self.inner.output.lock().start_flush();
        // Waited for outside the lock: other threads go on logging meanwhile.
        let gone = match done {
            Err(WriterGone) => true,
            Ok(Some(done)) => done.recv().is_err(),
            Ok(None) => false,
        };
        if gone {
            self.inner.writer_gone();
        }
        self.write_error().map_or(Ok(()), Err)
    }

    /// The first error writing the log, after which logging stopped; `None` while all is well.
    pub fn write_error(&self) -> Option<Error> {
        self.inner.status.report()
    }
}

impl<R> Inner<R> {
    fn log(&self, action: Action, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if self.status.stopped.load(Relaxed) {
            return;
        }
        let thread = os_thread_id();
        let handle = if self.streams_as_default {
            0
        } else {
            stream.raw_handle()
        };
        let mut output = self.output.lock();
        // Read under the lock, so times never go backwards down the file.
        let time = self.stamps.read();
        let record = Record::new(thread, time, action, ptr.addr(), bytes, handle);
        match &mut *output {
            Output::Direct(sink) => {
                sink.write_records(&[record]);
                let _ = sink.flush();
            }
            Output::Batched {
                records,
                to_writer,
                recycled,
                ..
            } => {
                records.push(record);
                if records.len() >= BATCH {
                    let empty = recycled
                        .try_recv()
                        .unwrap_or_else(|_| Vec::with_capacity(BATCH));
                    let full = std::mem::replace(records, empty);
                    // Blocks while BATCHES_IN_FLIGHT batches wait for the writer; fails only
                    // when the writer thread is gone (it panicked in the user's writer).
                    if to_writer.send(Message::Records(full)).is_err() {
                        // Lines were lost: say so where `flush` and `write_error` look.
                        self.writer_gone();
                    }
                }
            }
        }
    }

    /// Records that the writer thread died (it panicked in the user's writer) as the error,
    /// unless there is one already.
    fn writer_gone(&self) {
        let error = Error::io(
            "writing the allocation log",
            &io::Error::other("the log's writer thread panicked in the writer"),
        );
        self.status.stopped.store(true, Relaxed);
        self.status.error.lock().get_or_insert(error);
    }
}

/// The calling thread's OS id (Linux: its `gettid`, as spdlog's `%t`), read once per thread.
#[inline]
pub(crate) fn os_thread_id() -> u64 {
    thread_local! {
        static ID: u64 = read_os_thread_id();
    }
    ID.with(|id| *id)
}

fn read_os_thread_id() -> u64 {
    // `/proc/thread-self` links to `<pid>/task/<tid>`: the tid without `unsafe` or libc.
    #[cfg(target_os = "linux")]
    if let Some(tid) = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|link| link.file_name()?.to_str()?.parse().ok())
    {
        return tid;
    }
    // Elsewhere (or without /proc): a number unique to the thread within the process.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

memory_resource!(shared [R: MemoryResource] LoggingAdaptor<R>);

// SAFETY: every pointer it hands out is one the upstream returned for the same request (it
// only observes the call), and its properties are the upstream's: the upstream's promise holds.
unsafe impl<R: MemoryResource> Forward for Inner<R> {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let result = self.upstream.try_allocate(bytes, stream);
        match &result {
            Ok(ptr) => self.log(Action::Allocate, *ptr, bytes, stream),
            Err(_) => self.log(Action::AllocateFailure, DevicePtr::NULL, bytes, stream),
        }
        result
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // Logged first: once the upstream has the memory back another thread may get it and
        // log its allocation.
        self.log(Action::Free, ptr, bytes, stream);
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.upstream.deallocate(ptr, bytes, stream) };
    }
}

impl<R: MemoryResource> fmt::Debug for LoggingAdaptor<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoggingAdaptor")
            .field("path", &self.inner.path)
            .field("auto_flush", &self.inner.auto_flush)
            // Read, not reported: a log line of this is no answer to the caller.
            .field("write_error", &*self.inner.status.error.lock())
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

mod clock;

#[cfg(test)]
mod tests;
