//! The lines of RMM's log, formatted by hand for the logging adaptor's writer thread, with the
//! `Display` types they are tested against.

#[cfg(test)]
use std::fmt;
use std::io::{self, Write};
#[cfg(test)]
use std::time::{SystemTime, UNIX_EPOCH};

use super::fields::{Action, LOG_HEADER};

/// Writes the log's first line, [`LOG_HEADER`].
pub(crate) fn write_header(out: &mut impl Write) -> io::Result<()> {
    out.write_all(LOG_HEADER.as_bytes())?;
    out.write_all(b"\n")
}

/// The raw fields of one line, formatted later ([`LineFormatter::line`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Record {
    /// What the logging adaptor's clock read: nanoseconds since the Unix epoch, or counter
    /// ticks that its writer turns into them. [`LineFormatter::line`] is given the time.
    pub(crate) stamp: u64,
    thread: u64,
    action: Action,
    ptr: u64,
    bytes: usize,
    stream: u64,
}

impl Record {
    /// A line's fields, in the columns' order: `Thread,Time,Action,Pointer,Size,Stream`.
    pub(crate) fn new(
        thread: u64,
        stamp: u64,
        action: Action,
        ptr: u64,
        bytes: usize,
        stream: u64,
    ) -> Self {
        Record {
            stamp,
            thread,
            action,
            ptr,
            bytes,
            stream,
        }
    }
}

/// The longest line: a 20-digit thread id, the time (15), the longest action (16), two
/// 18-character hexadecimal numbers, a 20-digit size, five commas and the newline.
pub(crate) const MAX_LINE: usize = 20 + 15 + 16 + 18 + 20 + 18 + 6;

/// Formats records as lines of RMM's log: the bytes the `Display` types below print
/// (`TimeOfDay`, `CPointer`, `StreamHandle`), written by hand because `write!` costs several
/// times as much and the writer thread must keep up with the callers. The thread, the stream
/// and the second of the day repeat from line to line, so the last of each is kept formatted.
#[derive(Default)]
pub(crate) struct LineFormatter {
    thread: Cached,
    stream: Cached,
    /// The last second of the day and its `HH:MM:SS.`.
    second: Option<(u64, [u8; 9])>,
}

/// A number and its text, kept for the next line.
#[derive(Default)]
struct Cached {
    key: Option<u64>,
    text: Digits,
}

impl Cached {
    #[inline(always)]
    fn get(&mut self, key: u64, format: impl FnOnce(u64) -> Digits) -> &Digits {
        if self.key != Some(key) {
            self.key = Some(key);
            self.text = format(key);
        }
        &self.text
    }
}

/// Up to 20 ASCII bytes (a `u64` in decimal, or `0x` and 16 hex digits), left-aligned, so
/// that a line copies all 20 (a fixed-size move) and advances by `len`.
#[derive(Clone, Copy, Default)]
struct Digits {
    buf: [u8; 20],
    len: usize,
}

/// "00" to "99".
const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
                            2021222324252627282930313233343536373839\
                            4041424344454647484950515253545556575859\
                            6061626364656667686970717273747576777879\
                            8081828384858687888990919293949596979899";

impl Digits {
    fn decimal(mut n: u64) -> Self {
        let mut d = Digits {
            buf: [0; 20],
            len: n.checked_ilog10().unwrap_or(0) as usize + 1,
        };
        let mut end = d.len;
        while n >= 100 {
            let pair = (n % 100) as usize * 2;
            n /= 100;
            end -= 2;
            d.buf[end..end + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        }
        if n >= 10 {
            let pair = n as usize * 2;
            d.buf[..2].copy_from_slice(&PAIRS[pair..pair + 2]);
        } else {
            d.buf[0] = b'0' + n as u8;
        }
        d
    }

    /// `0x` and lowercase hex without leading zeros, or `zero` for 0. All sixteen digits are
    /// made at once in a `u128`, a byte each, instead of a nibble per loop.
    fn hex_or(n: u64, zero: &[u8]) -> Self {
        let mut d = Digits::default();
        if n == 0 {
            d.len = zero.len();
            d.buf[..d.len].copy_from_slice(zero);
            return d;
        }
        const ONES: u128 = u128::from_ne_bytes([1; 16]);
        // Nibble k of `n` to byte k of `x`.
        let mut x = u128::from(n);
        x = (x | (x << 32)) & 0x0000_0000_ffff_ffff_0000_0000_ffff_ffff;
        x = (x | (x << 16)) & 0x0000_ffff_0000_ffff_0000_ffff_0000_ffff;
        x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff_00ff_00ff_00ff_00ff;
        x = (x | (x << 4)) & (ONES * 0x0f);
        // '0' + nibble, and 'a' - '0' - 10 more where the nibble is 10 or more.
        let letters = ((x + ONES * 6) >> 4) & ONES;
        let ascii = x + ONES * u128::from(b'0') + letters * u128::from(b'a' - b'0' - 10);
        let digits = 16 - n.leading_zeros() as usize / 4;
        // The significant digits first, most significant leading.
        let text = (ascii << (8 * (16 - digits))).to_be_bytes();
        d.buf[..2].copy_from_slice(b"0x");
        d.buf[2..18].copy_from_slice(&text);
        d.len = 2 + digits;
        d
    }
}

/// A line under construction: `MAX_LINE` plus room for one whole `Digits` copied past its end.
struct Line {
    buf: [u8; MAX_LINE + 20],
    len: usize,
}

impl Line {
    #[inline(always)]
    fn digits(&mut self, d: &Digits) {
        self.buf[self.len..self.len + 20].copy_from_slice(&d.buf);
        self.len += d.len;
    }

    #[inline(always)]
    fn byte(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }

    #[inline(always)]
    fn bytes<const N: usize>(&mut self, b: &[u8; N]) {
        self.buf[self.len..self.len + N].copy_from_slice(b);
        self.len += N;
    }
}

impl LineFormatter {
    /// Appends `record`'s line to `out`, at `unix_nanos` (nanoseconds since the Unix epoch:
    /// what the record's stamp stands for).
    pub(crate) fn line(&mut self, out: &mut Vec<u8>, record: &Record, unix_nanos: u64) {
        let mut line = Line {
            buf: [0; MAX_LINE + 20],
            len: 0,
        };
        line.digits(self.thread.get(record.thread, Digits::decimal));
        line.byte(b',');
        let secs = unix_nanos / 1_000_000_000;
        let hms = match self.second {
            Some((second, text)) if second == secs => text,
            _ => {
                let of_day = secs % 86_400;
                let mut text = *b"00:00:00.";
                for (at, n) in [(0, of_day / 3600), (3, of_day / 60 % 60), (6, of_day % 60)] {
                    text[at] = b'0' + (n / 10) as u8;
                    text[at + 1] = b'0' + (n % 10) as u8;
                }
                self.second = Some((secs, text));
                text
            }
        };
        line.bytes(&hms);
        let micros = (unix_nanos % 1_000_000_000 / 1000) as usize;
        for pair in [micros / 10_000, micros / 100 % 100, micros % 100] {
            line.bytes(&[PAIRS[pair * 2], PAIRS[pair * 2 + 1]]);
        }
        line.byte(b',');
        // The action: one of three, at most 16 bytes.
        let action = record.action.as_str().as_bytes();
        line.buf[line.len..line.len + action.len()].copy_from_slice(action);
        line.len += action.len();
        line.byte(b',');
        line.digits(&Digits::hex_or(record.ptr, b"(nil)"));
        line.byte(b',');
        line.digits(&Digits::decimal(record.bytes as u64));
        line.byte(b',');
        line.digits(self.stream.get(record.stream, |h| Digits::hex_or(h, b"0")));
        line.byte(b'\n');
        out.extend_from_slice(&line.buf[..line.len]);
    }
}

/// `HH:MM:SS.ffffff` of a time in UTC (spdlog's `%H:%M:%S.%f`): the reference the formatter
/// is tested against.
#[cfg(test)]
pub(crate) struct TimeOfDay(pub(crate) SystemTime);

#[cfg(test)]
impl fmt::Display for TimeOfDay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let since = self.0.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs() % 86_400;
        write!(
            f,
            "{:02}:{:02}:{:02}.{:06}",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            since.subsec_micros()
        )
    }
}

#[cfg(test)]
/// A pointer as glibc's `printf("%p")` prints it: `(nil)` or `0x` and lowercase hex.
pub(crate) struct CPointer(pub(crate) u64);

#[cfg(test)]
impl fmt::Display for CPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        hex_or(f, self.0, "(nil)")
    }
}

#[cfg(test)]
/// `0x` and lowercase hex, or `zero` for 0: how C and C++ print a null pointer differs.
fn hex_or(f: &mut fmt::Formatter<'_>, value: u64, zero: &str) -> fmt::Result {
    match value {
        0 => f.write_str(zero),
        v => write!(f, "{v:#x}"),
    }
}

#[cfg(test)]
/// A stream handle as libstdc++'s `ostream << std::hex << (void*)` prints it (RMM's
/// `format_stream`): `0` for the null handle (no `0x` for zero), else `0x` and lowercase hex.
pub(crate) struct StreamHandle(pub(crate) u64);

#[cfg(test)]
impl fmt::Display for StreamHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        hex_or(f, self.0, "0")
    }
}

#[cfg(test)]
mod tests;
