//! Random operation sequences on the pool resource's core (`src/resource/suballoc/pool/core.rs`) checked
//! against a shadow model after every operation: live blocks never overlap and lie inside one
//! chunk, are 256-byte aligned, free bytes (total and per stream) and the counters equal the
//! model's, a freed block is reusable at once by its stream, a stream named by
//! `streams_with_block` can serve the request, and once everything is freed and merged into
//! one stream every chunk comes back whole.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use streamalloc::fuzzing::{PoolCore, ALIGN};

const STREAMS: u64 = 4;

#[derive(Arbitrary, Debug)]
enum Op {
    AddChunk {
        units: u16,
        gap: u8,
        stream: u8,
    },
    Alloc {
        size: u32,
        stream: u8,
    },
    Free {
        pick: u16,
        stream: u8,
    },
    /// Free, then allocate the same size on the same stream: must succeed.
    FreeReuse {
        pick: u16,
        stream: u8,
    },
    /// A free the core must refuse without a change: a wrong size or an address not handed out.
    BadFree {
        pick: u16,
        delta: u8,
    },
    FreeFront {
        pick: u16,
        head_units: u16,
        stream: u8,
    },
    /// What the wrapper does when the requester's own blocks fail: take from another stream.
    Take {
        size: u32,
        stream: u8,
    },
    Merge {
        from: u8,
        into: u8,
    },
    AdoptBelow {
        pick: u16,
    },
    RemoveIdle {
        keep: Option<u8>,
    },
    ReleaseEmpty,
    CutFreeHeads,
}

#[derive(Arbitrary, Debug)]
struct Input {
    ops: Vec<Op>,
    drain: bool,
}

/// Small, medium and large requests alike.
fn request(raw: u32) -> usize {
    let limit = [4 << 10, 64 << 10, 2 << 20][(raw & 3) as usize % 3];
    (raw >> 2) as usize % limit + 1
}

fn round(size: usize) -> usize {
    size.div_ceil(ALIGN) * ALIGN
}

#[derive(Default)]
struct Model {
    /// base → size.
    chunks: BTreeMap<u64, usize>,
    /// addr → (rounded size, requested size).
    live: BTreeMap<u64, (usize, usize)>,
    free_of: [usize; STREAMS as usize],
    next_base: u64,
}

impl Model {
    fn pick(&self, pick: u16) -> Option<(u64, usize, usize)> {
        if self.live.is_empty() {
            return None;
        }
        let (&a, &(r, s)) = self.live.iter().nth(pick as usize % self.live.len())?;
        Some((a, r, s))
    }

    /// Records a block the core handed out, checking it against every other.
    fn allocated(&mut self, addr: u64, size: usize, stream: u64) {
        let r = round(size);
        assert_eq!(addr % ALIGN as u64, 0, "{addr:#x} unaligned");
        let (&base, &csize) = self
            .chunks
            .range(..=addr)
            .next_back()
            .unwrap_or_else(|| panic!("{addr:#x} below every chunk"));
        assert!(
            addr + r as u64 <= base + csize as u64,
            "{addr:#x}+{r} outside chunk {base:#x}+{csize}"
        );
        if let Some((&b, &(bs, _))) = self.live.range(..addr + r as u64).next_back() {
            assert!(b + bs as u64 <= addr, "{addr:#x}+{r} overlaps {b:#x}+{bs}");
        }
        assert!(
            self.free_of[stream as usize] >= r,
            "stream {stream} had no {r} bytes"
        );
        self.free_of[stream as usize] -= r;
        self.live.insert(addr, (r, size));
    }

    fn check(&self, core: &PoolCore) {
        let free: usize = self.free_of.iter().sum();
        let live: usize = self.live.values().map(|&(r, _)| r).sum();
        let chunk_bytes: usize = self.chunks.values().sum();
        assert_eq!(core.free_bytes(), free, "free bytes");
        assert_eq!(core.allocation_count(), self.live.len(), "allocations");
        assert_eq!(core.chunk_count(), self.chunks.len(), "chunks");
        assert_eq!(core.chunk_bytes(), chunk_bytes, "chunk bytes");
        assert_eq!(free + live, chunk_bytes, "bytes lost");
        for s in 0..STREAMS {
            assert_eq!(
                core.free_bytes_of(s),
                self.free_of[s as usize],
                "stream {s}"
            );
        }
        let largest = core.largest_free_block();
        assert!(
            largest <= free && (free == 0) == (largest == 0),
            "largest {largest}"
        );
        assert!(core.free_block_count() <= free / ALIGN);
        assert_eq!(core.free_block_count() == 0, free == 0);
    }
}

fuzz_target!(|input: Input| {
    let mut core = PoolCore::new();
    let mut m = Model {
        next_base: 1 << 20,
        ..Model::default()
    };
    for op in input.ops {
        match op {
            Op::AddChunk { units, gap, stream } => {
                let size = (units as usize % 4096 + 1) * ALIGN;
                let base = m.next_base + (gap % 3) as u64 * ALIGN as u64;
                let s = stream as u64 % STREAMS;
                core.add_chunk(base, size, s);
                m.chunks.insert(base, size);
                m.free_of[s as usize] += size;
                m.next_base = base + size as u64;
            }
            Op::Alloc { size, stream } => {
                let size = request(size);
                let s = stream as u64 % STREAMS;
                if let Some(addr) = core.allocate(size, s) {
                    m.allocated(addr, size, s);
                }
            }
            Op::Free { pick, stream } | Op::FreeReuse { pick, stream } => {
                let Some((addr, r, size)) = m.pick(pick) else {
                    continue;
                };
                let s = stream as u64 % STREAMS;
                assert!(core.try_free(addr, size, s), "free of live {addr:#x}");
                m.live.remove(&addr);
                m.free_of[s as usize] += r;
                if matches!(op, Op::FreeReuse { .. }) {
                    m.check(&core);
                    let again = core.allocate(size, s);
                    let addr = again.unwrap_or_else(|| panic!("freed {size} not reusable"));
                    m.allocated(addr, size, s);
                }
            }
            Op::BadFree { pick, delta } => {
                let before = (core.free_bytes(), core.allocation_count());
                match m.pick(pick) {
                    // A live block freed with another size.
                    Some((addr, r, _)) if delta % 2 == 0 => {
                        let wrong = r + ALIGN * (delta as usize / 2 + 1);
                        assert!(!core.try_free(addr, wrong, 0), "{addr:#x} freed as {wrong}");
                    }
                    // An address inside a live block, or past every chunk.
                    other => {
                        let addr = match other {
                            Some((addr, r, _)) if r > ALIGN => addr + ALIGN as u64,
                            _ => m.next_base + ALIGN as u64 * delta as u64,
                        };
                        if !m.live.contains_key(&addr) {
                            assert!(!core.try_free(addr, ALIGN, 0), "foreign {addr:#x} freed");
                        }
                    }
                }
                assert_eq!((core.free_bytes(), core.allocation_count()), before);
            }
            Op::FreeFront {
                pick,
                head_units,
                stream,
            } => {
                let Some((addr, r, _)) = m.pick(pick) else {
                    continue;
                };
                let head = head_units as usize * ALIGN;
                let s = stream as u64 % STREAMS;
                let ok = core.free_front(addr, head, s);
                assert_eq!(
                    ok,
                    head > 0 && head < r,
                    "free_front {addr:#x} {head} of {r}"
                );
                if ok {
                    m.live.remove(&addr);
                    m.live.insert(addr + head as u64, (r - head, r - head));
                    m.free_of[s as usize] += head;
                }
            }
            Op::Take { size, stream } => {
                let size = request(size);
                let t = stream as u64 % STREAMS;
                let found = core.streams_with_block(size, t);
                assert!(!found.contains(&t));
                if let Some(&s) = found.first() {
                    let addr = core
                        .allocate(size, s)
                        .unwrap_or_else(|| panic!("stream {s} named for {size} cannot serve it"));
                    m.allocated(addr, size, s);
                }
            }
            Op::Merge { from, into } => {
                let (f, i) = (from as u64 % STREAMS, into as u64 % STREAMS);
                let merged = core.merge_stream(f, i);
                if f == i {
                    assert!(!merged);
                } else {
                    m.free_of[i as usize] += std::mem::take(&mut m.free_of[f as usize]);
                }
            }
            Op::AdoptBelow { pick } => {
                let Some((addr, _, _)) = m.pick(pick) else {
                    continue;
                };
                let Some(giver) = core.other_owner_below(addr) else {
                    continue;
                };
                let before: Vec<usize> = (0..STREAMS).map(|s| core.free_bytes_of(s)).collect();
                core.adopt_below(addr);
                let after: Vec<usize> = (0..STREAMS).map(|s| core.free_bytes_of(s)).collect();
                let given = before[giver as usize] - after[giver as usize];
                assert!(given > 0 && given.is_multiple_of(ALIGN), "adopted {given}");
                let gained: Vec<u64> = (0..STREAMS)
                    .filter(|&s| after[s as usize] > before[s as usize])
                    .collect();
                assert_eq!(gained.len(), 1, "{before:?} → {after:?}");
                assert_eq!(
                    after[gained[0] as usize] - before[gained[0] as usize],
                    given
                );
                m.free_of[giver as usize] -= given;
                m.free_of[gained[0] as usize] += given;
            }
            Op::RemoveIdle { keep } => {
                core.remove_idle_streams(keep.map(|k| k as u64 % STREAMS));
            }
            Op::ReleaseEmpty => {
                for (base, size, owner) in core.release_empty_chunks() {
                    assert_eq!(m.chunks.remove(&base), Some(size), "released {base:#x}");
                    assert!(m.live.range(base..base + size as u64).next().is_none());
                    m.free_of[owner as usize] -= size;
                }
            }
            Op::CutFreeHeads => {
                for (base, head, owner) in core.cut_free_heads() {
                    let size = m.chunks.remove(&base).expect("a chunk");
                    assert!(head > 0 && head < size && head % ALIGN == 0);
                    assert!(m.live.range(base..base + head as u64).next().is_none());
                    m.chunks.insert(base + head as u64, size - head);
                    m.free_of[owner as usize] -= head;
                }
            }
        }
        m.check(&core);
    }
    if input.drain {
        // Everything freed and merged into one stream: every chunk is one free block again.
        for (addr, (_, size)) in std::mem::take(&mut m.live) {
            assert!(core.try_free(addr, size, 0));
        }
        for s in 1..STREAMS {
            core.merge_stream(s, 0);
        }
        let released = core.release_empty_chunks();
        let expected: Vec<(u64, usize, u64)> = m.chunks.iter().map(|(&b, &s)| (b, s, 0)).collect();
        assert_eq!(released, expected, "chunks not whole after a full drain");
        assert_eq!((core.chunk_count(), core.free_bytes()), (0, 0));
    }
});
