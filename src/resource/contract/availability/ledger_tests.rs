//! The ledger of what each task holds, for deadlock detection.

use super::Availability;

/// Records from tasks spread over several workers (several shards) add up; a notify forgets
/// them all, whichever shard holds them, and a record after it counts again while the
/// stale shards of the old epoch stay forgotten.
#[test]
fn records_in_every_shard_count_until_the_next_notify() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    let a = std::sync::Arc::new(Availability::new());
    a.set_deadlock_detection(true);
    let record = |bytes: usize| {
        let a = a.clone();
        rt.spawn(async move {
            a.record_held(bytes);
            tokio::task::yield_now().await;
            a.record_held(bytes); // possibly on another worker: another shard
            tokio::task::id()
        })
    };
    // 16 tasks over 4 workers: some shard counts more than `FEW` of them, or all do in
    // turn when tokio runs them on one.
    let tasks: Vec<_> = (1..=16).map(|i| rt.block_on(record(i)).unwrap()).collect();
    let each_twice: usize = (1..=16).map(|i| 2 * i).sum();
    assert_eq!(a.holders.held_by(&tasks), each_twice);
    assert_eq!(a.holders.held_by(&tasks[..1]), 2);
    a.notify();
    assert_eq!(a.holders.held_by(&tasks), 0, "a notify left counts");
    a.notify(); // nothing recorded since: no new epoch, nothing changes
    let late = rt.block_on(record(1000)).unwrap();
    let all: Vec<_> = tasks.iter().copied().chain([late]).collect();
    assert_eq!(a.holders.held_by(&all), 2000, "old-epoch counts came back");
    a.notify();
    assert_eq!(a.holders.held_by(&all), 0);
}

/// One thread (one shard) counting more tasks than its short list holds: each task's
/// records add up whichever part of the shard holds them.
#[test]
fn a_shard_counts_many_tasks() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let a = std::sync::Arc::new(Availability::new());
    a.set_deadlock_detection(true);
    let n = 3 * super::FEW;
    let tasks: Vec<_> = (1..=n)
        .map(|i| {
            let a = a.clone();
            rt.block_on(rt.spawn(async move {
                a.record_held(i);
                a.record_held(i);
                tokio::task::id()
            }))
            .unwrap()
        })
        .collect();
    for (i, t) in tasks.iter().enumerate() {
        assert_eq!(a.holders.held_by(&[*t]), 2 * (i + 1));
    }
    assert_eq!(a.holders.held_by(&tasks), n * (n + 1));
}

/// Outside a tokio task nothing is counted (holdings there are unknown).
#[test]
fn records_outside_a_task_are_not_counted() {
    let a = Availability::new();
    a.record_held(4096);
    assert!(a.holders.shards.get().is_none());
}
