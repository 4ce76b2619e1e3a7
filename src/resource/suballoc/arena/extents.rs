//! The memory an arena holds from its upstream: [`Extents`], one upstream allocation each,
//! mapped to the global arena's page numbers.
//!
//! An arena of a given size holds one extent, taken at construction, for its whole life (RMM's
//! arena), found without a lock. A growing arena ([`ArenaConfig::growth_step`]) takes an extent
//! when its global arena cannot serve a request and gives wholly free extents back before it
//! grows again (and on [`trim`](super::ArenaResource::trim)); those sit behind a read-write
//! lock. Each extent's pages follow the previous extent's with one page between that is never
//! held, so that free ranges of two extents — whose addresses need not touch — never merge.
//!
//! A growing arena numbers its extents in two areas: extents taken for superblocks (small
//! requests) below [`LARGE_AREA`], extents taken for large requests from it on. Superblocks are
//! taken only from the first area, so small long-lived blocks never pin an extent that a large
//! short-lived block brought, which can then go back to the upstream whole.
//!
//! [`ArenaConfig::growth_step`]: super::ArenaConfig::growth_step

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use parking_lot::RwLock;

use super::core::consts::PAGE_SIZE;

/// The owner recorded for a page in the global arena (free or part of a large block), in
/// [`Extents`]' page owners.
pub(super) const GLOBAL: u32 = u32::MAX;

/// The first page of a growing arena's large-request area.
pub(super) const LARGE_AREA: u64 = 1 << 40;

/// One upstream allocation of the arena.
pub(super) struct Extent {
    /// Its address and size (a multiple of [`PAGE_SIZE`]).
    pub(super) base: u64,
    pub(super) bytes: usize,
    /// The global arena's number for its first page.
    pub(super) first_page: u64,
    /// Page → the slot of the stream arena it is lent to, or [`GLOBAL`].
    pub(super) owners: Box<[AtomicU32]>,
}

impl Extent {
    pub(super) fn new(base: u64, bytes: usize, first_page: u64) -> Self {
        debug_assert_eq!(bytes % PAGE_SIZE, 0);
        Extent {
            base,
            bytes,
            first_page,
            owners: (0..bytes / PAGE_SIZE)
                .map(|_| AtomicU32::new(GLOBAL))
                .collect(),
        }
    }

    pub(super) fn pages(&self) -> u64 {
        (self.bytes / PAGE_SIZE) as u64
    }

    pub(super) fn contains_addr(&self, addr: u64) -> bool {
        addr.wrapping_sub(self.base) < self.bytes as u64
    }

    pub(super) fn contains_page(&self, page: u64) -> bool {
        page.wrapping_sub(self.first_page) < self.pages()
    }

    /// The global page of `addr`, which lies in this extent.
    pub(super) fn page_of(&self, addr: u64) -> u64 {
        self.first_page + (addr - self.base) / PAGE_SIZE as u64
    }

    /// The address of global page `page`, which lies in this extent.
    pub(super) fn page_addr(&self, page: u64) -> u64 {
        self.base + (page - self.first_page) * PAGE_SIZE as u64
    }

    /// The owner entry of `page`, which lies in this extent.
    pub(super) fn owner(&self, page: u64) -> &AtomicU32 {
        &self.owners[(page - self.first_page) as usize]
    }
}

/// The extents of a growing arena, by address and by first page.
#[derive(Default)]
pub(super) struct Grown {
    by_addr: BTreeMap<u64, Arc<Extent>>,
    by_page: BTreeMap<u64, Arc<Extent>>,
    /// The bytes of every extent.
    held: usize,
    /// The first page of the next extent in the superblock area and in the large area.
    next: [u64; 2],
}

/// What an arena holds: one extent for life, or extents that come and go.
pub(super) enum Extents {
    Fixed(Extent),
    Growing(RwLock<Grown>),
}

impl Extents {
    /// Runs `f` on the extent that holds `addr`, if any.
    pub(super) fn by_addr<T>(&self, addr: u64, f: impl FnOnce(&Extent) -> T) -> Option<T> {
        self.holding(addr, Extent::contains_addr, |g| &g.by_addr, f)
    }

    /// Runs `f` on the extent that holds global page `page`, if any.
    pub(super) fn by_page<T>(&self, page: u64, f: impl FnOnce(&Extent) -> T) -> Option<T> {
        self.holding(page, Extent::contains_page, |g| &g.by_page, f)
    }

    /// Runs `f` on the extent that `holds` `key` (an address or a page): in a growing arena the
    /// last one that starts at or below `key` in `index`, the only one that can hold it.
    fn holding<T>(
        &self,
        key: u64,
        holds: fn(&Extent, u64) -> bool,
        index: fn(&Grown) -> &BTreeMap<u64, Arc<Extent>>,
        f: impl FnOnce(&Extent) -> T,
    ) -> Option<T> {
        match self {
            Extents::Fixed(e) => holds(e, key).then(|| f(e)),
            Extents::Growing(g) => {
                let g = g.read();
                let (_, e) = index(&g).range(..=key).next_back()?;
                holds(e, key).then(|| f(e))
            }
        }
    }

    /// The bytes held from the upstream.
    pub(super) fn held(&self) -> usize {
        match self {
            Extents::Fixed(e) => e.bytes,
            Extents::Growing(g) => g.read().held,
        }
    }

    /// `(base, bytes, first page, pages)` of every extent.
    pub(super) fn list(&self) -> Vec<(u64, usize, u64, u64)> {
        match self {
            Extents::Fixed(e) => vec![(e.base, e.bytes, e.first_page, e.pages())],
            Extents::Growing(g) => g
                .read()
                .by_page
                .values()
                .map(|e| (e.base, e.bytes, e.first_page, e.pages()))
                .collect(),
        }
    }

    /// Adds the upstream allocation `[base, base + bytes)` to a growing arena, in the large
    /// area when `large`; returns its first page.
    ///
    /// # Panics
    /// On an arena of a fixed size.
    pub(super) fn add(&self, base: u64, bytes: usize, large: bool) -> u64 {
        let Extents::Growing(g) = self else {
            unreachable!("an arena of a fixed size does not grow")
        };
        let mut g = g.write();
        let area = usize::from(large);
        let first = g.next[area].max(area as u64 * LARGE_AREA);
        let e = Arc::new(Extent::new(base, bytes, first));
        // One page between extents that is never held.
        g.next[area] = first + e.pages() + 1;
        debug_assert!(large || g.next[area] < LARGE_AREA);
        g.held += e.bytes;
        g.by_addr.insert(e.base, e.clone());
        g.by_page.insert(e.first_page, e);
        first
    }

    /// Removes the extent whose first page is `first_page` from a growing arena.
    pub(super) fn remove(&self, first_page: u64) {
        if let Extents::Growing(g) = self {
            let mut g = g.write();
            if let Some(e) = g.by_page.remove(&first_page) {
                g.by_addr.remove(&e.base);
                g.held -= e.bytes;
            }
        }
    }
}
