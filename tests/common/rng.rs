//! SplitMix64, exactly as `../shared/bench/WORKLOADS.md` gives it: deterministic and
//! dependency-free. Shared by the integration tests, the crate's unit tests
//! (`src/test_support.rs`) and the benches (`benches/common/workloads.rs`).

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
    #[allow(dead_code)] // not every includer draws sizes
    pub fn size(&mut self, max: usize) -> usize {
        1 + (self.next() % max as u64) as usize
    }

    /// Uniform in `0..n`.
    #[allow(dead_code)]
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
