use std::backtrace::Backtrace;
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::error::Result;
use crate::resource::contract::forward::{memory_resource, Forward};
use crate::resource::{
    Block, BlockState, DevicePtr, Fragmentation, MemoryResource, MemorySnapshot, Segment,
    SharedResource,
};
use crate::stream::{Stream, StreamId};

use table::{Insert, Table};

/// The most [`TrackingIssue`]s a [`TrackingAdaptor`] keeps; later ones are counted and logged
/// but not kept.
pub const MAX_TRACKING_ISSUES: usize = 1024;

/// An outstanding allocation as a [`TrackingAdaptor`] recorded it.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, Stream, TrackingAdaptor};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = TrackingAdaptor::new(CudaResource::new(&device)?);
/// let p = mr.try_allocate(4096, &stream)?;
/// let a = &mr.outstanding_allocations()[0];
/// assert_eq!((a.ptr, a.bytes, a.stream), (p, 4096, stream.id()));
/// assert!(a.backtrace.is_none()); // only with `TrackingAdaptor::with_backtraces`
/// # unsafe { mr.deallocate(p, 4096, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Allocation {
    /// The pointer the upstream returned.
    pub ptr: DevicePtr,
    /// The requested size.
    pub bytes: usize,
    /// The stream it was allocated on.
    pub stream: StreamId,
    /// Where it was allocated, when the adaptor captures backtraces.
    pub backtrace: Option<Arc<Backtrace>>,
}

impl fmt::Display for Allocation {
    /// RMM's format: `<ptr>: <bytes> B`, then ` : callstack:` and the backtrace when there is
    /// one. (The stream is ours.)
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} B on stream {}",
            self.ptr, self.bytes, self.stream.0
        )?;
        if let Some(bt) = &self.backtrace {
            write!(f, " : callstack:\n{bt}")?;
        }
        Ok(())
    }
}

/// Something a [`TrackingAdaptor`] saw that breaks the memory-resource contract. Each is logged
/// through `tracing` at `ERROR` when it happens and kept for
/// [`TrackingAdaptor::issues`].
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, Stream, TrackingAdaptor, TrackingIssue};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = TrackingAdaptor::new(CudaResource::new(&device)?);
/// let p = mr.try_allocate(4096, &stream)?;
/// // A bug: the wrong size. (On a GPU this is undefined behaviour; the host backend checks
/// // frees, refuses this one and records its own error on the device.)
/// unsafe { mr.deallocate(p, 1000, &stream) };
/// assert!(matches!(mr.issues()[..], [TrackingIssue::WrongSize { allocated: 4096, bytes: 1000, .. }]));
/// assert_eq!(mr.allocated_bytes(), 0);
/// assert!(device.take_deferred_error().is_some());
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrackingIssue {
    /// A free of a pointer that is not outstanding: never allocated through the adaptor, or
    /// freed already. The counts do not change; the free still goes to the upstream.
    UnknownPointer {
        /// The pointer freed.
        ptr: DevicePtr,
        /// The size the free gave.
        bytes: usize,
        /// The stream of the free.
        stream: StreamId,
    },
    /// A free whose size differs from the allocation's. The allocation's recorded size comes
    /// off the counts; the free goes to the upstream with the size it gave.
    WrongSize {
        /// The pointer freed.
        ptr: DevicePtr,
        /// The size the free gave.
        bytes: usize,
        /// The size allocated.
        allocated: usize,
        /// The stream of the free.
        stream: StreamId,
    },
    /// The upstream returned a pointer that was still outstanding here: it was freed by a path
    /// that bypassed the adaptor. The new allocation replaces the old record.
    PointerReused {
        /// The pointer.
        ptr: DevicePtr,
        /// The new allocation's size.
        bytes: usize,
        /// The size of the record it replaced.
        previous: usize,
        /// The stream of the new allocation.
        stream: StreamId,
    },
}

impl fmt::Display for TrackingIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrackingIssue::UnknownPointer { ptr, bytes, stream } => write!(
                f,
                "free of {ptr} ({bytes} B, stream {}): not an outstanding allocation",
                stream.0
            ),
            TrackingIssue::WrongSize {
                ptr,
                bytes,
                allocated,
                stream,
            } => write!(
                f,
                "free of {ptr} with {bytes} B (stream {}), but {allocated} B were allocated",
                stream.0
            ),
            TrackingIssue::PointerReused {
                ptr,
                bytes,
                previous,
                stream,
            } => write!(
                f,
                "allocation of {bytes} B (stream {}) returned {ptr}, still outstanding with \
                 {previous} B: it was freed without the tracking adaptor",
                stream.0
            ),
        }
    }
}

/// The outstanding allocations of a [`TrackingAdaptor`] at one moment, in address order: what
/// leaked when taken at the end of a run.
///
/// Its `Display` is a header line, then one line per allocation as RMM's
/// `get_outstanding_allocations_str` prints it (`<ptr>: <bytes> B`, here with the stream, and
/// the backtrace when captured).
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, MemoryResource, Stream, TrackingAdaptor};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = TrackingAdaptor::new(CudaResource::new(&device)?);
/// let p = mr.try_allocate(1000, &stream)?;
/// let report = mr.leak_report();
/// assert!(!report.is_empty());
/// assert_eq!(report.bytes(), 1000);
/// assert!(report.to_string().starts_with("1 outstanding allocation, 1000 B\n"));
/// # unsafe { mr.deallocate(p, 1000, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct LeakReport {
    allocations: Vec<Allocation>,
}

impl LeakReport {
    /// True when nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.allocations.is_empty()
    }

    /// The outstanding allocations, in address order.
    pub fn allocations(&self) -> &[Allocation] {
        &self.allocations
    }

    /// Their requested bytes, summed.
    pub fn bytes(&self) -> usize {
        self.allocations.iter().map(|a| a.bytes).sum()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.allocations.len();
        let s = if n == 1 { "" } else { "s" };
        writeln!(f, "{n} outstanding allocation{s}, {} B", self.bytes())?;
        for a in &self.allocations {
            writeln!(f, "{a}")?;
        }
        Ok(())
    }
}

/// Records every outstanding allocation, optionally with the backtrace of its allocation, and
/// reports leaks and bad frees (RMM's `tracking_resource_adaptor`).
///
/// A debugging aid, cheap enough to leave on: the records live in a lock-free table keyed by
/// address (up to 8,192 records), so an allocation or a free costs one
/// compare-and-swap and a few plain loads and stores, and threads never wait for each other.
/// An address whose slots in the table are all taken (many allocations outstanding at once)
/// has its record in a locked map instead, split in 16 shards by address; so do all records
/// when the adaptor captures backtraces ([`with_backtraces`](Self::with_backtraces)), which
/// costs microseconds per allocation anyway. A clone shares the records.
///
/// The figures ([`allocated_bytes`](Self::allocated_bytes),
/// [`outstanding_allocations`](Self::outstanding_allocations), …) visit the records one after
/// another: exact whenever they are read after the calls they cover; under concurrent calls,
/// each record is seen at its own moment (never half-written).
///
/// Allocations that return the null pointer (0 bytes) are not recorded, and freeing the null
/// pointer with 0 bytes is no issue. A record is removed before the free reaches the upstream,
/// so an upstream that hands the same address out again at once cannot collide with it (RMM's
/// ABA test).
///
/// # Bad frees
/// The counts never underflow. A free of a pointer that is not outstanding changes nothing; a
/// free with a size other than the allocation's removes the allocation and its recorded size.
/// Both are [`TrackingIssue`]s: logged through `tracing` at `ERROR` and kept for
/// [`issues`](Self::issues) (the first [`MAX_TRACKING_ISSUES`]; all are counted). Either way
/// the free is passed to the upstream unchanged, as in RMM: the adaptor reports, it does not
/// guess what the caller meant.
///
/// # Awaiting memory
/// The adaptor forwards the upstream's [`availability`](MemoryResource::availability) and
/// [`capacity_limit`](MemoryResource::capacity_limit), so awaited allocations wait through it as
/// on the upstream.
///
/// # Stream ordering
/// The records follow the host's calls: an allocation is outstanding from `try_allocate`'s
/// return until `deallocate` is called, whatever the device has reached by then.
///
/// # Snapshots
/// [`snapshot`](MemoryResource::snapshot) gives the upstream's picture with the bytes each
/// live block's caller asked for ([`Block::requested`](crate::Block::requested)) and, with
/// backtraces, where it was allocated ([`Block::site`](crate::Block::site)), so an export
/// ([`report::torch`](crate::report::torch)) shows call sites. Over an upstream that keeps
/// no picture (the driver's resources), it builds one from its records: a segment per
/// outstanding allocation, holding one live block. Records and the upstream's blocks are
/// read one after the other: under concurrent calls each is seen at its own moment. Taking
/// a snapshot changes nothing on the allocation path.
///
/// ```
/// use streamalloc::report::torch::write_torch_snapshot;
/// use streamalloc::{BlockState, CudaResource, Device, MemoryResource, Stream, TrackingAdaptor};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = TrackingAdaptor::with_backtraces(CudaResource::new(&device)?);
/// let p = mr.try_allocate(1000, &stream)?;
/// let snap = mr.snapshot().expect("built from the records: CudaResource keeps none");
/// assert_eq!(snap.resource, "tracking");
/// let block = &snap.segments[0].blocks[0];
/// assert_eq!((block.address, block.state, block.requested), (p, BlockState::Live, Some(1000)));
/// assert!(block.site.is_some()); // becomes the block's frames in memory_viz
/// let mut pickle = Vec::new(); // a file to drop on pytorch.org/memory_viz
/// write_torch_snapshot(&mut pickle, &snap, None)?;
/// # unsafe { mr.deallocate(p, 1000, &stream) };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamalloc::{CudaResource, Device, MemoryResource, Stream, TrackingAdaptor};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mr = TrackingAdaptor::with_backtraces(CudaResource::new(&device)?);
/// let kept = mr.try_allocate(1 << 20, &stream)?;
/// let freed = mr.try_allocate(4096, &stream)?;
/// stream.enqueue_delay(Duration::from_millis(100))?; // a kernel still running, so...
/// unsafe { mr.deallocate(freed, 4096, &stream) };    // ...this free waits in the stream
///
/// // A bug: a double free, while the first is still queued (the usual case on a GPU). The
/// // adaptor reports it and the counts stay right. The upstream refuses it too (the host
/// // backend checks frees as they are enqueued, the CUDA driver by its own records), and the
/// // device keeps that error, naming the pointer.
/// unsafe { mr.deallocate(freed, 4096, &stream) };
/// assert_eq!(mr.issue_count(), 1);
/// let error = device.take_deferred_error().expect("the double free is deferred");
/// assert!(error.to_string().contains(&format!("{:#x}", freed.addr())));
///
/// assert_eq!(mr.allocated_bytes(), 1 << 20);
/// let leaks = mr.leak_report();
/// assert_eq!(leaks.allocations()[0].ptr, kept);
/// println!("{leaks}"); // where `kept` was allocated, with its backtrace
/// # unsafe { mr.deallocate(kept, 1 << 20, &stream) };
/// # Ok::<(), streamalloc::Error>(())
/// ```
pub struct TrackingAdaptor<R: MemoryResource = SharedResource> {
    inner: Arc<Inner<R>>,
}

/// Buckets of the lock-free table: 8,192 records in 256 KiB (fewer when many addresses hash
/// alike; the others go to the locked overflow).
const TABLE_BUCKETS: usize = 2048;

struct Inner<R> {
    upstream: R,
    backtraces: bool,
    /// The records without a backtrace, while their bucket has room.
    table: Table,
    /// The other records. Those the table could hold are counted in their table bucket
    /// ([`Table::overflowed`]), so that only lookups in a bucket that overflowed take a lock.
    overflow: Box<[Shard]>,
    issues: Mutex<Issues>,
}

/// How many shards the overflow is split in (a power of two).
const SHARDS: usize = 16;

/// The overflow records of the addresses that hash here, and their bytes.
#[repr(align(128))] // a line (and its adjacent-line prefetch pair) of its own
#[derive(Default)]
struct Shard(Mutex<Records>);

#[derive(Default)]
struct Records {
    live: FxHashMap<DevicePtr, Record>,
    /// The sum of `live`'s sizes.
    bytes: usize,
}

#[derive(Default)]
struct Issues {
    /// The first [`MAX_TRACKING_ISSUES`] issues.
    kept: Vec<TrackingIssue>,
    /// All issues, kept or not.
    count: u64,
}

struct Record {
    bytes: usize,
    stream: StreamId,
    backtrace: Option<Arc<Backtrace>>,
}

impl<R> Inner<R> {
    /// The overflow shard of `ptr`'s record: the address's high bits after a multiplicative
    /// hash (the low 8 bits of a device pointer are zero).
    #[inline]
    fn shard(&self, ptr: DevicePtr) -> &Mutex<Records> {
        let hash = ptr.addr().wrapping_mul(0x9e37_79b9_7f4a_7c15);
        &self.overflow[(hash >> (64 - SHARDS.trailing_zeros())) as usize].0
    }

    /// Whether `ptr`'s record, if any, may be in the table.
    #[inline]
    fn in_table(&self, ptr: DevicePtr) -> bool {
        !self.backtraces && table::holds(ptr.addr())
    }

    /// Records an allocation and returns the size of the record it replaced, if `ptr` was
    /// outstanding already.
    #[inline]
    fn record(&self, ptr: DevicePtr, bytes: usize, stream: StreamId) -> Option<usize> {
        let addr = ptr.addr();
        // While the bucket has no overflow, no record of `ptr` can be there. Relaxed is
        // enough: an earlier allocation of `ptr` happened before this one (the upstream had it
        // back in between), so its count is seen, or a later one that still includes it.
        if self.in_table(ptr)
            && self.table.overflowed(addr).load(Relaxed) == 0
            && self.table.insert(addr, bytes as u64, stream.0) == Insert::Done
        {
            return None;
        }
        self.record_slow(ptr, bytes, stream)
    }

    /// [`record`](Self::record) when the overflow is involved or `ptr` is outstanding.
    #[cold]
    #[inline(never)]
    fn record_slow(&self, ptr: DevicePtr, bytes: usize, stream: StreamId) -> Option<usize> {
        let addr = ptr.addr();
        let in_table = self.in_table(ptr);
        // A record of `ptr` in the overflow is a duplicate, wherever the new one goes.
        let mut previous = if !in_table || self.table.overflowed(addr).load(Relaxed) != 0 {
            self.remove_overflow(ptr)
        } else {
            None
        };
        if in_table {
            loop {
                match self.table.insert(addr, bytes as u64, stream.0) {
                    Insert::Done => return previous,
                    Insert::Present => {
                        let old = self.table.remove(addr);
                        previous = old.map(|e| e.bytes as usize).or(previous);
                    }
                    Insert::Full => break,
                }
            }
        }
        // Captured outside the lock: it takes microseconds.
        let backtrace = self
            .backtraces
            .then(|| Arc::new(Backtrace::force_capture()));
        let record = Record {
            bytes,
            stream,
            backtrace,
        };
        let mut records = self.shard(ptr).lock();
        records.bytes += bytes;
        match records.live.insert(ptr, record) {
            Some(old) => {
                records.bytes -= old.bytes;
                Some(old.bytes)
            }
            None => {
                if in_table {
                    self.table.overflowed(addr).fetch_add(1, Relaxed);
                }
                previous
            }
        }
    }

    /// Removes `ptr`'s record and returns its size, if it is outstanding.
    #[inline]
    fn remove(&self, ptr: DevicePtr) -> Option<usize> {
        let addr = ptr.addr();
        if self.in_table(ptr) {
            if let Some(entry) = self.table.remove(addr) {
                return Some(entry.bytes as usize);
            }
            // As in `record`: an overflowed record of `ptr` is counted here.
            if self.table.overflowed(addr).load(Relaxed) == 0 {
                return None;
            }
        }
        self.remove_overflow(ptr)
    }

    /// Removes `ptr`'s record from the overflow and returns its size, if it is there.
    #[cold]
    #[inline(never)]
    fn remove_overflow(&self, ptr: DevicePtr) -> Option<usize> {
        let mut records = self.shard(ptr).lock();
        let removed = records.live.remove(&ptr)?;
        records.bytes -= removed.bytes;
        if self.in_table(ptr) {
            self.table.overflowed(ptr.addr()).fetch_sub(1, Relaxed);
        }
        Some(removed.bytes)
    }

    /// How many records the overflow holds.
    #[cfg(test)]
    fn overflow_len(&self) -> usize {
        self.overflow.iter().map(|s| s.0.lock().live.len()).sum()
    }

    /// Calls `f` with every record: the table's, then the overflow's shard by shard.
    fn for_each(&self, mut f: impl FnMut(DevicePtr, usize, StreamId, Option<&Arc<Backtrace>>)) {
        self.table.for_each(|e| {
            f(
                DevicePtr::from_raw(e.addr),
                e.bytes as usize,
                StreamId(e.stream),
                None,
            )
        });
        for shard in self.overflow.iter() {
            let records = shard.0.lock();
            for (&ptr, r) in &records.live {
                f(ptr, r.bytes, r.stream, r.backtrace.as_ref());
            }
        }
    }

    fn report(&self, issue: TrackingIssue) {
        tracing::error!(target: "streamalloc::tracking", %issue, "memory-resource misuse");
        let mut issues = self.issues.lock();
        issues.count += 1;
        if issues.kept.len() < MAX_TRACKING_ISSUES {
            issues.kept.push(issue);
        }
    }
}

impl<R: MemoryResource> TrackingAdaptor<R> {
    /// Tracks `upstream`'s allocations, without backtraces.
    pub fn new(upstream: R) -> Self {
        Self::build(upstream, false, TABLE_BUCKETS)
    }

    /// Tracks `upstream`'s allocations and captures a backtrace at each
    /// ([`Backtrace::force_capture`], whatever `RUST_BACKTRACE` says).
    pub fn with_backtraces(upstream: R) -> Self {
        // The records with a backtrace all live in the overflow: no table needed.
        Self::build(upstream, true, 1)
    }

    /// Without backtraces, over a table of `buckets` buckets: a small one sends records to the
    /// overflow early.
    #[cfg(test)]
    fn with_table_buckets(upstream: R, buckets: usize) -> Self {
        Self::build(upstream, false, buckets)
    }

    fn build(upstream: R, backtraces: bool, buckets: usize) -> Self {
        TrackingAdaptor {
            inner: Arc::new(Inner {
                upstream,
                backtraces,
                table: Table::new(buckets),
                overflow: (0..SHARDS).map(|_| Shard::default()).collect(),
                issues: Mutex::new(Issues::default()),
            }),
        }
    }

    /// Whether allocations record a backtrace.
    pub fn captures_backtraces(&self) -> bool {
        self.inner.backtraces
    }

    /// Requested bytes outstanding: RMM's `get_allocated_bytes`.
    pub fn allocated_bytes(&self) -> usize {
        let mut bytes = 0;
        self.inner.for_each(|_, b, _, _| bytes += b);
        bytes
    }

    /// How many allocations are outstanding.
    pub fn outstanding_count(&self) -> usize {
        let mut count = 0;
        self.inner.for_each(|_, _, _, _| count += 1);
        count
    }

    /// A snapshot of the outstanding allocations, in address order: RMM's
    /// `get_outstanding_allocations`, as a copy that is safe to hold while others allocate.
    pub fn outstanding_allocations(&self) -> Vec<Allocation> {
        let mut all = Vec::new();
        self.inner.for_each(|ptr, bytes, stream, backtrace| {
            all.push(Allocation {
                ptr,
                bytes,
                stream,
                backtrace: backtrace.cloned(),
            })
        });
        all.sort_unstable_by_key(|a| a.ptr);
        all
    }

    /// The outstanding allocations as a report whose `Display` lists them.
    pub fn leak_report(&self) -> LeakReport {
        LeakReport {
            allocations: self.outstanding_allocations(),
        }
    }

    /// Logs the [`leak_report`](Self::leak_report) through `tracing` at `DEBUG` (target
    /// `streamalloc::tracking`), as RMM's `log_outstanding_allocations` does.
    pub fn log_outstanding_allocations(&self) {
        if tracing::enabled!(target: "streamalloc::tracking", tracing::Level::DEBUG) {
            let report = self.leak_report();
            tracing::debug!(target: "streamalloc::tracking", "Outstanding Allocations: {report}");
        }
    }

    /// The bad frees and reused pointers seen so far, oldest first (at most
    /// [`MAX_TRACKING_ISSUES`]).
    pub fn issues(&self) -> Vec<TrackingIssue> {
        self.inner.issues.lock().kept.clone()
    }

    /// How many issues were seen, including those beyond [`MAX_TRACKING_ISSUES`].
    pub fn issue_count(&self) -> u64 {
        self.inner.issues.lock().count
    }
}

memory_resource!(shared [R: MemoryResource] TrackingAdaptor<R>);

// SAFETY: every pointer it hands out is one the upstream returned for the same request (it
// only observes the call), and its properties are the upstream's: the upstream's promise holds.
unsafe impl<R: MemoryResource> Forward for Inner<R> {
    #[inline]
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let ptr = self.upstream.try_allocate(bytes, stream)?;
        if ptr.is_null() {
            return Ok(ptr);
        }
        // Reported after the record is in: it logs, and takes a lock.
        if let Some(previous) = self.record(ptr, bytes, stream.id()) {
            self.report(TrackingIssue::PointerReused {
                ptr,
                bytes,
                previous,
                stream: stream.id(),
            });
        }
        Ok(ptr)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        if !(ptr.is_null() && bytes == 0) {
            // Untracked first: once the upstream has the memory back it may hand it out again.
            match self.remove(ptr) {
                Some(allocated) if allocated != bytes => self.report(TrackingIssue::WrongSize {
                    ptr,
                    bytes,
                    allocated,
                    stream: stream.id(),
                }),
                Some(_) => {}
                None => self.report(TrackingIssue::UnknownPointer {
                    ptr,
                    bytes,
                    stream: stream.id(),
                }),
            }
        }
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.upstream.deallocate(ptr, bytes, stream) };
    }

    /// The upstream's snapshot, each live block the adaptor recorded given its requested
    /// size and site; over an upstream that keeps none, one built from the records.
    fn snapshot(&self) -> Option<MemorySnapshot> {
        let mut records: FxHashMap<DevicePtr, (usize, StreamId, Option<Arc<Backtrace>>)> =
            FxHashMap::default();
        self.for_each(|ptr, bytes, stream, site| {
            records.insert(ptr, (bytes, stream, site.cloned()));
        });
        let Some(mut snap) = self.upstream.snapshot() else {
            return Some(self.records_snapshot(records));
        };
        for seg in &mut snap.segments {
            for block in seg
                .blocks
                .iter_mut()
                .filter(|b| b.state == BlockState::Live)
            {
                // A record and a block at one address are one allocation: the upstream
                // cannot hand an address out twice.
                if let Some((bytes, stream, site)) = records.remove(&block.address) {
                    block.requested = Some(bytes);
                    block.stream = block.stream.or(Some(stream));
                    block.site = site.or(block.site.take());
                }
            }
        }
        Some(snap)
    }

    fn fragmentation(&self) -> Option<Fragmentation> {
        // Requested sizes and sites change no figure: the upstream's, when it has them.
        self.upstream
            .fragmentation()
            .or_else(|| self.snapshot().map(|s| s.fragmentation()))
    }
}

impl<R: MemoryResource> Inner<R> {
    /// A snapshot of the outstanding allocations alone, for an upstream that keeps none: one
    /// segment per allocation (what the upstream handed out), holding one live block.
    fn records_snapshot(
        &self,
        records: FxHashMap<DevicePtr, (usize, StreamId, Option<Arc<Backtrace>>)>,
    ) -> MemorySnapshot {
        let mut snap = MemorySnapshot::new(self.upstream.properties().device, "tracking");
        snap.segments = records
            .into_iter()
            .map(|(ptr, (bytes, stream, site))| {
                let mut block = Block::new(ptr, bytes, BlockState::Live)
                    .on_stream(stream)
                    .with_requested(bytes);
                block.site = site;
                let mut seg = Segment::new(ptr, bytes);
                seg.stream = Some(stream);
                seg.coalesces = false; // each is its own upstream allocation
                seg.blocks.push(block);
                seg
            })
            .collect();
        snap.sort();
        snap
    }
}

impl<R: MemoryResource> fmt::Debug for TrackingAdaptor<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (outstanding, bytes, issues) = (
            self.outstanding_count(),
            self.allocated_bytes(),
            self.issue_count(),
        );
        f.debug_struct("TrackingAdaptor")
            .field("outstanding", &outstanding)
            .field("allocated_bytes", &bytes)
            .field("issues", &issues)
            .field("backtraces", &self.inner.backtraces)
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

mod table;

#[cfg(test)]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests;
