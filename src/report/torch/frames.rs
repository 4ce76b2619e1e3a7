//! An allocation site's frames, as PyTorch's `frames`: read from a captured backtrace's text.

use std::backtrace::{Backtrace, BacktraceStatus};
use std::io::{self, Write};

use super::pickle::Pickler;

/// One frame of an allocation site, as PyTorch's `Frame` dict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Frame {
    pub(super) name: String,
    pub(super) filename: String,
    pub(super) line: u64,
}

/// A frame, written once per file and fetched from the pickle's memo after: the same frames
/// (the program's entry, its runtime) appear in every site.
pub(super) fn write_frame<W: Write>(p: &mut Pickler<W>, f: &Frame) -> io::Result<()> {
    let key = format!("{}\0{}\0{}", f.name, f.filename, f.line);
    p.memoized(&key, |p| {
        p.dict(|d| {
            d.entry("filename", |p| p.str(&f.filename))?;
            d.entry("line", |p| p.uint(f.line))?;
            d.entry("name", |p| p.str(&f.name))
        })
    })
}

/// The frames of a captured backtrace, innermost first, without the tracking adaptor's own.
pub(super) fn frames(bt: &Backtrace) -> Vec<Frame> {
    if bt.status() != BacktraceStatus::Captured {
        return Vec::new();
    }
    let mut frames = parse_frames(&bt.to_string());
    // The adaptor's frames, and the std helpers between them (`bool::then` around the
    // capture), up to the last of the adaptor's: the caller comes first.
    const TRACKING: &str = "streamalloc::adaptor::tracking";
    let helper = |n: &str| {
        [
            "core::", "std::", "alloc::", "<core::", "<std::", "<alloc::",
        ]
        .iter()
        .any(|p| n.starts_with(p))
    };
    let own = frames
        .iter()
        .take_while(|f| f.name.contains(TRACKING) || helper(&f.name))
        .enumerate()
        .filter(|(_, f)| f.name.contains(TRACKING))
        .last()
        .map_or(0, |(i, _)| i + 1);
    frames.drain(..own);
    frames
}

/// Reads std's backtrace text: `  N: name` starts a frame (an inlined one has no number),
/// `at path:line:column` gives its location.
pub(super) fn parse_frames(text: &str) -> Vec<Frame> {
    let mut frames: Vec<Frame> = Vec::new();
    let mut located = true;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(at) = line.strip_prefix("at ") {
            if let (false, Some(f)) = (located, frames.last_mut()) {
                let mut parts = at.rsplitn(3, ':');
                let (col, line, file) = (parts.next(), parts.next(), parts.next());
                match (file, line.and_then(|l| l.parse().ok())) {
                    (Some(file), Some(line)) if col.is_some_and(|c| c.parse::<u64>().is_ok()) => {
                        f.filename = file.to_owned();
                        f.line = line;
                    }
                    _ => f.filename = at.to_owned(),
                }
                located = true;
            }
            continue;
        }
        let name = match line.split_once(": ") {
            Some((n, name)) if n.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => line,
        };
        frames.push(Frame {
            name: name.to_owned(),
            filename: "??".to_owned(),
            line: 0,
        });
        located = false;
    }
    frames
}
