//! RMM's allocation-log CSV, read line by line (RMM's `log_parser.hpp`).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::time::Duration;

use super::error::{ReplayError, ReplayResult};
use super::fields::{excerpt, Action};
use crate::resource::DevicePtr;

/// One line of an allocation log.
///
/// # Examples
///
/// ```
/// use streamalloc::replay::{parse_log_str, Action};
///
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n\
///            4242,09:15:02.000123,allocate,0x7f0000000000,256,0\n";
/// let e = parse_log_str(log)?[0];
/// assert_eq!((e.line, e.thread, e.action, e.bytes, e.stream), (2, 4242, Action::Allocate, 256, 0));
/// assert_eq!(e.ptr.addr(), 0x7f00_0000_0000);
/// assert_eq!(e.time.unwrap().as_micros(), (9 * 3600 + 15 * 60 + 2) * 1_000_000 + 123);
/// # Ok::<(), streamalloc::replay::ReplayError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event {
    /// The line's number in the log, counting from 1 (the header is line 1).
    pub line: usize,
    /// The OS thread id of the thread that made the call.
    pub thread: u64,
    /// The time of day it was logged, when the log has a `Time` column.
    pub time: Option<Duration>,
    /// What happened.
    pub action: Action,
    /// The pointer allocated or freed, in the logging process (null for failures and 0-byte
    /// allocations).
    pub ptr: DevicePtr,
    /// The requested size.
    pub bytes: usize,
    /// The stream's handle in the logging process (0: the default stream).
    pub stream: u64,
}

/// A parsed event is an item of a log read as it goes, so that
/// [`replay`](crate::replay::replay) takes either.
impl From<Event> for ReplayResult<Event> {
    fn from(e: Event) -> Self {
        Ok(e)
    }
}

impl From<&Event> for ReplayResult<Event> {
    fn from(e: &Event) -> Self {
        Ok(*e)
    }
}

/// The longest line the reader takes, line end excluded: an RMM log line is under 120 bytes,
/// so a longer one is not a log line, and reading it whole would cost its length in memory.
const MAX_LINE: usize = 64 << 10;

/// The header's column names, in the order `Columns::at` keeps them.
const NAMES: [&str; 6] = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"];
const THREAD: usize = 0;
const TIME: usize = 1;
const ACTION: usize = 2;
const POINTER: usize = 3;
const SIZE: usize = 4;
const STREAM: usize = 5;

/// Where each column sits in a line.
#[derive(Debug, Clone, Copy, Default)]
struct Columns {
    /// How many columns the header has.
    count: usize,
    /// The position of each of [`NAMES`] (all but `Time` are present).
    at: [Option<usize>; 6],
}

/// Reads an allocation log one event at a time: RMM's `log_parser.hpp`, with a line number in
/// every error.
///
/// The log is CSV with a header line naming the columns, as [`LoggingAdaptor`] and RMM's
/// `logging_resource_adaptor` write it. Columns are found by name, in any order, as RMM's
/// parser finds them: `Thread`, `Action`, `Pointer`, `Size` and `Stream` are required, `Time` is
/// read when present, others are ignored. Fields may be padded with spaces; blank lines are
/// skipped; `\r\n` line ends and a UTF-8 byte-order mark are accepted. A line (the header
/// included) may hold at most 64 KiB: a longer one is a parse error with its number, read in
/// bounded memory (the rest of it is skipped up to its newline).
///
/// | column | accepted |
/// |---|---|
/// | `Thread` | a decimal number |
/// | `Time` | `HH:MM:SS` with an optional fraction of up to 9 digits |
/// | `Action` | `allocate`, `allocate failure`, `free` |
/// | `Pointer`, `Stream` | hexadecimal with or without `0x` (as `%p`, `std::hex` and `fmt::ptr` print pointers), or `(nil)` |
/// | `Size` | a decimal number |
///
/// [`LoggingAdaptor`]: crate::LoggingAdaptor
///
/// # Errors
/// Each item is [`ReplayError::Parse`] with the line number for a malformed line, or [`ReplayError::Io`] when
/// reading fails. After an error the reader goes on with the next line.
///
/// # Examples
///
/// ```
/// use streamalloc::replay::EventReader;
///
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n\
///            1,00:00:00.000001,allocate,0x100,256,0\n\
///            1,00:00:00.000002,frees,0x100,256,0\n";
/// let mut reader = EventReader::new(log.as_bytes())?;
/// assert!(reader.next().unwrap().is_ok());
/// let e = reader.next().unwrap().unwrap_err();
/// assert_eq!(e.to_string(), "event log line 3: Action: `frees` is none of `allocate`, `allocate failure`, `free`");
/// assert!(reader.next().is_none());
/// # Ok::<(), streamalloc::replay::ReplayError>(())
/// ```
#[derive(Debug)]
pub struct EventReader<B> {
    input: B,
    columns: Columns,
    /// The number of the last line read.
    line: usize,
    buf: Vec<u8>,
    /// Set once reading has failed: a reader that fails once may fail for ever, so the
    /// iterator ends after reporting it. (A line that does not parse is different: the reader
    /// goes on with the next one.)
    failed: bool,
}

impl<B: BufRead> EventReader<B> {
    /// Reads the header line of `input`.
    ///
    /// # Errors
    /// [`ReplayError::Parse`] (line 1, or the first line that is not blank) when the input is empty
    /// or the header lacks a required column or names one twice; [`ReplayError::Io`] when reading
    /// fails.
    pub fn new(input: B) -> ReplayResult<Self> {
        let mut reader = EventReader {
            input,
            columns: Columns::default(),
            line: 0,
            buf: Vec::new(),
            failed: false,
        };
        let line = loop {
            match reader.next_line()? {
                None => {
                    return Err(ReplayError::parse(
                        reader.line.max(1),
                        "empty log: no header line",
                    ))
                }
                Some((_, text)) if text.trim().is_empty() => continue,
                Some((_, text)) => break text.trim_start_matches('\u{feff}').to_owned(),
            }
        };
        reader.columns =
            header(&line).map_err(|message| ReplayError::parse(reader.line, message))?;
        Ok(reader)
    }

    /// The number of the last line read (0 before any).
    pub fn line(&self) -> usize {
        self.line
    }

    /// The next line without its line end, and its number; `None` at the end of the input.
    ///
    /// At most [`MAX_LINE`] bytes of a line are kept: a longer one is a parse error with its
    /// number, and the rest of it is skipped up to its newline without being stored.
    fn next_line(&mut self) -> ReplayResult<Option<(usize, &str)>> {
        self.buf.clear();
        let line = self.line + 1;
        let io_error =
            |e: std::io::Error| ReplayError::io(format!("reading event log line {line}"), &e);
        // One byte past the cap, so that a line of exactly MAX_LINE bytes and its newline
        // (or a last line of MAX_LINE bytes) are told apart from a longer one.
        let limit = (MAX_LINE + 2) as u64;
        let n = match (&mut self.input)
            .take(limit)
            .read_until(b'\n', &mut self.buf)
        {
            Ok(n) => n,
            Err(e) => {
                self.failed = true;
                return Err(io_error(e));
            }
        };
        if n == 0 {
            return Ok(None);
        }
        self.line = line;
        let ended = self.buf.ends_with(b"\n");
        let mut len = self.buf.len() - usize::from(ended);
        if self.buf[..len].ends_with(b"\r") {
            len -= 1;
        }
        if len > MAX_LINE {
            if !ended {
                if let Err(e) = skip_line(&mut self.input) {
                    self.failed = true;
                    return Err(io_error(e));
                }
            }
            self.buf.clear();
            return Err(ReplayError::parse(
                line,
                format!(
                    "longer than {} KiB (the most a line may hold)",
                    MAX_LINE >> 10
                ),
            ));
        }
        let bytes = &self.buf[..len];
        std::str::from_utf8(bytes)
            .map(|text| Some((line, text)))
            .map_err(|e| ReplayError::parse(line, format!("not UTF-8 text ({e})")))
    }
}

/// Consumes `input` up to and including its next newline (or its end), storing nothing.
fn skip_line(input: &mut impl BufRead) -> std::io::Result<()> {
    loop {
        let available = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(());
        }
        match available.iter().position(|&b| b == b'\n') {
            Some(i) => {
                input.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = available.len();
                input.consume(n);
            }
        }
    }
}

impl<B: BufRead> Iterator for EventReader<B> {
    type Item = ReplayResult<Event>;

    fn next(&mut self) -> Option<ReplayResult<Event>> {
        if self.failed {
            return None;
        }
        let columns = self.columns;
        loop {
            let (line, text) = match self.next_line() {
                Ok(Some(next)) => next,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            if text.trim().is_empty() {
                continue;
            }
            return Some(
                row(text, line, &columns).map_err(|message| ReplayError::parse(line, message)),
            );
        }
    }
}

/// Reads every event of an allocation log (see [`EventReader`] for the format).
///
/// # Errors
/// The first error of [`EventReader`], with its line number.
///
/// # Examples
///
/// ```
/// use std::io::BufReader;
/// use streamalloc::replay::{parse_log, Action};
///
/// let log = b"Thread,Time,Action,Pointer,Size,Stream\r\n\
///             12,08:00:00.000001,allocate failure,(nil),4096,0x2\r\n";
/// let events = parse_log(BufReader::new(&log[..]))?;
/// assert_eq!((events[0].action, events[0].stream), (Action::AllocateFailure, 2));
/// # Ok::<(), streamalloc::replay::ReplayError>(())
/// ```
pub fn parse_log(input: impl BufRead) -> ReplayResult<Vec<Event>> {
    EventReader::new(input)?.collect()
}

/// Reads every event of the allocation log in the file at `path` (the
/// [`LoggingAdaptor`](crate::LoggingAdaptor)'s example writes and reads one).
///
/// # Errors
/// [`ReplayError::Io`] when the file cannot be opened or read; as [`parse_log`] otherwise.
pub fn parse_log_file(path: impl AsRef<Path>) -> ReplayResult<Vec<Event>> {
    let path = path.as_ref();
    let file = File::open(path)
        .map_err(|e| ReplayError::io(format!("opening the event log {}", path.display()), &e))?;
    parse_log(BufReader::new(file))
}

/// Reads every event of an allocation log held in a string.
///
/// # Errors
/// As [`parse_log`].
///
/// # Examples
///
/// ```
/// use streamalloc::replay::parse_log_str;
/// use streamalloc::replay::ReplayError;
///
/// let log = "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,free,0x100,lots,0\n";
/// let Err(ReplayError::Parse { line, message, .. }) = parse_log_str(log) else { panic!() };
/// assert_eq!((line, message.as_str()), (2, "Size: `lots` is not a decimal number"));
/// ```
pub fn parse_log_str(text: &str) -> ReplayResult<Vec<Event>> {
    parse_log(text.as_bytes())
}

fn header(line: &str) -> std::result::Result<Columns, String> {
    let mut columns = Columns::default();
    for (i, name) in line.split(',').enumerate() {
        columns.count += 1;
        let name = name.trim();
        if let Some(k) = NAMES.iter().position(|&n| n == name) {
            if columns.at[k].replace(i).is_some() {
                return Err(format!("the header names column `{name}` twice"));
            }
        }
    }
    for k in [THREAD, ACTION, POINTER, SIZE, STREAM] {
        if columns.at[k].is_none() {
            return Err(format!(
                "the header `{}` has no `{}` column (expected \
                 `Thread,Time,Action,Pointer,Size,Stream`)",
                excerpt(line),
                NAMES[k]
            ));
        }
    }
    Ok(columns)
}

fn row(text: &str, line: usize, columns: &Columns) -> std::result::Result<Event, String> {
    // Only the named columns' fields are kept; a line with more fields than the header is an
    // error found without splitting all of it.
    let mut picked = [""; 6];
    let mut n = 0;
    for (i, field) in text.split(',').enumerate() {
        if i == columns.count {
            return Err(format!(
                "more fields than the header's {} columns",
                columns.count
            ));
        }
        n = i + 1;
        for (k, at) in columns.at.iter().enumerate() {
            if *at == Some(i) {
                picked[k] = field.trim();
            }
        }
    }
    if n != columns.count {
        return Err(format!(
            "{n} field{} where the header has {} columns",
            if n == 1 { "" } else { "s" },
            columns.count
        ));
    }
    Ok(Event {
        line,
        thread: decimal(NAMES[THREAD], picked[THREAD])?,
        time: columns.at[TIME]
            .map(|_| time_of_day(picked[TIME]))
            .transpose()?,
        action: picked[ACTION].parse()?,
        ptr: DevicePtr::from_raw(pointer(NAMES[POINTER], picked[POINTER])?),
        bytes: decimal(NAMES[SIZE], picked[SIZE])?,
        stream: pointer(NAMES[STREAM], picked[STREAM])?,
    })
}

fn decimal<T: std::str::FromStr>(column: &str, s: &str) -> std::result::Result<T, String> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(v) = s.parse() {
            return Ok(v);
        }
        return Err(format!("{column}: `{}` is out of range", excerpt(s)));
    }
    Err(format!(
        "{column}: `{}` is not a decimal number",
        excerpt(s)
    ))
}

/// A pointer as `%p` (`0x…`, `(nil)`), `std::hex` (`0x…`, `0`) or `fmt::ptr` (`0x…`) prints it.
fn pointer(column: &str, s: &str) -> std::result::Result<u64, String> {
    if s == "(nil)" {
        return Ok(0);
    }
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        if let Ok(v) = u64::from_str_radix(digits, 16) {
            return Ok(v);
        }
        return Err(format!("{column}: `{}` is out of range", excerpt(s)));
    }
    Err(format!(
        "{column}: `{}` is not a hexadecimal pointer or `(nil)`",
        excerpt(s)
    ))
}

/// `HH:MM:SS[.fraction]` as a time of day.
fn time_of_day(s: &str) -> std::result::Result<Duration, String> {
    let bad = || format!("Time: `{}` is not HH:MM:SS.ffffff", excerpt(s));
    let (hms, fraction) = s.split_once('.').unwrap_or((s, ""));
    let mut parts = hms.split(':');
    let mut next = |max: u64| -> std::result::Result<u64, String> {
        let part = parts.next().ok_or_else(bad)?;
        if part.is_empty() || part.len() > 2 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let v: u64 = part.parse().map_err(|_| bad())?;
        if v > max {
            return Err(bad());
        }
        Ok(v)
    };
    // 60 seconds: a leap second.
    let (h, m, sec) = (next(23)?, next(59)?, next(60)?);
    if parts.next().is_some() {
        return Err(bad());
    }
    let nanos = if s.contains('.') {
        if fraction.is_empty()
            || fraction.len() > 9
            || !fraction.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        let digits: u32 = fraction.parse().map_err(|_| bad())?;
        digits * 10u32.pow(9 - fraction.len() as u32)
    } else {
        0
    };
    Ok(Duration::new(h * 3600 + m * 60 + sec, nanos))
}

#[cfg(test)]
mod tests;
