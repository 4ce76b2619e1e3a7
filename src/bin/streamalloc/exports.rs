//! `--html` and `--torch-snapshot`: the two exports, each in one function.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use streamalloc::replay::WhatIf;
use streamalloc::report::torch::write_torch_snapshot;
use streamalloc::{Device, MemorySnapshot};

use crate::resources::ResourceKind;
use crate::table::Report;

// EXPORT WIRING (issue 15): `torch` calls helper 3's `report::torch::write_torch_snapshot`
// (merged); `html` is to call helper 4's `report::html::HtmlReport` (feat/html-report): until
// it is merged it refuses with a clear error, so the option already parses and everything else
// is written.

/// Writes the HTML report: the table, the notes, and one section per resource (its timeline
/// and its snapshot at the log's peak).
pub(crate) fn html(path: &Path, report: &Report<'_>) -> io::Result<()> {
    let _ = (path, report.header(), report.rows(), report.notes());
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "the HTML export (streamalloc::report::html) is not in this build yet",
    ))
}

/// Writes PyTorch's memory snapshot of the first resource that gave a snapshot at the peak,
/// with its timeline up to the peak as the trace; where none gave one, the first resource's trace alone
/// (an empty snapshot), said on stderr.
pub(crate) fn torch(
    path: &Path,
    device: &Device,
    rows: &[(ResourceKind, Result<WhatIf, String>)],
) -> io::Result<()> {
    let ok = || rows.iter().filter_map(|(k, r)| Some((k, r.as_ref().ok()?)));
    let (snapshot, timeline) = match ok().find(|(_, w)| w.peak_snapshot.is_some()) {
        Some((_, w)) => (
            w.peak_snapshot.clone().expect("found above"),
            w.timeline_at_peak.as_ref(),
        ),
        None => {
            let (kind, w) = ok().next().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "no resource replayed the log")
            })?;
            eprintln!(
                "streamalloc: no resource gave a snapshot at the peak; {} holds {}'s trace only",
                path.display(),
                kind.name()
            );
            (
                MemorySnapshot::new(device.id(), kind.name()),
                w.timeline_at_peak.as_ref(),
            )
        }
    };
    let mut file = io::BufWriter::new(File::create(path)?);
    write_torch_snapshot(&mut file, &snapshot, timeline)?;
    file.flush()
}
