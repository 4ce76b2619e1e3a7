//! Colours: one per stream (the same stream has the same colour in a section's timeline and
//! segment map), and the fixed ones of free and pending memory and of the reserved line.

use crate::ids::StreamId;

/// Stream colours (Tableau 10, which stay apart for most colour vision). A stream past the
/// tenth takes them again: the legend and the hover titles still tell streams apart.
pub(crate) const PALETTE: [(u8, u8, u8); 10] = [
    (0x4e, 0x79, 0xa7),
    (0xf2, 0x8e, 0x2b),
    (0x59, 0xa1, 0x4f),
    (0xb0, 0x7a, 0xa1),
    (0x76, 0xb7, 0xb2),
    (0xed, 0xc9, 0x48),
    (0xe1, 0x57, 0x59),
    (0x9c, 0x75, 0x5f),
    (0xff, 0x9d, 0xa7),
    (0x5b, 0x5b, 0xc8),
];

/// Free memory any stream can use now.
pub(crate) const FREE: (u8, u8, u8) = (0xe4, 0xe4, 0xe4);
/// Pending memory (freed, usable by nobody yet).
pub(crate) const PENDING: (u8, u8, u8) = (0x8a, 0x8a, 0x8a);
/// The reserved-bytes line.
pub(crate) const RESERVED: (u8, u8, u8) = (0x20, 0x20, 0x20);
/// The peak marker.
pub(crate) const PEAK: (u8, u8, u8) = (0xc0, 0x00, 0x00);
/// Out-of-memory marks.
pub(crate) const OOM: (u8, u8, u8) = (0xa0, 0x00, 0x7a);
/// Axes and grid.
pub(crate) const GRID: (u8, u8, u8) = (0xd0, 0xd0, 0xd0);

/// `#rrggbb`.
pub(crate) fn hex((r, g, b): (u8, u8, u8)) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

/// `c` mixed with white: what free-on-stream memory of a stream is filled with, under its
/// stream's hatching.
pub(crate) fn tint((r, g, b): (u8, u8, u8)) -> (u8, u8, u8) {
    let mix = |c: u8| (c as u16 + 2 * 255).div_euclid(3) as u8;
    (mix(r), mix(g), mix(b))
}

/// Streams in the order they get colours.
#[derive(Debug, Clone, Default)]
pub(crate) struct StreamColours {
    streams: Vec<StreamId>,
    names: Vec<String>,
}

impl StreamColours {
    /// Colours in the order of `streams`, which print as their names.
    pub(crate) fn named<'a>(streams: impl IntoIterator<Item = (StreamId, &'a str)>) -> Self {
        let mut colours = StreamColours::default();
        for (s, name) in streams {
            let i = colours.index(s);
            colours.names[i] = name.to_owned();
        }
        colours
    }

    /// The stream's place, giving it the next one when it has none.
    pub(crate) fn index(&mut self, stream: StreamId) -> usize {
        match self.streams.iter().position(|&s| s == stream) {
            Some(i) => i,
            None => {
                self.streams.push(stream);
                self.names.push(stream.to_string());
                self.streams.len() - 1
            }
        }
    }

    /// The place of `stream`, if it has one.
    pub(crate) fn position(&self, stream: StreamId) -> Option<usize> {
        self.streams.iter().position(|&s| s == stream)
    }

    /// The streams' names, in colour order.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// The colour of the stream at `index`.
    pub(crate) fn of_index(index: usize) -> (u8, u8, u8) {
        PALETTE[index % PALETTE.len()]
    }
}
