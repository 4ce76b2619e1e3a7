//! The lock-free part of the tracking adaptor's records: a fixed table of buckets, each a few
//! slots keyed by address, written with one compare-and-swap per insertion and one per removal.
//!
//! An address hashes to one bucket and lives in any of its slots; a lookup reads the bucket's
//! keys (one cache line) and never probes further, so a removal simply empties its slot (no
//! tombstones, no chains to repair). An insertion finding its bucket full says so and the
//! adaptor keeps that record in its locked overflow instead.
//!
//! A slot's key says who owns it: [`EMPTY`], [`BUSY`] (one thread is writing or removing the
//! record, and only it touches the slot's fields) or the address of a complete record. Claiming
//! a slot is the compare-and-swap `EMPTY → BUSY` (insertion) or `address → BUSY` (removal); the
//! owner releases it with a plain store of the address or of `EMPTY`. Readers that own nothing
//! (the snapshots) read a slot under its seqlock `version`, odd while an insertion writes the
//! fields, so a record they report is one that some insertion wrote whole: never the key of
//! one and the size of another. The loom models in `loom_tests` check these claims.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::sync::{fence, AtomicU32, AtomicU64};

/// Slots per bucket: their keys fill half a 64-byte line, and an insertion reads them all.
/// (Two under loom, to keep the models small.)
#[cfg(not(loom))]
pub(super) const SLOTS: usize = 4;
#[cfg(loom)]
pub(super) const SLOTS: usize = 2;

/// A key: the slot holds no record.
const EMPTY: u64 = 0;
/// A key: a thread owns the slot while it writes or removes its record.
const BUSY: u64 = u64::MAX;

/// Whether the table can hold a record at `addr`: every address but the two that mark a slot's
/// state (an upstream that returns `u64::MAX` has its records in the overflow).
#[inline]
pub(super) fn holds(addr: u64) -> bool {
    addr != EMPTY && addr != BUSY
}

/// What [`Table::insert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Insert {
    /// The record is in the table.
    Done,
    /// The address is outstanding already; nothing changed.
    Present,
    /// Every slot of the address's bucket is taken; nothing changed.
    Full,
}

/// A record's fields as the table keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) addr: u64,
    pub(super) bytes: u64,
    pub(super) stream: u64,
}

#[repr(C, align(64))]
struct Bucket {
    /// The slots' keys, read together by every lookup.
    keys: [AtomicU64; SLOTS],
    /// Per slot: bumped to odd by an insertion before it writes the slot's fields, to even
    /// after: a reader that saw the same even value before and after reading them read one
    /// record.
    versions: [AtomicU32; SLOTS],
    /// How many records of addresses that hash here the adaptor keeps in its overflow
    /// (changed under the overflow's lock): while 0, a lookup needs no lock.
    overflowed: AtomicU32,
    fields: [Fields; SLOTS],
}

struct Fields {
    bytes: AtomicU64,
    stream: AtomicU64,
}

impl Bucket {
    fn new() -> Self {
        Bucket {
            keys: std::array::from_fn(|_| AtomicU64::new(EMPTY)),
            versions: std::array::from_fn(|_| AtomicU32::new(0)),
            overflowed: AtomicU32::new(0),
            fields: std::array::from_fn(|_| Fields {
                bytes: AtomicU64::new(0),
                stream: AtomicU64::new(0),
            }),
        }
    }
}

/// `buckets × SLOTS` records at most; insertions beyond a full bucket are refused.
pub(super) struct Table {
    buckets: Box<[Bucket]>,
}

impl Table {
    /// A table of `buckets` buckets (at least one).
    pub(super) fn new(buckets: usize) -> Self {
        Table {
            buckets: (0..buckets.max(1)).map(|_| Bucket::new()).collect(),
        }
    }

    /// How many records it can hold at most.
    #[cfg(all(test, not(loom)))]
    pub(super) fn capacity(&self) -> usize {
        self.buckets.len() * SLOTS
    }

    /// `addr`'s bucket: the high bits of a multiplicative hash, scaled to the bucket count
    /// (the low bits of a device pointer are zero).
    #[inline]
    fn bucket(&self, addr: u64) -> &Bucket {
        let hash = addr.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let index = (u128::from(hash) * self.buckets.len() as u128) >> 64;
        &self.buckets[index as usize]
    }

    /// The count of `addr`'s bucket's records that the adaptor keeps in its overflow.
    #[inline]
    pub(super) fn overflowed(&self, addr: u64) -> &AtomicU32 {
        &self.bucket(addr).overflowed
    }

    /// Records `bytes` on `stream` at `addr`, unless `addr` is outstanding already or its
    /// bucket is full. `addr` must satisfy [`holds`].
    #[inline]
    pub(super) fn insert(&self, addr: u64, bytes: u64, stream: u64) -> Insert {
        debug_assert!(holds(addr));
        let bucket = self.bucket(addr);
        // The whole bucket first (a record of `addr` in any slot is a duplicate), as masks:
        // independent compares rather than a chain of branches.
        let mut present = false;
        let mut empty = 0u32;
        for (i, key) in bucket.keys.iter().enumerate() {
            let k = key.load(Relaxed);
            present |= k == addr;
            empty |= u32::from(k == EMPTY) << i;
        }
        if present {
            return Insert::Present;
        }
        while empty != 0 {
            let i = empty.trailing_zeros() as usize;
            empty &= empty - 1;
            let (key, version, fields) = (&bucket.keys[i], &bucket.versions[i], &bucket.fields[i]);
            // Acquire: the previous owner's reads and writes of the slot come before ours.
            if key.compare_exchange(EMPTY, BUSY, Acquire, Relaxed).is_ok() {
                let v = version.load(Relaxed);
                version.store(v.wrapping_add(1), Relaxed);
                // The odd version is visible to any reader that sees a field written below.
                fence(Release);
                fields.bytes.store(bytes, Relaxed);
                fields.stream.store(stream, Relaxed);
                version.store(v.wrapping_add(2), Release);
                // Release: whoever reads the key (the removal) sees the fields.
                key.store(addr, Release);
                return Insert::Done;
            }
        }
        Insert::Full
    }

    /// Removes the record at `addr` and returns it, if the table has one.
    #[inline]
    pub(super) fn remove(&self, addr: u64) -> Option<Entry> {
        if !holds(addr) {
            return None;
        }
        let bucket = self.bucket(addr);
        for (key, fields) in bucket.keys.iter().zip(&bucket.fields) {
            // Acquire: pairs with the insertion's release of the key, so the fields are its.
            if key.load(Relaxed) == addr
                && key.compare_exchange(addr, BUSY, Acquire, Relaxed).is_ok()
            {
                let entry = Entry {
                    addr,
                    bytes: fields.bytes.load(Relaxed),
                    stream: fields.stream.load(Relaxed),
                };
                // Release: our reads come before the next owner's writes.
                key.store(EMPTY, Release);
                return Some(entry);
            }
        }
        None
    }

    /// Calls `f` with every record, each as it was at some moment during the call: a slot
    /// that changes while it is read counts as empty (it was, in between).
    pub(super) fn for_each(&self, mut f: impl FnMut(Entry)) {
        for bucket in self.buckets.iter() {
            for ((key, version), fields) in
                bucket.keys.iter().zip(&bucket.versions).zip(&bucket.fields)
            {
                let before = version.load(Acquire);
                let addr = key.load(Acquire);
                if before % 2 == 1 || !holds(addr) {
                    continue;
                }
                let bytes = fields.bytes.load(Relaxed);
                let stream = fields.stream.load(Relaxed);
                // A field written by a later insertion makes its odd version visible here.
                fence(Acquire);
                if version.load(Relaxed) == before {
                    f(Entry {
                        addr,
                        bytes,
                        stream,
                    });
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_and_a_full_bucket() {
        let table = Table::new(1);
        assert_eq!(table.capacity(), SLOTS);
        for i in 1..=SLOTS as u64 {
            assert_eq!(table.insert(i * 256, i, 7), Insert::Done);
        }
        assert_eq!(table.insert(256, 9, 7), Insert::Present);
        assert_eq!(table.insert(0x9900, 1, 7), Insert::Full);
        let mut seen = Vec::new();
        table.for_each(|e| seen.push((e.addr, e.bytes)));
        seen.sort_unstable();
        let expected: Vec<_> = (1..=SLOTS as u64).map(|i| (i * 256, i)).collect();
        assert_eq!(seen, expected);
        let e = table.remove(3 * 256).unwrap();
        assert_eq!((e.bytes, e.stream), (3, 7));
        assert_eq!(table.remove(3 * 256), None);
        assert_eq!(table.remove(0), None);
        assert_eq!(table.remove(u64::MAX), None);
        // The freed slot takes the next record.
        assert_eq!(table.insert(0x9900, 1, 8), Insert::Done);
        assert_eq!(table.remove(0x9900).map(|e| e.stream), Some(8));
    }

    #[test]
    fn a_bucket_is_two_cache_lines() {
        assert_eq!(std::mem::size_of::<Bucket>(), 128);
    }

    #[test]
    fn only_the_state_markers_are_refused() {
        assert!(!holds(0));
        assert!(!holds(u64::MAX));
        assert!(holds(1));
        assert!(holds(u64::MAX - 1));
    }
}
