//! `RUSTFLAGS="--cfg loom" cargo test --lib --release loom_tests`
//!
//! The tracking table's claims, on a table of one bucket (two slots under loom).

use loom::thread;

use super::table::{Entry, Insert, Table};
use crate::sync::Arc;

fn entry(addr: u64, bytes: u64, stream: u64) -> Entry {
    Entry {
        addr,
        bytes,
        stream,
    }
}

fn snapshot(table: &Table) -> Vec<Entry> {
    let mut all = Vec::new();
    table.for_each(|e| all.push(e));
    all
}

/// A snapshot racing with a slot that is emptied and refilled (with another record at the
/// same address, and with a record at another address) sees only whole records. (The
/// snapshot runs on the spawned thread: loom backtracks from a load that follows a store, so
/// the writes come first in its first execution.)
#[test]
fn a_snapshot_never_sees_half_a_record() {
    loom::model(|| {
        let table = Arc::new(Table::new(1));
        assert_eq!(table.insert(0x100, 1, 1), Insert::Done);
        let reader = {
            let table = table.clone();
            thread::spawn(move || {
                for e in snapshot(&table) {
                    assert!(
                        [entry(0x100, 1, 1), entry(0x100, 2, 2), entry(0x200, 3, 3)].contains(&e),
                        "a torn record: {e:?}"
                    );
                }
            })
        };
        assert_eq!(table.remove(0x100), Some(entry(0x100, 1, 1)));
        assert_eq!(table.insert(0x100, 2, 2), Insert::Done);
        assert_eq!(table.remove(0x100), Some(entry(0x100, 2, 2)));
        assert_eq!(table.insert(0x200, 3, 3), Insert::Done);
        reader.join().unwrap();
        assert_eq!(snapshot(&table), [entry(0x200, 3, 3)]);
    });
}

/// Two threads inserting into the same bucket take different slots; each removes its own
/// record and gets its own fields back.
#[test]
fn concurrent_insertions_take_different_slots() {
    loom::model(|| {
        let table = Arc::new(Table::new(1));
        let other = {
            let table = table.clone();
            thread::spawn(move || {
                assert_eq!(table.insert(0x200, 2, 2), Insert::Done);
                table.remove(0x200)
            })
        };
        assert_eq!(table.insert(0x100, 1, 1), Insert::Done);
        assert_eq!(table.remove(0x100), Some(entry(0x100, 1, 1)));
        assert_eq!(other.join().unwrap(), Some(entry(0x200, 2, 2)));
        assert!(snapshot(&table).is_empty());
    });
}

/// A double free racing with itself: exactly one removal gets the record.
#[test]
fn racing_removals_of_one_record_take_it_once() {
    loom::model(|| {
        let table = Arc::new(Table::new(1));
        assert_eq!(table.insert(0x100, 1, 1), Insert::Done);
        let other = {
            let table = table.clone();
            thread::spawn(move || table.remove(0x100))
        };
        let mine = table.remove(0x100);
        let theirs = other.join().unwrap();
        assert_eq!(mine.or(theirs), Some(entry(0x100, 1, 1)));
        assert!(mine.is_none() || theirs.is_none(), "removed twice");
        assert!(snapshot(&table).is_empty());
    });
}

/// A record freed on another thread than its allocation's (the handoff through a channel
/// orders them): the removal sees the whole record, and the slot is reused cleanly.
#[test]
fn a_record_freed_on_another_thread_is_whole() {
    loom::model(|| {
        let table = Arc::new(Table::new(1));
        let (tx, rx) = loom::sync::mpsc::channel();
        let freer = {
            let table = table.clone();
            thread::spawn(move || {
                let addr = rx.recv().unwrap();
                table.remove(addr)
            })
        };
        assert_eq!(table.insert(0x100, 7, 9), Insert::Done);
        tx.send(0x100).unwrap();
        assert_eq!(table.insert(0x200, 1, 1), Insert::Done);
        assert_eq!(freer.join().unwrap(), Some(entry(0x100, 7, 9)));
        assert_eq!(snapshot(&table), [entry(0x200, 1, 1)]);
    });
}
