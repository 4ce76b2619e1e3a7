//! [`StreamArena`]: one stream's superblocks, cut into blocks by address-ordered first fit,
//! with the blocks other streams freed kept pending. See the [core's documentation](super).

use rustc_hash::FxHashMap;

use super::consts::SUPERBLOCK_SIZE;
use super::fences::merge_fences;
use super::tree::FitTree;
use crate::resource::contract::size::ALIGN;

/// A superblock a [`StreamArena`] gives back, wholly free, with the fences of everyone that
/// freed memory in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Released<F> {
    pub(crate) base: u64,
    pub(crate) size: u64,
    pub(crate) fences: Vec<F>,
}

/// A block freed on another stream than the arena's, not reusable until that stream's fence
/// has been waited on.
#[derive(Debug, Clone)]
struct Pending<F> {
    addr: u64,
    size: u64,
    fence: F,
}

/// What a block of a [`StreamArena`] is ([`StreamArena::pieces`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece<F> {
    /// Free, reusable by the arena's stream.
    Free,
    /// Allocated: by the arena's stream, or (`Some`) borrowed by the stream of that fence.
    Live(Option<F>),
    /// Freed behind the fence of another stream.
    Pending(F),
}

/// One stream's arena: superblocks lent by the global arena, cut into blocks by
/// address-ordered first fit. See the [core's documentation](super).
pub(crate) struct StreamArena<F> {
    /// The free blocks, by address. Each lies inside one superblock; no two free blocks of one
    /// superblock are adjacent (they are merged at once).
    free: FitTree<()>,
    /// Start → size of every allocated block.
    live: FxHashMap<u64, u64>,
    /// Base → size of every superblock. Free, live and pending blocks tile each exactly.
    superblocks: FxHashMap<u64, u64>,
    /// Blocks freed on other streams.
    pending: Vec<Pending<F>>,
    /// Start → the fence of the stream that borrowed it, of every live block another stream
    /// borrowed (so that a picture of the arena names the stream it was allocated on). Empty
    /// but for the last resort of an exhausted arena.
    borrowed: FxHashMap<u64, F>,
    superblock_bytes: u64,
    free_bytes: u64,
    live_bytes: u64,
    pending_bytes: u64,
}

impl<F> Default for StreamArena<F> {
    fn default() -> Self {
        StreamArena {
            free: FitTree::new(),
            live: FxHashMap::default(),
            superblocks: FxHashMap::default(),
            pending: Vec::new(),
            borrowed: FxHashMap::default(),
            superblock_bytes: 0,
            free_bytes: 0,
            live_bytes: 0,
            pending_bytes: 0,
        }
    }
}

impl<F> std::fmt::Debug for StreamArena<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamArena")
            .field("superblocks", &self.superblocks.len())
            .field("free_bytes", &self.free_bytes)
            .field("live_bytes", &self.live_bytes)
            .field("pending_bytes", &self.pending_bytes)
            .finish()
    }
}

impl<F: Clone + PartialEq> StreamArena<F> {
    /// Adds the superblock `[base, base + size)` as one free block.
    ///
    /// # Panics
    /// When it is not [`ALIGN`]-aligned, smaller than [`SUPERBLOCK_SIZE`] or a superblock of
    /// this arena starts there already.
    pub(crate) fn add_superblock(&mut self, base: u64, size: u64) {
        assert!(
            base % ALIGN as u64 == 0 && size % ALIGN as u64 == 0 && size >= SUPERBLOCK_SIZE as u64,
            "superblock {base:#x}+{size:#x} is not an aligned range of at least 1 MiB"
        );
        let previous = self.superblocks.insert(base, size);
        assert!(previous.is_none(), "superblock {base:#x} added twice");
        self.free.insert(base, size, ());
        self.superblock_bytes += size;
        self.free_bytes += size;
    }

    /// Allocates `size` bytes (a non-zero multiple of [`ALIGN`]) from the free block with the
    /// lowest address that holds them, carved from its head. `None` when no free block is
    /// large enough.
    pub(crate) fn allocate(&mut self, size: u64) -> Option<u64> {
        debug_assert!(
            size > 0 && size % ALIGN as u64 == 0,
            "unaligned size {size}"
        );
        let pos = self.free.first_fit(size)?;
        let (start, block) = self.free.entry(pos);
        if block == size {
            self.free.remove(pos);
        } else {
            self.free.set(pos, start + size, block - size);
        }
        let previous = self.live.insert(start, size);
        debug_assert!(previous.is_none(), "{start:#x} allocated twice");
        self.free_bytes -= size;
        self.live_bytes += size;
        Some(start)
    }

    /// Frees the block at `addr` on the arena's own stream: it merges with its free
    /// neighbours in the same superblock and is reusable at once.
    ///
    /// # Panics
    /// When `addr` is not a live block of this arena or was allocated with another size.
    pub(crate) fn free(&mut self, addr: u64, size: u64) {
        self.take_live(addr, size);
        self.insert_free(addr, size);
    }

    /// Frees the block at `addr` on another stream, whose `fence` must be waited on before the
    /// arena's stream reuses it.
    ///
    /// # Panics
    /// As [`free`](Self::free).
    pub(crate) fn free_pending(&mut self, addr: u64, size: u64, fence: F) {
        self.take_live(addr, size);
        self.pending.push(Pending { addr, size, fence });
        self.pending_bytes += size;
    }

    /// The distinct fences of the pending blocks.
    pub(crate) fn pending_fences(&self) -> Vec<F> {
        let mut fences = Vec::new();
        merge_fences(&mut fences, self.pending.iter().map(|p| p.fence.clone()));
        fences
    }

    /// The pending bytes behind each distinct fence.
    pub(crate) fn pending_by_fence(&self) -> Vec<(F, u64)> {
        let mut by: Vec<(F, u64)> = Vec::new();
        for p in &self.pending {
            match by.iter_mut().find(|(f, _)| *f == p.fence) {
                Some((_, bytes)) => *bytes += p.size,
                None => by.push((p.fence.clone(), p.size)),
            }
        }
        by
    }

    /// Makes every pending block free (the caller has waited on their fences).
    pub(crate) fn reclaim_pending(&mut self) {
        for p in std::mem::take(&mut self.pending) {
            self.pending_bytes -= p.size;
            self.insert_free(p.addr, p.size);
        }
    }

    /// Removes every superblock without a live block and returns them, each with `home` (the
    /// arena's stream) and the fences of its pending blocks. In address order.
    pub(crate) fn release_free_superblocks(&mut self, home: &F) -> Vec<Released<F>> {
        if self.free_bytes + self.pending_bytes < SUPERBLOCK_SIZE as u64 {
            // No superblock can be without live blocks: skip the walk over them (an awaited
            // request retries this on every free while it waits).
            return Vec::new();
        }
        let mut bases: Vec<(u64, u64)> = self.superblocks.iter().map(|(&b, &s)| (b, s)).collect();
        bases.sort_unstable();
        let index_of = |addr: u64| bases.partition_point(|&(b, _)| b <= addr) - 1;
        let mut busy = vec![false; bases.len()];
        for &addr in self.live.keys() {
            busy[index_of(addr)] = true;
        }
        let mut fences: Vec<Vec<F>> = vec![vec![home.clone()]; bases.len()];
        let mut kept = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            let i = index_of(p.addr);
            if busy[i] {
                kept.push(p);
            } else {
                self.pending_bytes -= p.size;
                merge_fences(&mut fences[i], [p.fence]);
            }
        }
        self.pending = kept;
        let mut released = Vec::new();
        for (i, (&(base, size), fences)) in bases.iter().zip(fences).enumerate() {
            if busy[i] {
                continue;
            }
            let end = base + size;
            let starts: Vec<u64> =
                std::iter::successors(self.free.lower_bound(base), |&p| self.free.next(p))
                    .map(|p| self.free.entry(p).0)
                    .take_while(|&start| start < end)
                    .collect();
            for start in starts {
                let pos = self.free.lower_bound(start).expect("listed above");
                self.free_bytes -= self.free.entry(pos).1;
                self.free.remove(pos);
            }
            self.superblocks.remove(&base);
            self.superblock_bytes -= size;
            released.push(Released { base, size, fences });
        }
        released
    }

    /// Notes that the live block at `addr` was borrowed by the stream of `fence`.
    pub(crate) fn mark_borrowed(&mut self, addr: u64, fence: F) {
        debug_assert!(self.live.contains_key(&addr), "{addr:#x} is not live");
        self.borrowed.insert(addr, fence);
    }

    /// The superblocks as `(base, size, holds a live block)`, in address order.
    pub(crate) fn superblock_uses(&self) -> Vec<(u64, u64, bool)> {
        let mut out: Vec<(u64, u64, bool)> = self
            .superblocks
            .iter()
            .map(|(&b, &s)| (b, s, false))
            .collect();
        out.sort_unstable();
        for &addr in self.live.keys() {
            let i = out.partition_point(|&(b, _, _)| b <= addr) - 1;
            out[i].2 = true;
        }
        out
    }

    /// Every block, free, live or pending, as `(start, size, what)`, in address order.
    pub(crate) fn pieces(&self) -> Vec<(u64, u64, Piece<F>)> {
        let mut out: Vec<(u64, u64, Piece<F>)> =
            self.free
                .iter()
                .map(|(start, n, _)| (start, n, Piece::Free))
                .chain(self.live.iter().map(|(&start, &n)| {
                    (start, n, Piece::Live(self.borrowed.get(&start).cloned()))
                }))
                .chain(
                    self.pending
                        .iter()
                        .map(|p| (p.addr, p.size, Piece::Pending(p.fence.clone()))),
                )
                .collect();
        out.sort_unstable_by_key(|&(start, _, _)| start);
        out
    }

    /// Whether `addr` is a live block of this arena.
    #[cfg(test)]
    pub(crate) fn is_live(&self, addr: u64) -> bool {
        self.live.contains_key(&addr)
    }

    /// The number of superblocks.
    pub(crate) fn superblock_count(&self) -> usize {
        self.superblocks.len()
    }

    /// The superblocks as `(base, size)`, in address order.
    #[cfg(test)]
    pub(crate) fn superblocks(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<_> = self.superblocks.iter().map(|(&b, &s)| (b, s)).collect();
        out.sort_unstable();
        out
    }

    /// The total size of the superblocks.
    pub(crate) fn superblock_bytes(&self) -> u64 {
        self.superblock_bytes
    }

    /// The total size of the free blocks (pending ones not included).
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Whether a block of `size` bytes allocated here starts at `addr` and is live.
    pub(crate) fn is_live_with(&self, addr: u64, size: u64) -> bool {
        self.live.get(&addr) == Some(&size)
    }

    /// The total size of the live blocks.
    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// The total size of the pending blocks.
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// The number of live blocks.
    pub(crate) fn live_count(&self) -> usize {
        self.live.len()
    }

    /// The number of free blocks.
    pub(crate) fn free_block_count(&self) -> usize {
        self.free.len()
    }

    /// The size of the largest free block; 0 when there is none. O(1).
    pub(crate) fn largest_free(&self) -> u64 {
        self.free.max_size()
    }

    // ---- internals ----

    fn take_live(&mut self, addr: u64, size: u64) {
        let allocated = self
            .live
            .remove(&addr)
            .unwrap_or_else(|| panic!("{addr:#x} is not allocated from this arena (double free?)"));
        assert_eq!(
            allocated, size,
            "{addr:#x} was allocated with {allocated} bytes, freed with {size}"
        );
        self.live_bytes -= size;
        if !self.borrowed.is_empty() {
            self.borrowed.remove(&addr);
        }
    }

    /// Adds `[addr, addr + size)` to the free blocks, merged with its free neighbours unless a
    /// superblock boundary lies between them.
    fn insert_free(&mut self, addr: u64, size: u64) {
        let near = self.free.near(addr);
        let end = addr + size;
        let below = near.below.filter(|&b| {
            let (start, n) = self.free.entry(b);
            start + n == addr && !self.superblocks.contains_key(&addr)
        });
        let above = near
            .above
            .filter(|&a| self.free.entry(a).0 == end && !self.superblocks.contains_key(&end));
        match (below, above) {
            (Some(b), Some(a)) => {
                let (start, n) = self.free.entry(b);
                let merged = n + size + self.free.entry(a).1;
                self.free.set(b, start, merged);
                self.free.remove(a);
            }
            (Some(b), None) => {
                let (start, n) = self.free.entry(b);
                self.free.set(b, start, n + size);
            }
            (None, Some(a)) => {
                let merged = size + self.free.entry(a).1;
                self.free.set(a, addr, merged);
            }
            (None, None) => self.free.insert_at(near.at, addr, size, ()),
        }
        self.free_bytes += size;
    }

    /// The free blocks as `(start, size)`, in address order.
    #[cfg(test)]
    pub(crate) fn free_blocks(&self) -> Vec<(u64, u64)> {
        self.free.iter().map(|(start, n, _)| (start, n)).collect()
    }

    /// Checks every invariant exhaustively; panics with a description of the first broken one.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.free.check();
        // Every superblock is tiled exactly by its free, live and pending blocks.
        let mut pieces = std::collections::BTreeMap::<u64, (u64, char)>::new();
        let mut add = |start: u64, size: u64, kind: char| {
            assert!(
                start % ALIGN as u64 == 0 && size % ALIGN as u64 == 0 && size > 0,
                "{kind} {start:#x}+{size:#x} unaligned"
            );
            assert!(
                pieces.insert(start, (size, kind)).is_none(),
                "{kind} {start:#x} twice"
            );
        };
        for (start, size) in self.free_blocks() {
            add(start, size, 'f');
        }
        for (&start, &size) in &self.live {
            add(start, size, 'l');
        }
        for p in &self.pending {
            add(p.addr, p.size, 'p');
        }
        let mut sizes = (0, 0, 0);
        for (base, size) in self.superblocks() {
            let end = base + size;
            let mut at = base;
            let mut last = ' ';
            for (&start, &(n, kind)) in pieces.range(base..end) {
                assert_eq!(
                    start, at,
                    "gap or overlap at {start:#x} in superblock {base:#x}"
                );
                assert!(
                    !(kind == 'f' && last == 'f'),
                    "free blocks at {start:#x} not merged"
                );
                match kind {
                    'f' => sizes.0 += n,
                    'l' => sizes.1 += n,
                    _ => sizes.2 += n,
                }
                at = start + n;
                last = kind;
            }
            assert_eq!(at, end, "superblock {base:#x} not tiled to its end");
        }
        assert_eq!(
            sizes,
            (self.free_bytes, self.live_bytes, self.pending_bytes),
            "byte counters"
        );
        assert_eq!(
            self.free_bytes + self.live_bytes + self.pending_bytes,
            self.superblock_bytes,
            "bytes lost"
        );
        for addr in self.borrowed.keys() {
            assert!(
                self.live.contains_key(addr),
                "borrowed {addr:#x} is not live"
            );
        }
        let counted: usize = self
            .superblocks()
            .iter()
            .map(|&(b, s)| pieces.range(b..b + s).count())
            .sum();
        assert_eq!(counted, pieces.len(), "blocks outside the superblocks");
    }
}
