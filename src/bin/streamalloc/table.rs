//! The what-if table and the notes under it.

use std::io::{self, Write};
use std::path::Path;

use streamalloc::replay::{LogSummary, ReplayFailureKind, ReplayMode, ReplayReport};

use crate::resources::ResourceKind;

/// Everything `streamalloc replay` prints, for the terminal and for the HTML report.
pub(crate) struct Report<'a> {
    pub(crate) log: &'a Path,
    pub(crate) device: &'a str,
    /// The mode every row was replayed in.
    pub(crate) mode: ReplayMode,
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
    /// The line above the table: which mode made its figures.
    pub(crate) fn heading(&self) -> String {
        match self.mode {
            ReplayMode::PerThread => {
                let threads = self
                    .rows
                    .iter()
                    .find_map(|(_, row)| row.as_ref().ok().map(|w| w.threads))
                    .unwrap_or(0);
                format!(
                    "per-thread replay: each resource ran the log on {threads} threads, one per \
                     logged thread, each in its log order (waits: allocations that waited for \
                     another thread's free)"
                )
            }
            _ => "in-order replay: each resource ran the log's events in log order on one \
                  thread"
                .to_owned(),
        }
    }

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
            if w.waits > 0 || w.free_waits > 0 {
                notes.push(format!(
                    "{}: {} allocations waited for memory, {:.1} ms in all; {} frees waited \
                     for their allocation on another thread",
                    kind.name(),
                    w.waits,
                    w.waited.as_secs_f64() * 1e3,
                    w.free_waits
                ));
            }
            if w.skipped.threads_over_limit > 0 {
                notes.push(format!(
                    "{}: {} events on threads past the limit ran on one shared thread",
                    kind.name(),
                    w.skipped.threads_over_limit
                ));
            }
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
        writeln!(out, "{}", self.heading())?;
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
            mode: ReplayMode::InOrder,
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

    /// Per thread, the line above the table names the mode and the threads, and the notes
    /// give the waits' time and the frees that waited.
    #[test]
    fn the_per_thread_mode_is_named_with_its_waits() {
        let summary = LogSummary::default();
        let mut w = ReplayReport::default();
        w.mode = ReplayMode::PerThread;
        w.threads = 3;
        w.waits = 2;
        w.waited = std::time::Duration::from_micros(12_340);
        w.free_waits = 5;
        let rows = [(ResourceKind::Pool, Ok(w))];
        let report = Report {
            log: Path::new("x.csv"),
            device: "host",
            mode: ReplayMode::PerThread,
            summary: &summary,
            rows: &rows,
        };
        assert!(
            report
                .heading()
                .starts_with("per-thread replay: each resource ran the log on 3 threads,"),
            "{}",
            report.heading()
        );
        let notes = report.notes();
        assert!(
            notes.contains(
                &"pool: 2 allocations waited for memory, 12.3 ms in all; 5 frees waited for \
                  their allocation on another thread"
                    .to_owned()
            ),
            "{notes:?}"
        );
        let mut out = Vec::new();
        report.write(&mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.starts_with("per-thread replay:")
                && out.lines().nth(1).unwrap().starts_with("resource")
        );
    }
}
