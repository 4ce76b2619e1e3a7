//! The allocator cores of the arena resource: [`StreamArena`] (one stream's superblocks, cut
//! into blocks by address-ordered first fit) and [`GlobalArena`] (the arena's pages, lent out as
//! superblocks or handed out whole for large requests).
//!
//! Both are plain single-threaded data structures over *addresses and sizes*: they know nothing
//! of CUDA, streams or events. What must happen on a stream before memory may be reused is an
//! opaque *fence* `F` that the cores carry along and hand back; the public wrapper turns fences
//! into event waits, puts each core behind its own lock, and decides when superblocks move.
//! All metadata lives in host memory, keyed by address (device memory is not host-writable).
//!
//! # Granularity
//! Blocks are multiples of [`ALIGN`] (256 bytes). The global arena counts in *pages* of
//! [`PAGE_SIZE`] (64 KiB): a superblock is at least [`SUPERBLOCK_PAGES`] pages (1 MiB, RMM's
//! `superblock::minimum_size`) and a large request takes whole pages. The wrapper converts
//! pages to addresses.
//!
//! # Address-ordered first fit in O(log n)
//! Free blocks (and the global arena's free page ranges) live in a [`FitTree`]: a B+tree by
//! address whose inner nodes know the largest free size below each child. First fit — the free block
//! with the lowest address that is large enough, RMM's and jemalloc's policy against
//! fragmentation — is one walk down the tree; a block is carved from the *head* of the block
//! found, so the remainder keeps its place in the tree. A free finds its free neighbours with
//! one more walk and merges with them, unless they lie across a superblock boundary: blocks
//! never merge across superblocks, so that a wholly free superblock is a whole range that can go
//! back to the global arena. RMM's arena scans its superblocks and their free lists linearly.
//!
//! # Frees on other streams: pending blocks
//! A block freed on the arena's own stream is reusable at once. A block freed on another stream
//! T (the memory was handed over) is *pending*: it keeps T's fence and is not reused until the
//! wrapper has made the arena's stream wait for T ([`StreamArena::reclaim_pending`]), or its
//! superblock goes back to the global arena with the fence attached.
//!
//! # Fences in the global arena
//! Every free page range carries the fences of every stream that freed memory into it (a
//! superblock brings its arena's stream and the fences of its pending blocks; a large block
//! the stream that freed it). Ranges coalesce whatever their fences, which are merged, so
//! memory freed on several streams still forms one large range; whoever takes pages waits on
//! the range's fences first.

mod tree;

use rustc_hash::FxHashMap;

use self::tree::{FitTree, Pos};
pub(crate) use crate::resource::size::{
    align_to_size_class, align_up, largest_size_class_within, ALIGN,
};

/// The smallest superblock: RMM's `superblock::minimum_size`, 1 MiB. Requests above it are
/// served by the global arena directly.
pub(crate) const SUPERBLOCK_SIZE: usize = 1 << 20;
/// The global arena's unit: 64 KiB.
pub(crate) const PAGE_SIZE: usize = 64 << 10;
/// Pages in the smallest superblock.
pub(crate) const SUPERBLOCK_PAGES: u64 = (SUPERBLOCK_SIZE / PAGE_SIZE) as u64;
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

/// One stream's arena: superblocks lent by the global arena, cut into blocks by
/// address-ordered first fit. See the [module documentation](self).
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
        let counted: usize = self
            .superblocks()
            .iter()
            .map(|&(b, s)| pieces.range(b..b + s).count())
            .sum();
        assert_eq!(counted, pieces.len(), "blocks outside the superblocks");
    }
}

/// Adds each of `from` to `into` unless it is there already.
fn merge_fences<F: PartialEq>(into: &mut Vec<F>, from: impl IntoIterator<Item = F>) {
    for f in from {
        if !into.contains(&f) {
            into.push(f);
        }
    }
}

/// What the global arena hands out: a superblock lent to a stream arena, or a large block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    Superblock,
    Large,
}

/// Pages the global arena can hand out, found by [`GlobalArena::find`]: valid until the arena
/// changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    pos: Pos,
    /// The first page.
    pub(crate) start: u64,
    /// How many pages would be taken.
    pub(crate) pages: u64,
    pub(crate) what: Use,
}

/// The global arena: the arena's pages, free ones in address-ordered ranges that carry the
/// fences of the streams that freed them. See the [module documentation](self).
pub(crate) struct GlobalArena<F> {
    pages: u64,
    /// Free page ranges, coalesced: no two are adjacent.
    free: FitTree<Vec<F>>,
    /// First page → pages, of every large block handed out.
    large: FxHashMap<u64, u64>,
    free_pages: u64,
    large_pages: u64,
    /// Pages lent to stream arenas as superblocks.
    lent_pages: u64,
}

impl<F> std::fmt::Debug for GlobalArena<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalArena")
            .field("pages", &self.pages)
            .field("free_pages", &self.free_pages)
            .field("large_pages", &self.large_pages)
            .field("lent_pages", &self.lent_pages)
            .finish()
    }
}

impl<F: Clone + PartialEq> GlobalArena<F> {
    /// An arena of `pages` free pages (at least one superblock), to be waited on with
    /// `fences` before first use.
    ///
    /// # Panics
    /// When `pages` is below [`SUPERBLOCK_PAGES`].
    pub(crate) fn new(pages: u64, fences: Vec<F>) -> Self {
        assert!(
            pages >= SUPERBLOCK_PAGES,
            "an arena holds at least one superblock"
        );
        let mut free = FitTree::new();
        let mut initial = Vec::new();
        merge_fences(&mut initial, fences);
        free.insert(0, pages, initial);
        GlobalArena {
            pages,
            free,
            large: FxHashMap::default(),
            free_pages: pages,
            large_pages: 0,
            lent_pages: 0,
        }
    }

    /// The lowest free pages that serve `what`: a superblock of [`SUPERBLOCK_PAGES`] (the
    /// whole range when the rest would be smaller than a superblock, as RMM does), or a large
    /// block of exactly `pages`.
    pub(crate) fn find(&self, what: Use, pages: u64) -> Option<Candidate> {
        let want = match what {
            Use::Superblock => SUPERBLOCK_PAGES,
            Use::Large => pages,
        };
        debug_assert!(want > 0);
        let pos = self.free.first_fit(want)?;
        let (start, size) = self.free.entry(pos);
        let pages = if what == Use::Superblock && size < want + SUPERBLOCK_PAGES {
            size
        } else {
            want
        };
        Some(Candidate {
            pos,
            start,
            pages,
            what,
        })
    }

    /// The fences of the range `c` lies in.
    pub(crate) fn fences(&self, c: &Candidate) -> &[F] {
        self.free.value(c.pos)
    }

    /// Hands out the pages of `c`, found by [`find`](Self::find) with no change since. The
    /// rest of the range keeps its fences.
    pub(crate) fn take(&mut self, c: Candidate) {
        let (start, size) = self.free.entry(c.pos);
        debug_assert_eq!(start, c.start, "stale candidate");
        if size == c.pages {
            self.free.remove(c.pos);
        } else {
            self.free.set(c.pos, c.start + c.pages, size - c.pages);
        }
        self.free_pages -= c.pages;
        match c.what {
            Use::Superblock => self.lent_pages += c.pages,
            Use::Large => {
                self.large.insert(c.start, c.pages);
                self.large_pages += c.pages;
            }
        }
    }

    /// Takes back the large block at page `start`, freed behind `fence`.
    ///
    /// # Panics
    /// When no large block starts there or it has another number of pages.
    pub(crate) fn free_large(&mut self, start: u64, pages: u64, fence: F) {
        let allocated = self.large.remove(&start).unwrap_or_else(|| {
            panic!("page {start} does not start a large block of this arena (double free?)")
        });
        assert_eq!(
            allocated, pages,
            "the large block at page {start} has {allocated} pages, freed as {pages}"
        );
        self.large_pages -= pages;
        self.insert_free(start, pages, vec![fence]);
    }

    /// Takes back a superblock from a stream arena, freed behind `fences`.
    pub(crate) fn return_superblock(&mut self, start: u64, pages: u64, fences: Vec<F>) {
        assert!(
            start + pages <= self.pages,
            "superblock pages {start}+{pages} outside the arena"
        );
        self.lent_pages -= pages;
        self.insert_free(start, pages, fences);
    }

    /// The arena's size in pages.
    pub(crate) fn pages(&self) -> u64 {
        self.pages
    }

    /// Free pages.
    pub(crate) fn free_pages(&self) -> u64 {
        self.free_pages
    }

    /// Pages of live large blocks.
    pub(crate) fn large_pages(&self) -> u64 {
        self.large_pages
    }

    /// The number of live large blocks.
    pub(crate) fn large_count(&self) -> usize {
        self.large.len()
    }

    /// Pages lent to stream arenas.
    pub(crate) fn lent_pages(&self) -> u64 {
        self.lent_pages
    }

    /// The longest free range, in pages. O(1).
    pub(crate) fn largest_free_pages(&self) -> u64 {
        self.free.max_size()
    }

    /// The free ranges as `(first page, pages, fences)`, in address order.
    pub(crate) fn free_ranges(&self) -> Vec<(u64, u64, &[F])> {
        self.free
            .iter()
            .map(|(start, pages, fences)| (start, pages, fences.as_slice()))
            .collect()
    }

    /// Adds the free range `[start, start + pages)` behind `fences`, merged with its free
    /// neighbours (whose fences it joins).
    fn insert_free(&mut self, start: u64, pages: u64, fences: Vec<F>) {
        let near = self.free.near(start);
        let end = start + pages;
        let below = near.below.filter(|&b| {
            let (k, n) = self.free.entry(b);
            k + n == start
        });
        let above = near.above.filter(|&a| self.free.entry(a).0 == end);
        match (below, above) {
            (Some(b), Some(a)) => {
                let (k, n) = self.free.entry(b);
                let merged = n + pages + self.free.entry(a).1;
                let above_fences = std::mem::take(self.free.value_mut(a));
                merge_fences(
                    self.free.value_mut(b),
                    above_fences.into_iter().chain(fences),
                );
                self.free.set(b, k, merged);
                self.free.remove(a);
            }
            (Some(b), None) => {
                let (k, n) = self.free.entry(b);
                merge_fences(self.free.value_mut(b), fences);
                self.free.set(b, k, n + pages);
            }
            (None, Some(a)) => {
                let merged = pages + self.free.entry(a).1;
                merge_fences(self.free.value_mut(a), fences);
                self.free.set(a, start, merged);
            }
            (None, None) => {
                let mut own = Vec::new();
                merge_fences(&mut own, fences);
                self.free.insert_at(near.at, start, pages, own);
            }
        }
        self.free_pages += pages;
    }

    /// Checks every invariant exhaustively; panics with a description of the first broken one.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.free.check();
        let mut at = None;
        let mut total = 0;
        let mut pieces = std::collections::BTreeMap::<u64, u64>::new();
        for (start, pages, fences) in self.free_ranges() {
            assert!(pages > 0);
            if let Some(end) = at {
                assert!(
                    end < start,
                    "free ranges at page {start} overlap or are not merged"
                );
            }
            at = Some(start + pages);
            total += pages;
            for (i, f) in fences.iter().enumerate() {
                assert!(!fences[..i].contains(f), "a fence twice at page {start}");
            }
            pieces.insert(start, pages);
        }
        assert_eq!(total, self.free_pages, "free pages");
        let large: u64 = self.large.values().sum();
        assert_eq!(large, self.large_pages, "large pages");
        for (&start, &pages) in &self.large {
            assert!(
                pieces.insert(start, pages).is_none(),
                "large block at free page {start}"
            );
        }
        let mut end = 0;
        for (&start, &pages) in &pieces {
            assert!(end <= start, "page {start} both free and in a large block");
            end = start + pages;
        }
        assert!(end <= self.pages, "pages past the arena");
        assert_eq!(
            self.free_pages + self.large_pages + self.lent_pages,
            self.pages,
            "pages lost"
        );
    }
}

#[cfg(test)]
mod tests;
