//! The mapped pool's allocator core: an address-ordered, coalescing free list over offsets of
//! one range, with lowest-address first fit.
//!
//! It knows nothing of CUDA or of mapping: the range is a span of offsets, and each free block
//! carries the *owners* whose frees it holds (the streams, as small integers, that must be
//! waited for before another stream uses it). Lowest-address first fit keeps the used memory
//! packed at the bottom of the range, which is what lets the pool map only the bottom and
//! give back the rest: free space left at the top never strands a large request, it just
//! grows.
//!
//! Free blocks are indexed twice: by address (coalescing, lookups) and by size class (a
//! quarter of a power of two, TLSF's split), each class address-ordered, with a bitmap of the
//! classes that have blocks. A request of class `c` is served by the lowest-addressed block
//! among the first block of every class above `c` (all of which fit) and the first fitting
//! block of class `c` below that address, looking at no more than [`SCAN`] blocks of class
//! `c`: O(log n) per operation, and exact first fit unless class `c` holds more than `SCAN`
//! too-small blocks below the candidate. With no candidate from a larger class, the whole of
//! class `c` is scanned, so a block that fits is always found.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

/// A stream that freed memory into a block, as a small integer the pool maps to the stream.
pub(crate) type Owner = u32;

/// How many blocks of the request's own size class a search looks at.
const SCAN: usize = 32;

/// Size classes: four per power of two, for lengths up to 2^64.
const CLASSES: usize = 256;

/// The owners of a free block, sorted and without repeats (almost always one or none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Owners(Vec<Owner>);

impl Owners {
    /// The owners of memory just freed by `owner`.
    pub(crate) fn one(owner: Owner) -> Self {
        Owners(vec![owner])
    }

    /// Adds every owner of `other`.
    pub(crate) fn join(&mut self, other: &Owners) {
        for &o in &other.0 {
            if let Err(i) = self.0.binary_search(&o) {
                self.0.insert(i, o);
            }
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = Owner> + '_ {
        self.0.iter().copied()
    }
}

#[derive(Debug)]
struct Free {
    len: u64,
    owners: Owners,
}

/// Why a free was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadFree {
    /// No live allocation starts there (a double free or a foreign pointer).
    Unknown,
    /// An allocation starts there, of this other length.
    WrongSize(u64),
}

/// The free list. Invariants (checked by `check` in tests): free blocks never overlap or
/// touch (touching ones are merged), every block is in exactly the size class of its length,
/// `free_bytes` is their sum, and no live allocation overlaps a free block.
#[derive(Debug)]
pub(crate) struct FreeList {
    /// Free blocks by start offset.
    blocks: BTreeMap<u64, Free>,
    /// Start offsets of the free blocks of each size class.
    classes: Vec<BTreeSet<u64>>,
    /// Bit `k` set when class `k` has a block.
    nonempty: [u64; CLASSES / 64],
    free_bytes: u64,
    /// Live allocations: start to length.
    /// Live allocations: start to length and the owner they were allocated for.
    live: FxHashMap<u64, (u64, Owner)>,
    live_bytes: u64,
}

/// The size class of a length (> 0): the power of two below it, split in four.
fn class_of(len: u64) -> usize {
    debug_assert!(len > 0);
    let log = 63 - len.leading_zeros() as usize;
    let sub = if log >= 2 {
        ((len >> (log - 2)) & 3) as usize
    } else {
        0
    };
    log * 4 + sub
}

impl FreeList {
    /// A list whose range `0..len` is all free, owned by no one.
    pub(crate) fn new(len: u64) -> Self {
        let mut list = FreeList {
            blocks: BTreeMap::new(),
            classes: (0..CLASSES).map(|_| BTreeSet::new()).collect(),
            nonempty: [0; CLASSES / 64],
            free_bytes: 0,
            live: FxHashMap::default(),
            live_bytes: 0,
        };
        if len > 0 {
            list.insert(0, len, Owners::default());
        }
        list
    }

    fn insert(&mut self, start: u64, len: u64, owners: Owners) {
        let c = class_of(len);
        self.classes[c].insert(start);
        self.nonempty[c / 64] |= 1 << (c % 64);
        self.free_bytes += len;
        self.blocks.insert(start, Free { len, owners });
    }

    fn remove(&mut self, start: u64) -> Free {
        let block = self
            .blocks
            .remove(&start)
            .expect("a free block starts there");
        let c = class_of(block.len);
        self.classes[c].remove(&start);
        if self.classes[c].is_empty() {
            self.nonempty[c / 64] &= !(1 << (c % 64));
        }
        self.free_bytes -= block.len;
        block
    }

    /// The classes above `c` that have blocks, in increasing order.
    fn classes_above(&self, c: usize) -> impl Iterator<Item = usize> + '_ {
        // Word by word, each word's set bits lowest first: a few instructions per class
        // that has blocks, none for the empty ones.
        let first = c + 1;
        (first / 64..CLASSES / 64).flat_map(move |w| {
            let mut bits = self.nonempty[w];
            if w == first / 64 {
                bits &= u64::MAX.checked_shl((first % 64) as u32).unwrap_or(0);
            }
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let k = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    w * 64 + k
                })
            })
        })
    }

    /// The start of the lowest free block of at least `size` bytes (> 0), as described in the
    /// module docs; `None` when no block is that large.
    pub(crate) fn find(&self, size: u64) -> Option<u64> {
        let c = class_of(size);
        let best = self.ends_above(c, BTreeSet::first).min();
        self.probe(size, best, self.classes[c].iter(), |start, b| start > b)
    }

    /// The start of the highest free block of at least `size` bytes (> 0): [`find`](Self::find)
    /// from the other end of the range (the last block of every larger class, and up to
    /// [`SCAN`] blocks of the request's own class from the top, or all of them when no larger
    /// class has one). A pool that puts small blocks at the top of its range and large ones at
    /// the bottom keeps long-lived small blocks from pinning the pages between large ones.
    pub(crate) fn find_high(&self, size: u64) -> Option<u64> {
        let c = class_of(size);
        let best = self.ends_above(c, BTreeSet::last).max();
        self.probe(size, best, self.classes[c].iter().rev(), |start, b| {
            start < b
        })
    }

    /// The block at one `end` (first or last) of every class above `c` that has blocks.
    fn ends_above(
        &self,
        c: usize,
        end: fn(&BTreeSet<u64>) -> Option<&u64>,
    ) -> impl Iterator<Item = u64> + '_ {
        self.classes_above(c)
            .map(move |k| *end(&self.classes[k]).expect("a non-empty class"))
    }

    /// The first of `starts` (the request's own class, walked from the wanted end) whose block
    /// holds `size` bytes, before one lies `past` the `best` block of a larger class; else
    /// `best`. With a larger block in hand, a few probes for a nearer one; without one, the
    /// whole class, so that `None` means no block is that large (a near-full pool must not
    /// refuse a request a block in this class fits).
    fn probe<'a>(
        &self,
        size: u64,
        best: Option<u64>,
        starts: impl Iterator<Item = &'a u64>,
        past: impl Fn(u64, u64) -> bool,
    ) -> Option<u64> {
        let probes = if best.is_some() { SCAN } else { usize::MAX };
        for &start in starts.take(probes) {
            if best.is_some_and(|b| past(start, b)) {
                break;
            }
            if self.blocks[&start].len >= size {
                return Some(start);
            }
        }
        best
    }

    /// Allocates the last `size` bytes of the free block that starts at `start` (one
    /// [`find_high`](Self::find_high) returned) for `owner`; the rest stays free with the same
    /// owners. Returns where the allocation starts and the block's owners.
    pub(crate) fn allocate_tail_for(
        &mut self,
        start: u64,
        size: u64,
        owner: Owner,
    ) -> (u64, Owners) {
        let block = self.remove(start);
        assert!(
            size > 0 && size <= block.len,
            "allocate_tail_for({start}, {size}) from a free block of {}",
            block.len
        );
        let at = start + block.len - size;
        if size < block.len {
            self.insert(start, block.len - size, block.owners.clone());
        }
        self.live.insert(at, (size, owner));
        self.live_bytes += size;
        (at, block.owners)
    }

    /// The free block that contains offset `at`: its start, length and owners.
    pub(crate) fn block_containing(&self, at: u64) -> Option<(u64, u64, &Owners)> {
        let (&start, block) = self.blocks.range(..=at).next_back()?;
        (at < start + block.len).then_some((start, block.len, &block.owners))
    }

    /// Allocates `size` bytes at the start of the free block that starts at `start` (one
    /// [`find`](Self::find) returned); the rest of the block stays free with the same owners.
    /// Returns the block's owners, whose frees the caller must order after.
    #[cfg(test)]
    pub(crate) fn allocate_at(&mut self, start: u64, size: u64) -> Owners {
        self.allocate_for(start, size, 0)
    }

    /// [`allocate_at`](Self::allocate_at) for `owner`, whom a snapshot names as the stream
    /// the allocation was made on.
    pub(crate) fn allocate_for(&mut self, start: u64, size: u64, owner: Owner) -> Owners {
        let block = self.remove(start);
        assert!(
            size > 0 && size <= block.len,
            "allocate_at({start}, {size}) from a free block of {}",
            block.len
        );
        if size < block.len {
            self.insert(start + size, block.len - size, block.owners.clone());
        }
        self.live.insert(start, (size, owner));
        self.live_bytes += size;
        block.owners
    }

    /// Frees the allocation at `start` of `size` bytes for `owner`, merging it with the free
    /// blocks it touches (their owners joined). Returns the merged block's start and end.
    pub(crate) fn free(
        &mut self,
        start: u64,
        size: u64,
        owner: Owner,
    ) -> Result<(u64, u64), BadFree> {
        match self.live.get(&start) {
            Some(&(len, _)) if len == size => {}
            Some(&(len, _)) => return Err(BadFree::WrongSize(len)),
            None => return Err(BadFree::Unknown),
        }
        self.live.remove(&start);
        self.live_bytes -= size;
        let mut lo = start;
        let mut hi = start + size;
        let mut owners = Owners::one(owner);
        if let Some((&prev, block)) = self.blocks.range(..start).next_back() {
            if prev + block.len == start {
                let block = self.remove(prev);
                owners.join(&block.owners);
                lo = prev;
            }
        }
        if self.blocks.contains_key(&hi) {
            let block = self.remove(hi);
            owners.join(&block.owners);
            hi += block.len;
        }
        self.insert(lo, hi - lo, owners);
        Ok((lo, hi))
    }

    /// Bytes free.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// How many free blocks there are.
    pub(crate) fn free_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The largest free block's length (0 when none).
    pub(crate) fn largest_free(&self) -> u64 {
        let top = (0..CLASSES)
            .rev()
            .find(|&k| self.nonempty[k / 64] & (1 << (k % 64)) != 0);
        top.map_or(0, |k| {
            self.classes[k]
                .iter()
                .map(|s| self.blocks[s].len)
                .max()
                .unwrap_or(0)
        })
    }

    /// Live allocations.
    pub(crate) fn live_allocations(&self) -> usize {
        self.live.len()
    }

    /// Bytes of the live allocations.
    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// The live allocations, in no order: start, length, the owner they were made for.
    pub(crate) fn live(&self) -> impl Iterator<Item = (u64, u64, Owner)> + '_ {
        self.live.iter().map(|(&s, &(len, o))| (s, len, o))
    }

    /// The free blocks, in address order: start, length, owners.
    pub(crate) fn blocks(&self) -> impl Iterator<Item = (u64, u64, &Owners)> + '_ {
        self.blocks.iter().map(|(&s, b)| (s, b.len, &b.owners))
    }

    /// Panics if an invariant does not hold (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut end = None;
        let mut sum = 0;
        for (&start, block) in &self.blocks {
            assert!(block.len > 0);
            if let Some(e) = end {
                assert!(
                    start > e,
                    "free blocks at {start} touch or overlap the one before"
                );
            }
            end = Some(start + block.len);
            sum += block.len;
            assert!(self.classes[class_of(block.len)].contains(&start));
        }
        assert_eq!(sum, self.free_bytes);
        let indexed: usize = self.classes.iter().map(BTreeSet::len).sum();
        assert_eq!(indexed, self.blocks.len());
        for (&start, &(len, _)) in &self.live {
            if let Some((s, l, _)) = self.block_containing(start) {
                panic!("live {start}+{len} inside free {s}+{l}");
            }
            if let Some((&s, _)) = self.blocks.range(start..start + len).next() {
                panic!("free block at {s} inside live {start}+{len}");
            }
        }
    }
}

#[cfg(test)]
mod tests;
