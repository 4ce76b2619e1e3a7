//! Random operation sequences on the fixed-size resource's core
//! (`src/resource/suballoc/fixed_size/core.rs`) checked against a shadow model after every operation:
//! a block handed out is a block boundary of one chunk and not live already, a list serves
//! exactly when the model says it holds blocks, a freed block is reusable at once, double and
//! foreign frees are refused without a change, stealing moves half a victim's blocks, and the
//! counters equal the model's.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use streamalloc::fuzzing::{FixedSizeCore, ALIGN};

const STREAMS: u64 = 4;

#[derive(Arbitrary, Debug)]
enum Op {
    AddChunk {
        stream: u8,
        gap: u8,
    },
    Alloc {
        stream: u8,
    },
    Free {
        pick: u16,
        stream: u8,
    },
    FreeReuse {
        pick: u16,
        stream: u8,
    },
    /// A double free or an address that is not a block start: refused, nothing changes.
    BadFree {
        pick: u16,
        offset: u16,
    },
    /// What the wrapper does when a stream's list is empty: take half of another's.
    Steal {
        stream: u8,
    },
    ForgetIdle {
        keep: u8,
    },
    TakeChunks,
}

#[derive(Arbitrary, Debug)]
struct Input {
    block_units: u8,
    per_chunk: u8,
    ops: Vec<Op>,
}

struct Model {
    block: u64,
    per_chunk: u64,
    chunks: BTreeSet<u64>,
    live: BTreeSet<u64>,
    /// Blocks that were handed out and freed since (a second free must be refused).
    freed: BTreeSet<u64>,
    free_of: [usize; STREAMS as usize],
    /// slot → stream, for the lists the core holds.
    slots: BTreeMap<u32, u64>,
    next_base: u64,
}

impl Model {
    fn slot(&mut self, core: &mut FixedSizeCore, s: u64) -> u32 {
        let slot = core.slot_or_insert(s, s);
        assert_eq!(core.payload(slot), s, "slot {slot} payload");
        if let Some(&other) = self.slots.get(&slot) {
            assert_eq!(other, s, "slot {slot} of two streams");
        }
        self.slots.insert(slot, s);
        slot
    }

    fn pick(&self, pick: u16) -> Option<u64> {
        (!self.live.is_empty()).then(|| {
            *self
                .live
                .iter()
                .nth(pick as usize % self.live.len())
                .unwrap()
        })
    }

    fn allocated(&mut self, addr: u64, s: u64) {
        let base = *self
            .chunks
            .range(..=addr)
            .next_back()
            .expect("below every chunk");
        let off = addr - base;
        assert!(
            off < self.block * self.per_chunk && off.is_multiple_of(self.block),
            "{addr:#x} not a block"
        );
        assert!(self.live.insert(addr), "{addr:#x} handed out twice");
        self.freed.remove(&addr);
        self.free_of[s as usize] -= 1;
    }

    fn freed(&mut self, addr: u64, s: u64) {
        assert!(self.live.remove(&addr));
        self.freed.insert(addr);
        self.free_of[s as usize] += 1;
    }

    fn check(&self, core: &FixedSizeCore) {
        assert_eq!(core.live(), self.live.len(), "live");
        assert_eq!(
            core.free_blocks(),
            self.free_of.iter().sum::<usize>(),
            "free blocks"
        );
        assert_eq!(core.chunk_count(), self.chunks.len(), "chunks");
        assert_eq!(
            core.live() + core.free_blocks(),
            self.chunks.len() * self.per_chunk as usize,
            "blocks lost"
        );
    }
}

fuzz_target!(|input: Input| {
    let block = (input.block_units as u64 % 64 + 1) * ALIGN as u64;
    let per_chunk = input.per_chunk as u64 % 130 + 1;
    let mut core = FixedSizeCore::new(block as usize, per_chunk as usize);
    let mut m = Model {
        block,
        per_chunk,
        chunks: BTreeSet::new(),
        live: BTreeSet::new(),
        freed: BTreeSet::new(),
        free_of: [0; STREAMS as usize],
        slots: BTreeMap::new(),
        next_base: 1 << 20,
    };
    for op in input.ops {
        match op {
            Op::AddChunk { stream, gap } => {
                let s = stream as u64 % STREAMS;
                let slot = m.slot(&mut core, s);
                let base = m.next_base + (gap % 3) as u64 * ALIGN as u64;
                core.add_chunk(base, slot);
                m.chunks.insert(base);
                m.free_of[s as usize] += per_chunk as usize;
                m.next_base = base + block * per_chunk;
            }
            Op::Alloc { stream } => {
                let s = stream as u64 % STREAMS;
                let slot = m.slot(&mut core, s);
                match core.allocate(slot) {
                    Some(addr) => m.allocated(addr, s),
                    None => assert_eq!(m.free_of[s as usize], 0, "stream {s} has blocks"),
                }
            }
            Op::Free { pick, stream } | Op::FreeReuse { pick, stream } => {
                let Some(addr) = m.pick(pick) else { continue };
                let s = stream as u64 % STREAMS;
                assert!(core.free(addr, s, s), "free of live {addr:#x}");
                m.freed(addr, s);
                let slot = m.slot(&mut core, s);
                if matches!(op, Op::FreeReuse { .. }) {
                    let again = core.allocate(slot).expect("a freed block is reusable");
                    m.allocated(again, s);
                }
            }
            Op::BadFree { pick, offset } => {
                let before = (core.live(), core.free_blocks());
                let addr = match (
                    m.freed.iter().nth(pick as usize % m.freed.len().max(1)),
                    offset % 2,
                ) {
                    (Some(&addr), 0) => addr,
                    _ => match m.pick(pick) {
                        Some(addr) => {
                            addr + (offset as u64 % (block / ALIGN as u64).max(2)).max(1)
                                * ALIGN as u64
                                % block.max(1)
                        }
                        None => m.next_base + offset as u64,
                    },
                };
                if m.live.contains(&addr) {
                    continue;
                }
                assert!(!core.free(addr, 0, 0), "bad free {addr:#x} taken");
                assert_eq!((core.live(), core.free_blocks()), before);
            }
            Op::Steal { stream } => {
                let s = stream as u64 % STREAMS;
                let slot = m.slot(&mut core, s);
                match core.pick_victim(slot) {
                    Some(victim) => {
                        let v = *m.slots.get(&victim).expect("a victim the model knows");
                        assert_ne!(v, s);
                        assert!(m.free_of[v as usize] > 0, "victim {v} has no blocks");
                        // The highest payload (= stream) among the lists with blocks.
                        let best = (0..STREAMS)
                            .filter(|&o| o != s && m.free_of[o as usize] > 0)
                            .max();
                        assert_eq!(best, Some(v));
                        core.move_half(victim, slot);
                        let n = m.free_of[v as usize];
                        m.free_of[v as usize] = n / 2;
                        m.free_of[s as usize] += n - n / 2;
                    }
                    None => {
                        let others = (0..STREAMS).any(|o| o != s && m.free_of[o as usize] > 0);
                        assert!(!others, "no victim, but another list has blocks");
                    }
                }
            }
            Op::ForgetIdle { keep } => {
                let k = keep as u64 % STREAMS;
                let slot = m.slot(&mut core, k);
                core.forget_idle(slot);
                let free_of = m.free_of;
                m.slots
                    .retain(|&sl, s| sl == slot || free_of[*s as usize] > 0);
            }
            Op::TakeChunks => {
                if !m.live.is_empty() {
                    continue;
                }
                let bases = core.take_chunks();
                assert_eq!(bases, m.chunks.iter().copied().collect::<Vec<_>>());
                m.chunks.clear();
                m.freed.clear();
                m.free_of = [0; STREAMS as usize];
                m.slots.clear();
            }
        }
        m.check(&core);
    }
});
