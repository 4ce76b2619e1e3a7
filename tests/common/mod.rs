//! Shared test support: the resource acceptance suite (a port of RMM's `mr_ref_tests`) and a
//! small deterministic random number generator. Included by `tests/host` and `tests/cuda`.

#![allow(dead_code)]

pub mod arena_suite;
pub mod buffer_suite;
pub mod pool_suite;
pub mod stress;
pub mod suite;

/// SplitMix64, as in the shared benchmark workloads: deterministic and dependency-free.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `1..=max`.
    pub fn size(&mut self, max: usize) -> usize {
        1 + (self.next() % max as u64) as usize
    }
}
