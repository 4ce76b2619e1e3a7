//! The `Time` column's clock: what a call reads (a stamp, under the lock that orders the lines)
//! and how the writer turns stamps into times of day.
//!
//! `SystemTime::now` costs 20–30 ns (a `clock_gettime`); a log line costs the caller little
//! else, and a pair of calls reads it twice. Where Linux itself keeps time with the CPU's
//! time-stamp counter (clocksource `tsc`: invariant and synchronised across cores, or the
//! kernel would not use it), or could (see `system_keeps_time_by_ticks`), a call reads the counter instead (`rdtsc`, ~9 ns), and the writer
//! converts: each batch reads the counter, `Instant` and `SystemTime` once, and a stamp is that
//! time of day less the ticks since the stamp at the counter's rate. The rate is measured
//! against `Instant` since the adaptor was made, so its error over a stamp's age is at most
//! the jitter of two clock reads: well under the column's microsecond.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::backend::cpu_clock::{system_keeps_time_by_ticks, ticks};

/// A clock the builder was given.
pub(super) type Clock = Box<dyn Fn() -> SystemTime + Send + Sync>;

/// What the hot path reads for a line's time.
pub(super) enum Stamps {
    /// The builder's clock, called for every line: nanoseconds since the Unix epoch.
    Custom(Clock),
    /// `SystemTime::now` for every line: nanoseconds since the Unix epoch.
    System,
    /// The time-stamp counter, in ticks: see the module's comment.
    Ticks(TickOrigin),
}

/// A counter reading and the `Instant` read with it, when the adaptor was made.
#[derive(Clone, Copy)]
pub(super) struct TickOrigin {
    ticks: u64,
    at: Instant,
}

impl Stamps {
    /// The builder's clock if it was given one; else the counter where it keeps the system's
    /// time; else `SystemTime::now`.
    pub(super) fn new(custom: Option<Clock>) -> Self {
        match custom {
            Some(clock) => Stamps::Custom(clock),
            None => match ticks() {
                Some(ticks) if system_keeps_time_by_ticks() => Stamps::Ticks(TickOrigin {
                    ticks,
                    at: Instant::now(),
                }),
                _ => Stamps::System,
            },
        }
    }

    /// A line's stamp, read now.
    #[inline]
    pub(super) fn read(&self) -> u64 {
        match self {
            Stamps::Ticks(_) => ticks().unwrap_or(0),
            Stamps::System => unix_nanos(SystemTime::now()),
            Stamps::Custom(clock) => unix_nanos(clock()),
        }
    }

    /// What turns this clock's stamps into times, for the writer.
    pub(super) fn reader(&self) -> StampReader {
        match self {
            Stamps::Ticks(origin) => StampReader::Ticks(*origin),
            Stamps::System | Stamps::Custom(_) => StampReader::Nanos,
        }
    }
}

/// Turns stamps into nanoseconds since the Unix epoch, on the writer's side.
#[derive(Clone, Copy)]
pub(super) enum StampReader {
    /// The stamps are the time already.
    Nanos,
    /// The stamps are counter ticks since this origin.
    Ticks(TickOrigin),
}

impl StampReader {
    /// The conversion for a batch written now.
    pub(super) fn now(self) -> Conversion {
        let StampReader::Ticks(origin) = self else {
            return Conversion::Nanos;
        };
        let ticks_now = ticks().unwrap_or(origin.ticks);
        let nanos_now = unix_nanos(SystemTime::now());
        let elapsed = origin.at.elapsed().as_nanos() as f64;
        let ticks_elapsed = ticks_now.saturating_sub(origin.ticks);
        // With no tick yet counted, every stamp is of now.
        let nanos_per_tick = if ticks_elapsed == 0 {
            0.0
        } else {
            elapsed / ticks_elapsed as f64
        };
        Conversion::Ticks {
            ticks_now,
            nanos_now,
            nanos_per_tick,
        }
    }
}

/// Stamps to nanoseconds since the Unix epoch, for one batch.
#[derive(Clone, Copy)]
pub(super) enum Conversion {
    Nanos,
    Ticks {
        ticks_now: u64,
        nanos_now: u64,
        nanos_per_tick: f64,
    },
}

impl Conversion {
    /// The time of `stamp`, in nanoseconds since the Unix epoch. `last` is the time of the
    /// stamp before: counter stamps are converted batch by batch, and a batch's conversion may
    /// put its first line a little before the last of the batch before, so such a line gets
    /// the time before it instead. The times of other clocks are written as they were read.
    #[inline]
    pub(super) fn unix_nanos(self, stamp: u64, last: &mut u64) -> u64 {
        match self {
            Conversion::Nanos => stamp,
            Conversion::Ticks {
                ticks_now,
                nanos_now,
                nanos_per_tick,
            } => {
                let ago = ticks_now.saturating_sub(stamp) as f64 * nanos_per_tick;
                *last = nanos_now.saturating_sub(ago as u64).max(*last);
                *last
            }
        }
    }
}

/// Nanoseconds since the Unix epoch; 0 for times before it (printed as midnight, as before).
pub(super) fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Stamps of the counter read back as the time they were read, to well within the
    /// column's microsecond plus what reading the system clock beside them costs.
    #[test]
    fn counter_stamps_read_back_as_the_time_they_were_taken() {
        let stamps = Stamps::new(None);
        let reader = stamps.reader();
        std::thread::sleep(Duration::from_millis(20));
        let mut taken = Vec::new();
        for _ in 0..5 {
            let before = unix_nanos(SystemTime::now());
            let stamp = stamps.read();
            let after = unix_nanos(SystemTime::now());
            taken.push((before, stamp, after));
            std::thread::sleep(Duration::from_millis(10));
        }
        let conversion = reader.now();
        let mut last = 0;
        for (before, stamp, after) in taken {
            let previous = last;
            let at = conversion.unix_nanos(stamp, &mut last);
            // A slack of 200 µs for a clock read preempted on a loaded machine.
            let slack = 200_000;
            assert!(
                before - slack <= at && at <= after + slack,
                "{before} <= {at} <= {after}"
            );
            assert!(at >= previous, "times go up with the stamps");
        }
    }

    #[test]
    fn the_builders_clock_is_read_for_every_line() {
        let stamps = Stamps::new(Some(Box::new(|| UNIX_EPOCH + Duration::from_nanos(42))));
        assert_eq!(stamps.read(), 42);
        assert_eq!(
            stamps.reader().now().unix_nanos(stamps.read(), &mut 100),
            42
        );
        let before_epoch = Stamps::new(Some(Box::new(|| UNIX_EPOCH - Duration::from_secs(1))));
        assert_eq!(before_epoch.read(), 0);
    }
}
