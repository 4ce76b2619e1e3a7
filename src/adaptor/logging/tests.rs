use std::io::{self, Write};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::rmm_csv::LOG_HEADER;
use crate::test_support::{self, free, host, recording, SharedWriter as Shared, KIB, MIB};
use crate::{CudaResource, LimitingAdaptor};

/// A writer that takes `budget` bytes, then fails every write.
struct Failing {
    budget: usize,
    taken: Shared,
}

impl Write for Failing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.budget == 0 {
            return Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"));
        }
        let n = buf.len().min(self.budget);
        self.budget -= n;
        self.taken.write(&buf[..n])
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// 03:04:05.006007 on the second day of 1970, and one microsecond later on each call.
fn fixed_clock() -> impl Fn() -> SystemTime + Send + Sync {
    let calls = std::sync::atomic::AtomicU64::new(0);
    move || {
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        UNIX_EPOCH
            + Duration::from_secs(86_400 + 3 * 3600 + 4 * 60 + 5)
            + Duration::from_micros(6007 + n)
    }
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "streamalloc-{}-{name}-{:?}.csv",
        std::process::id(),
        thread::current().id()
    ))
}

/// The exact bytes for a fixed sequence: header, allocate, allocate failure, a 0-byte
/// allocation, frees, with the thread pinned to this thread's id and the time to a fixed clock.
#[test]
fn the_output_is_rmms_format_byte_for_byte() {
    let (device, s) = host();
    // SAFETY: the test uses the made-up pointers as numbers only; nothing touches memory there.
    let (up, _) = unsafe {
        recording(&device, |bytes| match bytes {
            0 => Ok(DevicePtr::NULL),
            b if b > MIB => Err(Error::OutOfMemory {
                details: None,
                requested: b,
                available: None,
                device: crate::Device::host().id(),
            }),
            _ => Ok(DevicePtr::from_raw(0x7f3a_5c00_0000)),
        })
    };
    let out = Shared::default();
    let mr = LoggingAdaptor::builder()
        .clock(fixed_clock())
        .build_to_writer(up, out.clone())
        .unwrap();
    let p = mr.try_allocate(1000, &s).unwrap();
    assert!(mr.try_allocate(1 << 40, &s).unwrap_err().is_out_of_memory());
    let z = mr.try_allocate(0, &s).unwrap();
    free(&mr, z, 0, &s);
    free(&mr, p, 1000, &s);
    mr.flush().unwrap();

    let tid = os_thread_id();
    let h = s.raw_handle();
    assert_ne!(h, 0, "host streams have non-zero handles");
    let expected = format!(
        "Thread,Time,Action,Pointer,Size,Stream\n\
         {tid},03:04:05.006007,allocate,0x7f3a5c000000,1000,{h:#x}\n\
         {tid},03:04:05.006008,allocate failure,(nil),1099511627776,{h:#x}\n\
         {tid},03:04:05.006009,allocate,(nil),0,{h:#x}\n\
         {tid},03:04:05.006010,free,(nil),0,{h:#x}\n\
         {tid},03:04:05.006011,free,0x7f3a5c000000,1000,{h:#x}\n"
    );
    assert_eq!(out.text(), expected);
}

/// For RMM's replay benchmark, which takes only default-stream logs.
#[test]
fn streams_can_be_logged_as_the_default_stream() {
    let (device, s) = host();
    let out = Shared::default();
    let mr = LoggingAdaptor::builder()
        .streams_as_default(true)
        .build_to_writer(CudaResource::new(&device).unwrap(), out.clone())
        .unwrap();
    let p = mr.try_allocate(KIB, &s).unwrap();
    free(&mr, p, KIB, &s);
    mr.flush().unwrap();
    let text = out.text();
    let streams: Vec<&str> = text
        .lines()
        .skip(1)
        .map(|l| l.rsplit(',').next().unwrap())
        .collect();
    assert_eq!(streams, ["0", "0"], "{text}");
}

#[test]
fn the_thread_column_is_the_os_thread_id() {
    let here = os_thread_id();
    assert_eq!(here, os_thread_id(), "stable within a thread");
    let there = thread::spawn(os_thread_id).join().unwrap();
    assert_ne!(here, there);
    #[cfg(target_os = "linux")]
    {
        // The kernel lists this thread's id among the process's tasks.
        let task = std::path::Path::new("/proc/self/task").join(here.to_string());
        assert!(task.exists(), "{} does not exist", task.display());
    }
}

/// Lines written from several threads are whole lines, each with its thread's id, and the time
/// column never goes backwards down the file.
#[test]
fn concurrent_lines_are_whole_and_in_time_order() {
    let (device, s) = host();
    let out = Shared::default();
    // A clock that advances on every read: the times go up down the file only if each line
    // reads it under the lock that orders the lines.
    let mr = LoggingAdaptor::builder()
        .clock(fixed_clock())
        .build_to_writer(CudaResource::new(&device).unwrap(), out.clone())
        .unwrap();
    let ids: Vec<u64> = thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    for i in 0..50 {
                        let p = mr.try_allocate(256 * (i + 1), &s).unwrap();
                        free(&mr, p, 256 * (i + 1), &s);
                    }
                    os_thread_id()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    mr.flush().unwrap();
    let text = out.text();
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 300);
    let mut last = String::new();
    for line in &lines {
        let fields: Vec<&str> = line.split(',').collect();
        assert_eq!(fields.len(), 6, "{line}");
        assert!(ids.contains(&fields[0].parse().unwrap()), "{line}");
        assert!(fields[1] > last.as_str(), "time did not go up at {line}");
        last = fields[1].to_owned();
    }
    s.synchronize_blocking().unwrap();
}

#[test]
fn lines_are_buffered_until_a_flush_or_the_last_drop() {
    let (device, s) = host();
    let path = temp_path("buffered");
    let mr = LoggingAdaptor::to_file(CudaResource::new(&device).unwrap(), &path).unwrap();
    assert_eq!(mr.path(), Some(path.as_path()));
    assert!(!mr.auto_flush());
    let p = mr.try_allocate(KIB, &s).unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "",
        "still buffered"
    );
    mr.flush().unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);

    let copy = mr.clone();
    free(&copy, p, KIB, &s);
    drop(mr);
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
    drop(copy); // the last handle flushes
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn auto_flush_writes_every_line_through() {
    let (device, s) = host();
    let path = temp_path("auto-flush");
    let mr = LoggingAdaptor::builder()
        .auto_flush(true)
        .build_to_file(CudaResource::new(&device).unwrap(), &path)
        .unwrap();
    assert!(mr.auto_flush());
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("{LOG_HEADER}\n")
    );
    let p = mr.try_allocate(KIB, &s).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
    free(&mr, p, KIB, &s);
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_file_is_truncated() {
    let (device, _) = host();
    let path = temp_path("truncated");
    std::fs::write(&path, "old contents\nmore\n").unwrap();
    let mr = LoggingAdaptor::to_file(CudaResource::new(&device).unwrap(), &path).unwrap();
    mr.flush().unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("{LOG_HEADER}\n")
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_file_that_cannot_be_created_is_an_io_error_naming_it() {
    let (device, _) = host();
    let path = std::env::temp_dir().join("streamalloc-no-such-dir/sub/log.csv");
    let e = LoggingAdaptor::to_file(CudaResource::new(&device).unwrap(), &path).unwrap_err();
    let Error::Io { kind, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(*kind, io::ErrorKind::NotFound);
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
}

#[test]
fn a_header_that_cannot_be_written_is_an_error() {
    let (device, _) = host();
    let failing = Failing {
        budget: 0,
        taken: Shared::default(),
    };
    let e = LoggingAdaptor::builder()
        .auto_flush(true)
        .build_to_writer(CudaResource::new(&device).unwrap(), failing)
        .unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Io {
                kind: io::ErrorKind::StorageFull,
                ..
            }
        ),
        "{e:?}"
    );
}

/// The variable's value decides: unset and empty are errors that name it, a path is the log
/// file. (Read through `build_from_var`, so the test leaves the process's environment alone.)
#[test]
fn from_env_reads_the_path_and_says_clearly_when_it_is_missing() {
    let (device, s) = host();
    let from = |value: Option<&std::ffi::OsStr>| {
        LoggingAdaptorBuilder::new()
            .build_from_var(CudaResource::new(&device).unwrap(), value.map(Into::into))
    };
    let e = from(None).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(
        e.to_string().contains("STREAMALLOC_LOG_FILE is not set"),
        "{e}"
    );
    let e = from(Some("".as_ref())).unwrap_err();
    assert!(
        e.to_string().contains("STREAMALLOC_LOG_FILE is empty"),
        "{e}"
    );

    let path = temp_path("from-env");
    let mr = from(Some(path.as_os_str())).unwrap();
    assert_eq!(mr.path(), Some(path.as_path()));
    let p = mr.try_allocate(KIB, &s).unwrap();
    free(&mr, p, KIB, &s);
    drop(mr);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    std::fs::remove_file(&path).unwrap();
}

/// A write that fails cannot fail the allocation or the free: the error is kept and returned
/// by `flush`, logging stops, and allocation goes on.
#[test]
fn a_failed_write_is_recorded_and_stops_logging_without_failing_allocations() {
    let (device, s) = host();
    let taken = Shared::default();
    let header_and_a_bit = LOG_HEADER.len() + 1 + 10;
    let mr = LoggingAdaptor::builder()
        .auto_flush(true)
        .build_to_writer(
            CudaResource::new(&device).unwrap(),
            Failing {
                budget: header_and_a_bit,
                taken: taken.clone(),
            },
        )
        .unwrap();
    assert!(mr.write_error().is_none());
    let p = mr.try_allocate(KIB, &s).unwrap();
    let e = mr.write_error().expect("the line could not be written");
    assert!(
        matches!(
            &e,
            Error::Io {
                kind: io::ErrorKind::StorageFull,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("allocation log"), "{e}");
    free(&mr, p, KIB, &s);
    let q = mr.try_allocate(KIB, &s).unwrap();
    free(&mr, q, KIB, &s);
    assert_eq!(mr.flush().unwrap_err(), e);
    assert_eq!(
        taken.0.lock().len(),
        header_and_a_bit,
        "nothing after the error"
    );
    assert!(format!("{mr:?}").contains("StorageFull"));
    drop(mr); // no panic on the last drop either
    s.synchronize_blocking().unwrap();
    assert!(device.take_deferred_error().is_none());
}

/// A buffered log whose flush fails reports it from `flush`.
#[test]
fn a_failed_flush_is_an_error() {
    let (device, s) = host();
    let mr = LoggingAdaptor::to_writer(
        CudaResource::new(&device).unwrap(),
        Failing {
            budget: 5,
            taken: Shared::default(),
        },
    )
    .unwrap();
    let p = mr.try_allocate(KIB, &s).unwrap(); // buffered: no error yet
    assert!(mr.write_error().is_none());
    let e = mr.flush().unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert_eq!(mr.write_error(), Some(e));
    free(&mr, p, KIB, &s);
}

#[test]
fn forwards_the_upstream() {
    let (device, _) = host();
    let mr = LoggingAdaptor::to_writer(
        LimitingAdaptor::new(CudaResource::new(&device).unwrap(), MIB),
        io::sink(),
    )
    .unwrap();
    assert_eq!(mr.capacity_limit(), Some(MIB));
    assert!(mr.availability().is_some());
    assert_eq!(mr.properties(), mr.upstream().properties());
    assert_eq!(mr.path(), None);
    assert!(format!("{:?}", LoggingAdaptor::builder().auto_flush(true)).contains("true"));
}

/// Awaiting through the adaptor: the waiting request's failed attempts are logged as
/// `allocate failure`, then its success.
#[test]
fn a_waiting_allocation_resumes_after_a_free() {
    let out = Shared::default();
    let writer = out.clone();
    let mut handle = None;
    test_support::a_waiting_allocation_resumes_after_a_free(4 * KIB, 4 * KIB, KIB, |l| {
        let mr = LoggingAdaptor::to_writer(l, writer).unwrap();
        handle = Some(mr.clone());
        mr
    });
    handle.unwrap().flush().unwrap();
    let text = out.text();
    let actions: Vec<(&str, &str)> = text
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[2], f[4])
        })
        .collect();
    assert_eq!(actions[0], ("allocate", "4096"));
    let kib: Vec<&str> = actions
        .iter()
        .filter(|(_, size)| *size == "1024")
        .map(|(a, _)| *a)
        .collect();
    // The attempts of the 1 KiB request: failures while 4 KiB were held, then one success,
    // then its free.
    let (failures, last_two) = kib.split_at(kib.len() - 2);
    assert!(failures.len() >= 2, "{kib:?}");
    assert!(failures.iter().all(|&a| a == "allocate failure"), "{kib:?}");
    assert_eq!(last_two, ["allocate", "free"]);
    assert!(text.contains(",allocate failure,(nil),4097,"), "{text}");
}

/// Many batches from several threads: `flush` returns with every line written, whole and in
/// time order, and the last drop writes the partial batch after it.
#[test]
fn every_line_of_many_batches_is_written_by_flush_and_by_the_last_drop() {
    let (device, s) = host();
    let out = Shared::default();
    let mr = LoggingAdaptor::builder()
        .clock(fixed_clock())
        .build_to_writer(CudaResource::new(&device).unwrap(), out.clone())
        .unwrap();
    const THREADS: usize = 3;
    const PAIRS: usize = BATCH + 300; // each thread: more than two batches of lines
    thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                for i in 0..PAIRS {
                    let bytes = 256 * (i % 7 + 1);
                    let p = mr.try_allocate(bytes, &s).unwrap();
                    free(&mr, p, bytes, &s);
                }
            });
        }
    });
    mr.flush().unwrap();
    let lines = |text: &str| text.lines().count();
    assert_eq!(lines(&out.text()), 1 + 2 * THREADS * PAIRS);

    let p = mr.try_allocate(KIB, &s).unwrap();
    free(&mr, p, KIB, &s);
    drop(mr); // unflushed: the last drop writes these two lines
    let text = out.text();
    assert_eq!(lines(&text), 3 + 2 * THREADS * PAIRS);
    let mut last = String::new();
    for line in text.lines().skip(1) {
        let time = line.split(',').nth(1).unwrap();
        assert!(time > last.as_str(), "time did not go up at {line}");
        last = time.to_owned();
    }
    s.synchronize_blocking().unwrap();
}

/// A writer that panics on its first write (after the header).
struct Panicking {
    header_done: bool,
}

impl Write for Panicking {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.header_done {
            panic!("the user's writer panicked");
        }
        self.header_done = true;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Lines lost because the writer thread died in the user's writer while writing a full batch
/// are an error for `flush` and `write_error`, not a silent `Ok`.
#[test]
fn lines_lost_to_a_panicking_writer_make_flush_fail() {
    let (device, s) = host();
    let mr = LoggingAdaptor::to_writer(
        CudaResource::new(&device).unwrap(),
        Panicking { header_done: false },
    )
    .unwrap();
    // Enough pairs to hand the writer a full batch (it dies writing it) and then more.
    for _ in 0..4 * super::BATCH {
        let p = mr.try_allocate(KIB, &s).unwrap();
        free(&mr, p, KIB, &s);
    }
    // Let the writer thread reach the batch and die before the flush is sent.
    thread::sleep(Duration::from_millis(300));
    let e = mr.flush().unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert_eq!(mr.write_error(), Some(e));
}

/// A writer whose flush always fails, or panics.
struct FailingFlush {
    panics: bool,
}

impl Write for FailingFlush {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        assert!(!self.panics, "the user's writer panicked");
        Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"))
    }
}

/// The last drop writes the rest and flushes, and cannot return what fails there: an error
/// that neither `flush` nor `write_error` handed out goes to the device's deferred errors
/// (a failing write, a failing final flush, a writer that panics on the last lines), and
/// one they handed out is not reported twice.
#[test]
fn an_error_nobody_took_goes_to_the_device_at_the_last_drop() {
    let (device, s) = host();
    let writers: [(&str, Box<dyn Write + Send>); 3] = [
        (
            "write",
            Box::new(Failing {
                budget: LOG_HEADER.len() + 5,
                taken: Shared::default(),
            }),
        ),
        ("flush", Box::new(FailingFlush { panics: false })),
        ("panic", Box::new(FailingFlush { panics: true })),
    ];
    for (how, writer) in writers {
        let mr = LoggingAdaptor::to_writer(CudaResource::new(&device).unwrap(), writer).unwrap();
        let p = mr.try_allocate(KIB, &s).unwrap();
        free(&mr, p, KIB, &s);
        drop(mr);
        let e = device.take_deferred_error();
        assert!(
            matches!(&e, Some(Error::Io { context, .. }) if context.contains("allocation log")),
            "{how}: {e:?}"
        );
        assert!(device.take_deferred_error().is_none(), "{how}: twice");
    }
    // Taken through `flush` before the drop: not reported again.
    let mr = LoggingAdaptor::to_writer(
        CudaResource::new(&device).unwrap(),
        FailingFlush { panics: false },
    )
    .unwrap();
    assert!(mr.flush().is_err());
    drop(mr);
    assert!(device.take_deferred_error().is_none());
}

/// With the default clock (the time-stamp counter where the kernel keeps time by it), lines
/// from several threads, over several batches, carry the time of day they were logged at and
/// never go backwards down the file.
#[test]
fn default_clock_lines_carry_their_time_and_go_up_across_threads() {
    let (device, s) = host();
    let out = Shared::default();
    let mr = LoggingAdaptor::to_writer(CudaResource::new(&device).unwrap(), out.clone()).unwrap();
    let before = SystemTime::now();
    thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                for i in 0..1500 {
                    let p = mr.try_allocate(256 * (i % 7 + 1), &s).unwrap();
                    free(&mr, p, 256 * (i % 7 + 1), &s);
                }
            });
        }
    });
    let after = SystemTime::now();
    mr.flush().unwrap();
    // Microseconds of the day, as the `Time` column prints them.
    let of_day = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_micros() % 86_400_000_000;
    let parse = |f: &str| -> u128 {
        let (hms, micros) = f.split_once('.').unwrap();
        let n: Vec<u128> = hms.split(':').map(|x| x.parse().unwrap()).collect();
        ((n[0] * 60 + n[1]) * 60 + n[2]) * 1_000_000 + micros.parse::<u128>().unwrap()
    };
    let (from, to) = (of_day(before), of_day(after));
    if to < from {
        return; // Midnight passed: the window wraps; nothing to compare.
    }
    let text = out.text();
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 3 * 1500 * 2);
    let mut last = 0;
    for line in lines {
        let time = parse(line.split(',').nth(1).unwrap());
        // A millisecond of slack for a clock read on a loaded machine.
        assert!(
            from <= time + 1000 && time <= to + 1000,
            "{line} outside {from}..{to}"
        );
        assert!(time >= last, "time went back at {line}");
        last = time;
    }
    s.synchronize_blocking().unwrap();
}
