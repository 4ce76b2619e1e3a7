//! A small streaming pickle encoder: just what PyTorch's memory snapshot needs (dicts, lists,
//! tuples, strings, integers of any width, floats, booleans, `None`).
//!
//! The opcodes are those that both Python's `pickle` and memory_viz's own JavaScript
//! unpickler read (protocol 4 without frames; no `BINUNICODE8`, `LONG4` or `BINBYTES`):
//! the viewer rejects anything else. Lists and dicts are written in batches of
//! [`BATCH`] items between a `MARK` and an `APPENDS`/`SETITEMS`, as Python's pickler does, so
//! that no reader has to hold a whole long list on its stack (the viewer spreads a batch into
//! one call's arguments, which JavaScript engines limit).

use std::collections::HashMap;
use std::io::{self, Write};

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const BINFLOAT: u8 = b'G';
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const APPENDS: u8 = b'e';
const EMPTY_DICT: u8 = b'}';
const SETITEMS: u8 = b'u';
const MARK: u8 = b'(';
const EMPTY_TUPLE: u8 = b')';
const TUPLE: u8 = b't';
const TUPLE1: u8 = 0x85;
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// Items per `MARK` … `APPENDS`/`SETITEMS` batch (Python's own batch size).
pub(crate) const BATCH: usize = 1000;

/// Writes one pickled object to `out`: [`new`](Pickler::new), one value, [`finish`](Pickler::finish).
pub(crate) struct Pickler<W: Write> {
    out: W,
    /// Strings written once and fetched from the memo after: the dict keys and the few
    /// fixed values (states, actions) that repeat in every segment, block and event.
    names: HashMap<&'static str, u32>,
    /// Other memoized objects, by a key their writer gives ([`Pickler::memoized`]).
    objects: HashMap<Box<str>, u32>,
    /// Memo slots used.
    memo_len: u32,
    /// How many [`memoized`](Pickler::memoized) writers are running: inside one, names are
    /// written out, not fetched from the memo.
    inside_memoized: u32,
}

impl<W: Write> Pickler<W> {
    /// Starts the pickle (protocol 4).
    pub(crate) fn new(mut out: W) -> io::Result<Self> {
        out.write_all(&[PROTO, 4])?;
        Ok(Pickler {
            out,
            names: HashMap::new(),
            objects: HashMap::new(),
            memo_len: 0,
            inside_memoized: 0,
        })
    }

    /// Ends the pickle and hands the writer back.
    pub(crate) fn finish(mut self) -> io::Result<W> {
        self.out.write_all(&[STOP])?;
        Ok(self.out)
    }

    pub(crate) fn none(&mut self) -> io::Result<()> {
        self.out.write_all(&[NONE])
    }

    pub(crate) fn bool(&mut self, v: bool) -> io::Result<()> {
        self.out.write_all(&[if v { NEWTRUE } else { NEWFALSE }])
    }

    /// An integer: the shortest of Python's encodings, `LONG1` (little-endian two's
    /// complement) past 32 bits, so 64-bit addresses and sizes come back exact.
    pub(crate) fn int(&mut self, v: i128) -> io::Result<()> {
        if (0..=0xff).contains(&v) {
            self.out.write_all(&[BININT1, v as u8])
        } else if (0..=0xffff).contains(&v) {
            self.out.write_all(&[BININT2])?;
            self.out.write_all(&(v as u16).to_le_bytes())
        } else if let Ok(v) = i32::try_from(v) {
            self.out.write_all(&[BININT])?;
            self.out.write_all(&v.to_le_bytes())
        } else {
            let bytes = v.to_le_bytes();
            let mut n = bytes.len();
            // Drop sign-extension bytes: a top byte that only repeats the sign of the one below.
            while n > 1
                && ((bytes[n - 1] == 0 && bytes[n - 2] & 0x80 == 0)
                    || (bytes[n - 1] == 0xff && bytes[n - 2] & 0x80 != 0))
            {
                n -= 1;
            }
            self.out.write_all(&[LONG1, n as u8])?;
            self.out.write_all(&bytes[..n])
        }
    }

    pub(crate) fn uint(&mut self, v: u64) -> io::Result<()> {
        self.int(i128::from(v))
    }

    /// A float. (No key of the format holds one today; PyTorch's newer ones may.)
    #[allow(dead_code)]
    pub(crate) fn float(&mut self, v: f64) -> io::Result<()> {
        self.out.write_all(&[BINFLOAT])?;
        self.out.write_all(&v.to_be_bytes())
    }

    /// A string (UTF-8). One over 4 GiB cannot be written with the opcodes the viewer reads:
    /// an `InvalidInput` error.
    pub(crate) fn str(&mut self, s: &str) -> io::Result<()> {
        if let Ok(n) = u8::try_from(s.len()) {
            self.out.write_all(&[SHORT_BINUNICODE, n])?;
        } else {
            let n = u32::try_from(s.len()).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a string of {} bytes is too long to pickle", s.len()),
                )
            })?;
            self.out.write_all(&[BINUNICODE])?;
            self.out.write_all(&n.to_le_bytes())?;
        }
        self.out.write_all(s.as_bytes())
    }

    /// A string that repeats (a key, a state's name): written once, fetched from the memo after.
    pub(crate) fn name(&mut self, s: &'static str) -> io::Result<()> {
        if self.inside_memoized > 0 {
            // A memoized object holds no references into the memo: a reader that counts
            // references (serde-pickle) visits the object's contents once per reference to it,
            // more often than the stream names them, and runs out of a shared name.
            return self.str(s);
        }
        if let Some(&i) = self.names.get(s) {
            return self.get(i);
        }
        self.str(s)?;
        if let Some(i) = self.put()? {
            self.names.insert(s, i);
        }
        Ok(())
    }

    /// An object that `key` identifies, which `write` writes the first time; later ones fetch
    /// it from the memo (the frames of allocation sites: the same few repeat in every block).
    /// The reader gets one shared object.
    pub(crate) fn memoized(
        &mut self,
        key: &str,
        write: impl FnOnce(&mut Self) -> io::Result<()>,
    ) -> io::Result<()> {
        if let Some(&i) = self.objects.get(key) {
            return self.get(i);
        }
        self.inside_memoized += 1;
        let written = write(self);
        self.inside_memoized -= 1;
        written?;
        if let Some(i) = self.put()? {
            self.objects.insert(key.into(), i);
        }
        Ok(())
    }

    /// Stores the object on top of the stack in the next memo slot, and returns the slot.
    fn put(&mut self) -> io::Result<Option<u32>> {
        let i = self.memo_len;
        let Some(next) = i.checked_add(1) else {
            return Ok(None); // memo full: later copies are written out again
        };
        self.memo_len = next;
        match u8::try_from(i) {
            Ok(i) => self.out.write_all(&[BINPUT, i])?,
            Err(_) => {
                self.out.write_all(&[LONG_BINPUT])?;
                self.out.write_all(&i.to_le_bytes())?;
            }
        }
        Ok(Some(i))
    }

    fn get(&mut self, i: u32) -> io::Result<()> {
        match u8::try_from(i) {
            Ok(i) => self.out.write_all(&[BINGET, i]),
            Err(_) => {
                self.out.write_all(&[LONG_BINGET])?;
                self.out.write_all(&i.to_le_bytes())
            }
        }
    }

    /// A tuple of integers (PyTorch's `segment_pool_id` is a pair).
    pub(crate) fn int_tuple(&mut self, items: &[i128]) -> io::Result<()> {
        match items.len() {
            0 => self.out.write_all(&[EMPTY_TUPLE]),
            1..=3 => {
                for &v in items {
                    self.int(v)?;
                }
                self.out.write_all(&[TUPLE1 + items.len() as u8 - 1])
            }
            _ => {
                self.out.write_all(&[MARK])?;
                for &v in items {
                    self.int(v)?;
                }
                self.out.write_all(&[TUPLE])
            }
        }
    }

    /// A list whose items `each` writes, one call per item.
    pub(crate) fn list<T>(
        &mut self,
        items: impl IntoIterator<Item = T>,
        mut each: impl FnMut(&mut Self, T) -> io::Result<()>,
    ) -> io::Result<()> {
        self.out.write_all(&[EMPTY_LIST])?;
        let mut n = 0usize;
        for item in items {
            if n % BATCH == 0 {
                if n > 0 {
                    self.out.write_all(&[APPENDS])?;
                }
                self.out.write_all(&[MARK])?;
            }
            each(self, item)?;
            n += 1;
        }
        if n > 0 {
            self.out.write_all(&[APPENDS])?;
        }
        Ok(())
    }

    /// A dict with string keys; `entries` writes them through [`Dict::entry`].
    pub(crate) fn dict(
        &mut self,
        entries: impl FnOnce(&mut Dict<'_, W>) -> io::Result<()>,
    ) -> io::Result<()> {
        self.out.write_all(&[EMPTY_DICT])?;
        let mut dict = Dict { p: self, n: 0 };
        entries(&mut dict)?;
        if dict.n > 0 {
            dict.p.out.write_all(&[SETITEMS])?;
        }
        Ok(())
    }
}

/// The dict being written by [`Pickler::dict`].
pub(crate) struct Dict<'p, W: Write> {
    p: &'p mut Pickler<W>,
    n: usize,
}

impl<W: Write> Dict<'_, W> {
    /// One entry: the key, then the value `value` writes.
    pub(crate) fn entry(
        &mut self,
        key: &'static str,
        value: impl FnOnce(&mut Pickler<W>) -> io::Result<()>,
    ) -> io::Result<()> {
        if self.n % BATCH == 0 {
            if self.n > 0 {
                self.p.out.write_all(&[SETITEMS])?;
            }
            self.p.out.write_all(&[MARK])?;
        }
        self.p.name(key)?;
        value(self.p)?;
        self.n += 1;
        Ok(())
    }
}

/// The opcodes memory_viz's JavaScript unpickler reads, with the bytes of argument each takes
/// (`None`: a length-prefixed argument). Tests check that every pickle written uses only these.
#[cfg(test)]
pub(crate) fn viewer_opcode(op: u8) -> Option<Option<usize>> {
    Some(match op {
        PROTO | BININT1 | BINPUT | BINGET => Some(1),
        BININT2 => Some(2),
        BININT | LONG_BINPUT | LONG_BINGET => Some(4),
        BINFLOAT => Some(8),
        STOP | NONE | NEWTRUE | NEWFALSE | EMPTY_LIST | APPENDS | EMPTY_DICT | SETITEMS | MARK
        | EMPTY_TUPLE | TUPLE | TUPLE1 | 0x86 | 0x87 => Some(0),
        LONG1 | SHORT_BINUNICODE | BINUNICODE => None,
        _ => return None,
    })
}

/// Walks `bytes` opcode by opcode and returns the first the viewer cannot read, with its
/// offset, or `None`; panics on a truncated pickle.
#[cfg(test)]
pub(crate) fn first_foreign_opcode(bytes: &[u8]) -> Option<(usize, u8)> {
    let mut i = 0;
    while i < bytes.len() {
        let op = bytes[i];
        let Some(arg) = viewer_opcode(op) else {
            return Some((i, op));
        };
        let arg = match arg {
            Some(n) => n,
            None if op == BINUNICODE => {
                4 + u32::from_le_bytes(bytes[i + 1..i + 5].try_into().unwrap()) as usize
            }
            None => 1 + bytes[i + 1] as usize,
        };
        if op == STOP {
            assert_eq!(i + 1, bytes.len(), "bytes after STOP");
            return None;
        }
        i += 1 + arg;
    }
    panic!("no STOP");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pickled(f: impl FnOnce(&mut Pickler<Vec<u8>>) -> io::Result<()>) -> Vec<u8> {
        let mut p = Pickler::new(Vec::new()).unwrap();
        f(&mut p).unwrap();
        p.finish().unwrap()
    }

    #[test]
    fn integers_take_the_shortest_encoding_and_64_bit_ones_stay_exact() {
        assert_eq!(pickled(|p| p.int(7)), [PROTO, 4, BININT1, 7, STOP]);
        assert_eq!(
            pickled(|p| p.float(1.5)),
            [PROTO, 4, BINFLOAT, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, STOP]
        );
        assert_eq!(
            pickled(|p| p.int(0x1234)),
            [PROTO, 4, BININT2, 0x34, 0x12, STOP]
        );
        assert_eq!(
            pickled(|p| p.int(-1)),
            [PROTO, 4, BININT, 0xff, 0xff, 0xff, 0xff, STOP]
        );
        // 2^31 needs a fifth byte so that its top bit is not read as a sign.
        assert_eq!(
            pickled(|p| p.int(1 << 31)),
            [PROTO, 4, LONG1, 5, 0, 0, 0, 0x80, 0, STOP]
        );
        let mut max = vec![PROTO, 4, LONG1, 9];
        max.extend([0xff; 8]);
        max.extend([0, STOP]);
        assert_eq!(pickled(|p| p.uint(u64::MAX)), max);
        assert_eq!(
            pickled(|p| p.int(i128::from(i64::MIN))),
            [PROTO, 4, LONG1, 8, 0, 0, 0, 0, 0, 0, 0, 0x80, STOP]
        );
    }

    /// A memoized dict fetched several times, after its keys were used elsewhere, reads back
    /// whole in serde-pickle, which visits a shared object's contents once per reference: its
    /// keys are written out, not fetched from the memo (fetched, the second visit failed with
    /// `Recursive`, as the stripped GPU test binary's repeated `<unknown>` frames showed).
    #[test]
    fn a_memoized_object_read_several_times_reads_whole_each_time() {
        let bytes = pickled(|p| {
            p.list(0..4, |p, _| {
                p.dict(|d| d.entry("name", |p| p.int(1)))?;
                p.memoized("frame", |p| p.dict(|d| d.entry("name", |p| p.int(7))))
            })
        });
        let v = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).unwrap();
        let serde_pickle::Value::List(items) = v else {
            panic!("{v:?}")
        };
        assert_eq!(items.len(), 8);
        for (i, item) in items.iter().enumerate() {
            let serde_pickle::Value::Dict(d) = item else {
                panic!("{item:?}")
            };
            let want = if i % 2 == 0 { 1 } else { 7 };
            let key = serde_pickle::HashableValue::String("name".into());
            assert_eq!(d.get(&key), Some(&serde_pickle::Value::I64(want)), "{i}");
        }
    }

    #[test]
    fn repeated_names_come_from_the_memo() {
        let bytes = pickled(|p| p.list(0..3, |p, _| p.name("ab")));
        assert_eq!(
            bytes,
            [
                PROTO,
                4,
                EMPTY_LIST,
                MARK,
                SHORT_BINUNICODE,
                2,
                b'a',
                b'b',
                BINPUT,
                0,
                BINGET,
                0,
                BINGET,
                0,
                APPENDS,
                STOP
            ]
        );
    }

    #[test]
    fn memoized_objects_are_written_once_and_slots_past_255_take_four_bytes() {
        let keys: Vec<String> = (0..300).map(|i| i.to_string()).collect();
        let bytes = pickled(|p| {
            p.list(keys.iter().chain(&keys), |p, k| {
                p.memoized(k, |p| p.int(k.parse::<i128>().unwrap() << 40))
            })
        });
        assert_eq!(first_foreign_opcode(&bytes), None);
        let count = |op: u8, arg: &[u8]| {
            bytes
                .windows(1 + arg.len())
                .filter(|w| w[0] == op && &w[1..] == arg)
                .count()
        };
        assert_eq!(count(BINGET, &[0]), 1);
        assert_eq!(count(LONG_BINPUT, &299u32.to_le_bytes()), 1);
        assert_eq!(count(LONG_BINGET, &299u32.to_le_bytes()), 1);
    }

    #[test]
    fn long_lists_are_written_in_batches() {
        // Zeros, so that no item's bytes look like a MARK or an APPENDS.
        let bytes = pickled(|p| p.list(0..(2 * BATCH + 1), |p, _| p.int(0)));
        assert_eq!(bytes.iter().filter(|&&b| b == MARK).count(), 3);
        assert_eq!(bytes.iter().filter(|&&b| b == APPENDS).count(), 3);
        assert_eq!(bytes.len(), 2 + 1 + 3 * 2 + (2 * BATCH + 1) * 2 + 1);
        assert_eq!(
            pickled(|p| p.list(0..0, |p, i: i32| p.int(i.into()))),
            [PROTO, 4, EMPTY_LIST, STOP]
        );
    }

    #[test]
    fn strings_past_255_bytes_take_a_four_byte_length() {
        let s = "é".repeat(200); // 400 bytes
        let bytes = pickled(|p| p.str(&s));
        assert_eq!(first_foreign_opcode(&bytes), None);
        assert_eq!(&bytes[2..7], &[BINUNICODE, 0x90, 0x01, 0, 0]);
        assert_eq!(&bytes[7..bytes.len() - 1], s.as_bytes());
    }
}
