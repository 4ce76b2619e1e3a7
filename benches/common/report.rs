//! The report of a bench that prints tables (`benches/completion.rs`, `benches/pipeline.rs`):
//! plain text for stdout, Markdown for `STREAMALLOC_BENCH_OUT=path.md`.

/// A titled table of strings.
pub struct Table {
    title: String,
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Table {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells);
    }

    /// Columns padded to their widest cell, under a rule.
    pub fn text(&self) -> String {
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|i| {
                std::iter::once(&self.headers[i])
                    .chain(self.rows.iter().map(|r| &r[i]))
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            padded.join("  ").trim_end().to_string()
        };
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        let mut lines = vec![self.title.clone(), line(&self.headers), line(&rule)];
        lines.extend(self.rows.iter().map(|r| line(r)));
        lines.join("\n") + "\n"
    }

    /// A Markdown table under a `###` heading.
    pub fn markdown(&self) -> String {
        let line = |cells: &[String]| format!("| {} |", cells.join(" | "));
        let rule = vec!["---".to_string(); self.headers.len()];
        let mut lines = vec![
            format!("### {}\n", self.title),
            line(&self.headers),
            line(&rule),
        ];
        lines.extend(self.rows.iter().map(|r| line(r)));
        lines.join("\n") + "\n"
    }
}

enum Block {
    Line(String),
    Table(Table),
}

/// A bench's report: lines and tables, rendered as plain text (stdout) and as Markdown (for
/// `STREAMALLOC_BENCH_OUT=path.md`).
pub struct Report {
    title: String,
    blocks: Vec<Block>,
}

impl Report {
    /// An empty report headed `title`.
    pub fn new(title: impl Into<String>) -> Report {
        Report {
            title: title.into(),
            blocks: Vec::new(),
        }
    }

    pub fn line(&mut self, s: String) {
        self.blocks.push(Block::Line(s));
    }

    pub fn table(&mut self, t: Table) {
        self.blocks.push(Block::Table(t));
    }

    fn render(
        &self,
        head: String,
        line: fn(&str) -> String,
        table: fn(&Table) -> String,
    ) -> String {
        let mut out = head;
        for b in &self.blocks {
            out.push_str(&match b {
                Block::Line(s) => line(s),
                Block::Table(t) => table(t),
            });
        }
        out
    }

    pub fn text(&self) -> String {
        self.render(
            format!("{}\n", self.title),
            |s| format!("{s}\n"),
            |t| format!("\n{}", t.text()),
        )
    }

    pub fn markdown(&self) -> String {
        self.render(
            format!("## {}\n\n", self.title),
            |s| format!("- {s}\n"),
            |t| format!("\n{}", t.markdown()),
        )
    }

    /// Prints the report, and writes it as Markdown to the file `STREAMALLOC_BENCH_OUT` names,
    /// if set.
    pub fn publish(&self) -> std::io::Result<()> {
        println!("{}", self.text());
        if let Some(path) = std::env::var_os("STREAMALLOC_BENCH_OUT") {
            std::fs::write(&path, self.markdown())?;
            println!("markdown report written to {}", path.to_string_lossy());
        }
        Ok(())
    }
}
