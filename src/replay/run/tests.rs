//! The what-if replay on bad input (counted skips, or typed errors with the line in strict
//! mode; never a panic, never a hang), its figures, and RMM compatibility of our logs.

use std::io::{self, Read};
use std::sync::Arc;

use crate::device::Device;
use crate::replay::*;
use crate::resource::{MemoryResource, Timeline, TraceAction};
use crate::stream::Stream;
use crate::test_support::SharedWriter;
use crate::{
    ArenaResource, BinningResource, CudaAsyncResource, CudaResource, FixedSizeResource,
    LimitingAdaptor, LoggingAdaptor, MappedPoolResource, PoolResource, SharedResource,
};

fn reader(text: &str) -> EventReader<&[u8]> {
    EventReader::new(text.as_bytes()).unwrap()
}

fn log(rows: &[&str]) -> String {
    let mut s = format!("{LOG_HEADER}\n");
    for r in rows {
        s.push_str(r);
        s.push('\n');
    }
    s
}

fn strict() -> ReplayOptions {
    ReplayOptions {
        strict: true,
        ..ReplayOptions::default()
    }
}

fn run(
    text: &str,
    mr: &dyn MemoryResource,
    device: &Device,
    o: &ReplayOptions,
) -> ReplayResult<ReplayReport> {
    replay(reader(text), mr, device, o)
}

fn error_line(e: &ReplayError) -> usize {
    match e {
        ReplayError::Parse { line, .. }
        | ReplayError::Inconsistent { line, .. }
        | ReplayError::TooManyStreams { line, .. } => *line,
        other => panic!("no line: {other:?}"),
    }
}

/// Frees of unknown pointers, allocations of live pointers and frees with another size are
/// counted and skipped (kept with their line); strict mode refuses each with its line.
#[test]
fn inconsistent_events_are_counted_or_refused_with_their_line() {
    let text = log(&[
        "1,00:00:00.000001,allocate,0x1000,256,0x5",
        "1,00:00:00.000002,free,0x9000,64,0x5", // line 3: unknown
        "1,00:00:00.000003,allocate,0x1000,512,0x5", // line 4: live already
        "1,00:00:00.000004,free,0x1000,100,0x5", // line 5: another size
    ]);
    let device = Device::host();
    let mr = CudaResource::new(&device).unwrap();
    let w = run(&text, &mr, &device, &ReplayOptions::default()).unwrap();
    assert_eq!(
        (
            w.skipped.unknown_pointer,
            w.skipped.pointer_already_live,
            w.skipped.size_mismatch
        ),
        (1, 1, 1)
    );
    let lines: Vec<usize> = w.failures.iter().map(|f| f.line).collect();
    assert_eq!(lines, [3, 4, 5]);
    assert_eq!(
        (w.allocations, w.frees, w.refused, w.peak_live),
        (1, 1, 0, 256)
    );
    let s = scan_log(reader(&text), &ReplayOptions::default()).unwrap();
    assert_eq!(s.skipped.total(), 3);
    assert_eq!(
        w.skipped.to_string(),
        "1 frees of pointers not live skipped, 1 allocations of live pointers skipped, 1 frees \
         with another size (freed with the allocated size)"
    );

    // Strict mode leaves nothing allocated: a free refused for its size is freed at the end.
    let stats = crate::StatisticsAdaptor::new(CudaResource::new(&device).unwrap());
    let mismatch = log(&[
        "1,00:00:00.000001,allocate,0x1000,256,0x5",
        "1,00:00:00.000004,free,0x1000,100,0x5",
    ]);
    run(&mismatch, &stats, &device, &strict()).unwrap_err();
    assert_eq!(stats.bytes_counter().value, 0, "nothing leaks");

    for (row, line) in [(1, 3), (2, 4), (3, 5)] {
        let rows = [
            "1,00:00:00.000001,allocate,0x1000,256,0x5",
            [
                "1,00:00:00.000002,free,0x9000,64,0x5",
                "1,00:00:00.000003,allocate,0x1000,512,0x5",
                "1,00:00:00.000004,free,0x1000,100,0x5",
            ][row - 1],
        ];
        let text = log(&rows);
        for e in [
            run(&text, &mr, &device, &strict()).unwrap_err(),
            scan_log(reader(&text), &strict()).unwrap_err(),
        ] {
            assert!(matches!(e, ReplayError::Inconsistent { .. }), "{e:?}");
            assert_eq!(error_line(&e), 3, "{e}");
            assert!(
                e.to_string().starts_with("event log line 3: "),
                "{e} ({line})"
            );
        }
    }
}

/// Malformed lines (missing columns, truncated, not UTF-8) are skipped and counted; strict
/// mode refuses the first with its line.
#[test]
fn malformed_lines_are_skipped_or_refused_with_their_line() {
    let mut bytes = log(&[
        "1,00:00:00.000001,allocate,0x1000,256,0x5",
        "1,00:00:00.000002,allocate,0x2000", // line 3: missing columns
        "1,00:00:00.000003,allocate,0x\u{1}000,256,0", // line 4: bad pointer
    ])
    .into_bytes();
    bytes.extend_from_slice(b"1,00:00:00.000004,free,0x1000,256,\xff\xfe\n"); // line 5: not UTF-8
    bytes.extend_from_slice(b"1,00:00:00.000005,free,0x10"); // line 6: truncated
    let device = Device::host();
    let mr = CudaResource::new(&device).unwrap();
    let w = replay(
        EventReader::new(&bytes[..]).unwrap(),
        &mr,
        &device,
        &ReplayOptions::default(),
    )
    .unwrap();
    assert_eq!(w.skipped.malformed, 4);
    assert_eq!((w.events, w.allocations, w.unfreed.len()), (1, 1, 1));
    let s = scan_log(
        EventReader::new(&bytes[..]).unwrap(),
        &ReplayOptions::default(),
    )
    .unwrap();
    assert_eq!((s.skipped.malformed, s.events, s.lines), (4, 1, 6));

    let e = replay(
        EventReader::new(&bytes[..]).unwrap(),
        &mr,
        &device,
        &strict(),
    )
    .unwrap_err();
    assert_eq!(error_line(&e), 3, "{e}");
    let e = scan_log(EventReader::new(&bytes[..]).unwrap(), &strict()).unwrap_err();
    assert_eq!(error_line(&e), 3, "{e}");
    // Only the not-UTF-8 line, then only the truncated one.
    let mut tail = format!("{LOG_HEADER}\n").into_bytes();
    tail.extend_from_slice(b"1,00:00:00.000004,free,0x1000,256,\xff\xfe\n");
    let e = scan_log(EventReader::new(&tail[..]).unwrap(), &strict()).unwrap_err();
    assert!(
        e.to_string().contains("not UTF-8") && error_line(&e) == 2,
        "{e}"
    );
    let e = scan_log(
        reader(&format!("{LOG_HEADER}\n1,00:00:00.0,free,0x10")),
        &strict(),
    )
    .unwrap_err();
    assert_eq!(error_line(&e), 2, "{e}");
}

/// A log without its header: the first data line is read as the header and refused, line 1.
#[test]
fn a_missing_header_is_an_error_on_line_1() {
    let e = EventReader::new("1,00:00:00.000001,allocate,0x1000,256,0\n".as_bytes()).unwrap_err();
    assert!(matches!(e, ReplayError::Parse { line: 1, .. }), "{e:?}");
    assert!(e.to_string().contains("has no `Thread` column"), "{e}");
}

/// Sizes near `usize::MAX` are refused allocations (failures), on every resource the CLI
/// builds: no panic, no overflow in the live tallies, nothing reserved.
#[test]
fn sizes_near_usize_max_are_failures_on_every_resource() {
    let max = usize::MAX;
    let text = log(&[
        &format!("1,00:00:00.000001,allocate,0x1000,{max},0x5"),
        &format!("1,00:00:00.000002,allocate,0x2000,{},0x5", max - 255),
        &format!("1,00:00:00.000003,allocate,0x3000,{},0x5", 1usize << 62),
        "1,00:00:00.000004,allocate,0x4000,256,0x5",
        &format!("1,00:00:00.000005,free,0x1000,{max},0x5"),
        "1,00:00:00.000006,free,0x4000,256,0x5",
    ]);
    let s = scan_log(reader(&text), &ReplayOptions::default()).unwrap();
    assert_eq!(s.peak_live, usize::MAX, "saturates");
    let device = Device::host();
    let cuda = || CudaResource::new(&device).unwrap();
    let pool = || PoolResource::new(cuda(), 0, None).unwrap();
    let resources: Vec<(&str, SharedResource)> = vec![
        ("cuda", Arc::new(cuda())),
        ("pool", Arc::new(pool())),
        ("arena", Arc::new(ArenaResource::new(cuda(), None).unwrap())),
        (
            "binning",
            Arc::new(BinningResource::with_range(pool(), 18, 22).unwrap()),
        ),
        (
            "cuda-async",
            Arc::new(CudaAsyncResource::new(&device).unwrap()),
        ),
        (
            "fixed-size",
            Arc::new(FixedSizeResource::with_defaults(cuda()).unwrap()),
        ),
        (
            "mapped-pool",
            Arc::new(MappedPoolResource::new(&device).unwrap()),
        ),
    ];
    for (name, mr) in resources {
        let options = ReplayOptions {
            record: true,
            snapshot_line: Some(s.peak_line),
            ..ReplayOptions::default()
        };
        let w = run(&text, &*mr, &device, &options).unwrap();
        assert_eq!((w.refused, w.allocations, w.frees), (3, 1, 1), "{name}");
        assert_eq!(w.peak_live, 256, "{name}");
        assert_eq!(w.skipped.total(), 0, "{name}: {:?}", w.skipped);
    }
}

/// A resource that refuses while memory may come back is retried once after the streams are
/// synchronised, and the replay goes on: a failure, never a hang.
#[test]
fn a_refusal_that_cannot_end_is_a_failure_not_a_hang() {
    let device = Device::host();
    let mr = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 1 << 20);
    let text = log(&[
        "1,00:00:00.000001,allocate,0x100000,786432,0x5",
        "2,00:00:00.000002,allocate,0x200000,786432,0x6", // refused: 768 KiB are live
        "1,00:00:00.000003,free,0x100000,786432,0x5",
        "2,00:00:00.000004,free,0x200000,786432,0x6", // its allocation failed: no second failure
        "2,00:00:00.000005,allocate,0x300000,786432,0x6",
        "2,00:00:00.000006,free,0x300000,786432,0x6",
    ]);
    let w = run(&text, &mr, &device, &ReplayOptions::default()).unwrap();
    assert_eq!((w.refused, w.waits, w.allocations, w.frees), (1, 0, 2, 2));
    assert_eq!(w.skipped.total(), 0);
    assert_eq!(w.failures[0].line, 3);
    assert_eq!(w.operations, 2 + 2 + 2, "the refused one was tried twice");
}

/// Only the first `max_failures` failures are kept; all are counted.
#[test]
fn failures_kept_are_bounded_and_all_are_counted() {
    let mut rows = Vec::new();
    for i in 0..500 {
        rows.push(format!(
            "1,00:00:00.000001,allocate,{:#x},{},0",
            0x1000 + i * 256,
            1usize << 60
        ));
    }
    let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
    let device = Device::host();
    let mr = CudaResource::new(&device).unwrap();
    let w = run(&log(&rows), &mr, &device, &ReplayOptions::default()).unwrap();
    assert_eq!((w.refused, w.failures.len()), (500, 100));
}

/// Streams past the limit run on one shared stream, counted; strict mode refuses the first
/// event on one, with its line.
#[test]
fn streams_past_the_limit_are_counted_or_refused() {
    let text = log(&[
        "1,00:00:00.000001,allocate,0x1000,256,0x1",
        "1,00:00:00.000002,allocate,0x2000,256,0x2",
        "1,00:00:00.000003,allocate,0x3000,256,0x3",
        "1,00:00:00.000004,free,0x3000,256,0x4",
    ]);
    let device = Device::host();
    let mr = CudaResource::new(&device).unwrap();
    let two = ReplayOptions {
        max_streams: 2,
        ..ReplayOptions::default()
    };
    let w = run(&text, &mr, &device, &two).unwrap();
    assert_eq!((w.streams, w.skipped.streams_over_limit), (2, 2));
    assert_eq!((w.allocations, w.frees, w.unfreed.len()), (3, 3, 2));
    let strict_two = ReplayOptions {
        strict: true,
        ..two
    };
    for e in [
        run(&text, &mr, &device, &strict_two).unwrap_err(),
        scan_log(reader(&text), &strict_two).unwrap_err(),
    ] {
        assert_eq!(e, ReplayError::TooManyStreams { line: 4, limit: 2 });
    }
}

/// The scan's peak is the live bytes' maximum; the recording pass takes the snapshot right
/// after it and its timeline reaches the same peak, with the logged streams named.
#[test]
fn the_peak_is_found_and_recorded() {
    let text = log(&[
        "1,10:00:00.000001,allocate,0x1000,1000,0x5560f474fff0",
        "2,10:00:00.000002,allocate,0x2000,3000,0x5560f4acda50",
        "1,10:00:00.000003,free,0x1000,1000,0x5560f474fff0",
        "2,10:00:00.000004,allocate,0x3000,500,0x5560f4acda50",
        "2,10:00:00.000005,free,0x2000,3000,0x5560f4acda50",
    ]);
    let s = scan_log(reader(&text), &ReplayOptions::default()).unwrap();
    assert_eq!(
        (s.peak_live, s.peak_line, s.streams, s.threads),
        (4000, 3, 2, 2)
    );
    let device = Device::host();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
    let options = ReplayOptions {
        record: true,
        snapshot_line: Some(s.peak_line),
        ..ReplayOptions::default()
    };
    let w = run(&text, &pool, &device, &options).unwrap();
    assert_eq!((w.peak_live, w.unfreed.len()), (4000, 1));
    assert!(w.peak_reserved >= 4000, "{}", w.peak_reserved);
    if let Some(snap) = &w.peak_snapshot {
        assert_eq!(snap.live_bytes(), 4096, "rounded to 256 B: 1024 + 3072");
    }
    // The log's events, and the pool's segments taken for them (the first allocation's
    // at least) before them.
    let logged = |t: &Timeline| {
        let actions: Vec<TraceAction> = t.events().map(|e| e.action).collect();
        let segments = actions
            .iter()
            .filter(|a| **a == TraceAction::SegmentAlloc)
            .count();
        assert!(
            segments >= 1 && actions[0] == TraceAction::SegmentAlloc,
            "{actions:?}"
        );
        actions.len() - segments
    };
    assert_eq!(logged(w.timeline_at_peak.as_ref().unwrap()), 2);
    let t = w.timeline.unwrap();
    assert_eq!(t.peak_live_bytes(), 4000);
    assert_eq!(logged(&t), 5);
    let names: Vec<&str> = t.streams().map(|(_, n)| n).collect();
    assert_eq!(names, ["stream 0x5560f474fff0", "stream 0x5560f4acda50"]);
    assert_eq!(
        t.events().last().unwrap().time,
        std::time::Duration::from_micros(4)
    );
}

/// What the logging adaptor writes on default streams is what RMM's parser
/// (benchmarks/utilities/log_parser.hpp) accepts: columns found by name (rapidcsv), Thread,
/// Size and Stream read as decimal integers, Pointer with `std::stoull(s, nullptr, 16)` or
/// `(nil)`, Time as `HH:MM:SS.micros`, Action one of three words.
#[test]
fn our_default_stream_logs_are_what_rmm_parses() {
    let device = Device::host();
    let stream = Stream::new(&device).unwrap();
    let out = SharedWriter::default();
    let limited = LimitingAdaptor::new(CudaResource::new(&device).unwrap(), 1 << 20);
    let mr = LoggingAdaptor::builder()
        .streams_as_default(true)
        .build_to_writer(limited, out.clone())
        .unwrap();
    let a = mr.try_allocate(1000, &stream).unwrap();
    let z = mr.try_allocate(0, &stream).unwrap();
    assert!(mr.try_allocate(2 << 20, &stream).is_err());
    // SAFETY: allocated above with these sizes, freed once, never used.
    unsafe {
        mr.deallocate(a, 1000, &stream);
        mr.deallocate(z, 0, &stream);
    }
    mr.flush().unwrap();
    let text = out.text();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("Thread,Time,Action,Pointer,Size,Stream"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 5, "{text}");
    let decimal = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    for r in &rows {
        assert_eq!(r.len(), 6, "{r:?}");
        assert!(decimal(r[0]), "Thread (size_t): {r:?}");
        let t: Vec<&str> = r[1].split([':', '.']).collect();
        assert!(
            t.len() == 4 && t.iter().all(|p| decimal(p)) && t[3].len() == 6,
            "Time: {r:?}"
        );
        assert!(
            ["allocate", "allocate failure", "free"].contains(&r[2]),
            "{r:?}"
        );
        let p = r[3];
        assert!(
            p == "(nil)"
                || p.strip_prefix("0x")
                    .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit())),
            "Pointer (stoull base 16 or (nil)): {r:?}"
        );
        assert!(decimal(r[4]), "Size: {r:?}");
        assert_eq!(r[5], "0", "Stream: the default stream, decimal 0");
    }
    assert_eq!(rows[2][2], "allocate failure");
    assert_eq!(rows[2][3], "(nil)");
    assert_eq!(rows[1][3], "(nil)", "0 bytes: the null pointer");
}

/// A log generated on the fly, without holding it: alloc/free pairs on three streams.
struct Generated {
    rows: u64,
    next: u64,
    pending: Vec<u8>,
}

impl Read for Generated {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pending.len() < buf.len() && self.next <= self.rows {
            if self.next == 0 {
                self.pending.extend_from_slice(LOG_HEADER.as_bytes());
                self.pending.push(b'\n');
            } else {
                let i = self.next - 1;
                let pair = i / 2;
                let ptr = 0x7f00_0000_0000u64 + (pair % 64) * 0x10_0000;
                let (action, stream) = (if i % 2 == 0 { "allocate" } else { "free" }, pair % 3 + 1);
                let line = format!(
                    "{},12:00:00.{:06},{action},{ptr:#x},{},{stream:#x}\n",
                    100 + pair % 3,
                    i % 1_000_000,
                    4096 + (pair % 7) * 256
                );
                self.pending.extend_from_slice(line.as_bytes());
            }
            self.next += 1;
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        Ok(n)
    }
}

/// 10^7 rows stream through a scan and a replay without being held: only the live set (one
/// allocation here) is kept. Slow in debug builds; run with `--ignored --release`.
#[test]
#[ignore = "10^7 rows: about a minute in a debug build"]
fn ten_million_rows_stream_through() {
    let rows = 10_000_000;
    let csv = || {
        io::BufReader::new(Generated {
            rows,
            next: 0,
            pending: Vec::new(),
        })
    };
    let s = scan_log(EventReader::new(csv()).unwrap(), &ReplayOptions::default()).unwrap();
    assert_eq!((s.events, s.streams, s.skipped.total()), (rows, 3, 0));
    let device = Device::host();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
    let options = ReplayOptions {
        record: true,
        snapshot_line: Some(s.peak_line),
        ..Default::default()
    };
    let w = replay(EventReader::new(csv()).unwrap(), &pool, &device, &options).unwrap();
    assert_eq!((w.events, w.refused, w.frees), (rows, 0, rows / 2));
    assert_eq!(w.peak_live, s.peak_live);
}

/// A long line is one malformed line, counted and skipped by the scan and the replay, refused
/// with its line in strict mode.
#[test]
fn a_long_line_is_a_counted_malformed_line_or_refused() {
    let long = "9".repeat(200 << 10);
    let text = log(&[
        "1,00:00:00.000001,allocate,0x1000,256,0x5",
        &long,
        "1,00:00:00.000002,free,0x1000,256,0x5",
    ]);
    let s = scan_log(reader(&text), &ReplayOptions::default()).unwrap();
    assert_eq!((s.events, s.skipped.malformed, s.lines), (2, 1, 4));
    let device = Device::host();
    let mr = CudaResource::new(&device).unwrap();
    let w = run(&text, &mr, &device, &ReplayOptions::default()).unwrap();
    assert_eq!((w.allocations, w.frees, w.skipped.malformed), (1, 1, 1));
    let e = scan_log(reader(&text), &strict()).unwrap_err();
    assert_eq!(error_line(&e), 3);
    assert!(e.to_string().contains("longer than 64 KiB"), "{e}");
}

/// Threads and streams are counted exactly, whatever `max_streams` (which bounds only the
/// streams a replay creates).
#[test]
fn threads_and_streams_are_counted_exactly() {
    let rows: Vec<String> = (1..=5000u64)
        .map(|i| format!("{i},00:00:00.000001,allocate failure,(nil),256,{i:#x}"))
        .collect();
    let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
    let s = scan_log(reader(&log(&rows)), &ReplayOptions::default()).unwrap();
    assert_eq!((s.threads, s.streams), (5000, 5000));
    let one = ReplayOptions {
        max_streams: 1,
        ..ReplayOptions::default()
    };
    let s = scan_log(reader(&log(&rows[..10])), &one).unwrap();
    assert_eq!((s.threads, s.streams), (10, 10));
}

/// `allocate,(nil),N` with N > 0 is replayed as logged (N bytes, freed by the next free of
/// `(nil)`), and the scan counts it in the log's peak the same way: both peaks agree.
#[test]
fn null_allocations_count_the_same_in_the_scan_and_the_replay() {
    let text = log(&[
        "1,00:00:00.000001,allocate,(nil),1000,0",
        "1,00:00:00.000002,allocate,0x2000,500,0",
        "1,00:00:00.000003,free,(nil),1000,0",
        "1,00:00:00.000004,free,0x2000,500,0",
    ]);
    let s = scan_log(reader(&text), &ReplayOptions::default()).unwrap();
    let device = Device::host();
    let mr = CudaResource::new(&device).unwrap();
    let w = run(&text, &mr, &device, &ReplayOptions::default()).unwrap();
    assert_eq!((s.peak_live, s.peak_line), (1500, 3));
    assert_eq!((w.peak_live, w.unfreed.len()), (1500, 0));
}
