use std::time::Duration;

use super::{FreeOrder, MAX_EVENTS};
use crate::device::Device;
use crate::stream::Stream;
use crate::test_support::hold;

#[test]
fn stamps_name_frees_across_the_32_bit_wrap() {
    let device = Device::host();
    let s = Stream::new(&device).unwrap();
    let mut order = FreeOrder::new(&s);
    let near_wrap = u64::from(u32::MAX) - 1;
    order.changed_to(near_wrap);
    order.changed_to(near_wrap + 5); // past 2^32
    assert_eq!(order.free_of_stamp(near_wrap as u32), near_wrap);
    assert_eq!(order.free_of_stamp((near_wrap + 5) as u32), near_wrap + 5);
    assert_eq!(order.free_of_stamp((near_wrap + 3) as u32), near_wrap + 3);
}

#[test]
fn an_eager_stream_keeps_a_bounded_list_of_events() {
    let device = Device::host();
    let s = Stream::new(&device).unwrap();
    let mut order = FreeOrder::new(&s);
    order.set_eager();
    // The stream is held up, so no event completes and none can be pruned but by the bound.
    let held = hold(&s, Duration::from_secs(10));
    for free in 1..=3 * MAX_EVENTS as u64 {
        order.changed_to(free);
    }
    assert_eq!(order.events.len(), MAX_EVENTS);
    assert_eq!(
        order.events.back().map(|e| e.1),
        Some(3 * MAX_EVENTS as u64)
    );
    // Once the stream has passed them, a new event drops the completed ones.
    drop(held);
    s.synchronize_blocking().unwrap();
    order.changed_to(3 * MAX_EVENTS as u64 + 1);
    assert!(
        order.events.len() <= 2,
        "{} events kept",
        order.events.len()
    );
}

#[test]
fn a_taker_of_an_old_free_waits_on_the_event_after_it_and_not_once_it_passed() {
    let device = Device::host();
    let (s, t) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let mut order = FreeOrder::new(&s);
    order.set_eager();
    order.changed_to(1);
    // S's work between the frees, held while the test looks at what T waits for.
    let work = hold(&s, Duration::from_secs(10));
    order.changed_to(2);
    let s_done = s.record().unwrap();
    order.order_upto(&t, 1).unwrap();
    t.synchronize_blocking().unwrap();
    assert!(
        !s_done.is_complete().unwrap(),
        "T waited for the event after free 2, not free 1"
    );
    // T is known to be past free 1: taking it again adds nothing; free 2 needs its event.
    assert_eq!(order.waited(t.id()), 1);
    order.order_upto(&t, 2).unwrap();
    assert_eq!(order.waited(t.id()), 2);
    drop(work);
    s.synchronize_blocking().unwrap();
}
