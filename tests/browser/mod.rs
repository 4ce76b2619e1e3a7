//! The HTML report in a real browser (headless Chromium): at a desktop's width and a phone's,
//! no two texts overlap, none is cut (past the viewport, its picture or a clipping box) and
//! none is drawn over a line or an area of its picture; `geometry.js` measures the page as
//! Chromium lays it out. A screenshot of each width is kept in `target/ci-artifacts/`.
//!
//! Ignored by default, as it needs Chromium: `.ci/run` installs it and runs this test with
//! `cargo test --features cli --test cli -- --ignored browser`. Run that way without Chromium,
//! it fails and says so. `STREAMALLOC_CHROMIUM` names the browser's binary where it is not
//! `chromium`, `chromium-browser` or `google-chrome` on the PATH.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::{replay_excerpt, text};

const GEOMETRY: &str = include_str!("geometry.js");

/// The widths checked: a desktop's and a phone's (a 390-pixel-wide phone).
const WIDTHS: [(&str, u32); 2] = [("desktop", 1280), ("phone", 390)];

fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("STREAMALLOC_CHROMIUM") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|p| p.is_file())
}

/// Where the run's artifacts go: `target/ci-artifacts/` (or under `CARGO_TARGET_DIR`).
fn artifacts() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("ci-artifacts");
    std::fs::create_dir_all(&dir).expect("the artifacts folder is created");
    dir
}

/// Runs headless Chromium on `page` in a window `width` × `height`, with `args`; its stdout.
/// Chromium's first start on a fresh machine fails now and then (its zygote cannot fork): a
/// failed run is tried once more.
fn run_chromium(browser: &Path, page: &Path, width: u32, height: u32, args: &[&str]) -> String {
    let profile = tempfile_dir();
    let mut last = String::new();
    for _ in 0..2 {
        let out = Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--force-device-scale-factor=1",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--window-size={width},{height}"))
            .args(args)
            .arg(format!("file://{}", page.display()))
            .output()
            .expect("Chromium starts");
        if out.status.success() && (!args.contains(&"--dump-dom") || !out.stdout.is_empty()) {
            let _ = std::fs::remove_dir_all(&profile);
            return text(&out.stdout);
        }
        last = format!("{}\n{}", out.status, text(&out.stderr));
    }
    panic!("Chromium failed twice on {}: {last}", page.display());
}

/// A fresh profile folder for one Chromium run.
fn tempfile_dir() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "streamalloc-chromium-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What `geometry.js` found: the JSON it writes into the page, out of the dumped DOM.
struct Findings {
    json: String,
}

impl Findings {
    fn of(dom: &str) -> Findings {
        let start = dom
            .find("<pre id=\"geometry-result\">")
            .unwrap_or_else(|| panic!("the geometry script wrote no result:\n{dom}"));
        let rest = &dom[start + "<pre id=\"geometry-result\">".len()..];
        let json = &rest[..rest.find("</pre>").expect("the result closes")];
        let json = json
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&nbsp;", "\u{a0}")
            .replace("&amp;", "&");
        Findings { json }
    }

    /// The number after `"key":`.
    fn number(&self, key: &str) -> u64 {
        let at = self.json.find(&format!("\"{key}\":")).expect(key) + key.len() + 3;
        let digits: String = self.json[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("{key} in {}", self.json))
    }

    /// The problems, one a line (the JSON strings as they are, escapes and all).
    fn problems(&self) -> Vec<String> {
        let at = self.json.find("\"problems\":[").expect("problems") + "\"problems\":[".len();
        let list = &self.json[at..self.json.rfind(']').unwrap()];
        let mut out = Vec::new();
        let (mut current, mut in_string, mut escaped) = (String::new(), false, false);
        for c in list.chars() {
            match (in_string, escaped, c) {
                (true, false, '\\') => escaped = true,
                (true, false, '"') => {
                    in_string = false;
                    out.push(std::mem::take(&mut current));
                }
                (true, _, c) => {
                    escaped = false;
                    current.push(c);
                }
                (false, _, '"') => in_string = true,
                _ => {}
            }
        }
        out
    }
}

#[test]
#[ignore = "needs Chromium: .ci/run installs it and runs this with --ignored"]
fn the_report_in_a_browser_has_no_overlapping_or_cut_text() {
    let browser = chromium().expect(
        "Chromium is not installed (chromium, chromium-browser or google-chrome on the PATH, or \
         STREAMALLOC_CHROMIUM): this test cannot run; .ci/run installs it (apt-get install \
         chromium)",
    );
    let dir = artifacts();
    let report = dir.join("report.html");
    let out = replay_excerpt(
        "pool,arena,binning,cuda-async",
        &["--html", report.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&report).unwrap();
    let at = page.rfind("</body>").expect("the page has a body");
    let checked = format!(
        "{}<script>{GEOMETRY}</script>\n{}",
        &page[..at],
        &page[at..]
    );

    let mut failures = Vec::new();
    for (name, width) in WIDTHS {
        let started = Instant::now();
        // Headless Chromium's window is at least 500 pixels wide: the page is checked in a
        // frame of the width (its srcdoc shares the host's origin, so the script can write
        // its findings there).
        let host = dir.join(format!("report-checked-{name}.html"));
        std::fs::write(
            &host,
            format!(
                "<!DOCTYPE html>\n<html><body style=\"margin:0\"><iframe width=\"{width}\" \
                 height=\"900\" style=\"border:0;display:block\" srcdoc=\"{}\"></iframe>\
                 </body></html>\n",
                checked.replace('&', "&amp;").replace('"', "&quot;")
            ),
        )
        .unwrap();
        let dom = run_chromium(&browser, &host, width.max(500), 900, &["--dump-dom"]);
        let findings = Findings::of(&dom);
        assert_eq!(
            findings.number("viewport"),
            u64::from(width),
            "{name}: the viewport"
        );
        // Four resources, each a timeline and a segment map (cuda-async gives no snapshot),
        // one of each drawing shown at either width.
        assert_eq!(findings.number("pictures"), 7, "{name}: {}", findings.json);
        assert!(findings.number("texts") > 100, "{name}: {}", findings.json);
        let height = findings.number("height").clamp(900, 16_000) as u32;
        let shot = dir.join(format!("report-{name}.png"));
        run_chromium(
            &browser,
            &report,
            width,
            height,
            &[&format!("--screenshot={}", shot.display())],
        );
        assert!(shot.is_file(), "no screenshot at {}", shot.display());
        println!(
            "{name} ({width} px): {} texts in {} pictures and the page checked in {:.1} s; \
             screenshot {}",
            findings.number("texts"),
            findings.number("pictures"),
            started.elapsed().as_secs_f64(),
            shot.display()
        );
        failures.extend(
            findings
                .problems()
                .into_iter()
                .map(|p| format!("{name}: {p}")),
        );
    }
    assert!(
        failures.is_empty(),
        "{} problems in the report's layout:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
