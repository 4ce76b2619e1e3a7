//! Reports on memory: a self-contained HTML page ([`html`]) and PyTorch's memory-snapshot
//! format ([`torch`]), from a [`MemorySnapshot`](crate::MemorySnapshot) and a
//! [`Timeline`](crate::Timeline), whether a replay or a running program produced them.

pub mod html;
pub mod torch;
