//! [`GlobalArena`]: the arena's pages, lent out as superblocks or handed out whole for large
//! requests, free ranges carrying the fences of the streams that freed them. See the [core's
//! documentation](super).

use rustc_hash::FxHashMap;

use super::consts::SUPERBLOCK_PAGES;
use super::fences::merge_fences;
use super::tree::{FitTree, Pos};

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
/// fences of the streams that freed them. See the [core's documentation](super).
pub(crate) struct GlobalArena<F> {
    /// Pages held: free, lent or large.
    pages: u64,
    /// One past the highest page ever held. A growing arena's extents are separated by a page
    /// that is never held, so free ranges of two extents never merge.
    end: u64,
    /// Free page ranges, coalesced: no two are adjacent.
    free: FitTree<Vec<F>>,
    /// First page → (pages, the caller's tag: the wrapper's allocating stream), of every large
    /// block handed out.
    large: FxHashMap<u64, (u64, u64)>,
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
            end: pages,
            free,
            large: FxHashMap::default(),
            free_pages: pages,
            large_pages: 0,
            lent_pages: 0,
        }
    }

    /// An arena that holds no pages yet and grows with [`add_range`](Self::add_range).
    pub(crate) fn empty() -> Self {
        GlobalArena {
            pages: 0,
            end: 0,
            free: FitTree::new(),
            large: FxHashMap::default(),
            free_pages: 0,
            large_pages: 0,
            lent_pages: 0,
        }
    }

    /// Adds the free pages `[start, start + pages)`, to be waited on with `fences` before
    /// first use. They must not touch any page held (at least one page between), so that they
    /// never merge with another range's pages.
    ///
    /// # Panics
    /// When the range is empty or touches held pages.
    pub(crate) fn add_range(&mut self, start: u64, pages: u64, fences: Vec<F>) {
        assert!(pages > 0, "an empty range");
        let near = self.free.near(start);
        let apart_below = near.below.is_none_or(|b| {
            let (k, n) = self.free.entry(b);
            k + n < start
        });
        let apart_above = near
            .above
            .is_none_or(|a| self.free.entry(a).0 > start + pages);
        assert!(
            apart_below && apart_above,
            "pages {start}+{pages} touch the arena's free pages"
        );
        let mut own = Vec::new();
        merge_fences(&mut own, fences);
        self.free.insert_at(near.at, start, pages, own);
        self.pages += pages;
        self.free_pages += pages;
        self.end = self.end.max(start + pages);
    }

    /// Removes the free range `[start, start + pages)` if it is free as a whole (and not part
    /// of a larger free range); returns its fences, which the caller waits on before giving the
    /// memory away.
    pub(crate) fn remove_free_range(&mut self, start: u64, pages: u64) -> Option<Vec<F>> {
        let pos = self.free.lower_bound(start)?;
        if self.free.entry(pos) != (start, pages) {
            return None;
        }
        let fences = self.free.remove(pos);
        self.pages -= pages;
        self.free_pages -= pages;
        Some(fences)
    }

    /// The lowest free pages that serve `what`: a superblock of [`SUPERBLOCK_PAGES`] (the
    /// whole range when the rest would be smaller than a superblock, as RMM does), or a large
    /// block of exactly `pages`.
    pub(crate) fn find(&self, what: Use, pages: u64) -> Option<Candidate> {
        self.find_below(what, pages, u64::MAX)
    }

    /// [`find`](Self::find) among the free ranges that start below page `limit` only.
    pub(crate) fn find_below(&self, what: Use, pages: u64, limit: u64) -> Option<Candidate> {
        let want = match what {
            Use::Superblock => SUPERBLOCK_PAGES,
            Use::Large => pages,
        };
        debug_assert!(want > 0);
        let pos = self.free.first_fit(want)?;
        let (start, size) = self.free.entry(pos);
        if start >= limit {
            return None;
        }
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

    /// Hands out the pages of `c`, found by [`find`](Self::find) with no change since, a large
    /// block with `tag` (kept for [`large_blocks`](Self::large_blocks)). The rest of the range
    /// keeps its fences.
    pub(crate) fn take(&mut self, c: Candidate, tag: u64) {
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
                self.large.insert(c.start, (c.pages, tag));
                self.large_pages += c.pages;
            }
        }
    }

    /// Whether a large block of `pages` pages starts at page `start`.
    pub(crate) fn is_large(&self, start: u64, pages: u64) -> bool {
        self.large.get(&start).is_some_and(|&(n, _)| n == pages)
    }

    /// Takes back the large block at page `start`, freed behind `fence`.
    ///
    /// # Panics
    /// When no large block starts there or it has another number of pages.
    pub(crate) fn free_large(&mut self, start: u64, pages: u64, fence: F) {
        let (allocated, _) = self.large.remove(&start).unwrap_or_else(|| {
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
            start + pages <= self.end,
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

    /// The large blocks as `(first page, pages, tag)`, in no order.
    pub(crate) fn large_blocks(&self) -> Vec<(u64, u64, u64)> {
        self.large.iter().map(|(&s, &(n, t))| (s, n, t)).collect()
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
        let large: u64 = self.large.values().map(|&(n, _)| n).sum();
        assert_eq!(large, self.large_pages, "large pages");
        for (&start, &(pages, _)) in &self.large {
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
        assert!(end <= self.end, "pages past the arena");
        assert_eq!(
            self.free_pages + self.large_pages + self.lent_pages,
            self.pages,
            "pages lost"
        );
    }
}
