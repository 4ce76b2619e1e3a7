//! `--html`, `--svg` and `--torch-snapshot`: the exports, each in one function.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use streamalloc::replay::ReplayReport;
use streamalloc::report::html::{
    segment_map_svg, segment_map_svg_named, timeline_svg, HtmlReport, ReportSection,
};
use streamalloc::report::torch::write_torch_snapshot;
use streamalloc::{Device, MemorySnapshot};

use crate::resources::ResourceKind;
use crate::table::Report;

/// Writes the HTML report: the mode in its title, the table, the line that says which mode made
/// it and the notes, and one section per resource (its timeline and its snapshot at the log's
/// peak).
pub(crate) fn html(file: File, report: &Report<'_>) -> io::Result<()> {
    let mut page = HtmlReport::new(format!(
        "streamalloc {} replay of {}",
        report.mode,
        report.log.display()
    ))
    .table(report.header(), report.rows())
    .note(report.heading());
    for note in report.notes() {
        page = page.note(note);
    }
    for (kind, row) in report.rows {
        let Ok(w) = row else { continue };
        page = page.section(ReportSection {
            name: kind.name(),
            timeline: w.timeline.clone().unwrap_or_default(),
            peak: w.peak_snapshot.clone(),
        });
    }
    let mut file = io::BufWriter::new(file);
    page.write_to(&mut file)?;
    file.flush()
}

/// Writes each resource's timeline and, where it gave one, its segment map at the peak as
/// standalone SVG files into `dir` (made before the replay: [`open`]).
pub(crate) fn svg(
    dir: &Path,
    rows: &[(ResourceKind, Result<ReplayReport, String>)],
) -> io::Result<()> {
    for (kind, row) in rows {
        let Ok(w) = row else { continue };
        let name = kind.name();
        if let Some(timeline) = &w.timeline {
            std::fs::write(
                dir.join(format!("{name}-timeline.svg")),
                timeline_svg(timeline, 960, 380),
            )?;
        }
        if let Some(peak) = &w.peak_snapshot {
            // The streams named and coloured as in the timeline.
            let map = match &w.timeline {
                Some(timeline) => segment_map_svg_named(peak, timeline, 960),
                None => segment_map_svg(peak, 960),
            };
            std::fs::write(dir.join(format!("{name}-segments.svg")), map)?;
        }
    }
    Ok(())
}

/// Writes PyTorch's memory snapshot of the first resource that gave a snapshot at the peak,
/// with its timeline up to the peak as the trace; where none gave one, the first resource's trace alone
/// (an empty snapshot), said on stderr.
pub(crate) fn torch(
    file: File,
    path: &Path,
    device: &Device,
    rows: &[(ResourceKind, Result<ReplayReport, String>)],
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
    let mut file = io::BufWriter::new(file);
    write_torch_snapshot(&mut file, &snapshot, timeline)?;
    file.flush()
}

/// The exports asked for, created before the replay so that a path that cannot be written
/// fails at once, not after minutes of replay.
#[derive(Debug, Default)]
pub(crate) struct Outputs {
    pub(crate) html: Option<(PathBuf, File)>,
    pub(crate) svg: Option<PathBuf>,
    pub(crate) torch: Option<(PathBuf, File)>,
}

/// Creates every export's file (and the SVG directory); the errors of all that fail, each
/// naming its path.
pub(crate) fn open(
    html: Option<&Path>,
    svg: Option<&Path>,
    torch: Option<&Path>,
) -> Result<Outputs, Vec<String>> {
    let mut errors = Vec::new();
    let mut create = |what: &str, path: Option<&Path>| {
        let path = path?;
        match File::create(path) {
            Ok(file) => Some((path.to_owned(), file)),
            Err(e) => {
                errors.push(format!("cannot create the {what} {}: {e}", path.display()));
                None
            }
        }
    };
    let html = create("HTML report", html);
    let torch = create("torch snapshot", torch);
    let svg = svg.and_then(|dir| match std::fs::create_dir_all(dir) {
        Ok(()) => Some(dir.to_owned()),
        Err(e) => {
            errors.push(format!(
                "cannot create the SVG directory {}: {e}",
                dir.display()
            ));
            None
        }
    });
    if errors.is_empty() {
        Ok(Outputs { html, svg, torch })
    } else {
        Err(errors)
    }
}
