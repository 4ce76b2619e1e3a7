use std::io::{self, Read};
use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;

use super::*;
use crate::rmm_csv::{CPointer, ReplayError, StreamHandle, TimeOfDay, LOG_HEADER};

const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// The line number of a parse error, or a panic for any other error.
fn error_line(e: &ReplayError) -> usize {
    match e {
        ReplayError::Parse { line, .. } => *line,
        other => panic!("not a parse error: {other:?}"),
    }
}

fn parse_err(text: &str) -> ReplayError {
    parse_log_str(text).unwrap_err()
}

/// A log in the shape RMM writes it: spdlog's thread ids and times, glibc's `%p`, libstdc++'s
/// stream pointers (`0` for the default stream), a failure with `(nil)`, a 0-byte allocation,
/// and addresses reused after a free.
const RMM_SAMPLE: &str = "\
Thread,Time,Action,Pointer,Size,Stream
2310716,16:36:43.474583,allocate,0x7f8a7a000000,1000,0
2310716,16:36:43.474595,allocate,0x7f8a7a000400,2000,0x55e3c7c1b5d0
2310717,16:36:43.474601,allocate failure,(nil),1099511627776,0
2310716,16:36:43.474610,free,0x7f8a7a000000,1000,0
2310717,16:36:43.474613,allocate,0x7f8a7a000000,512,0x2
2310716,16:36:43.474615,allocate,(nil),0,0
2310716,16:36:43.474618,free,0x7f8a7a000400,2000,0x55e3c7c1b5d0
2310716,16:36:43.474620,free,(nil),0,0
2310717,16:36:43.474622,free,0x7f8a7a000000,512,0x2
";

#[test]
fn the_header_is_rmms() {
    assert_eq!(LOG_HEADER, HEADER);
}

#[test]
fn parses_an_rmm_log() {
    let events = parse_log_str(RMM_SAMPLE).unwrap();
    assert_eq!(events.len(), 9);
    let at = |h: u64, m: u64, s: u64, us: u64| {
        Some(Duration::from_secs(h * 3600 + m * 60 + s) + Duration::from_micros(us))
    };
    assert_eq!(
        events[0],
        Event {
            line: 2,
            thread: 2_310_716,
            time: at(16, 36, 43, 474_583),
            action: Action::Allocate,
            ptr: DevicePtr::from_raw(0x7f8a_7a00_0000),
            bytes: 1000,
            stream: 0,
        }
    );
    assert_eq!(events[1].stream, 0x55e3_c7c1_b5d0);
    assert_eq!(
        (events[2].action, events[2].ptr, events[2].bytes),
        (Action::AllocateFailure, DevicePtr::NULL, 1 << 40)
    );
    assert_eq!(events[4].stream, 2, "cudaStreamPerThread");
    assert_eq!((events[5].ptr, events[5].bytes), (DevicePtr::NULL, 0));
    let lines: Vec<usize> = events.iter().map(|e| e.line).collect();
    assert_eq!(lines, (2..=10).collect::<Vec<_>>());
    let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
    use Action::*;
    assert_eq!(
        actions,
        [
            Allocate,
            Allocate,
            AllocateFailure,
            Free,
            Allocate,
            Allocate,
            Free,
            Free,
            Free
        ]
    );
}

/// Older RMM (fmtlib's `fmt::ptr`) printed null pointers as `0x0`; `0X` and bare hexadecimal
/// are taken too.
#[test]
fn pointer_spellings() {
    let log = format!(
        "{HEADER}\n1,00:00:00.0,allocate,0x0,0,0x0\n1,00:00:00.0,free,0XABC0,1,abc0\n\
         1,00:00:00.0,free,FFFFFFFFFFFFFFFF,1,0\n"
    );
    let events = parse_log_str(&log).unwrap();
    assert_eq!((events[0].ptr, events[0].stream), (DevicePtr::NULL, 0));
    assert_eq!((events[1].ptr.addr(), events[1].stream), (0xabc0, 0xabc0));
    assert_eq!(events[2].ptr.addr(), u64::MAX);
}

/// Columns are found by name, in any order, as RMM's parser finds them; `Time` may be missing;
/// other columns are ignored; fields may be padded.
#[test]
fn columns_by_name() {
    let log = "Stream, Size ,Extra,Pointer,Action,Thread\n\
               0x10, 256 ,whatever,0x100,allocate,7\n";
    let e = parse_log_str(log).unwrap()[0];
    assert_eq!(
        (e.stream, e.bytes, e.ptr.addr(), e.action, e.thread, e.time),
        (0x10, 256, 0x100, Action::Allocate, 7, None)
    );
}

#[test]
fn crlf_blank_lines_and_a_byte_order_mark() {
    let log = format!(
        "\u{feff}{HEADER}\r\n\r\n1,00:00:01.5,allocate,0x100,256,0\r\n   \n\
         1,00:00:02,free,0x100,256,0"
    );
    let events = parse_log_str(&log).unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(
        (events[0].line, events[1].line),
        (3, 5),
        "blank lines count"
    );
    assert_eq!(events[0].time, Some(Duration::from_millis(1500)));
    assert_eq!(events[1].time, Some(Duration::from_secs(2)));
}

#[test]
fn time_of_day_forms() {
    let ok = |s: &str| time_of_day(s).unwrap();
    assert_eq!(ok("00:00:00.000000"), Duration::ZERO);
    assert_eq!(ok("23:59:60.999999999"), Duration::new(86_400, 999_999_999));
    assert_eq!(ok("1:2:3.4"), Duration::new(3723, 400_000_000));
    assert_eq!(ok("10:20:30"), Duration::from_secs(37_230));
    for bad in [
        "",
        "24:00:00.0",
        "10:60:00.0",
        "10:00:61.0",
        "10:00",
        "10:00:00:00",
        "10:00:00.",
        "10:00:00.1234567890",
        "10:00:00.12a",
        "aa:00:00.0",
        "100:00:00.0",
        "-1:00:00.0",
        "+1:00:00.0",
    ] {
        let e = time_of_day(bad).unwrap_err();
        assert!(e.starts_with("Time:"), "{bad}: {e}");
    }
}

#[test]
fn header_errors_are_on_line_1() {
    let e = parse_err("");
    assert_eq!(error_line(&e), 1);
    assert!(e.to_string().contains("empty log"), "{e}");

    let e = parse_err("Thread,Time,Action,Pointer,Size\n1,00:00:00.0,free,0x1,1\n");
    assert_eq!(error_line(&e), 1);
    assert!(e.to_string().contains("no `Stream` column"), "{e}");

    let e = parse_err("Thread,Time,Action,Pointer,Size,Stream,Size\n");
    assert!(e.to_string().contains("`Size` twice"), "{e}");

    // A header after blank lines: its own line number.
    let e = parse_err("\n\nthread,time,action,pointer,size,stream\n");
    assert_eq!(error_line(&e), 3);
    assert!(
        e.to_string().starts_with("event log line 3: the header"),
        "{e}"
    );
}

#[test]
fn every_row_error_names_its_line_and_column() {
    let cases: [(&str, &str); 14] = [
        (
            "1,00:00:00.0,allocate,0x100,256",
            "5 fields where the header has 6",
        ),
        ("1,00:00:00.0,allocate,0x100,256,0,7", "more fields than"),
        ("1", "1 field where"),
        (
            "x1,00:00:00.0,allocate,0x100,256,0",
            "Thread: `x1` is not a decimal",
        ),
        ("-1,00:00:00.0,allocate,0x100,256,0", "Thread: `-1`"),
        (
            "99999999999999999999,00:00:00.0,free,0x1,1,0",
            "Thread: `99999999999999999999` is out of range",
        ),
        ("1,12:00,allocate,0x100,256,0", "Time: `12:00`"),
        (
            "1,00:00:00.0,Allocate,0x100,256,0",
            "Action: `Allocate` is none of",
        ),
        (
            "1,00:00:00.0,allocate,,256,0",
            "Pointer: `` is not a hexadecimal",
        ),
        ("1,00:00:00.0,allocate,0xg00,256,0", "Pointer: `0xg00`"),
        (
            "1,00:00:00.0,allocate,0x10000000000000000,256,0",
            "Pointer: `0x10000000000000000` is out of range",
        ),
        (
            "1,00:00:00.0,allocate,0x100,2.5,0",
            "Size: `2.5` is not a decimal",
        ),
        (
            "1,00:00:00.0,allocate,0x100,99999999999999999999,0",
            "Size: `99999999999999999999` is out of range",
        ),
        (
            "1,00:00:00.0,allocate,0x100,256,nil",
            "Stream: `nil` is not a hexadecimal",
        ),
    ];
    for (row, message) in cases {
        // A good line first, so the bad one is line 3.
        let log = format!("{HEADER}\n1,00:00:00.0,free,0x1,1,0\n{row}\n");
        let e = parse_err(&log);
        assert_eq!(error_line(&e), 3, "{row}: {e}");
        assert!(e.to_string().contains(message), "{row}: {e}");
        assert!(e.to_string().starts_with("event log line 3: "), "{e}");
    }
}

#[test]
fn long_bad_fields_are_cut_short_in_messages() {
    let long = "z".repeat(10_000);
    let e = parse_err(&format!("{HEADER}\n{long},00:00:00.0,free,0x1,1,0\n"));
    assert!(e.to_string().len() < 200, "{e}");
    assert!(e.to_string().contains('…'));
}

#[test]
fn a_line_that_is_not_utf8_is_a_parse_error() {
    let mut log = format!("{HEADER}\n1,00:00:00.0,free,0x1,1,0\n").into_bytes();
    log.extend_from_slice(b"1,00:00:00.0,free,0x\xff,1,0\n");
    let e = parse_log(&log[..]).unwrap_err();
    assert_eq!(error_line(&e), 3);
    assert!(e.to_string().contains("not UTF-8"), "{e}");
}

#[test]
fn the_reader_goes_on_after_a_bad_line() {
    let log = format!("{HEADER}\n1,00:00:00.0,free,0x1,1,0\nbad\n1,00:00:00.0,free,0x2,1,0\n");
    let mut reader = EventReader::new(log.as_bytes()).unwrap();
    assert_eq!(reader.line(), 1);
    assert_eq!(reader.next().unwrap().unwrap().line, 2);
    assert_eq!(error_line(&reader.next().unwrap().unwrap_err()), 3);
    assert_eq!(reader.next().unwrap().unwrap().ptr.addr(), 2);
    assert!(reader.next().is_none());
    assert_eq!(reader.line(), 4);
}

/// A reader that fails after its first `n` bytes.
struct Broken<'a> {
    data: &'a [u8],
}

impl Read for Broken<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.data.is_empty() {
            return Err(io::Error::new(io::ErrorKind::ConnectionReset, "gone"));
        }
        let n = buf.len().min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn a_failed_read_is_an_io_error_with_the_line() {
    let log = format!("{HEADER}\n1,00:00:00.0,free,0x1,1,0\n");
    let input = io::BufReader::with_capacity(
        8,
        Broken {
            data: log.as_bytes(),
        },
    );
    let e = parse_log(input).unwrap_err();
    let ReplayError::Io { kind, context, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(*kind, io::ErrorKind::ConnectionReset);
    assert_eq!(context, "reading event log line 3");
}

/// A reader that fails may fail for ever: the iterator reports the failure once and ends,
/// where going on (as it does after a line that does not parse) would never end.
#[test]
fn a_failed_reader_ends_after_reporting_it() {
    let log = format!("{HEADER}\n");
    let input = io::BufReader::new(Broken {
        data: log.as_bytes(),
    });
    let reader = EventReader::new(input).unwrap();
    let items: Vec<_> = reader.take(10).collect();
    assert_eq!(items.len(), 1, "{items:?}");
    assert!(matches!(items[0], Err(ReplayError::Io { .. })), "{items:?}");
}

#[test]
fn a_missing_file_is_an_io_error_naming_it() {
    let path = std::env::temp_dir().join("streamalloc-no-such-log.csv");
    let e = parse_log_file(&path).unwrap_err();
    assert!(
        matches!(
            &e,
            ReplayError::Io {
                kind: io::ErrorKind::NotFound,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("streamalloc-no-such-log.csv"), "{e}");
}

/// A line as the logging adaptor formats it.
fn logged_line(e: &Event, at: Duration) -> String {
    format!(
        "{},{},{},{},{},{}",
        e.thread,
        TimeOfDay(UNIX_EPOCH + at),
        e.action,
        CPointer(e.ptr.addr()),
        e.bytes,
        StreamHandle(e.stream)
    )
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        Just(Action::Allocate),
        Just(Action::AllocateFailure),
        Just(Action::Free)
    ]
}

/// Fragments that look like the format, so random lines get past the first check often.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,22}",
        "0x[0-9a-fA-F]{0,18}",
        "\\(nil\\)",
        "[0-9]{1,3}:[0-9]{1,3}:[0-9]{1,3}\\.[0-9]{0,10}",
        Just("allocate".to_owned()),
        Just("allocate failure".to_owned()),
        Just("free".to_owned()),
        ".{0,12}",
    ]
}

fn random_line() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(fragment(), 0..9).prop_map(|f| f.join(",")),
        ".{0,80}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random lines never panic the parser, and every error is a parse error on a line that
    /// exists, or an event on its own line.
    #[test]
    fn random_lines_never_panic_and_errors_have_their_line(
        lines in prop::collection::vec(random_line(), 0..12),
    ) {
        let text = format!("{HEADER}\n{}", lines.join("\n"));
        let total = text.as_bytes().split(|&b| b == b'\n').count();
        let reader = EventReader::new(text.as_bytes()).unwrap();
        for item in reader {
            match item {
                Ok(e) => prop_assert!((2..=total).contains(&e.line)),
                Err(ReplayError::Parse { line, message }) => {
                    prop_assert!((2..=total).contains(&line), "line {line} of {total}");
                    prop_assert!(!message.is_empty());
                }
                Err(other) => prop_assert!(false, "{other:?}"),
            }
        }
        // Random bytes too, as the header or anywhere.
        let bytes: Vec<u8> = lines.join("\n").into_bytes();
        let _ = parse_log(&bytes[..]);
    }

    /// What the logging adaptor writes, the parser reads back exactly.
    #[test]
    fn logged_lines_parse_back(
        events in prop::collection::vec(
            (any::<u64>(), action(), any::<u64>(), any::<usize>(), any::<u64>(), 0u64..86_400_000_000),
            1..20,
        ),
    ) {
        let mut text = format!("{HEADER}\n");
        let mut expected = Vec::new();
        for (i, &(thread, action, ptr, bytes, stream, micros)) in events.iter().enumerate() {
            let at = Duration::from_micros(micros);
            let e = Event {
                line: i + 2,
                thread,
                time: Some(at),
                action,
                ptr: DevicePtr::from_raw(ptr),
                bytes,
                stream,
            };
            text.push_str(&logged_line(&e, at));
            text.push('\n');
            expected.push(e);
        }
        prop_assert_eq!(parse_log_str(&text).unwrap(), expected);
    }
}

#[test]
fn random_bytes_in_a_reader_do_not_panic() {
    // A deterministic walk over byte soup, through a one-byte buffer (reads split anywhere).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..200 {
        let mut bytes = HEADER.as_bytes().to_vec();
        bytes.push(b'\n');
        for _ in 0..64 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            bytes.push(b",:.x0123456789abcdef(nil)\n\r\xff "[(state % 27) as usize]);
        }
        let input = io::BufReader::with_capacity(1, &bytes[..]);
        for item in EventReader::new(input).unwrap() {
            if let Err(e) = item {
                assert!(error_line(&e) >= 2);
            }
        }
    }
}

/// A line longer than [`MAX_LINE`] is a parse error with its number, read in bounded memory:
/// the reader keeps at most [`MAX_LINE`] bytes of it and skips the rest up to its newline, then
/// goes on with the next line.
#[test]
fn a_line_longer_than_the_cap_is_an_error_with_its_number_in_bounded_memory() {
    let mut log = format!("{HEADER}\n1,00:00:00.000001,allocate,0x100,256,0\n");
    log.push_str(&"7".repeat(4 << 20)); // 4 MiB, no comma: line 3
    log.push_str("\n1,00:00:00.000002,free,0x100,256,0\n");
    let mut reader = EventReader::new(log.as_bytes()).unwrap();
    assert_eq!(reader.next().unwrap().unwrap().line, 2);
    let e = reader.next().unwrap().unwrap_err();
    assert_eq!(error_line(&e), 3);
    assert_eq!(
        e.to_string(),
        "event log line 3: longer than 64 KiB (the most a line may hold)"
    );
    assert!(
        reader.buf.capacity() <= 2 * (MAX_LINE + 2),
        "the reader held {} bytes for the long line",
        reader.buf.capacity()
    );
    let next = reader.next().unwrap().unwrap();
    assert_eq!((next.line, next.action), (4, Action::Free));
    assert!(reader.next().is_none());

    // A long last line without a newline, and a long header, likewise.
    let tail = format!("{HEADER}\n{}", "x".repeat(MAX_LINE + 1));
    let e = parse_log_str(&tail).unwrap_err();
    assert_eq!(error_line(&e), 2);
    let header = format!("{HEADER},{}\n", "y".repeat(1 << 20));
    let e = parse_log_str(&header).unwrap_err();
    assert_eq!(error_line(&e), 1);
    assert!(e.to_string().contains("longer than 64 KiB"), "{e}");

    // A line of exactly the cap, newline excluded, is read.
    let pad = MAX_LINE - "1,00:00:00.000001,allocate,0x100,256,0".len();
    let exact = format!(
        "Thread,Time,Action,Pointer,Size,Stream,Note\n1,00:00:00.000001,allocate,0x100,256,0,{}\n",
        "z".repeat(pad - 1)
    );
    assert_eq!(parse_log_str(&exact).unwrap().len(), 1);
}
