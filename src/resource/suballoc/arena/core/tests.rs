use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::consts::{SUPERBLOCK_PAGES, SUPERBLOCK_SIZE};
use super::tree::FitTree;
use super::*;

const KIB: u64 = 1024;
const BASE: u64 = 0x7f00_0000_0000;
const SB: u64 = SUPERBLOCK_SIZE as u64;

/// Fences in these tests: a stream number.
type Fence = u8;

// ---- the tree ----

#[derive(Debug, Clone)]
enum TreeOp {
    Insert { key: u64, size: u64 },
    Remove { pick: usize },
    Set { pick: usize, size: u64, shift: u64 },
    FirstFit { size: u64 },
    Near { key: u64 },
}

fn any_tree_op(keys: u64) -> impl Strategy<Value = TreeOp> {
    prop_oneof![
        6 => (0..keys, 1..64u64).prop_map(|(key, size)| TreeOp::Insert { key, size }),
        3 => any::<usize>().prop_map(|pick| TreeOp::Remove { pick }),
        2 => (any::<usize>(), 1..64u64, 0..4u64)
            .prop_map(|(pick, size, shift)| TreeOp::Set { pick, size, shift }),
        2 => (1..70u64).prop_map(|size| TreeOp::FirstFit { size }),
        1 => (0..keys).prop_map(|key| TreeOp::Near { key }),
    ]
}

/// The tree against a sorted map of start → (length, payload), a `Vec` of `(start, length,
/// payload)` (cheap to compare whole after every operation, unlike a `BTreeMap` in a debug
/// build): same entries in the same order, the same first fit and neighbours, every invariant
/// after every operation.
fn run_tree_ops(ops: Vec<TreeOp>) {
    let mut tree: FitTree<u64> = FitTree::new();
    let mut model: Vec<(u64, u64, u64)> = Vec::new();
    // Where `key` is or would go in the model.
    let find = |model: &[(u64, u64, u64)], key: u64| model.binary_search_by_key(&key, |e| e.0);
    for op in ops {
        match op {
            TreeOp::Insert { key, size } => {
                let Err(at) = find(&model, key) else {
                    continue;
                };
                tree.insert(key, size, key * 10);
                model.insert(at, (key, size, key * 10));
            }
            TreeOp::Remove { pick } => {
                if model.is_empty() {
                    continue;
                }
                let (key, _, payload) = model.remove(pick % model.len());
                let pos = tree.lower_bound(key).unwrap();
                assert_eq!(tree.entry(pos).0, key);
                assert_eq!(tree.remove(pos), payload, "payload of {key}");
            }
            TreeOp::Set { pick, size, shift } => {
                if model.is_empty() {
                    continue;
                }
                let at = pick % model.len();
                let key = model[at].0;
                // Move the start left, but not onto or past the previous start.
                let floor = at.checked_sub(1).map_or(0, |prev| model[prev].0 + 1);
                let new_key = key.saturating_sub(shift).max(floor);
                let pos = tree.lower_bound(key).unwrap();
                tree.set(pos, new_key, size);
                *tree.value_mut(pos) += 1;
                model[at] = (new_key, size, model[at].2 + 1); // stays in order: above `floor`
            }
            TreeOp::FirstFit { size } => {
                let expected = model.iter().find(|e| e.1 >= size).map(|e| e.0);
                assert_eq!(tree.first_fit(size).map(|p| tree.entry(p).0), expected);
            }
            TreeOp::Near { key } => {
                let Err(at) = find(&model, key) else {
                    continue;
                };
                let near = tree.near(key);
                let below = at.checked_sub(1).map(|i| (model[i].0, model[i].1));
                let above = model.get(at).map(|e| (e.0, e.1));
                assert_eq!(near.below.map(|p| tree.entry(p)), below);
                assert_eq!(near.above.map(|p| tree.entry(p)), above);
                assert_eq!(tree.lower_bound(key).map(|p| tree.entry(p)), above);
                // Inserting at the place `near` gives keeps the order.
                tree.insert_at(near.at, key, 1, 7);
                model.insert(at, (key, 1, 7));
            }
        }
        tree.check();
        let listed: Vec<(u64, u64, u64)> = tree.iter().map(|(k, s, &v)| (k, s, v)).collect();
        assert_eq!(listed, model);
        assert_eq!(tree.len(), model.len());
        assert_eq!(
            tree.max_size(),
            model.iter().map(|e| e.1).max().unwrap_or(0)
        );
    }
}

proptest! {
    #![proptest_config(crate::test_support::xorshift(ProptestConfig::default()))]
    #[test]
    fn tree_matches_a_sorted_map(ops in prop::collection::vec(any_tree_op(512), 1..300)) {
        run_tree_ops(ops);
    }
}

proptest! {
    #![proptest_config(crate::test_support::xorshift(ProptestConfig::with_cases(16)))]

    /// Enough entries for three levels of nodes, so that leaves and inner nodes split, empty
    /// and the root collapses.
    #[test]
    fn a_deep_tree_matches_a_sorted_map(ops in prop::collection::vec(any_tree_op(1 << 20), 1..3000)) {
        run_tree_ops(ops);
    }
}

#[test]
fn a_tree_grows_and_shrinks_through_every_height() {
    let mut tree: FitTree<()> = FitTree::new();
    let n = 40_000u64;
    // Scrambled order, so that splits happen everywhere in the tree.
    let keys: Vec<u64> = (0..n).map(|i| (i * 7919) % n).collect();
    for (i, &k) in keys.iter().enumerate() {
        tree.insert(k * 4, 1 + k % 97, ());
        if i % 5000 == 0 {
            tree.check();
        }
    }
    tree.check();
    assert_eq!(tree.len(), n as usize);
    assert_eq!(tree.max_size(), 97);
    let pos = tree.first_fit(97).unwrap();
    assert_eq!(tree.entry(pos), (96 * 4, 97));
    for (i, &k) in keys.iter().enumerate().rev() {
        let pos = tree.lower_bound(k * 4).unwrap();
        tree.remove(pos);
        if i % 5000 == 0 {
            tree.check();
        }
    }
    tree.check();
    assert_eq!((tree.len(), tree.max_size()), (0, 0));
    assert!(tree.first_fit(1).is_none());
}

// ---- a stream arena ----

fn arena_with(superblocks: &[(u64, u64)]) -> StreamArena<Fence> {
    let mut arena = StreamArena::default();
    for &(base, size) in superblocks {
        arena.add_superblock(base, size);
    }
    arena.check_invariants();
    arena
}

/// RMM's `SuperblockFirstFit` and `BlockSplit`: the block comes from the head, the rest stays
/// free behind it.
#[test]
fn allocate_splits_from_the_head() {
    let mut a = arena_with(&[(BASE, SB)]);
    assert_eq!(a.allocate(256), Some(BASE));
    assert_eq!(a.allocate(1024), Some(BASE + 256));
    a.check_invariants();
    assert_eq!(a.free_blocks(), vec![(BASE + 1280, SB - 1280)]);
    assert_eq!((a.live_bytes(), a.free_bytes()), (1280, SB - 1280));
    assert_eq!(a.live_count(), 2);
}

/// RMM's `SuperblockEmpty`, `SuperblockMaxFreeSize` and `SuperblockMaxFreeSizeWhenFull`.
#[test]
fn largest_free_tracks_the_largest_block() {
    let mut a = arena_with(&[(BASE, SB)]);
    assert_eq!(a.largest_free(), SB);
    let p = a.allocate(SB / 4).unwrap();
    assert_eq!(a.largest_free(), 3 * SB / 4);
    let q = a.allocate(3 * SB / 4).unwrap();
    assert_eq!(a.largest_free(), 0, "full");
    assert_eq!(a.allocate(256), None);
    a.free(p, SB / 4);
    assert_eq!(a.largest_free(), SB / 4);
    a.free(q, 3 * SB / 4);
    assert_eq!(a.free_blocks(), vec![(BASE, SB)], "empty again");
    a.check_invariants();
}

/// Three 1 KiB blocks x, y, z filling the head of a superblock, and a fourth block w holding
/// the rest, so that only x, y and z can merge.
fn three_blocks() -> (StreamArena<Fence>, u64, u64, u64) {
    let mut a = arena_with(&[(BASE, SB)]);
    let x = a.allocate(KIB).unwrap();
    let y = a.allocate(KIB).unwrap();
    let z = a.allocate(KIB).unwrap();
    let _w = a.allocate(SB - 3 * KIB).unwrap();
    assert_eq!((x, y, z), (BASE, BASE + KIB, BASE + 2 * KIB));
    assert_eq!(a.free_block_count(), 0);
    (a, x, y, z)
}

/// RMM's `SuperblockCoalesceMergeNext`.
#[test]
fn free_merges_with_the_next_block() {
    let (mut a, _, y, z) = three_blocks();
    a.free(z, KIB);
    a.free(y, KIB);
    a.check_invariants();
    assert_eq!(a.free_blocks(), vec![(y, 2 * KIB)]);
}

/// RMM's `SuperblockCoalesceMergePrevious`.
#[test]
fn free_merges_with_the_previous_block() {
    let (mut a, x, y, _) = three_blocks();
    a.free(x, KIB);
    a.free(y, KIB);
    a.check_invariants();
    assert_eq!(a.free_blocks(), vec![(x, 2 * KIB)]);
}

/// RMM's `SuperblockCoalesceMergePreviousAndNext`.
#[test]
fn free_merges_with_both_neighbours() {
    let (mut a, x, y, z) = three_blocks();
    a.free(x, KIB);
    a.free(z, KIB);
    assert_eq!(a.free_block_count(), 2);
    a.free(y, KIB);
    a.check_invariants();
    assert_eq!(a.free_blocks(), vec![(x, 3 * KIB)]);
    assert_eq!(a.largest_free(), 3 * KIB);
}

/// RMM's `SuperblockCoalesceAfterFull`: a full superblock freed block by block is one free
/// block again.
#[test]
fn a_full_superblock_coalesces_back() {
    let mut a = arena_with(&[(BASE, SB)]);
    let blocks: Vec<u64> = (0..SB / (4 * KIB))
        .map(|_| a.allocate(4 * KIB).unwrap())
        .collect();
    assert_eq!(a.allocate(256), None);
    for (i, &p) in blocks.iter().enumerate() {
        // Every other block first, then the rest: each later free merges both ways.
        if i % 2 == 0 {
            a.free(p, 4 * KIB);
        }
    }
    a.check_invariants();
    assert_eq!(a.free_block_count(), blocks.len() / 2);
    for (i, &p) in blocks.iter().enumerate() {
        if i % 2 == 1 {
            a.free(p, 4 * KIB);
        }
    }
    a.check_invariants();
    assert_eq!(a.free_blocks(), vec![(BASE, SB)]);
}

#[test]
fn first_fit_takes_the_lowest_address_that_fits() {
    // Free blocks of 8 KiB (low) and 2 KiB (high): a 1.5 KiB request takes the low one,
    // though the high one fits better (first fit, not best fit).
    let mut a = arena_with(&[(BASE, SB)]);
    let big = a.allocate(8 * KIB).unwrap();
    let _sep = a.allocate(KIB).unwrap();
    let small = a.allocate(2 * KIB).unwrap();
    let _rest = a.allocate(SB - 11 * KIB).unwrap();
    a.free(big, 8 * KIB);
    a.free(small, 2 * KIB);
    assert_eq!(a.allocate(1536), Some(big));
    // 7 KiB no longer fits at `big`'s remainder (6.5 KiB) nor at `small`.
    assert_eq!(a.allocate(7 * KIB), None);
    assert_eq!(a.allocate(2 * KIB), Some(big + 1536));
    // The rest of `big` (4.5 KiB) still comes first, for any size it holds.
    assert_eq!(a.allocate(4 * KIB + 512), Some(big + 3584));
    assert_eq!(a.allocate(2 * KIB), Some(small));
    a.check_invariants();
}

#[test]
fn blocks_never_merge_across_superblocks() {
    // Two adjacent superblocks: a request for both together fails, and frees meeting at
    // the boundary stay apart, in either order.
    let mut a = arena_with(&[(BASE, SB), (BASE + SB, SB)]);
    assert_eq!(a.allocate(2 * SB), None);
    for low_first in [true, false] {
        let lo = a.allocate(SB).unwrap();
        let hi = a.allocate(SB).unwrap();
        assert_eq!((lo, hi), (BASE, BASE + SB));
        let order = if low_first { [lo, hi] } else { [hi, lo] };
        for p in order {
            a.free(p, SB);
            a.check_invariants();
        }
        assert_eq!(a.free_blocks(), vec![(BASE, SB), (BASE + SB, SB)]);
    }
    // Pieces that meet exactly at the boundary.
    let below = a.allocate(SB - 256).unwrap();
    let edge = a.allocate(256).unwrap();
    let above = a.allocate(256).unwrap();
    assert_eq!((edge, above), (BASE + SB - 256, BASE + SB));
    a.free(edge, 256);
    a.free(above, 256);
    a.check_invariants();
    assert_eq!(a.free_blocks(), vec![(edge, 256), (above, SB)]);
    a.free(below, SB - 256);
    assert_eq!(a.free_blocks(), vec![(BASE, SB), (BASE + SB, SB)]);
}

#[test]
fn pending_blocks_are_reused_only_after_reclaim() {
    let mut a = arena_with(&[(BASE, SB)]);
    let p = a.allocate(SB).unwrap();
    a.free_pending(p, SB, 7);
    a.check_invariants();
    assert_eq!(
        (a.free_bytes(), a.pending_bytes(), a.live_bytes()),
        (0, SB, 0)
    );
    assert_eq!(a.allocate(256), None, "a pending block is not reused");
    assert_eq!(a.pending_fences(), vec![7]);
    a.reclaim_pending();
    a.check_invariants();
    assert_eq!(a.pending_fences(), Vec::<Fence>::new());
    assert_eq!(a.free_blocks(), vec![(BASE, SB)]);
    assert_eq!(a.allocate(256), Some(BASE));
}

#[test]
fn reclaimed_blocks_merge_with_free_ones() {
    let (mut a, x, y, z) = three_blocks();
    a.free(x, KIB);
    a.free_pending(y, KIB, 1);
    a.free_pending(z, KIB, 2);
    a.free_pending(BASE + 3 * KIB, SB - 3 * KIB, 1);
    assert_eq!(a.pending_fences(), vec![1, 2]);
    a.reclaim_pending();
    a.check_invariants();
    assert_eq!(a.free_blocks(), vec![(BASE, SB)]);
}

#[test]
fn release_keeps_superblocks_with_live_blocks() {
    let sbs = [(BASE, SB), (BASE + 4 * SB, 2 * SB), (BASE + 8 * SB, SB)];
    let mut a = arena_with(&sbs);
    let first = a.allocate(SB).unwrap();
    let second = a.allocate(256).unwrap();
    assert_eq!((first, second), (BASE, BASE + 4 * SB));
    a.free(first, SB);
    let released = a.release_free_superblocks(&9);
    a.check_invariants();
    assert_eq!(
        released,
        vec![
            Released {
                base: BASE,
                size: SB,
                fences: vec![9]
            },
            Released {
                base: BASE + 8 * SB,
                size: SB,
                fences: vec![9]
            },
        ]
    );
    assert_eq!(a.superblocks(), vec![(BASE + 4 * SB, 2 * SB)]);
    assert!(a.is_live(second));
    assert_eq!(a.free_bytes(), 2 * SB - 256);
    assert_eq!(
        a.release_free_superblocks(&9),
        vec![],
        "nothing more to give"
    );
}

#[test]
fn release_carries_the_fences_of_pending_blocks() {
    let mut a = arena_with(&[(BASE, SB), (BASE + SB, SB), (BASE + 4 * SB, SB)]);
    let x = a.allocate(SB).unwrap();
    let y = a.allocate(SB / 2).unwrap();
    let z = a.allocate(SB / 4).unwrap();
    let w = a.allocate(SB).unwrap();
    assert_eq!(
        (x, y, z, w),
        (BASE, BASE + SB, BASE + SB + SB / 2, BASE + 4 * SB)
    );
    a.free_pending(y, SB / 2, 3);
    a.free_pending(z, SB / 4, 4);
    a.free_pending(x, SB, 3);
    a.check_invariants();
    let released = a.release_free_superblocks(&9);
    a.check_invariants();
    assert_eq!(
        released,
        vec![
            Released {
                base: BASE,
                size: SB,
                fences: vec![9, 3]
            },
            Released {
                base: BASE + SB,
                size: SB,
                fences: vec![9, 3, 4]
            },
        ]
    );
    assert_eq!(a.superblocks(), vec![(BASE + 4 * SB, SB)]);
    assert_eq!(
        (a.free_bytes(), a.pending_bytes(), a.live_bytes()),
        (0, 0, SB)
    );
    a.free(w, SB);
    let released = a.release_free_superblocks(&9);
    assert_eq!(released.len(), 1);
    assert_eq!(a.superblock_count(), 0);
    a.check_invariants();
}

#[test]
#[should_panic(expected = "double free")]
fn double_free_panics() {
    let mut a = arena_with(&[(BASE, SB)]);
    let p = a.allocate(KIB).unwrap();
    a.free(p, KIB);
    a.free(p, KIB);
}

#[test]
#[should_panic(expected = "allocated with 1024 bytes, freed with 2048")]
fn freeing_with_another_size_panics() {
    let mut a = arena_with(&[(BASE, SB)]);
    let p = a.allocate(KIB).unwrap();
    a.free(p, 2 * KIB);
}

#[test]
#[should_panic(expected = "not allocated from this arena")]
fn freeing_a_foreign_address_panics() {
    let mut a = arena_with(&[(BASE, SB)]);
    let p = a.allocate(KIB).unwrap();
    a.free_pending(p + 256, 768, 1);
}

#[test]
#[should_panic(expected = "at least 1 MiB")]
fn a_superblock_below_one_mebibyte_panics() {
    arena_with(&[(BASE, SB / 2)]);
}

// ---- the stream arena against a model ----

/// The reference model: plain ordered maps and brute force.
#[derive(Debug, Default)]
struct Model {
    superblocks: BTreeMap<u64, u64>,
    /// start → size; kept merged within superblocks by `normalize`.
    free: BTreeMap<u64, u64>,
    live: BTreeMap<u64, u64>,
    /// start → (size, fence).
    pending: BTreeMap<u64, (u64, Fence)>,
}

impl Model {
    fn normalize(&mut self) {
        let ranges: Vec<(u64, u64)> = std::mem::take(&mut self.free).into_iter().collect();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (start, size) in ranges {
            match out.last_mut() {
                Some((s, n)) if *s + *n == start && !self.superblocks.contains_key(&start) => {
                    *n += size
                }
                _ => out.push((start, size)),
            }
        }
        self.free = out.into_iter().collect();
    }

    /// Address-ordered first fit, by brute force.
    fn first_fit(&self, size: u64) -> Option<u64> {
        self.free
            .iter()
            .find(|&(_, &n)| n >= size)
            .map(|(&start, _)| start)
    }
}

#[derive(Debug, Clone)]
enum ArenaOp {
    AddSuperblock { mib: u64, gap: u64 },
    Allocate { size: u64 },
    Free { pick: usize },
    FreePending { pick: usize, fence: Fence },
    Reclaim,
    Release,
}

fn any_block_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => (1..=64u64).prop_map(|u| u * 256),
        1 => (1..=4096u64).prop_map(|u| u * 256),
    ]
}

fn any_arena_op() -> impl Strategy<Value = ArenaOp> {
    prop_oneof![
        1 => (1..=2u64, 0..=1u64).prop_map(|(mib, gap)| ArenaOp::AddSuperblock { mib, gap }),
        12 => any_block_size().prop_map(|size| ArenaOp::Allocate { size }),
        8 => any::<usize>().prop_map(|pick| ArenaOp::Free { pick }),
        3 => (any::<usize>(), 1..4u8).prop_map(|(pick, fence)| ArenaOp::FreePending { pick, fence }),
        1 => Just(ArenaOp::Reclaim),
        1 => Just(ArenaOp::Release),
    ]
}

fn check_arena_against(a: &StreamArena<Fence>, m: &Model) {
    a.check_invariants();
    let free: Vec<(u64, u64)> = m.free.iter().map(|(&s, &n)| (s, n)).collect();
    assert_eq!(a.free_blocks(), free, "free blocks differ from the model");
    let sbs: Vec<(u64, u64)> = m.superblocks.iter().map(|(&b, &n)| (b, n)).collect();
    assert_eq!(a.superblocks(), sbs, "superblocks differ from the model");
    assert_eq!(a.live_bytes(), m.live.values().sum::<u64>());
    assert_eq!(
        a.pending_bytes(),
        m.pending.values().map(|v| v.0).sum::<u64>()
    );
    assert_eq!(
        a.largest_free(),
        m.free.values().copied().max().unwrap_or(0)
    );
    let mut fences: Vec<Fence> = a.pending_fences();
    fences.sort_unstable();
    let expected: BTreeSet<Fence> = m.pending.values().map(|v| v.1).collect();
    assert_eq!(fences, expected.into_iter().collect::<Vec<_>>());
}

fn run_arena_ops(ops: Vec<ArenaOp>) {
    let mut a: StreamArena<Fence> = StreamArena::default();
    let mut m = Model::default();
    let mut next_base = BASE;
    for op in ops {
        match op {
            ArenaOp::AddSuperblock { mib, gap } => {
                let base = next_base + gap * SB;
                next_base = base + mib * SB;
                a.add_superblock(base, mib * SB);
                m.superblocks.insert(base, mib * SB);
                m.free.insert(base, mib * SB);
            }
            ArenaOp::Allocate { size } => {
                let got = a.allocate(size);
                assert_eq!(got, m.first_fit(size), "not the first fit for {size}");
                if let Some(p) = got {
                    let n = m.free.remove(&p).unwrap();
                    if n > size {
                        m.free.insert(p + size, n - size);
                    }
                    m.live.insert(p, size);
                }
            }
            ArenaOp::Free { pick } => {
                if m.live.is_empty() {
                    continue;
                }
                let (&p, &n) = m.live.iter().nth(pick % m.live.len()).unwrap();
                m.live.remove(&p);
                a.free(p, n);
                m.free.insert(p, n);
                m.normalize();
            }
            ArenaOp::FreePending { pick, fence } => {
                if m.live.is_empty() {
                    continue;
                }
                let (&p, &n) = m.live.iter().nth(pick % m.live.len()).unwrap();
                m.live.remove(&p);
                a.free_pending(p, n, fence);
                m.pending.insert(p, (n, fence));
            }
            ArenaOp::Reclaim => {
                a.reclaim_pending();
                for (p, (n, _)) in std::mem::take(&mut m.pending) {
                    m.free.insert(p, n);
                }
                m.normalize();
            }
            ArenaOp::Release => {
                let released = a.release_free_superblocks(&0);
                let expected: Vec<(u64, u64)> = m
                    .superblocks
                    .iter()
                    .filter(|&(&b, &n)| m.live.range(b..b + n).next().is_none())
                    .map(|(&b, &n)| (b, n))
                    .collect();
                let got: Vec<(u64, u64)> = released.iter().map(|r| (r.base, r.size)).collect();
                assert_eq!(got, expected, "released superblocks");
                for r in released {
                    let mut want = vec![0];
                    for (_, &(_, f)) in m.pending.range(r.base..r.base + r.size) {
                        if !want.contains(&f) {
                            want.push(f);
                        }
                    }
                    let mut got = r.fences.clone();
                    got.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(got, want, "fences of superblock {:#x}", r.base);
                    m.superblocks.remove(&r.base);
                    let inside: Vec<u64> = m
                        .free
                        .range(r.base..r.base + r.size)
                        .map(|(&s, _)| s)
                        .collect();
                    for s in inside {
                        m.free.remove(&s);
                    }
                    let inside: Vec<u64> = m
                        .pending
                        .range(r.base..r.base + r.size)
                        .map(|(&s, _)| s)
                        .collect();
                    for s in inside {
                        m.pending.remove(&s);
                    }
                }
            }
        }
        check_arena_against(&a, &m);
    }
}

proptest! {
    #![proptest_config(crate::test_support::xorshift(ProptestConfig::with_cases(256)))]

    /// Random operations against the model: every allocation is exactly the model's
    /// address-ordered first fit, frees merge exactly as the model does, pending blocks and
    /// released superblocks carry the right fences, and no byte is lost.
    #[test]
    fn stream_arena_matches_the_model(
        ops in prop::collection::vec(any_arena_op(), 1..250)
            .prop_map(|mut ops| { ops.insert(0, ArenaOp::AddSuperblock { mib: 1, gap: 0 }); ops })
    ) {
        run_arena_ops(ops);
    }
}

/// Thousands of live blocks in one arena (the random benchmark's shape), checked at intervals.
#[test]
fn many_live_blocks_stay_consistent() {
    let mut a: StreamArena<Fence> = StreamArena::default();
    for i in 0..64 {
        a.add_superblock(BASE + i * SB, SB);
    }
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut live: Vec<(u64, u64)> = Vec::new();
    for i in 0..40_000 {
        if live.len() < 2_000 || next() % 2 == 0 {
            let size = (1 + next() % 256) * 256;
            if let Some(p) = a.allocate(size) {
                live.push((p, size));
            }
        } else {
            let j = (next() % live.len() as u64) as usize;
            let (p, size) = live.swap_remove(j);
            a.free(p, size);
        }
        if i % 10_000 == 0 {
            a.check_invariants();
        }
    }
    for (p, size) in live.drain(..) {
        a.free(p, size);
    }
    a.check_invariants();
    assert_eq!(a.free_block_count(), 64);
    assert_eq!(a.release_free_superblocks(&0).len(), 64);
}

// ---- the global arena ----

const PAGES_PER_MIB: u64 = SUPERBLOCK_PAGES;

fn take(g: &mut GlobalArena<Fence>, what: Use, pages: u64) -> Option<(u64, u64, Vec<Fence>)> {
    let c = g.find(what, pages)?;
    let fences = g.fences(&c).to_vec();
    g.take(c, 0);
    g.check_invariants();
    Some((c.start, c.pages, fences))
}

/// RMM's `GlobalArenaAcquire`: a 4 MiB arena lends four 1 MiB superblocks at consecutive
/// addresses, and no fifth.
#[test]
fn superblocks_are_lent_in_address_order() {
    let mut g = GlobalArena::new(4 * PAGES_PER_MIB, vec![0]);
    for i in 0..4 {
        let (start, pages, fences) = take(&mut g, Use::Superblock, 0).unwrap();
        assert_eq!((start, pages), (i * PAGES_PER_MIB, PAGES_PER_MIB));
        assert_eq!(fences, vec![0]);
    }
    assert_eq!(g.find(Use::Superblock, 0), None);
    assert_eq!(g.lent_pages(), 4 * PAGES_PER_MIB);
}

#[test]
fn a_range_below_two_superblocks_is_lent_whole() {
    let mut g = GlobalArena::new(PAGES_PER_MIB + 5, vec![]);
    let (start, pages, _) = take(&mut g, Use::Superblock, 0).unwrap();
    assert_eq!((start, pages), (0, PAGES_PER_MIB + 5));
    assert_eq!(g.free_pages(), 0);
}

/// RMM's `GlobalArenaReleaseMergeNext`, `...MergePrevious`, `...MergePreviousAndNext` and
/// `...ReleaseMultiple`: returned superblocks merge, and then the whole arena is one block at
/// its base again.
#[test]
fn returned_superblocks_merge_in_any_order() {
    for order in [
        [0, 1, 2, 3],
        [3, 2, 1, 0],
        [0, 2, 1, 3],
        [1, 3, 0, 2],
        [2, 0, 3, 1],
    ] {
        let mut g = GlobalArena::new(4 * PAGES_PER_MIB, vec![]);
        let lent: Vec<u64> = (0..4)
            .map(|_| take(&mut g, Use::Superblock, 0).unwrap().0)
            .collect();
        assert_eq!(g.find(Use::Large, 2 * PAGES_PER_MIB), None);
        for (k, &i) in order.iter().enumerate() {
            g.return_superblock(lent[i], PAGES_PER_MIB, vec![i as Fence + 1]);
            g.check_invariants();
            assert_eq!(g.free_pages(), (k as u64 + 1) * PAGES_PER_MIB);
        }
        assert_eq!(g.free_ranges().len(), 1, "order {order:?}");
        let (start, pages, mut fences) = take(&mut g, Use::Large, 4 * PAGES_PER_MIB).unwrap();
        assert_eq!((start, pages), (0, 4 * PAGES_PER_MIB));
        fences.sort_unstable();
        assert_eq!(fences, vec![1, 2, 3, 4], "every returner's fence, once");
    }
}

/// RMM's `GlobalArenaAllocate`, `...AllocateExtraLarge`, `...Deallocate`: large blocks come
/// from the lowest pages that fit, go back merged, and a request past the arena fails.
#[test]
fn large_blocks_first_fit_and_merge_back() {
    let mut g = GlobalArena::new(8 * PAGES_PER_MIB, vec![0]);
    let (a, _, _) = take(&mut g, Use::Large, 3 * PAGES_PER_MIB).unwrap();
    let (b, _, _) = take(&mut g, Use::Large, 2 * PAGES_PER_MIB).unwrap();
    let (c, _, _) = take(&mut g, Use::Large, 3 * PAGES_PER_MIB).unwrap();
    assert_eq!((a, b, c), (0, 3 * PAGES_PER_MIB, 5 * PAGES_PER_MIB));
    assert_eq!(g.find(Use::Large, 1), None);
    assert_eq!(g.find(Use::Large, u64::MAX), None);
    g.free_large(b, 2 * PAGES_PER_MIB, 2);
    g.check_invariants();
    // 3 MiB does not fit in the 2 MiB hole; 1 MiB does, at its start.
    assert_eq!(g.find(Use::Large, 3 * PAGES_PER_MIB), None);
    let (d, _, fences) = take(&mut g, Use::Large, PAGES_PER_MIB).unwrap();
    assert_eq!((d, fences), (b, vec![2]));
    g.free_large(a, 3 * PAGES_PER_MIB, 1);
    g.free_large(c, 3 * PAGES_PER_MIB, 3);
    g.free_large(d, PAGES_PER_MIB, 4);
    g.check_invariants();
    let ranges = g.free_ranges();
    assert_eq!(ranges.len(), 1);
    let mut fences = ranges[0].2.to_vec();
    fences.sort_unstable();
    assert_eq!(fences, vec![1, 2, 3, 4]);
    assert_eq!(g.large_count(), 0);
}

#[test]
fn the_rest_of_a_range_keeps_its_fences() {
    let mut g = GlobalArena::new(4 * PAGES_PER_MIB, vec![5, 5, 6]);
    let (_, _, fences) = take(&mut g, Use::Large, PAGES_PER_MIB + 1).unwrap();
    assert_eq!(fences, vec![5, 6], "deduplicated");
    assert_eq!(g.free_ranges()[0].2, &[5, 6]);
}

#[test]
#[should_panic(expected = "double free")]
fn freeing_a_large_block_twice_panics() {
    let mut g = GlobalArena::new(4 * PAGES_PER_MIB, vec![]);
    let (a, pages, _) = take(&mut g, Use::Large, 2 * PAGES_PER_MIB).unwrap();
    g.free_large(a, pages, 0);
    g.free_large(a, pages, 0);
}

#[derive(Debug, Clone)]
enum GlobalOp {
    Superblock,
    Large { pages: u64 },
    FreeLarge { pick: usize, fence: Fence },
    Return { pick: usize, fence: Fence },
}

fn any_global_op() -> impl Strategy<Value = GlobalOp> {
    prop_oneof![
        3 => Just(GlobalOp::Superblock),
        3 => (1..=48u64).prop_map(|pages| GlobalOp::Large { pages }),
        2 => (any::<usize>(), 0..4u8).prop_map(|(pick, fence)| GlobalOp::FreeLarge { pick, fence }),
        2 => (any::<usize>(), 0..4u8).prop_map(|(pick, fence)| GlobalOp::Return { pick, fence }),
    ]
}

proptest! {
    #![proptest_config(crate::test_support::xorshift(ProptestConfig::default()))]
    /// The global arena against a page model: first fit by address, the superblock rule,
    /// merged ranges whose fences are the union of what went into them.
    #[test]
    fn global_arena_matches_the_model(
        pages in 16..200u64,
        ops in prop::collection::vec(any_global_op(), 1..200),
    ) {
        let mut g = GlobalArena::new(pages, vec![9]);
        // Model: per page, None = handed out, Some(fences) = free.
        let mut model: Vec<Option<BTreeSet<Fence>>> = vec![Some([9].into()); pages as usize];
        let mut large: Vec<(u64, u64)> = Vec::new();
        let mut lent: Vec<(u64, u64)> = Vec::new();
        // The free runs of the model, with the union of their pages' fences.
        let runs = |model: &[Option<BTreeSet<Fence>>]| {
            let mut out: Vec<(u64, u64, BTreeSet<Fence>)> = Vec::new();
            for (i, p) in model.iter().enumerate() {
                match (p, out.last_mut()) {
                    (Some(f), Some((s, n, fs))) if *s + *n == i as u64 => {
                        *n += 1;
                        fs.extend(f);
                    }
                    (Some(f), _) => out.push((i as u64, 1, f.clone())),
                    (None, _) => {}
                }
            }
            out
        };
        for op in ops {
            match op {
                GlobalOp::Superblock | GlobalOp::Large { .. } => {
                    let (what, want) = match op {
                        GlobalOp::Large { pages } => (Use::Large, pages),
                        _ => (Use::Superblock, SUPERBLOCK_PAGES),
                    };
                    let expected = runs(&model).into_iter().find(|r| r.1 >= want);
                    match take(&mut g, what, want) {
                        Some((start, n, fences)) => {
                            let (s, len, fs) = expected.expect("served what the model cannot");
                            prop_assert_eq!(start, s, "not the first fit");
                            let n_expected = if what == Use::Superblock && len < 2 * SUPERBLOCK_PAGES { len } else { want };
                            prop_assert_eq!(n, n_expected);
                            let got: BTreeSet<Fence> = fences.into_iter().collect();
                            prop_assert_eq!(&got, &fs, "fences of the range");
                            for p in &mut model[start as usize..(start + n) as usize] {
                                *p = None;
                            }
                            // The rest of the range keeps every fence of the range.
                            for p in &mut model[(start + n) as usize..(s + len) as usize] {
                                *p = Some(fs.clone());
                            }
                            match what {
                                Use::Large => large.push((start, n)),
                                Use::Superblock => lent.push((start, n)),
                            }
                        }
                        None => prop_assert!(expected.is_none(), "the model can serve {}", want),
                    }
                }
                GlobalOp::FreeLarge { pick, fence } | GlobalOp::Return { pick, fence } => {
                    let from = if matches!(op, GlobalOp::FreeLarge { .. }) { &mut large } else { &mut lent };
                    if from.is_empty() {
                        continue;
                    }
                    let (start, n) = from.swap_remove(pick % from.len());
                    if matches!(op, GlobalOp::FreeLarge { .. }) {
                        g.free_large(start, n, fence);
                    } else {
                        g.return_superblock(start, n, vec![fence]);
                    }
                    for p in &mut model[start as usize..(start + n) as usize] {
                        *p = Some([fence].into());
                    }
                }
            }
            g.check_invariants();
            // Each range carries exactly the union of its pages' fences.
            let got = g.free_ranges();
            let want = runs(&model);
            prop_assert_eq!(got.len(), want.len());
            for ((s, n, f), (ws, wn, wf)) in got.into_iter().zip(want) {
                prop_assert_eq!((s, n), (ws, wn));
                let f: BTreeSet<Fence> = f.iter().copied().collect();
                prop_assert_eq!(f, wf, "fences of the range at page {}", s);
            }
        }
    }
}
