//! The writer's formats: RMM's column formats, and the hand-written formatter against them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::rmm_csv::fields::ALLOCATE_FAILURE;

#[test]
fn columns_are_formatted_as_rmm_prints_them() {
    assert_eq!(CPointer(0).to_string(), "(nil)");
    assert_eq!(CPointer(0xABC0).to_string(), "0xabc0");
    // libstdc++ prints a null pointer through `std::hex` as `0`, without `0x`.
    assert_eq!(StreamHandle(0).to_string(), "0");
    assert_eq!(StreamHandle(0x55d0_c2a3_e610).to_string(), "0x55d0c2a3e610");
    let at = |secs: u64, micros: u64| {
        TimeOfDay(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros))
            .to_string()
    };
    assert_eq!(at(0, 0), "00:00:00.000000");
    assert_eq!(at(86_399, 999_999), "23:59:59.999999");
    assert_eq!(at(86_400 * 365 + 13 * 3600 + 7, 42), "13:00:07.000042");
    // Before the epoch (a clock set far back): midnight, never a panic.
    assert_eq!(
        TimeOfDay(UNIX_EPOCH - Duration::from_secs(5)).to_string(),
        "00:00:00.000000"
    );
    // The longest line fits.
    let longest = format!(
        "{},{},{ALLOCATE_FAILURE},{},{},{}\n",
        u64::MAX,
        at(0, 0),
        CPointer(u64::MAX),
        usize::MAX,
        StreamHandle(u64::MAX)
    );
    assert!(longest.len() <= MAX_LINE, "{} > {MAX_LINE}", longest.len());
}

/// The writer thread's byte formatter prints what the `Display` types (RMM's formats) print,
/// on the edges of every column.
#[test]
fn the_byte_formatter_prints_what_the_display_types_print() {
    let times = [
        UNIX_EPOCH,
        UNIX_EPOCH - Duration::from_secs(5),
        UNIX_EPOCH + Duration::from_secs(86_399) + Duration::from_micros(999_999),
        UNIX_EPOCH
            + Duration::from_secs(86_400 * 20_000 + 13 * 3600 + 7)
            + Duration::from_nanos(42_999),
        SystemTime::now(),
    ];
    let numbers = [
        0,
        1,
        9,
        10,
        0xf,
        0x10,
        255,
        1 << 40,
        0x7f3a_5c00_0000,
        u64::MAX - 1,
        u64::MAX,
    ];
    let mut line = Vec::new();
    // One formatter throughout: its kept thread, stream and second are hit and missed.
    let mut formatter = LineFormatter::default();
    for time in times {
        for &n in &numbers {
            for action in [Action::Allocate, Action::AllocateFailure, Action::Free] {
                let record = Record {
                    stamp: 0,
                    thread: n,
                    ptr: n,
                    bytes: n as usize,
                    stream: n.rotate_left(7),
                    action,
                };
                line.clear();
                let nanos = time
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                formatter.line(&mut line, &record, nanos);
                let expected = format!(
                    "{n},{},{action},{},{},{}\n",
                    TimeOfDay(time),
                    CPointer(n),
                    n as usize,
                    StreamHandle(n.rotate_left(7))
                );
                assert_eq!(String::from_utf8(line.clone()).unwrap(), expected);
                assert!(line.len() <= MAX_LINE);
            }
        }
    }
}
