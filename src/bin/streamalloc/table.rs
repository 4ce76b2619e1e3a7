//! The what-if table and the notes under it.

use std::io::{self, Write};
use std::path::Path;

use streamalloc::replay::{LogSummary, ReplayFailureKind, ReplayReport};

use crate::resources::ResourceKind;

/// Everything `streamalloc replay` prints, for the terminal and for the HTML report.
pub(crate) struct Report<'a> {
    pub(crate) log: &'a Path,
    pub(crate) device: &'a str,
    pub(crate) summary: &'a LogSummary,
    pub(crate) rows: &'a [(ResourceKind, Result<ReplayReport, String>)],
}

/// `1234567` as `1.2 MiB`; bytes below 1 KiB as `512 B`.
pub(crate) fn bytes(n: usize) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// A count of distinct threads or streams: exact, or `>N` past the scan's limit.
fn distinct(n: usize) -> String {
    if n > LogSummary::COUNT_LIMIT {
        format!(">{}", LogSummary::COUNT_LIMIT)
    } else {
        n.to_string()
    }
}

impl Report<'_> {
    pub(crate) fn header(&self) -> Vec<String> {
        [
            "resource",
            "peak live",
            "peak reserved",
            "reserved/live",
            "failures",
            "waits",
            "ns/op",
            "largest free @peak",
            "free @peak",
        ]
        .map(String::from)
        .to_vec()
    }

    pub(crate) fn rows(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|(kind, row)| match row {
                Ok(w) => {
                    let frag = w.peak_fragmentation.as_ref();
                    vec![
                        kind.name(),
                        bytes(w.peak_live),
                        bytes(w.peak_reserved),
                        format!("{:.2}", w.reserved_ratio()),
                        w.refused.to_string(),
                        w.waits.to_string(),
                        format!("{:.0}", w.ns_per_operation()),
                        frag.map_or("-".into(), |f| bytes(f.largest_free_block)),
                        frag.map_or("-".into(), |f| bytes(f.free_bytes())),
                    ]
                }
                // The error goes in the notes: a cell holds a figure.
                Err(_) => {
                    let mut cells = vec![kind.name()];
                    cells.resize(self.header().len(), "-".to_owned());
                    cells
                }
            })
            .collect()
    }

    /// Lines under the table: the log, what was skipped, the first failures.
    pub(crate) fn notes(&self) -> Vec<String> {
        let s = self.summary;
        let mut notes = vec![format!(
            "{}: {} events ({} allocations, {} frees, {} logged failures) on {} threads and {} \
             streams; peak live {} B at line {}; replayed on {}",
            self.log.display(),
            s.events,
            s.allocations,
            s.frees,
            s.logged_failures,
            distinct(s.threads),
            distinct(s.streams),
            s.peak_live,
            s.peak_line,
            self.device
        )];
        if s.skipped.total() > 0 {
            notes.push(format!("log: {}", s.skipped));
        }
        for (kind, row) in self.rows {
            let w = match row {
                Ok(w) => w,
                Err(e) => {
                    notes.push(format!("{}: unavailable: {e}", kind.name()));
                    continue;
                }
            };
            if w.skipped.streams_over_limit > 0 {
                notes.push(format!(
                    "{}: {} events on streams past the limit ran on one shared stream",
                    kind.name(),
                    w.skipped.streams_over_limit
                ));
            }
            let refused: Vec<_> = w
                .failures
                .iter()
                .filter(|f| matches!(f.kind, ReplayFailureKind::AllocationFailed(_)))
                .take(3)
                .collect();
            for f in &refused {
                notes.push(format!("{}: {f}", kind.name()));
            }
            if w.refused > refused.len() as u64 {
                notes.push(format!(
                    "{}: {} more failures",
                    kind.name(),
                    w.refused - refused.len() as u64
                ));
            }
        }
        notes
    }

    pub(crate) fn write(&self, out: &mut impl Write) -> io::Result<()> {
        let header = self.header();
        let rows = self.rows();
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |out: &mut dyn Write, cells: &[String]| -> io::Result<()> {
            let mut text = String::new();
            for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
                if i == 0 {
                    text.push_str(&format!("{cell:<w$}"));
                } else {
                    text.push_str(&format!("  {cell:>w$}"));
                }
            }
            writeln!(out, "{}", text.trim_end())
        };
        line(out, &header)?;
        for row in &rows {
            line(out, row)?;
        }
        writeln!(out)?;
        for note in self.notes() {
            writeln!(out, "{note}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resource that cannot be built gets "-" cells and its error in the notes.
    #[test]
    fn a_resource_that_cannot_be_built_has_dashes_and_a_note() {
        let summary = LogSummary::default();
        let rows = [(
            ResourceKind::Managed,
            Err("no managed memory here".to_owned()),
        )];
        let report = Report {
            log: Path::new("x.csv"),
            device: "host",
            summary: &summary,
            rows: &rows,
        };
        let cells = &report.rows()[0];
        assert_eq!(cells.len(), report.header().len());
        assert_eq!(cells[0], "managed");
        assert!(cells[1..].iter().all(|c| c == "-"), "{cells:?}");
        assert!(
            report
                .notes()
                .contains(&"managed: unavailable: no managed memory here".to_owned()),
            "{:?}",
            report.notes()
        );
    }
}
