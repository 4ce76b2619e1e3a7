use std::sync::atomic::Ordering;

use crate::{
    Block, BlockState, CudaResource, Device, DevicePtr, HostConfig, MemoryResource, MemorySnapshot,
    PoolResource, Segment, Stream, TimelineAdaptor, TraceAction,
};

fn device() -> Device {
    Device::host_with(HostConfig::default().capacity(64 << 20))
}

/// Every allocation, free and out-of-memory refusal is an event with its stream, address and
/// bytes; live bytes follow them per stream.
#[test]
fn records_allocations_frees_and_refusals_per_stream() {
    let device = device();
    let (s1, s2) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 1 << 20, Some(1 << 20)).unwrap();
    let mr = TimelineAdaptor::new(pool);
    mr.name_stream(&s2, "copy");

    let a = mr.try_allocate(4096, &s1).unwrap();
    let b = mr.try_allocate(8192, &s2).unwrap();
    assert!(mr
        .try_allocate(4 << 20, &s1)
        .unwrap_err()
        .is_out_of_memory());
    // SAFETY: allocated through `mr` with these bytes, freed once.
    unsafe { mr.deallocate(a, 4096, &s1) };

    let t = mr.timeline();
    let events: Vec<_> = t
        .events()
        .map(|e| (e.action, e.address, e.bytes, e.stream))
        .collect();
    assert_eq!(
        events,
        [
            (TraceAction::Alloc, a, 4096, s1.id()),
            (TraceAction::Alloc, b, 8192, s2.id()),
            (TraceAction::Oom, DevicePtr::NULL, 4 << 20, s1.id()),
            (TraceAction::Free, a, 4096, s1.id()),
        ]
    );
    assert_eq!((t.live_bytes(), t.peak_live_bytes()), (8192, 12288));
    // Streams in the order the timeline met them: s2 when it was named.
    assert_eq!(t.series().last().unwrap().live_by_stream, [8192, 0]);
    let names: Vec<_> = t.streams().map(|(s, n)| (s, n.to_owned())).collect();
    assert_eq!(
        names,
        [(s2.id(), "copy".to_owned()), (s1.id(), s1.id().to_string())]
    );
    // SAFETY: allocated through `mr` with these bytes, freed once.
    unsafe { mr.deallocate(b, 8192, &s2) };
    // A clone is the same adaptor: it sees the same timeline.
    assert_eq!(mr.clone().timeline().recorded_events(), 5);
}

/// The point of the peak carries the reserved bytes of that moment, read from the upstream
/// when live bytes reach a new peak, though the pool grew between two samples.
#[test]
fn the_peak_carries_the_reserved_bytes_of_its_moment() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 1 << 20, Some(32 << 20)).unwrap();
    let mr = TimelineAdaptor::new(pool.clone());
    let small: Vec<_> = (0..3).map(|_| mr.try_allocate(1024, &s).unwrap()).collect();
    let big = mr.try_allocate(8 << 20, &s).unwrap(); // the pool grows for it
    let reserved_at_peak = pool.memory_stats().reserved_bytes.unwrap();
    assert!(reserved_at_peak > 8 << 20);
    // SAFETY: allocated through `mr` with these bytes, freed once.
    unsafe { mr.deallocate(big, 8 << 20, &s) };
    for p in small {
        // SAFETY: allocated through `mr` with these bytes, freed once.
        unsafe { mr.deallocate(p, 1024, &s) };
    }
    let t = mr.timeline();
    let series = t.series();
    let peak = series.iter().max_by_key(|p| p.live_bytes).unwrap();
    assert_eq!(peak.live_bytes, (8 << 20) + 3 * 1024);
    assert_eq!(peak.reserved_bytes, reserved_at_peak);
    assert_eq!(series[0].reserved_bytes, 1 << 20);
}

/// Reserved bytes are read at least every `RESERVED_SAMPLE_EVERY` events, also when no new
/// peak comes: a pool trimmed back shows it within that many events.
#[test]
fn reserved_bytes_are_sampled_without_a_new_peak() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let pool =
        PoolResource::new(CudaResource::new(&device).unwrap(), 1 << 20, Some(32 << 20)).unwrap();
    let mr = TimelineAdaptor::new(pool.clone());
    let keep = mr.try_allocate(1024, &s).unwrap(); // keeps the first chunk from a trim
    let big = mr.try_allocate(8 << 20, &s).unwrap();
    let at_peak = pool.memory_stats().reserved_bytes.unwrap();
    // SAFETY: allocated through `mr` with these bytes, freed once.
    unsafe { mr.deallocate(big, 8 << 20, &s) };
    s.synchronize_blocking().unwrap();
    pool.trim();
    let after_trim = pool.memory_stats().reserved_bytes.unwrap();
    assert!(after_trim < at_peak, "{after_trim} {at_peak}");
    let every = TimelineAdaptor::<PoolResource>::RESERVED_SAMPLE_EVERY;
    for _ in 0..every / 2 {
        let p = mr.try_allocate(256, &s).unwrap();
        // SAFETY: allocated through `mr` with these bytes, freed once.
        unsafe { mr.deallocate(p, 256, &s) };
    }
    // SAFETY: allocated through `mr` with these bytes, freed once.
    unsafe { mr.deallocate(keep, 1024, &s) };
    let t = mr.timeline();
    assert_eq!(t.peak_live_bytes(), (8 << 20) + 1024);
    let series = t.series();
    let peak = series.iter().max_by_key(|p| p.live_bytes).unwrap();
    assert_eq!(peak.reserved_bytes, at_peak);
    assert_eq!(pool.memory_stats().reserved_bytes.unwrap(), after_trim);
    assert_eq!(series.last().unwrap().reserved_bytes, after_trim);
}

/// The timeline stays within its limits however long the program runs.
#[test]
fn with_limits_bounds_the_record() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let mr = TimelineAdaptor::with_limits(CudaResource::new(&device).unwrap(), 10, 8);
    for _ in 0..1000 {
        let p = mr.try_allocate(256, &s).unwrap();
        // SAFETY: allocated through `mr` with these bytes, freed once.
        unsafe { mr.deallocate(p, 256, &s) };
    }
    let t = mr.timeline();
    assert_eq!((t.events().count(), t.recorded_events()), (10, 2000));
    assert!(t.series().len() <= 10);
    assert_eq!(t.peak_live_bytes(), 256);
}

/// An upstream whose snapshot is one segment holding one live block of its live bytes: enough
/// to see which moment a snapshot was taken at.
#[derive(Debug)]
struct Snapshotting {
    inner: CudaResource,
    live: std::sync::atomic::AtomicUsize,
    snapshots: std::sync::atomic::AtomicUsize,
}

// SAFETY: every pointer is one `inner` returned for the same request, with its properties.
unsafe impl MemoryResource for Snapshotting {
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> crate::Result<DevicePtr> {
        let p = self.inner.try_allocate(bytes, stream)?;
        self.live.fetch_add(bytes, Ordering::Relaxed);
        Ok(p)
    }

    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.inner.deallocate(ptr, bytes, stream) }
    }

    fn properties(&self) -> crate::Properties {
        self.inner.properties()
    }

    fn snapshot(&self) -> Option<MemorySnapshot> {
        self.snapshots.fetch_add(1, Ordering::Relaxed);
        let live = self.live.load(Ordering::Relaxed);
        let at = DevicePtr::from_raw(0x1000);
        let mut segment = Segment::new(at, live);
        segment.blocks.push(Block::new(at, live, BlockState::Live));
        let mut s = MemorySnapshot::new(self.inner.properties().device, "test");
        s.segments.push(segment);
        Some(s)
    }
}

/// With peak snapshots on, the adaptor keeps a snapshot within 1/16 of the peak, taken once
/// per 1/16 of growth rather than at every allocation; off, it takes none.
#[test]
fn keeps_a_snapshot_near_the_peak() {
    let device = device();
    let s = Stream::new(&device).unwrap();
    let upstream = Snapshotting {
        inner: CudaResource::new(&device).unwrap(),
        live: 0.into(),
        snapshots: 0.into(),
    };
    let mr = TimelineAdaptor::new(upstream);
    let first = mr.try_allocate(4096, &s).unwrap();
    assert!(mr.peak_snapshot().is_none()); // off by default
    mr.snapshot_peaks(true);
    let mut held = vec![first];
    for _ in 0..1000 {
        held.push(mr.try_allocate(4096, &s).unwrap());
    }
    let peak = 1001 * 4096;
    for p in held.drain(500..) {
        // SAFETY: allocated through `mr` with these bytes, freed once.
        unsafe { mr.deallocate(p, 4096, &s) };
    }
    for _ in 0..400 {
        held.push(mr.try_allocate(4096, &s).unwrap()); // below the peak: no new snapshot
    }
    let snapshot = mr.peak_snapshot().unwrap();
    let live = snapshot.live_bytes();
    assert!(live <= peak && live >= peak / 17 * 16, "{live} of {peak}");
    let taken = mr.upstream().snapshots.load(Ordering::Relaxed);
    assert!((2..=100).contains(&taken), "{taken} snapshots");
    for p in held {
        // SAFETY: allocated through `mr` with these bytes, freed once.
        unsafe { mr.deallocate(p, 4096, &s) };
    }
}
