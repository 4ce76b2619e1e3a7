//! The pool's count of allocated bytes and their peak, when asked for (PyTorch's
//! `memory_allocated` and `max_memory_allocated`).
//!
//! The pool's fast path keeps no shared counter: each stream's shard is locked on its own, so
//! threads on different streams never write one cache line (the mt16 workload's throughput
//! grows with threads). An exact peak of the sum over every shard needs exactly such a line,
//! written by every allocation and free; so it is kept only when the pool is made with
//! [`PoolResource::with_peak_allocated`](super::PoolResource::with_peak_allocated).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

/// Allocated bytes (as the pool rounds them) and their peak, counted while `on`. On a line of
/// its own, so that counting does not slow reads of the pool's other fields.
#[repr(align(64))]
#[derive(Default)]
pub(super) struct PeakCounter {
    on: AtomicBool,
    /// Signed: a free is counted out before it is checked, and a double free counted back in
    /// afterwards, so the count may dip below zero meanwhile.
    bytes: AtomicI64,
    peak: AtomicUsize,
}

impl PeakCounter {
    /// Counts from now on, starting from the `bytes` allocated now (which is also the peak).
    pub(super) fn start(&self, bytes: usize) {
        self.bytes.store(bytes as i64, Ordering::Relaxed);
        self.peak.store(bytes, Ordering::Relaxed);
        self.on.store(true, Ordering::Relaxed);
    }

    /// Counts an allocation of `bytes` (rounded).
    #[inline]
    pub(super) fn add(&self, bytes: usize) {
        if self.on.load(Ordering::Relaxed) {
            // Every count is one step of a single order of additions, so the largest value a
            // step returns is the peak of that order.
            // Wrapping as the atomic's own add: this runs in `deallocate`, which never panics.
            let added = bytes as i64;
            let now = self
                .bytes
                .fetch_add(added, Ordering::Relaxed)
                .wrapping_add(added)
                .max(0) as usize;
            if now > self.peak.load(Ordering::Relaxed) {
                self.peak.fetch_max(now, Ordering::Relaxed);
            }
        }
    }

    /// Counts a free of `bytes` (rounded).
    #[inline]
    pub(super) fn sub(&self, bytes: usize) {
        if self.on.load(Ordering::Relaxed) {
            self.bytes.fetch_sub(bytes as i64, Ordering::Relaxed);
        }
    }

    /// Makes the peak what is allocated now.
    pub(super) fn reset_peak(&self) {
        self.peak.store(self.current(), Ordering::Relaxed);
    }

    fn current(&self) -> usize {
        self.bytes.load(Ordering::Relaxed).max(0) as usize
    }

    /// The allocated bytes and their peak, when counted.
    pub(super) fn figures(&self) -> Option<(usize, usize)> {
        self.on
            .load(Ordering::Relaxed)
            .then(|| (self.current(), self.peak.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::PeakCounter;

    #[test]
    fn nothing_is_counted_until_started() {
        let c = PeakCounter::default();
        c.add(512);
        assert_eq!(c.figures(), None);
        c.start(256);
        assert_eq!(c.figures(), Some((256, 256)));
    }

    #[test]
    fn the_peak_is_the_most_allocated_at_once_until_reset() {
        let c = PeakCounter::default();
        c.start(0);
        c.add(256);
        c.add(1024);
        c.sub(256);
        c.add(512);
        assert_eq!(c.figures(), Some((1536, 1536)));
        c.sub(1024);
        assert_eq!(c.figures(), Some((512, 1536)));
        c.reset_peak();
        assert_eq!(c.figures(), Some((512, 512)));
    }

    #[test]
    fn a_free_counted_back_in_leaves_the_peak_alone() {
        let c = PeakCounter::default();
        c.start(0);
        // A double free with nothing live: out, then back in.
        c.sub(4096);
        c.add(256);
        c.add(4096);
        assert_eq!(c.figures(), Some((256, 256)));
    }

    #[test]
    fn threads_counting_at_once_leave_an_exact_count_and_a_reachable_peak() {
        let c = PeakCounter::default();
        c.start(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        c.add(256);
                        c.sub(256);
                    }
                });
            }
        });
        let (bytes, peak) = c.figures().unwrap();
        assert_eq!(bytes, 0);
        assert!(
            (256..=4 * 256).contains(&peak),
            "{peak}: at most four blocks were live at once"
        );
    }
}
