//! The `streamalloc` binary (feature `cli`): the what-if table on a real RMM log excerpt, exit
//! codes on bad input, `--help`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};

#[path = "browser/mod.rs"]
mod browser;

const EXCERPT: &str = "tests/data/rmm_26.10_5streams_excerpt.csv";

fn streamalloc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_streamalloc"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the binary runs")
}

/// `streamalloc replay` of the excerpt on the host backend, over `resources`, with `more`
/// arguments.
fn replay_excerpt(resources: &str, more: &[&str]) -> Output {
    let mut args = vec![
        "replay",
        EXCERPT,
        "--resource",
        resources,
        "--device",
        "host",
    ];
    args.extend_from_slice(more);
    streamalloc(&args)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The log's peak of live bytes and its line, computed here independently of the crate.
fn peak_of(log: &str) -> (usize, usize) {
    let mut live: HashMap<&str, usize> = HashMap::new();
    let (mut now, mut peak, mut at) = (0usize, 0usize, 0usize);
    for (i, line) in log.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let bytes: usize = f[4].parse().unwrap();
        match f[2] {
            "allocate" => {
                live.insert(f[3], bytes);
                now += bytes;
                if now > peak {
                    (peak, at) = (now, i + 1);
                }
            }
            "free" => now -= live.remove(f[3]).unwrap(),
            _ => {}
        }
    }
    (peak, at)
}

/// As the table prints bytes: `369.6 MiB`.
fn human(n: usize) -> String {
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", ["KiB", "MiB", "GiB", "TiB"][unit])
}

#[test]
fn the_table_lists_each_resource_with_the_logs_peak() {
    let log =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(EXCERPT)).unwrap();
    let (peak, line) = peak_of(&log);
    assert!(peak > 100 << 20, "the excerpt's peak is {peak}");
    let out = replay_excerpt("pool,cuda", &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    // The line above the table says which mode made it: in order, the default.
    assert_eq!(
        lines[0], "in-order replay: each resource ran the log's events in log order on one thread",
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("resource") && lines[1].contains("peak live"),
        "{stdout}"
    );
    for (row, name) in [(2, "pool"), (3, "cuda")] {
        let cells: Vec<&str> = lines[row].split_whitespace().collect();
        assert_eq!(cells[0], name, "{stdout}");
        assert_eq!(
            format!("{} {}", cells[1], cells[2]),
            human(peak),
            "{stdout}"
        );
        assert_eq!(cells[6..8], ["0", "0"], "no failures, no waits: {stdout}");
    }
    assert!(
        stdout.contains(&format!(
            "1768 events (1249 allocations, 519 frees, 0 logged failures) on 5 threads and 5 \
             streams; peak live {peak} B at line {line}"
        )),
        "{stdout}"
    );
    // Nothing but the table goes to stdout when it is not a terminal: no progress bar.
    assert!(
        !stdout.contains('\r') && !stdout.contains('\u{1b}'),
        "{stdout:?}"
    );
}

/// An in-order replay's figures are the log's: identical runs print identical figures, the
/// picture at the peak included (the mapped pool's used to read blocks as pending or free by
/// how far the emulated streams had got). Only the timed column may differ. (Not the arena's
/// on the host backend: see the book's replay section.)
#[test]
fn in_order_figures_are_the_same_in_every_run() {
    let figures = || {
        let out = replay_excerpt("mapped-pool,pool", &[]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        stdout
            .lines()
            .skip(2)
            .take(2)
            .map(|row| {
                let cells: Vec<&str> = row.split_whitespace().collect();
                // Every column but ns/op (sizes take two cells each).
                let (head, tail) = (cells.len() - 5, cells.len() - 4);
                format!("{} | {}", cells[..head].join(" "), cells[tail..].join(" "))
            })
            .collect::<Vec<_>>()
    };
    let first = figures();
    assert_eq!(first.len(), 2, "{first:?}");
    for _ in 0..3 {
        assert_eq!(figures(), first);
    }
}

/// `--mode per-thread`: the line above the table says so, with the logged threads' count; every
/// allocation and free of the excerpt is made (the host device has room for any
/// interleaving); the HTML report's title and notes say the mode too.
#[test]
fn the_per_thread_mode_is_named_above_its_table() {
    let html = scratch("per-thread").join("report.html");
    let out = replay_excerpt(
        "pool,cuda",
        &["--mode", "per-thread", "--html", html.to_str().unwrap()],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with(
            "per-thread replay: each resource ran the log on 5 threads, one per logged thread"
        ),
        "{stdout}"
    );
    assert!(lines[1].starts_with("resource"), "{stdout}");
    for (row, name) in [(2, "pool"), (3, "cuda")] {
        let cells: Vec<&str> = lines[row].split_whitespace().collect();
        assert_eq!(cells[0], name, "{stdout}");
        assert_eq!(cells[6], "0", "no failures: {stdout}");
    }
    assert!(
        stdout.contains("1768 events (1249 allocations, 519 frees, 0 logged failures)"),
        "{stdout}"
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("streamalloc per-thread replay of"), "{page}");
    assert!(page.contains("per-thread replay: each resource ran the log on 5 threads"));
    std::fs::remove_dir_all(html.parent().unwrap()).unwrap();

    let out = streamalloc(&[
        "replay",
        EXCERPT,
        "--resource",
        "pool",
        "--mode",
        "sideways",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("`in-order` or `per-thread`"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_unknown_resource_is_refused_with_the_valid_names() {
    let out = streamalloc(&["replay", EXCERPT, "--resource", "pool,slab"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    for name in [
        "cuda",
        "managed",
        "pool",
        "arena",
        "binning",
        "cuda-async",
        "fixed-size",
        "mapped-pool",
    ] {
        assert!(stderr.contains(name), "{name}: {stderr}");
    }
    assert!(stderr.contains("'slab'"), "{stderr}");
}

#[test]
fn bad_input_exits_2_with_the_line_or_is_counted() {
    let dir = std::env::temp_dir().join(format!("streamalloc-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.csv");
    let mut bytes = b"Thread,Time,Action,Pointer,Size,Stream\n\
        1,00:00:00.000001,allocate,0x1000,256,0x5\n\
        1,00:00:00.000002,free,0x9000,256,0x5\n\
        1,00:00:00.000003,allocate,0x2000\n"
        .to_vec();
    bytes.extend_from_slice(b"1,00:00:00.000004,free,0x1000,256,\xff\n");
    std::fs::write(&bad, &bytes).unwrap();
    let bad = bad.to_str().unwrap();

    let out = streamalloc(&["replay", bad, "--resource", "pool", "--device", "host"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("log: 2 malformed lines skipped, 1 frees of pointers not live skipped"),
        "{stdout}"
    );

    let out = streamalloc(&[
        "replay",
        bad,
        "--resource",
        "pool",
        "--device",
        "host",
        "--strict",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("event log line 3: free of 0x9000"),
        "{stderr}"
    );

    let missing = dir.join("missing.csv");
    let out = streamalloc(&["replay", missing.to_str().unwrap(), "--resource", "pool"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("missing.csv"),
        "{}",
        text(&out.stderr)
    );

    let headless = dir.join("headless.csv");
    std::fs::write(&headless, "1,00:00:00.000001,allocate,0x1000,256,0\n").unwrap();
    let out = streamalloc(&["replay", headless.to_str().unwrap(), "--resource", "pool"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("event log line 1"),
        "{}",
        text(&out.stderr)
    );

    let out = streamalloc(&[
        "replay",
        EXCERPT,
        "--resource",
        "pool",
        "--device",
        "sideways",
    ]);
    assert_eq!(out.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_describes_the_options_and_columns() {
    let out = streamalloc(&["replay", "--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for word in [
        "--resource",
        "--device",
        "--html",
        "--torch-snapshot",
        "--strict",
        "--mode",
        "in-order",
        "per-thread",
        "REPLAY_BENCHMARK",
        "--max-threads",
        "--wait-timeout-ms",
        "peak reserved",
        "ns/op",
        "binning",
        "2^18..2^22",
        "waits",
        "first resource that gives a snapshot",
        "regular file",
        "Exit codes",
        "0: ",
        "1: ",
        "2: ",
        "3: ",
    ] {
        assert!(help.contains(word), "{word}: {help}");
    }
    let out = streamalloc(&["--help"]);
    assert!(out.status.success() && text(&out.stdout).contains("replay"));
}

#[test]
fn every_export_is_written() {
    let dir = std::env::temp_dir().join(format!("streamalloc-cli-torch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("snapshot.pickle");
    let html = dir.join("report.html");
    let out = replay_excerpt(
        "pool,arena",
        &[
            "--torch-snapshot",
            path.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
            "--svg",
            dir.join("svg").to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Standalone pictures: both resources' timelines and segment maps.
    for name in [
        "pool-timeline",
        "pool-segments",
        "arena-timeline",
        "arena-segments",
    ] {
        let svg = std::fs::read_to_string(dir.join("svg").join(format!("{name}.svg"))).unwrap();
        assert!(
            svg.starts_with("<svg xmlns=") && svg.trim_end().ends_with("</svg>"),
            "{name}"
        );
    }
    let pickle = std::fs::read(&path).unwrap();
    assert!(pickle.len() > 1000, "{} bytes", pickle.len());
    assert_eq!(&pickle[..2], b"\x80\x04", "pickle protocol 4");
    assert_eq!(pickle.last(), Some(&b'.'));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<svg") && page.contains("</html>"),
        "{} bytes",
        page.len()
    );
    // The table, both resources' sections and the logged streams' names are in it.
    for word in ["peak reserved", "pool", "arena", "stream 0x5560f4acda50"] {
        assert!(page.contains(word), "{word}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("streamalloc-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A log whose peak is a TiB finishes at once on every resource: the host device's capacity is
/// clamped to something real, so the request is a counted failure, not a TiB mapped page by
/// page.
#[test]
fn a_hostile_tib_log_is_a_counted_failure_on_every_resource() {
    let dir = scratch("tib");
    let log = dir.join("tib.csv");
    std::fs::write(
        &log,
        "Thread,Time,Action,Pointer,Size,Stream\n\
         1,00:00:00.000001,allocate,0x7f0000000000,1099511627776,0\n\
         1,00:00:00.000002,free,0x7f0000000000,1099511627776,0\n",
    )
    .unwrap();
    let names = [
        "cuda",
        "managed",
        "pool",
        "arena",
        "binning",
        "cuda-async",
        "fixed-size",
        "mapped-pool",
    ];
    let out = streamalloc(&[
        "replay",
        log.to_str().unwrap(),
        "--resource",
        &names.join(","),
        "--device",
        "host",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for name in names {
        let row = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name}: {stdout}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        // resource, peak live (2 cells), peak reserved (2), ratio, failures, waits, ...
        assert_eq!((cells[1], cells[6]), ("0", "1"), "{name}: {stdout}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A LOG that is not a regular file (a pipe, a device) is refused up front with exit code 2:
/// the log is read once per pass.
#[cfg(unix)]
#[test]
fn a_log_that_is_not_a_regular_file_is_refused() {
    use std::io::Write as _;
    use std::process::Stdio;
    let log = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(EXCERPT)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_streamalloc"))
        .args([
            "replay",
            "/dev/stdin",
            "--resource",
            "pool",
            "--device",
            "host",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // The binary may exit before reading it all: a broken pipe is fine.
    let _ = stdin.write_all(&log);
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("not a regular file"), "{stderr}");
    let out = streamalloc(&["replay", "/dev/null", "--resource", "pool"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("not a regular file"));
}

/// An export that cannot be created fails before the replay (exit 3, no table), naming its
/// path.
#[test]
fn an_export_that_cannot_be_created_fails_before_the_replay() {
    let dir = scratch("nodir");
    let html = dir.join("missing-dir").join("report.html");
    let out = streamalloc(&[
        "replay",
        EXCERPT,
        "--resource",
        "pool",
        "--device",
        "host",
        "--html",
        html.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "", "no replay, no table");
    assert!(
        text(&out.stderr).contains("report.html"),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An export that fails while being written does not stop the others: every one is
/// attempted, and the exit code is 3.
#[cfg(target_os = "linux")]
#[test]
fn every_export_is_attempted_when_one_fails() {
    let dir = scratch("full");
    let pickle = dir.join("snapshot.pickle");
    let out = streamalloc(&[
        "replay",
        EXCERPT,
        "--resource",
        "pool",
        "--device",
        "host",
        "--html",
        "/dev/full",
        "--torch-snapshot",
        pickle.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("/dev/full"),
        "{}",
        text(&out.stderr)
    );
    let bytes = std::fs::read(&pickle).unwrap();
    assert_eq!(
        bytes.last(),
        Some(&b'.'),
        "the snapshot was written in full"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
