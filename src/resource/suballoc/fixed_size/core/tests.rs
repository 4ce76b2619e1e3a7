//! The fixed-size core alone: address-ordered blocks, frees onto the freeing stream's list,
//! foreign pointers and double frees refused, lists trading blocks, idle lists forgotten.

use super::*;

const BASE: u64 = 0x10_0000;
const BLOCK: usize = 1024;

#[test]
fn blocks_come_in_address_order_and_go_back_to_the_freeing_stream() {
    let mut core = FixedSizeCore::<u8>::new(BLOCK, 4);
    let a = core.slot_or_insert(StreamId(1), || 1);
    core.add_chunk(BASE, a);
    assert_eq!(
        (core.free_blocks(), core.live(), core.chunk_count()),
        (4, 0, 1)
    );
    let blocks: Vec<u64> = (0..4).map(|_| core.allocate(a).unwrap()).collect();
    assert_eq!(blocks, [BASE, BASE + 1024, BASE + 2048, BASE + 3072]);
    assert_eq!(core.allocate(a), None);
    assert_eq!((core.free_blocks(), core.live()), (0, 4));

    // A free on another stream makes that stream's list, with its payload.
    assert_eq!(core.free(BASE + 1024, StreamId(2), || 2).copied(), Some(2));
    assert_eq!((core.free_blocks(), core.live()), (1, 3));
    // A double free, an address inside a block and one outside every chunk change nothing.
    assert!(core.free(BASE + 1024, StreamId(2), || 3).is_none());
    assert!(core.free(BASE + 256, StreamId(1), || 3).is_none());
    assert!(core.free(BASE + 4096, StreamId(1), || 3).is_none());
    assert_eq!((core.free_blocks(), core.live()), (1, 3));
    assert_eq!(core.allocate(a), None, "the block is on stream 2's list");

    // Stream 1 takes from stream 2: the victim is the other list with blocks.
    let b = core.pick_victim(Some(a), |o| *o).unwrap();
    assert_ne!(b, a);
    assert_eq!(
        core.pick_victim(Some(b), |o| *o),
        None,
        "stream 1's list is empty"
    );
    core.move_half(b, a);
    assert_eq!(core.allocate(a), Some(BASE + 1024));
    assert_eq!(core.allocate(b), None);

    // Stream 2's list is empty: forgotten, its slot reused by the next new stream.
    core.forget_idle(Some(a));
    assert_eq!(core.orders_mut().count(), 1);
    assert_eq!(core.slot_or_insert(StreamId(3), || 9), b);
    assert_eq!(*core.order_mut(b), 9);

    for block in blocks {
        core.free(block, StreamId(1), || 1).unwrap();
    }
    assert_eq!((core.free_blocks(), core.live()), (4, 0));
    assert_eq!(core.take_chunks(), [BASE]);
    assert_eq!((core.free_blocks(), core.chunk_count()), (0, 0));
    assert_eq!(core.orders_mut().count(), 0);
}

#[test]
fn the_victim_is_the_best_ranked_then_the_fullest_list() {
    let mut core = FixedSizeCore::<u8>::new(BLOCK + 256, 3);
    let slots: Vec<u32> = (1..=3)
        .map(|s| core.slot_or_insert(StreamId(s), || s as u8))
        .collect();
    core.add_chunk(BASE, slots[1]);
    core.add_chunk(BASE + 0x10_0000, slots[2]);
    // Equal counts: the higher rank wins; a rank that ties falls back to the fuller list.
    assert_eq!(core.pick_victim(Some(slots[0]), |o| *o), Some(slots[2]));
    assert_eq!(
        core.pick_victim(Some(slots[0]), |o| u8::MAX - *o),
        Some(slots[1])
    );
    core.allocate(slots[2]).unwrap();
    assert_eq!(core.pick_victim(Some(slots[0]), |_| 0), Some(slots[1]));
    // Half, rounded up, moves: 3 blocks give 2.
    core.move_half(slots[1], slots[0]);
    let moved = std::iter::from_fn(|| core.allocate(slots[0])).count();
    assert_eq!(moved, 2);
    // Blocks of a size that is not a power of two are found by division.
    assert!(core.free(BASE + 1280, StreamId(1), || 1).is_some());
    assert!(core.free(BASE + 1024, StreamId(1), || 1).is_none());
}
