//! Random operation sequences on the arena resource's cores (`src/resource/suballoc/arena/core*`): a
//! global arena of pages lending superblocks to stream arenas and handing out large blocks,
//! checked against a shadow model after every operation: live blocks never overlap, lie inside
//! a superblock of their stream arena, are 256-byte aligned; large blocks and lent superblocks
//! never overlap each other or a free range; free ranges are coalesced; every byte and page
//! counter equals the model's; a freed block is reusable at once; released superblocks carry
//! the home stream's fence and the fences of their pending blocks; after a full drain the
//! global arena is one free range again.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use streamalloc::fuzzing::{GlobalArena, StreamArena, ALIGN, ARENA_PAGE_SIZE, SUPERBLOCK_PAGES};

const STREAMS: usize = 3;
const PAGE: u64 = ARENA_PAGE_SIZE as u64;

#[derive(Arbitrary, Debug)]
enum Op {
    Grow {
        stream: u8,
    },
    Alloc {
        stream: u8,
        size: u32,
    },
    Free {
        pick: u16,
    },
    FreeReuse {
        pick: u16,
    },
    /// Freed on another stream (fence = that stream): pending until reclaimed.
    FreePending {
        pick: u16,
        fence: u8,
    },
    Reclaim {
        stream: u8,
    },
    Release {
        stream: u8,
    },
    AllocLarge {
        pages: u8,
        fence_check: bool,
    },
    FreeLarge {
        pick: u16,
        fence: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    superblocks: u8,
    ops: Vec<Op>,
    drain: bool,
}

#[derive(Default)]
struct Model {
    /// addr → (size, stream).
    live: BTreeMap<u64, (u64, usize)>,
    /// Per stream: superblock base → size; pending fences (of blocks freed elsewhere).
    superblocks: [BTreeMap<u64, u64>; STREAMS],
    pending: [u64; STREAMS],
    /// Per stream: pending block addr → (size, fence).
    pending_at: [BTreeMap<u64, (u64, u64)>; STREAMS],
    /// First page → pages.
    large: BTreeMap<u64, u64>,
}

impl Model {
    fn pick(&self, pick: u16) -> Option<(u64, u64, usize)> {
        let n = self.live.len();
        (n > 0).then(|| {
            let (&a, &(s, st)) = self.live.iter().nth(pick as usize % n).unwrap();
            (a, s, st)
        })
    }

    fn allocated(&mut self, addr: u64, size: u64, s: usize) {
        assert_eq!(addr % ALIGN as u64, 0);
        let (&b, &bs) = self.superblocks[s]
            .range(..=addr)
            .next_back()
            .expect("in a superblock");
        assert!(
            addr + size <= b + bs,
            "{addr:#x}+{size} outside superblock {b:#x}+{bs}"
        );
        if let Some((&o, &(os, _))) = self.live.range(..addr + size).next_back() {
            assert!(o + os <= addr, "{addr:#x}+{size} overlaps {o:#x}+{os}");
        }
        self.live.insert(addr, (size, s));
    }

    /// Page ranges handed out (superblocks and large blocks), sorted.
    fn taken_pages(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self.large.iter().map(|(&p, &n)| (p, n)).collect();
        for sbs in &self.superblocks {
            out.extend(sbs.iter().map(|(&b, &s)| (b / PAGE, s / PAGE)));
        }
        out.sort_unstable();
        out
    }

    fn check(&self, global: &GlobalArena, arenas: &[StreamArena]) {
        // Pages: handed-out ranges and free ranges tile the arena exactly.
        let mut pieces = self.taken_pages();
        let free = global.free_ranges();
        let mut end = None;
        for &(start, pages, ref fences) in &free {
            assert!(pages > 0);
            if let Some(e) = end {
                assert!(e < start, "free ranges at page {start} not coalesced");
            }
            end = Some(start + pages);
            let distinct: BTreeSet<_> = fences.iter().collect();
            assert_eq!(distinct.len(), fences.len(), "a fence twice");
            pieces.push((start, pages));
        }
        pieces.sort_unstable();
        let mut at = 0;
        for (start, pages) in pieces {
            assert_eq!(start, at, "gap or overlap at page {start}");
            at += pages;
        }
        assert_eq!(at, global.pages(), "pages not tiled");
        let lent: u64 = self
            .superblocks
            .iter()
            .flat_map(|m| m.values())
            .sum::<u64>()
            / PAGE;
        let large: u64 = self.large.values().sum();
        assert_eq!(global.lent_pages(), lent, "lent pages");
        assert_eq!(global.large_pages(), large, "large pages");
        assert_eq!(global.large_count(), self.large.len());
        assert_eq!(
            global.free_pages(),
            global.pages() - lent - large,
            "free pages"
        );
        let longest = free.iter().map(|r| r.1).max().unwrap_or(0);
        assert_eq!(global.largest_free_pages(), longest);
        // Stream arenas.
        for (s, a) in arenas.iter().enumerate() {
            let sb: u64 = self.superblocks[s].values().sum();
            let live: u64 = self.live.values().filter(|v| v.1 == s).map(|v| v.0).sum();
            let count = self.live.values().filter(|v| v.1 == s).count();
            assert_eq!(a.superblock_bytes(), sb, "superblock bytes of {s}");
            assert_eq!(a.superblock_count(), self.superblocks[s].len());
            assert_eq!(a.live_bytes(), live, "live bytes of {s}");
            assert_eq!(a.live_count(), count);
            assert_eq!(a.pending_bytes(), self.pending[s], "pending bytes of {s}");
            assert_eq!(
                a.free_bytes() + live + self.pending[s],
                sb,
                "bytes lost in {s}"
            );
            assert!(a.largest_free() <= a.free_bytes());
            assert_eq!(a.free_block_count() == 0, a.free_bytes() == 0);
            let fences: BTreeSet<u64> = self.pending_at[s].values().map(|v| v.1).collect();
            let pending: u64 = self.pending_at[s].values().map(|v| v.0).sum();
            assert_eq!(pending, self.pending[s]);
            let got: BTreeSet<u64> = a.pending_fences().into_iter().collect();
            assert_eq!(got, fences, "pending fences of {s}");
        }
    }

    fn release(&mut self, global: &mut GlobalArena, arena: &mut StreamArena, s: usize) {
        for (base, size, fences) in arena.release_free_superblocks(s as u64) {
            assert_eq!(
                self.superblocks[s].remove(&base),
                Some(size),
                "released {base:#x}"
            );
            assert!(
                self.live.range(base..base + size).next().is_none(),
                "live block released"
            );
            assert!(fences.contains(&(s as u64)), "home fence missing");
            // Pending blocks of the superblock leave with it, their fences attached.
            let inside: Vec<u64> = self.pending_at[s]
                .range(base..base + size)
                .map(|(&a, _)| a)
                .collect();
            for addr in inside {
                let (bytes, f) = self.pending_at[s].remove(&addr).unwrap();
                assert!(fences.contains(&f), "fence {f} of a pending block lost");
                self.pending[s] -= bytes;
            }
            assert_eq!(base % PAGE, 0);
            global.return_superblock(base / PAGE, size / PAGE, fences);
        }
    }
}

fuzz_target!(|input: Input| {
    let pages =
        (input.superblocks as u64 % 8 + 1) * SUPERBLOCK_PAGES + input.superblocks as u64 / 8 % 16;
    let mut global = GlobalArena::new(pages, vec![99]);
    let mut arenas: Vec<StreamArena> = (0..STREAMS).map(|_| StreamArena::new()).collect();
    let mut m = Model::default();
    for op in input.ops {
        match op {
            Op::Grow { stream } => {
                let s = stream as usize % STREAMS;
                let Some(t) = global.take(false, 0) else {
                    continue;
                };
                assert!(t.pages >= SUPERBLOCK_PAGES);
                let (base, size) = (t.start * PAGE, t.pages * PAGE);
                arenas[s].add_superblock(base, size);
                m.superblocks[s].insert(base, size);
            }
            Op::Alloc { stream, size } => {
                let s = stream as usize % STREAMS;
                let limit = [4 << 10, 256 << 10, 1 << 20][(size & 3) as usize % 3];
                let size = ((size >> 2) as u64 % limit + 1).div_ceil(ALIGN as u64) * ALIGN as u64;
                if let Some(addr) = arenas[s].allocate(size) {
                    m.allocated(addr, size, s);
                } else {
                    assert!(arenas[s].largest_free() < size, "a {size} block was free");
                }
            }
            Op::Free { pick } | Op::FreeReuse { pick } => {
                let Some((addr, size, s)) = m.pick(pick) else {
                    continue;
                };
                assert!(arenas[s].is_live_with(addr, size));
                arenas[s].free(addr, size);
                m.live.remove(&addr);
                if matches!(op, Op::FreeReuse { .. }) {
                    let again = arenas[s].allocate(size).expect("a freed block is reusable");
                    m.allocated(again, size, s);
                }
            }
            Op::FreePending { pick, fence } => {
                let Some((addr, size, s)) = m.pick(pick) else {
                    continue;
                };
                let f = fence as u64 % STREAMS as u64;
                arenas[s].free_pending(addr, size, f);
                m.live.remove(&addr);
                m.pending[s] += size;
                assert!(m.pending_at[s].insert(addr, (size, f)).is_none());
            }
            Op::Reclaim { stream } => {
                let s = stream as usize % STREAMS;
                arenas[s].reclaim_pending();
                m.pending[s] = 0;
                m.pending_at[s].clear();
            }
            Op::Release { stream } => {
                let s = stream as usize % STREAMS;
                m.release(&mut global, &mut arenas[s], s);
            }
            Op::AllocLarge { pages, fence_check } => {
                let n = pages as u64 % (2 * SUPERBLOCK_PAGES) + 1;
                let found = global.find(true, n);
                match global.take(true, n) {
                    Some(t) => {
                        assert_eq!(Some((t.start, t.pages)), found);
                        assert_eq!(t.pages, n);
                        assert!(global.is_large(t.start, n));
                        if fence_check {
                            assert!(!t.fences.is_empty(), "free pages without a fence");
                        }
                        m.large.insert(t.start, n);
                    }
                    None => assert!(found.is_none() && global.largest_free_pages() < n),
                }
            }
            Op::FreeLarge { pick, fence } => {
                let n = m.large.len();
                if n == 0 {
                    continue;
                }
                let (&start, &pages) = m.large.iter().nth(pick as usize % n).unwrap();
                global.free_large(start, pages, fence as u64 % STREAMS as u64);
                m.large.remove(&start);
                assert!(!global.is_large(start, pages));
            }
        }
        m.check(&global, &arenas);
    }
    if input.drain {
        for (addr, (size, s)) in std::mem::take(&mut m.live) {
            arenas[s].free(addr, size);
        }
        for (s, arena) in arenas.iter_mut().enumerate() {
            arena.reclaim_pending();
            m.pending[s] = 0;
            m.pending_at[s].clear();
            m.release(&mut global, arena, s);
            assert_eq!(arena.superblock_count(), 0, "a free superblock kept");
        }
        for (start, pages) in std::mem::take(&mut m.large) {
            global.free_large(start, pages, 0);
        }
        m.check(&global, &arenas);
        let ranges = global.free_ranges();
        assert_eq!(ranges.len(), 1, "{ranges:?}");
        assert_eq!((ranges[0].0, ranges[0].1), (0, pages));
    }
});
