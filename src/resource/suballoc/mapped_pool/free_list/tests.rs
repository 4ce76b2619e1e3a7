use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

#[test]
fn size_classes_split_each_power_of_two_in_four() {
    assert_eq!(class_of(1), 0);
    assert_eq!(class_of(4), 8);
    assert_eq!(class_of(5), 9);
    assert_eq!(class_of(7), 11);
    assert_eq!(class_of(8), 12);
    assert_eq!(class_of(u64::MAX), CLASSES - 1);
    // Monotone: a longer block is never in a lower class.
    let mut last = 0;
    for len in 1..5000u64 {
        let c = class_of(len);
        assert!(c >= last, "{len}");
        last = c;
    }
}

#[test]
fn serves_from_the_lowest_address_and_grows_upwards() {
    let mut list = FreeList::new(1000);
    let a = list.find(100).unwrap();
    list.allocate_at(a, 100);
    let b = list.find(100).unwrap();
    list.allocate_at(b, 100);
    assert_eq!((a, b), (0, 100));
    list.free(a, 100, 7).unwrap();
    // The hole at 0 is lowest: a request that fits it goes there, one that does not goes above.
    assert_eq!(list.find(50), Some(0));
    assert_eq!(list.find(101), Some(200));
    list.check();
}

#[test]
fn frees_coalesce_with_both_neighbours_and_join_their_owners() {
    let mut list = FreeList::new(300);
    for _ in 0..3 {
        let p = list.find(100).unwrap();
        list.allocate_at(p, 100);
    }
    list.free(0, 100, 1).unwrap();
    list.free(200, 100, 3).unwrap();
    assert_eq!(list.free_blocks(), 2);
    assert_eq!(list.free(100, 100, 2), Ok((0, 300)));
    assert_eq!(list.free_blocks(), 1);
    let (_, len, owners) = list.block_containing(150).unwrap();
    assert_eq!(len, 300);
    assert_eq!(owners.iter().collect::<Vec<_>>(), vec![1, 2, 3]);
    list.check();
}

#[test]
fn bad_frees_are_refused_and_change_nothing() {
    let mut list = FreeList::new(1000);
    let p = list.find(256).unwrap();
    list.allocate_at(p, 256);
    assert_eq!(list.free(p, 512, 0), Err(BadFree::WrongSize(256)));
    assert_eq!(list.free(p + 256, 256, 0), Err(BadFree::Unknown));
    list.free(p, 256, 0).unwrap();
    assert_eq!(list.free(p, 256, 0), Err(BadFree::Unknown)); // double free
    assert_eq!(list.free_bytes(), 1000);
    assert_eq!(list.live_allocations(), 0);
    list.check();
}

#[test]
fn largest_free_block_is_found_among_its_class() {
    let mut list = FreeList::new(10_000);
    let sizes = [1000, 10, 1500, 10, 1200, 10];
    let mut starts = Vec::new();
    for s in sizes {
        let p = list.find(s).unwrap();
        list.allocate_at(p, s);
        starts.push(p);
    }
    list.free(starts[0], 1000, 0).unwrap();
    list.free(starts[2], 1500, 0).unwrap();
    list.free(starts[4], 1200, 0).unwrap();
    assert_eq!(list.largest_free(), 10_000 - 3730);
}

#[test]
fn classes_above_lists_exactly_the_non_empty_classes_above() {
    let mut list = FreeList::new(0);
    for (start, len) in [
        (0u64, 1u64),
        (10, 5),
        (100, 63),
        (1000, 64),
        (1 << 40, 1 << 39),
    ] {
        list.insert(start, len, Owners::default());
    }
    let all: Vec<usize> = (0..CLASSES)
        .filter(|&k| !list.classes[k].is_empty())
        .collect();
    for c in 0..CLASSES {
        let expected: Vec<usize> = all.iter().copied().filter(|&k| k > c).collect();
        assert_eq!(
            list.classes_above(c).collect::<Vec<_>>(),
            expected,
            "above {c}"
        );
    }
}

/// The naive oracle: the lowest free block of at least `size`.
fn naive_first_fit(list: &FreeList, size: u64) -> Option<u64> {
    list.blocks()
        .find(|&(_, len, _)| len >= size)
        .map(|(s, _, _)| s)
}

/// The naive oracle from the other end: the highest free block of at least `size`.
fn naive_last_fit(list: &FreeList, size: u64) -> Option<u64> {
    list.blocks()
        .filter(|&(_, len, _)| len >= size)
        .last()
        .map(|(s, _, _)| s)
}

proptest! {
    /// Random allocations and frees, checked against a shadow model of the live ranges (no
    /// overlap, all inside the range) and against the naive first fit: the list's invariants
    /// hold after every operation, and with few blocks per class its search is exact.
    #[test]
    fn random_ops_match_the_shadow_model(ops in proptest::collection::vec((any::<bool>(), 1u64..5000, any::<u16>()), 1..300)) {
        const LEN: u64 = 200_000;
        let mut list = FreeList::new(LEN);
        let mut shadow: BTreeMap<u64, u64> = BTreeMap::new();
        for (alloc, size, pick) in ops {
            if alloc || shadow.is_empty() {
                // Every other request from the top of the range (`find_high`).
                let high = pick % 2 == 1;
                let found = if high { list.find_high(size) } else { list.find(size) };
                if list.free_blocks() <= SCAN {
                    let naive = if high { naive_last_fit(&list, size) } else { naive_first_fit(&list, size) };
                    prop_assert_eq!(found, naive);
                }
                match found {
                    Some(block) => {
                        let p = if high {
                            let (p, _) = list.allocate_tail_for(block, size, 0);
                            // The rest of the block stays free below it, or none is left.
                            let rest = list.block_containing(block).map(|(s, l, _)| (s, s + l));
                            prop_assert!(rest.map_or(p == block, |r| r == (block, p)));
                            p
                        } else {
                            list.allocate_at(block, size);
                            block
                        };
                        prop_assert!(p + size <= LEN);
                        if let Some((&s, &l)) = shadow.range(..p + size).next_back() {
                            prop_assert!(s + l <= p, "{}+{} overlaps {}+{}", p, size, s, l);
                        }
                        shadow.insert(p, size);
                    }
                    None => prop_assert!(list.largest_free() < size),
                }
            } else {
                let i = pick as usize % shadow.len();
                let (&p, &l) = shadow.iter().nth(i).unwrap();
                shadow.remove(&p);
                prop_assert!(list.free(p, l, u32::from(pick % 3)).is_ok());
            }
            list.check();
            prop_assert_eq!(list.live_bytes(), shadow.values().sum::<u64>());
            prop_assert_eq!(list.free_bytes() + list.live_bytes(), LEN);
        }
        for (p, l) in shadow {
            list.free(p, l, 0).unwrap();
        }
        prop_assert_eq!(list.free_blocks(), 1);
        prop_assert_eq!(list.largest_free(), LEN);
    }
}

/// A request whose own class holds more than `SCAN` too-small blocks below the one that fits,
/// with no larger class to fall back on, still finds it: `None` means nothing fits (a near-full
/// pool refused such a request with its own largest free block in the error).
#[test]
fn a_fitting_block_behind_many_small_ones_of_its_class_is_found() {
    let holes = SCAN as u64 + 1;
    let total = holes * (4096 + 256) + 4864 + 1000;
    let mut list = FreeList::new(total);
    let mut small = Vec::new();
    for _ in 0..holes {
        let a = list.find(4096).unwrap();
        list.allocate_at(a, 4096);
        small.push(a);
        let keep = list.find(256).unwrap();
        list.allocate_at(keep, 256);
    }
    let big = list.find(4864).unwrap();
    list.allocate_at(big, 4864);
    let rest = list.find(1000).unwrap();
    list.allocate_at(rest, 1000);
    assert_eq!(list.find(1), None, "full");
    for a in small {
        list.free(a, 4096, 1).unwrap();
    }
    list.free(big, 4864, 1).unwrap();
    assert_eq!(class_of(4096), class_of(4864));
    assert_eq!(list.find(4608), Some(big));
    list.check();
}
