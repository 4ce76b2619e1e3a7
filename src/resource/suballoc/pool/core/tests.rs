use std::collections::BTreeMap;

use proptest::prelude::*;

use super::classes::{class_min, class_of, search_class, FL_COUNT, SL_COUNT};
use super::index::OWN_CLASS_PROBES;
use super::types::ALIGN_LOG2;
use super::*;

const A: StreamKey = StreamKey(1);
const B: StreamKey = StreamKey(2);
const C: StreamKey = StreamKey(3);
const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
const BASE: u64 = 0x7f00_0000_0000;

/// Every class `(fl, sl)`, in order, with its smallest size in units (class (0, 0) holds no
/// block and is left out).
fn all_classes() -> Vec<((usize, usize), u64)> {
    (0..FL_COUNT)
        .flat_map(|fl| (0..SL_COUNT).map(move |sl| (fl, sl)))
        .filter(|&c| c != (0, 0))
        .map(|(fl, sl)| ((fl, sl), class_min(fl, sl)))
        .collect()
}

// ---- size-class math ----

#[test]
fn every_class_round_trips_through_its_bounds() {
    let classes = all_classes();
    for w in classes.windows(2) {
        let ((class, min), (_, next_min)) = (w[0], w[1]);
        assert!(min < next_min, "classes out of order at {class:?}");
        assert_eq!(class_of(min), class, "smallest size of {class:?}");
        assert_eq!(class_of(next_min - 1), class, "largest size of {class:?}");
        assert_eq!(
            search_class(min),
            Some(class),
            "search for exactly {min} units"
        );
    }
    // The largest class reaches the largest size in bytes there is.
    let largest = u64::MAX >> ALIGN_LOG2;
    assert_eq!(class_of(largest), classes.last().unwrap().0);
    assert_eq!(search_class(largest), None);
}

#[test]
fn small_sizes_have_exact_classes() {
    for units in 1..64u64 {
        let (fl, sl) = class_of(units);
        assert_eq!(class_min(fl, sl), units);
        assert_eq!(search_class(units), Some((fl, sl)));
    }
    // From 64 units on, a class spans 2 or more sizes.
    assert_eq!(class_of(64), class_of(65));
    assert_eq!(search_class(65), Some(class_of(66)));
}

#[test]
fn align_up_rounds_to_256() {
    assert_eq!(align_up(1), Some(256));
    assert_eq!(align_up(256), Some(256));
    assert_eq!(align_up(257), Some(512));
    assert_eq!(align_up(usize::MAX - 255), Some(usize::MAX - 255));
    assert_eq!(align_up(usize::MAX - 254), None);
}

/// Sizes in units, spread over every first level.
fn any_units() -> impl Strategy<Value = u64> {
    prop_oneof![
        1..256u64,
        (0..56u32, any::<u64>()).prop_map(|(bits, x)| (x >> bits).max(1) >> 8)
    ]
    .prop_filter("non-zero", |&u| u > 0)
}

proptest! {
    #[test]
    fn class_of_brackets_the_size(units in any_units()) {
        let (fl, sl) = class_of(units);
        prop_assert!(fl < FL_COUNT && sl < SL_COUNT);
        prop_assert!(class_min(fl, sl) <= units);
        let next = if sl + 1 < SL_COUNT { (fl, sl + 1) } else { (fl + 1, 0) };
        if next.0 < FL_COUNT {
            prop_assert!(units < class_min(next.0, next.1));
        }
    }

    #[test]
    fn search_class_is_the_smallest_class_that_always_fits(units in any_units()) {
        match search_class(units) {
            Some((fl, sl)) => {
                // Every block of the found class fits.
                prop_assert!(class_min(fl, sl) >= units);
                // The class below it would not always fit.
                let below = all_classes()
                    .into_iter()
                    .take_while(|&(c, _)| c < (fl, sl))
                    .last();
                if let Some((_, below_min)) = below {
                    prop_assert!(below_min < units);
                }
                // It is the own class or the next one up.
                prop_assert!((fl, sl) >= class_of(units));
            }
            None => prop_assert!(all_classes().iter().all(|&(_, min)| min < units)),
        }
    }

    #[test]
    fn class_of_is_monotonic(a in any_units(), b in any_units()) {
        let (lo, hi) = (a.min(b), a.max(b));
        prop_assert!(class_of(lo) <= class_of(hi));
        prop_assert!(search_class(lo) <= search_class(hi).or(Some((FL_COUNT, 0))));
    }
}

// ---- split and coalesce ----

fn pool_with_chunk(size: usize, stream: StreamKey) -> PoolCore {
    let mut pool = PoolCore::new();
    pool.add_chunk(BASE, size, stream);
    pool.check_invariants();
    pool
}

#[test]
fn allocate_splits_and_the_rest_stays_free_on_the_stream() {
    let mut pool = pool_with_chunk(MIB, A);
    let p = pool.allocate(1000, A).unwrap();
    pool.check_invariants();
    // Carved from the tail: the free block keeps its start.
    assert_eq!(p, BASE + (MIB - 1024) as u64);
    assert_eq!(pool.free_bytes(), MIB - 1024, "1000 bytes round up to 1024");
    assert_eq!(pool.free_bytes_of(A), MIB - 1024);
    assert_eq!(pool.free_block_count(), 1);
    assert_eq!(pool.allocation_count(), 1);
    assert_eq!(pool.free_blocks(), vec![(BASE, (MIB - 1024) as u64, A)]);
    let q = pool.allocate(1, A).unwrap();
    assert_eq!(q, p - 256);
    pool.check_invariants();
}

/// A chunk's free head is cut off (the chunk then starts at its next block); wholly free
/// chunks and chunks whose head is allocated are left alone; the rest still goes back whole.
#[test]
fn cut_free_heads_moves_the_chunk_start() {
    let mut pool = pool_with_chunk(MIB, A);
    let other = BASE + 4 * MIB as u64;
    pool.add_chunk(other, MIB, B);
    let full = BASE + 8 * MIB as u64;
    pool.add_chunk(full, MIB, B);
    let p = pool.allocate(300 * KIB, A).unwrap();
    assert_eq!(pool.allocate(MIB, B), Some(full));
    pool.free(full, MIB, B);
    let q = pool.allocate(KIB, B).unwrap();
    let head = (MIB - 300 * KIB) as u64;
    assert_eq!(
        pool.cut_free_heads(),
        vec![(BASE, head as usize, A), (full, MIB - KIB, B)]
    );
    pool.check_invariants();
    assert_eq!(
        pool.chunks().iter().map(|c| (c.0, c.1)).collect::<Vec<_>>(),
        vec![
            (BASE + head, 300 * KIB as u64),
            (other, MIB as u64),
            (q, KIB as u64)
        ]
    );
    assert_eq!(pool.free_bytes(), MIB);
    assert_eq!(pool.cut_free_heads(), vec![], "nothing left to cut");
    pool.free(p, 300 * KIB, A);
    pool.check_invariants();
    assert_eq!(
        pool.release_empty_chunks(),
        vec![(BASE + head, 300 * KIB, A), (other, MIB, B)]
    );
    pool.check_invariants();
}

/// The head of an allocated block is freed, the rest stays allocated at its new start; the
/// free block of another stream just below it is adopted and the two coalesce.
#[test]
fn free_front_then_adopt_below_coalesces_across_owners() {
    let mut pool = pool_with_chunk(4 * MIB, B);
    let p = pool.allocate(MIB, B).unwrap();
    assert_eq!(p, BASE + 3 * MIB as u64);
    assert_eq!(pool.free_front(p, 1000, A), None, "unaligned head");
    assert_eq!(pool.free_front(p, MIB, A), None, "the whole block");
    assert_eq!(
        pool.free_front(p + 256, 256, A),
        None,
        "not an allocated block"
    );
    assert!(pool.free_front(p, 256 * KIB, A).is_some());
    pool.check_invariants();
    let rest = p + 256 * KIB as u64;
    assert_eq!(pool.allocation_count(), 1);
    assert_eq!(pool.other_owner_below(rest), Some(B));
    assert_eq!(pool.other_owner_below(p), None, "not allocated any more");
    pool.adopt_below(rest);
    pool.check_invariants();
    assert_eq!(pool.free_blocks(), vec![(BASE, rest - BASE, A)]);
    assert_eq!(
        (pool.free_bytes_of(A), pool.free_bytes_of(B)),
        ((rest - BASE) as usize, 0)
    );
    assert_eq!(pool.other_owner_below(rest), None);
    pool.free(rest, 768 * KIB, A);
    pool.check_invariants();
    assert_eq!(pool.free_blocks(), vec![(BASE, 4 * MIB as u64, A)]);
}

#[test]
fn exact_fit_removes_the_block() {
    let mut pool = pool_with_chunk(4 * KIB, A);
    assert_eq!(pool.allocate(4 * KIB, A), Some(BASE));
    pool.check_invariants();
    assert_eq!(pool.free_block_count(), 0);
    assert_eq!(pool.free_bytes(), 0);
    assert_eq!(pool.allocate(256, A), None);
    pool.free(BASE, 4 * KIB, A);
    pool.check_invariants();
    assert_eq!(pool.free_blocks(), vec![(BASE, 4 * KIB as u64, A)]);
}

/// Allocates three 1 KiB blocks x, y, z from a 3 KiB chunk.
fn three_blocks() -> (PoolCore, u64, u64, u64) {
    let mut pool = pool_with_chunk(3 * KIB, A);
    let x = pool.allocate(KIB, A).unwrap();
    let y = pool.allocate(KIB, A).unwrap();
    let z = pool.allocate(KIB, A).unwrap();
    let mut xyz = [x, y, z];
    xyz.sort_unstable();
    let [x, y, z] = xyz;
    assert_eq!((x, y, z), (BASE, BASE + 1024, BASE + 2048));
    assert_eq!(pool.free_block_count(), 0);
    (pool, x, y, z)
}

#[test]
fn free_coalesces_with_the_left_neighbour() {
    let (mut pool, x, y, _) = three_blocks();
    pool.free(x, KIB, A);
    pool.free(y, KIB, A);
    pool.check_invariants();
    assert_eq!(pool.free_blocks(), vec![(x, 2 * KIB as u64, A)]);
}

#[test]
fn free_coalesces_with_the_right_neighbour() {
    let (mut pool, _, y, z) = three_blocks();
    pool.free(z, KIB, A);
    pool.free(y, KIB, A);
    pool.check_invariants();
    assert_eq!(pool.free_blocks(), vec![(y, 2 * KIB as u64, A)]);
}

#[test]
fn free_coalesces_with_both_neighbours() {
    let (mut pool, x, y, z) = three_blocks();
    pool.free(x, KIB, A);
    pool.free(z, KIB, A);
    assert_eq!(pool.free_block_count(), 2);
    pool.free(y, KIB, A);
    pool.check_invariants();
    assert_eq!(pool.free_blocks(), vec![(x, 3 * KIB as u64, A)]);
    assert_eq!(pool.largest_free_block(), 3 * KIB);
}

#[test]
fn coalescing_moves_blocks_between_classes() {
    // 64 KiB of 256-byte blocks freed one by one grows one block through many classes.
    let mut pool = pool_with_chunk(64 * KIB, A);
    let mut ptrs: Vec<u64> = (0..256).map(|_| pool.allocate(256, A).unwrap()).collect();
    ptrs.sort_unstable();
    // Top down: each freed block absorbs its right neighbour.
    for (i, &p) in ptrs.iter().enumerate().rev() {
        pool.free(p, 256, A);
        pool.check_invariants();
        assert_eq!(pool.free_blocks(), vec![(p, (256 * (256 - i)) as u64, A)]);
    }
    // Bottom up: the left neighbour absorbs each freed block.
    assert_eq!(pool.allocate(64 * KIB, A), Some(BASE));
    pool.free(BASE, 64 * KIB, A);
    let mut ptrs: Vec<u64> = (0..256).map(|_| pool.allocate(256, A).unwrap()).collect();
    ptrs.sort_unstable();
    for (i, &p) in ptrs.iter().enumerate() {
        pool.free(p, 256, A);
        pool.check_invariants();
        assert_eq!(pool.free_blocks(), vec![(BASE, (256 * (i + 1)) as u64, A)]);
    }
}

#[test]
fn adjacent_chunks_never_merge() {
    let mut pool = PoolCore::new();
    let first = pool.add_chunk(BASE, 4 * KIB, A);
    let second = pool.add_chunk(BASE + 4096, 4 * KIB, A);
    assert_ne!(first, second);
    pool.check_invariants();
    assert_eq!(pool.free_block_count(), 2);
    assert_eq!(pool.chunk_count(), 2);
    assert_eq!(pool.chunk_bytes(), 8 * KIB);
    // A request for both together cannot be served.
    assert_eq!(pool.allocate(8 * KIB, A), None);
    let boundary = BASE + 4096;
    // Whole chunks freed in either order stay two blocks (the second free finds the other
    // chunk as its right, then its left, neighbour).
    for first_low in [true, false] {
        let a = pool.allocate(4 * KIB, A).unwrap();
        let b = pool.allocate(4 * KIB, A).unwrap();
        let (low, high) = (a.min(b), a.max(b));
        assert_eq!((low, high), (BASE, boundary));
        let order = if first_low { [low, high] } else { [high, low] };
        for p in order {
            pool.free(p, 4 * KIB, A);
            pool.check_invariants();
        }
        assert_eq!(
            pool.free_blocks(),
            vec![(BASE, 4096, A), (boundary, 4096, A)]
        );
    }
    // Pieces meeting exactly at the boundary do not merge either, freed in either order.
    for low_first in [true, false] {
        let parts: Vec<u64> = (0..32).map(|_| pool.allocate(256, A).unwrap()).collect();
        assert_eq!(pool.free_block_count(), 0);
        let (below, above) = (boundary - 256, boundary);
        assert!(parts.contains(&below) && parts.contains(&above));
        let order = if low_first {
            [below, above]
        } else {
            [above, below]
        };
        for p in order {
            pool.free(p, 256, A);
            pool.check_invariants();
        }
        assert_eq!(pool.free_blocks(), vec![(below, 256, A), (above, 256, A)]);
        for &p in parts.iter().filter(|&&p| p != below && p != above) {
            pool.free(p, 256, A);
            pool.check_invariants();
        }
        assert_eq!(pool.free_block_count(), 2);
    }
    assert_eq!(pool.release_empty_chunks().len(), 2);
}

#[test]
fn streams_do_not_merge_until_merge_stream() {
    let (mut pool, x, y, z) = three_blocks();
    pool.free(x, KIB, A);
    pool.free(y, KIB, B);
    pool.free(z, KIB, A);
    pool.check_invariants();
    assert_eq!(pool.free_block_count(), 3);
    assert_eq!(pool.free_bytes_of(A), 2 * KIB);
    assert_eq!(pool.free_bytes_of(B), KIB);
    // Neither stream can serve 2 KiB alone, nor serve from the other's block.
    assert_eq!(pool.allocate(2 * KIB, A), None);
    assert_eq!(pool.allocate(2 * KIB, B), None);
    assert_eq!(pool.stream_with_block(KIB, A), Some(B));
    assert_eq!(pool.stream_with_block(KIB, B), Some(A));
    assert_eq!(pool.stream_with_block(2 * KIB, B), None);
    pool.merge_stream(B, A);
    pool.check_invariants();
    assert_eq!(pool.free_blocks(), vec![(x, 3 * KIB as u64, A)]);
    assert_eq!(pool.free_bytes_of(A), 3 * KIB);
    assert_eq!(pool.free_bytes_of(B), 0);
    assert_eq!(pool.stream_with_block(KIB, A), None, "B owns nothing now");
    assert_eq!(pool.allocate(3 * KIB, A), Some(x));
}

#[test]
fn merge_stream_moves_every_block_and_coalesces_them_among_themselves() {
    // Alternate owners A, B, A, B, ...: after merging B into C, nothing merges (A in between);
    // after merging A into C too, the chunk is one block.
    let mut pool = pool_with_chunk(16 * KIB, C);
    let ptrs: Vec<u64> = (0..16).map(|_| pool.allocate(KIB, C).unwrap()).collect();
    for (i, &p) in ptrs.iter().enumerate() {
        pool.free(p, KIB, if i % 2 == 0 { A } else { B });
    }
    pool.check_invariants();
    assert_eq!(pool.free_block_count(), 16);
    pool.merge_stream(B, C);
    pool.check_invariants();
    assert_eq!(pool.free_block_count(), 16);
    assert_eq!(pool.free_bytes_of(C), 8 * KIB);
    pool.merge_stream(A, C);
    pool.check_invariants();
    assert_eq!(pool.free_blocks(), vec![(BASE, 16 * KIB as u64, C)]);
    // Merging a stream into itself, or one that owns nothing, changes nothing.
    pool.merge_stream(C, C);
    pool.merge_stream(A, C);
    pool.check_invariants();
    assert_eq!(pool.free_blocks(), vec![(BASE, 16 * KIB as u64, C)]);
}

#[test]
fn allocate_uses_only_the_streams_own_blocks() {
    let mut pool = pool_with_chunk(MIB, A);
    assert_eq!(pool.allocate(256, B), None, "B has never owned anything");
    let p = pool.allocate(MIB, A).unwrap();
    pool.free(p, MIB, B);
    assert_eq!(pool.allocate(256, A), None);
    assert_eq!(pool.allocate(MIB, B), Some(p));
    pool.check_invariants();
}

#[test]
fn stream_with_block_prefers_the_stream_with_most_free_bytes() {
    let mut pool = pool_with_chunk(16 * KIB, A);
    let p = pool.allocate(4 * KIB, A).unwrap();
    let q = pool.allocate(8 * KIB, A).unwrap();
    pool.free(p, 4 * KIB, B);
    pool.free(q, 8 * KIB, C);
    // A has 4 KiB, B 4 KiB, C 8 KiB.
    assert_eq!(pool.stream_with_block(KIB, B), Some(C));
    assert_eq!(
        pool.stream_with_block(KIB, C),
        Some(A),
        "tie goes to the smaller key"
    );
    assert_eq!(pool.stream_with_block(8 * KIB, A), Some(C));
    assert_eq!(pool.stream_with_block(8 * KIB, C), None);
    assert_eq!(pool.stream_with_block(usize::MAX, A), None);
}

#[test]
fn good_fit_takes_the_smaller_fitting_block() {
    // Free blocks of 8 KiB (first) and 2 KiB (second), separated by live blocks.
    let mut pool = pool_with_chunk(16 * KIB, A);
    let big = pool.allocate(8 * KIB, A).unwrap();
    let _sep1 = pool.allocate(KIB, A).unwrap();
    let small = pool.allocate(2 * KIB, A).unwrap();
    let _sep2 = pool.allocate(5 * KIB, A).unwrap();
    pool.free(big, 8 * KIB, A);
    pool.free(small, 2 * KIB, A);
    let p = pool.allocate(1500, A).unwrap();
    assert!(
        (small..small + 2048).contains(&p),
        "1536 bytes not from the 2 KiB block"
    );
    let q = pool.allocate(3 * KIB, A).unwrap();
    assert!((big..big + 8192).contains(&q));
    pool.check_invariants();
}

#[test]
fn a_lone_block_slightly_larger_than_the_request_is_found() {
    // 101 MiB and 101 MiB - 256 share a class (of 100 to 102 MiB), so the class search
    // alone, which starts at the next class, misses the block.
    let mut pool = pool_with_chunk(101 * MIB, A);
    let request = 101 * MIB - 256;
    let units = (request >> ALIGN_LOG2) as u64;
    assert_eq!(
        class_of(units),
        class_of(((101 * MIB) >> ALIGN_LOG2) as u64)
    );
    assert_ne!(search_class(units), Some(class_of(units)));
    assert_eq!(pool.largest_free_block_of(A), 101 * MIB);
    assert_eq!(pool.stream_with_block(request, B), Some(A));
    assert_eq!(pool.allocate(request, A), Some(BASE + 256));
    pool.check_invariants();
    assert_eq!(pool.free_bytes(), 256);
}

#[test]
fn sizes_are_rounded_up_on_allocate_and_free() {
    let mut pool = pool_with_chunk(4 * KIB, A);
    let p = pool.allocate(1, A).unwrap();
    let q = pool.allocate(257, A).unwrap();
    assert_eq!((p, q), (BASE + 4096 - 256, BASE + 4096 - 768));
    assert_eq!(pool.free_bytes(), 4 * KIB - 768);
    pool.free(q, 257, A);
    pool.free(p, 1, A);
    pool.check_invariants();
    assert_eq!(pool.free_blocks(), vec![(BASE, 4 * KIB as u64, A)]);
}

#[test]
fn requests_too_large_for_any_class_fail() {
    let mut pool = pool_with_chunk(MIB, A);
    assert_eq!(pool.allocate(usize::MAX, A), None);
    assert_eq!(pool.allocate(usize::MAX - 255, A), None);
    assert_eq!(pool.allocate(2 * MIB, A), None);
    pool.check_invariants();
}

#[test]
fn fully_freed_pool_coalesces_back_to_its_chunks_and_releases_them() {
    let mut pool = PoolCore::new();
    let chunks = [
        (BASE, 64 * KIB),
        (BASE + 64 * KIB as u64, 128 * KIB), // adjacent to the first
        (BASE + MIB as u64, 256 * KIB),
    ];
    for (i, &(base, size)) in chunks.iter().enumerate() {
        pool.add_chunk(base, size, [A, B, C][i]);
    }
    // Allocate everything in mixed sizes on each stream, then free in a scrambled order on
    // the other streams, then merge all into A.
    let mut live = Vec::new();
    for (i, s) in [A, B, C].into_iter().enumerate() {
        let mut k = 0;
        loop {
            let size = 256 * (1 + (k * 7 + i) % 13);
            k += 1;
            match pool.allocate(size, s) {
                Some(p) => live.push((p, size)),
                None if pool.free_bytes_of(s) == 0 => break,
                None => {}
            }
        }
    }
    assert_eq!(pool.free_bytes(), 0);
    let n = live.len();
    for j in 0..n {
        let (p, size) = live[(j * 7919) % n];
        pool.free(p, size, [A, B, C][j % 3]);
    }
    pool.check_invariants();
    assert_eq!(
        pool.release_empty_chunks(),
        vec![],
        "streams still split the chunks"
    );
    pool.merge_stream(B, A);
    pool.merge_stream(C, A);
    pool.check_invariants();
    let expected: Vec<(u64, u64, StreamKey)> =
        chunks.iter().map(|&(b, s)| (b, s as u64, A)).collect();
    assert_eq!(pool.free_blocks(), expected);
    assert_eq!(pool.free_bytes(), pool.chunk_bytes());
    let released = pool.release_empty_chunks();
    let with_owner: Vec<_> = chunks.iter().map(|&(b, s)| (b, s, A)).collect();
    assert_eq!(released, with_owner);
    pool.check_invariants();
    assert_eq!(pool.chunk_count(), 0);
    assert_eq!(pool.chunk_bytes(), 0);
    assert_eq!(pool.free_bytes(), 0);
    assert_eq!(pool.free_block_count(), 0);
    assert_eq!(pool.largest_free_block(), 0);
}

#[test]
fn release_keeps_chunks_in_use() {
    let mut pool = PoolCore::new();
    pool.add_chunk(BASE, 4 * KIB, A);
    pool.add_chunk(BASE + 8 * KIB as u64, 4 * KIB, A);
    let p = pool.allocate(4 * KIB, A).unwrap();
    assert_eq!(pool.release_empty_chunks().len(), 1);
    pool.check_invariants();
    assert_eq!(pool.chunk_bytes(), 4 * KIB);
    pool.free(p, 4 * KIB, A);
    assert_eq!(pool.release_empty_chunks(), vec![(p, 4 * KIB, A)]);
    pool.check_invariants();
    // Released ranges may come back as new chunks.
    pool.add_chunk(p, 4 * KIB, B);
    assert_eq!(pool.allocate(4 * KIB, B), Some(p));
    pool.check_invariants();
}

#[test]
#[should_panic(expected = "0-byte")]
fn zero_byte_allocate_panics() {
    pool_with_chunk(MIB, A).allocate(0, A);
}

#[test]
#[should_panic(expected = "aligned")]
fn unaligned_chunk_panics() {
    PoolCore::new().add_chunk(BASE + 16, MIB, A);
}

#[test]
#[should_panic(expected = "double free")]
fn double_free_panics() {
    let mut pool = pool_with_chunk(4 * KIB, A);
    let p = pool.allocate(KIB, A).unwrap();
    let _q = pool.allocate(KIB, A).unwrap();
    pool.free(p, KIB, A);
    pool.free(p, KIB, A);
}

#[test]
#[should_panic(expected = "not allocated from this pool")]
fn freeing_a_foreign_address_panics() {
    let mut pool = pool_with_chunk(4 * KIB, A);
    let p = pool.allocate(KIB, A).unwrap();
    pool.free(p + 256, 768, A);
}

#[test]
#[should_panic(expected = "allocated with 1024 bytes, freed with 2000")]
fn freeing_with_another_size_panics() {
    let mut pool = pool_with_chunk(4 * KIB, A);
    let p = pool.allocate(KIB, A).unwrap();
    pool.free(p, 2000, A);
}

#[test]
#[should_panic(expected = "overlaps a chunk")]
fn overlapping_chunk_panics() {
    let mut pool = pool_with_chunk(4 * KIB, A);
    pool.add_chunk(BASE + 3 * KIB as u64, 4 * KIB, A);
}

/// A random workload with 10,000 live blocks (the benchmark's shape), checked at intervals.
#[test]
fn ten_thousand_live_blocks_stay_consistent() {
    let mut pool = pool_with_chunk(1 << 30, A);
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut live: Vec<(u64, usize)> = Vec::new();
    for i in 0..60_000 {
        if live.len() < 10_000 || next() % 2 == 0 {
            let size = 1 + (next() % (64 * KIB as u64)) as usize;
            let p = pool.allocate(size, A).expect("pool has room");
            live.push((p, size));
        } else {
            let j = (next() % live.len() as u64) as usize;
            let (p, size) = live.swap_remove(j);
            pool.free(p, size, A);
        }
        if i % 10_000 == 0 {
            pool.check_invariants();
        }
    }
    let live_bytes: usize = live.iter().map(|&(_, s)| align_up(s).unwrap()).sum();
    assert_eq!(pool.free_bytes() + live_bytes, pool.chunk_bytes());
    for (p, size) in live.drain(..) {
        pool.free(p, size, A);
    }
    pool.check_invariants();
    assert_eq!(pool.free_blocks(), vec![(BASE, 1 << 30, A)]);
}

// ---- model-based test ----

/// The reference model: plain ordered maps, rebuilt by brute force, panicking on overlap.
#[derive(Debug, Default)]
struct Model {
    /// base → size.
    chunks: BTreeMap<u64, u64>,
    /// start → (size, owner); kept coalesced by `normalize`.
    free: BTreeMap<u64, (u64, StreamKey)>,
    /// start → (rounded size, requested size).
    live: BTreeMap<u64, (u64, usize)>,
}

/// Inserts `[start, start + size)` into `map`, panicking when it overlaps an entry.
fn insert_disjoint<V>(
    map: &mut BTreeMap<u64, V>,
    start: u64,
    size: u64,
    value: V,
    len: impl Fn(&V) -> u64,
) {
    assert!(size > 0);
    if let Some((&s, v)) = map.range(..=start).next_back() {
        assert!(
            s + len(v) <= start,
            "{start:#x}+{size:#x} overlaps {s:#x}+{:#x}",
            len(v)
        );
    }
    if let Some((&s, _)) = map.range(start..).next() {
        assert!(start + size <= s, "{start:#x}+{size:#x} overlaps {s:#x}");
    }
    map.insert(start, value);
}

impl Model {
    fn add_free(&mut self, start: u64, size: u64, owner: StreamKey) {
        insert_disjoint(&mut self.free, start, size, (size, owner), |v| v.0);
        // Free ranges may only cover chunk memory that is not live.
        let (&base, &csize) = self
            .chunks
            .range(..=start)
            .next_back()
            .expect("inside a chunk");
        assert!(start + size <= base + csize);
        if let Some((&s, &(n, _))) = self.live.range(..start + size).next_back() {
            assert!(s + n <= start, "free range overlaps live block");
        }
        self.normalize();
    }

    /// Merges adjacent free ranges of one owner that do not meet at a chunk base.
    fn normalize(&mut self) {
        let ranges: Vec<_> = std::mem::take(&mut self.free).into_iter().collect();
        let mut out: Vec<(u64, (u64, StreamKey))> = Vec::new();
        for (start, (size, owner)) in ranges {
            match out.last_mut() {
                Some((s, (n, o)))
                    if *s + *n == start && *o == owner && !self.chunks.contains_key(&start) =>
                {
                    *n += size
                }
                _ => out.push((start, (size, owner))),
            }
        }
        self.free = out.into_iter().collect();
    }

    fn free_of(&self, s: StreamKey) -> impl Iterator<Item = u64> + '_ {
        self.free.values().filter(move |v| v.1 == s).map(|v| v.0)
    }

    /// Whether the core must find a block of `s` for `size` bytes: one of `s`'s blocks is in
    /// a class at or above the search class, or the request's own class has few enough
    /// blocks to be probed whole and one of them fits.
    fn must_serve(&self, s: StreamKey, size: u64) -> bool {
        let units = size >> ALIGN_LOG2;
        let search = search_class(units);
        if self
            .free_of(s)
            .any(|n| search.is_some_and(|c| class_of(n >> ALIGN_LOG2) >= c))
        {
            return true;
        }
        let own = class_of(units);
        let in_own: Vec<u64> = self
            .free_of(s)
            .filter(|&n| class_of(n >> ALIGN_LOG2) == own)
            .collect();
        in_own.len() <= OWN_CLASS_PROBES && in_own.iter().any(|&n| n >= size)
    }

    fn can_serve(&self, s: StreamKey, size: u64) -> bool {
        self.free_of(s).any(|n| n >= size)
    }
}

#[derive(Debug, Clone)]
enum Op {
    AddChunk { units: u64, gap: u64, stream: u8 },
    Allocate { size: usize, stream: u8 },
    Free { pick: usize, stream: u8 },
    Merge { from: u8, into: u8 },
    Release,
    StreamWithBlock { size: usize, exclude: u8 },
    RemoveIdle { keep: Option<u8> },
}

fn any_size() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1..=64 * 256usize, 1 => 1..=4096 * 256usize]
}

fn any_op() -> impl Strategy<Value = Op> {
    let stream = 0..3u8;
    prop_oneof![
        3 => (prop_oneof![1..=64u64, 64..=8192u64], prop_oneof![Just(0u64), 1..=16u64], stream.clone())
            .prop_map(|(units, gap, stream)| Op::AddChunk { units, gap, stream }),
        12 => (any_size(), stream.clone()).prop_map(|(size, stream)| Op::Allocate { size, stream }),
        10 => (any::<usize>(), stream.clone()).prop_map(|(pick, stream)| Op::Free { pick, stream }),
        2 => (stream.clone(), stream.clone()).prop_map(|(from, into)| Op::Merge { from, into }),
        1 => Just(Op::Release),
        2 => (any_size(), stream.clone()).prop_map(|(size, exclude)| Op::StreamWithBlock { size, exclude }),
        1 => prop::option::of(stream).prop_map(|keep| Op::RemoveIdle { keep }),
    ]
}

fn key(s: u8) -> StreamKey {
    StreamKey(100 + u64::from(s))
}

/// Compares everything the core reports with the model.
fn check_against(pool: &PoolCore, model: &Model) {
    pool.check_invariants();
    let free: Vec<_> = model.free.iter().map(|(&s, &(n, o))| (s, n, o)).collect();
    assert_eq!(
        pool.free_blocks(),
        free,
        "free blocks differ from the model"
    );
    let chunks: Vec<_> = model.chunks.iter().map(|(&b, &n)| (b, n)).collect();
    let core_chunks: Vec<_> = pool.chunks().into_iter().map(|(b, n, _)| (b, n)).collect();
    assert_eq!(core_chunks, chunks, "chunks differ from the model");
    let free_bytes: u64 = model.free.values().map(|v| v.0).sum();
    let live_bytes: u64 = model.live.values().map(|v| v.0).sum();
    let chunk_bytes: u64 = model.chunks.values().sum();
    assert_eq!(pool.free_bytes() as u64, free_bytes);
    assert_eq!(pool.chunk_bytes() as u64, chunk_bytes);
    assert_eq!(
        chunk_bytes,
        free_bytes + live_bytes,
        "bytes lost or made up"
    );
    assert_eq!(pool.chunk_count(), model.chunks.len());
    assert_eq!(pool.free_block_count(), model.free.len());
    for s in 0..4 {
        assert_eq!(
            pool.free_bytes_of(key(s)) as u64,
            model.free_of(key(s)).sum::<u64>()
        );
        assert_eq!(
            pool.largest_free_block_of(key(s)) as u64,
            model.free_of(key(s)).max().unwrap_or(0)
        );
    }
    assert_eq!(
        pool.largest_free_block() as u64,
        model.free.values().map(|v| v.0).max().unwrap_or(0)
    );
}

fn run_ops(ops: Vec<Op>) {
    let mut pool = PoolCore::new();
    let mut model = Model::default();
    let mut next_base = BASE;
    for op in ops {
        match op {
            Op::AddChunk { units, gap, stream } => {
                let base = next_base + gap * ALIGN as u64;
                let size = units * ALIGN as u64;
                next_base = base + size;
                insert_disjoint(&mut model.chunks, base, size, size, |&n| n);
                pool.add_chunk(base, size as usize, key(stream));
                model.add_free(base, size, key(stream));
            }
            Op::Allocate { size, stream } => {
                let s = key(stream);
                let rounded = align_up(size).unwrap() as u64;
                match pool.allocate(size, s) {
                    Some(p) => {
                        assert_eq!(p % ALIGN as u64, 0);
                        // It must come from one free range of the same stream.
                        let (&start, &(n, owner)) = model
                            .free
                            .range(..=p)
                            .next_back()
                            .expect("allocated outside the free ranges");
                        assert!(p + rounded <= start + n, "allocated past a free range");
                        assert_eq!(owner, s, "allocated from another stream's block");
                        model.free.remove(&start);
                        if p > start {
                            model.free.insert(start, (p - start, owner));
                        }
                        if p + rounded < start + n {
                            model
                                .free
                                .insert(p + rounded, (start + n - p - rounded, owner));
                        }
                        insert_disjoint(&mut model.live, p, rounded, (rounded, size), |v| v.0);
                    }
                    None => assert!(
                        !model.must_serve(s, rounded),
                        "{s:?} could serve {rounded} bytes from {:?}",
                        model.free_of(s).collect::<Vec<_>>()
                    ),
                }
            }
            Op::Free { pick, stream } => {
                if model.live.is_empty() {
                    continue;
                }
                let (&p, &(rounded, size)) =
                    model.live.iter().nth(pick % model.live.len()).unwrap();
                model.live.remove(&p);
                pool.free(p, size, key(stream));
                model.add_free(p, rounded, key(stream));
            }
            Op::Merge { from, into } => {
                pool.merge_stream(key(from), key(into));
                for v in model.free.values_mut() {
                    if v.1 == key(from) {
                        v.1 = key(into);
                    }
                }
                model.normalize();
            }
            Op::Release => {
                let released = pool.release_empty_chunks();
                let expected: Vec<(u64, usize, StreamKey)> = model
                    .chunks
                    .iter()
                    .filter(|&(b, &n)| model.free.get(b).is_some_and(|v| v.0 == n))
                    .map(|(&b, &n)| (b, n as usize, model.free[&b].1))
                    .collect();
                assert_eq!(released, expected, "released chunks differ from the model");
                for (b, _, _) in released {
                    model.chunks.remove(&b);
                    model.free.remove(&b);
                }
            }
            Op::StreamWithBlock { size, exclude } => {
                let rounded = align_up(size).unwrap() as u64;
                let candidates: Vec<StreamKey> = pool
                    .streams_with_block(size, key(exclude))
                    .map(|(k, slot, bytes)| {
                        assert_eq!(pool.stream_slot(k), Some(slot));
                        assert_eq!(bytes, pool.free_bytes_of(k));
                        k
                    })
                    .collect();
                for s in (0..3).map(key).filter(|&s| s != key(exclude)) {
                    if model.must_serve(s, rounded) {
                        assert!(candidates.contains(&s), "{s:?} can serve {rounded}");
                    }
                    if candidates.contains(&s) {
                        assert!(model.can_serve(s, rounded), "{s:?} cannot serve {rounded}");
                    }
                }
                match pool.stream_with_block(size, key(exclude)) {
                    Some(t) => {
                        assert_ne!(t, key(exclude));
                        assert!(model.can_serve(t, rounded), "{t:?} cannot serve {rounded}");
                        // What it promises, allocate keeps.
                        assert!(pool.find_block(pool.stream_slots[&t.0], rounded).is_some());
                    }
                    None => {
                        for s in (0..3).map(key).filter(|&s| s != key(exclude)) {
                            assert!(!model.must_serve(s, rounded), "{s:?} could serve {rounded}");
                        }
                    }
                }
            }
            Op::RemoveIdle { keep } => {
                let keep = keep.map(key);
                let before: Vec<Option<u32>> = (0..3).map(|s| pool.stream_slot(key(s))).collect();
                let removed = pool.remove_idle_streams(keep);
                for s in 0..3u8 {
                    let owns = model.free_of(key(s)).next().is_some();
                    let slot = pool.stream_slot(key(s));
                    if owns || keep == Some(key(s)) {
                        assert_eq!(slot, before[s as usize], "{s} lost its slot");
                    } else {
                        assert_eq!(slot, None, "{s} owns nothing but keeps a slot");
                    }
                    if let Some(old) = before[s as usize] {
                        assert_eq!(removed.contains(&old), slot.is_none());
                    }
                }
            }
        }
        check_against(&pool, &model);
    }
}

proptest! {
    #![proptest_config(crate::test_support::xorshift(ProptestConfig::with_cases(512)))]

    #[test]
    fn matches_the_model(ops in prop::collection::vec(any_op(), 1..200)) {
        run_ops(ops);
    }
}
