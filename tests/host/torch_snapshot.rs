//! The PyTorch memory snapshot of a replayed log, checked against the rules PyTorch's viewer
//! and `torch/cuda/_memory_viz.py` read it by: blocks tile their segments, every block lies
//! in a segment alive at each event of the trace (the viewer's "Allocator State History"
//! replays the trace backwards from the snapshot), states, sizes, streams, devices, times.
//! Where PyTorch's own `_memory_viz.py` is at hand (an installed `torch`, or the file that
//! `TORCH_MEMORY_VIZ` names: it needs no `torch` to run), its `stats`, `trace`, `trace_plot`
//! and `segment_plot` read the snapshot too.

use std::collections::{BTreeMap, HashMap};

use serde_pickle::{HashableValue, Value};
use streamalloc::replay::{replay, scan_log, EventReader, ReplayOptions};
use streamalloc::report::torch::write_torch_snapshot;
use streamalloc::*;

/// RMM's 5-stream log, an excerpt.
const LOG: &str = include_str!("../data/rmm_26.10_5streams_excerpt.csv");

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    let Value::Dict(d) = v else {
        panic!("not a dict: {v:?}")
    };
    d.get(&HashableValue::String(key.to_owned()))
        .unwrap_or_else(|| panic!("no key {key}"))
}

fn list(v: &Value) -> &[Value] {
    match v {
        Value::List(l) => l,
        other => panic!("not a list: {other:?}"),
    }
}

fn int(v: &Value) -> u64 {
    match v {
        Value::I64(i) => u64::try_from(*i).expect("not negative"),
        Value::Int(i) => u64::try_from(i).expect("fits 64 bits"),
        other => panic!("not an int: {other:?}"),
    }
}

fn text(v: &Value) -> &str {
    match v {
        Value::String(s) => s,
        other => panic!("not a string: {other:?}"),
    }
}

/// Replays the excerpt on `mr` (recording), takes the snapshot at its peak and exports it.
fn export(mr: &dyn MemoryResource, device: &Device) -> Vec<u8> {
    let options = ReplayOptions::default();
    let summary = scan_log(EventReader::new(LOG.as_bytes()).unwrap(), &options).unwrap();
    let options = ReplayOptions {
        record: true,
        snapshot_line: Some(summary.peak_line),
        ..ReplayOptions::default()
    };
    let r = replay(
        EventReader::new(LOG.as_bytes()).unwrap(),
        mr,
        device,
        &options,
    )
    .unwrap();
    assert!(r.is_clean(), "{r}");
    let mut out = Vec::new();
    write_torch_snapshot(
        &mut out,
        r.peak_snapshot.as_ref().expect("a snapshot at the peak"),
        r.timeline_at_peak.as_ref(),
    )
    .unwrap();
    out
}

/// The viewer's picture at one event: whole segments (address → end), mapped runs (start →
/// end, merged) and blocks (address → end).
#[derive(Default)]
struct State {
    whole: BTreeMap<u64, u64>,
    /// Mapped runs: start → (end, stream). The viewer joins neighbouring ranges only where
    /// their streams agree, and takes an unmapped range out of the one run that holds it.
    mapped: BTreeMap<u64, (u64, u64)>,
    blocks: BTreeMap<u64, u64>,
}

impl State {
    /// The end of the whole segment or mapped run that starts at or before `start`, of each.
    fn ends_before(&self, start: u64) -> [Option<u64>; 2] {
        [
            self.whole.range(..=start).next_back().map(|(_, &e)| e),
            self.mapped
                .range(..=start)
                .next_back()
                .map(|(_, &(e, _))| e),
        ]
    }

    /// Whether `start..end` lies in one segment.
    fn covered(&self, start: u64, end: u64) -> bool {
        self.ends_before(start)
            .iter()
            .any(|e| e.is_some_and(|e| end <= e))
    }

    /// Whether a block overlaps `start..end`.
    fn holds_blocks(&self, start: u64, end: u64) -> bool {
        let before = self.blocks.range(..start).next_back();
        before.is_some_and(|(_, &e)| e > start) || self.blocks.range(start..end).next().is_some()
    }

    fn overlaps_segments(&self, start: u64, end: u64) -> bool {
        let last_whole = self.whole.range(..end).next_back().map(|(_, &e)| e);
        let last_run = self.mapped.range(..end).next_back().map(|(_, &(e, _))| e);
        [last_whole, last_run]
            .iter()
            .any(|e| e.is_some_and(|e| e > start))
    }

    /// Adds a mapped range of `stream`, joined to its neighbours of the same stream.
    fn map(&mut self, mut start: u64, mut end: u64, stream: u64) {
        if let Some((&s, &(e, st))) = self.mapped.range(..start).next_back() {
            if e == start && st == stream {
                self.mapped.remove(&s);
                start = s;
            }
        }
        if let Some(&(e, st)) = self.mapped.get(&end) {
            if st == stream {
                self.mapped.remove(&end);
                end = e;
            }
        }
        self.mapped.insert(start, (end, stream));
    }

    /// Takes a mapped range out of the run that holds it.
    fn unmap(&mut self, start: u64, end: u64) {
        let (&s, &(e, stream)) = self.mapped.range(..=start).next_back().expect("a run");
        assert!(end <= e, "unmapped {start:#x}..{end:#x} outside a run");
        self.mapped.remove(&s);
        if s < start {
            self.mapped.insert(s, (start, stream));
        }
        if end < e {
            self.mapped.insert(end, (e, stream));
        }
    }
}

/// What a checked snapshot showed.
#[derive(Debug, Default)]
struct Figures {
    segments: usize,
    actions: HashMap<String, usize>,
    segment_streams: std::collections::HashSet<u64>,
    internal_free: u64,
    /// Segments that are expandable (runs of mapped pages).
    expandable: usize,
}

/// Checks every rule. Whole segments and expandable ones (runs of mapped pages) may mix: a
/// pool keeps its large blocks in mapped pages.
fn check(bytes: &[u8]) -> Figures {
    let d = serde_pickle::value_from_slice(bytes, serde_pickle::DeOptions::new()).unwrap();
    let mut f = Figures::default();
    // Top-level keys PyTorch's `_snapshot()` has.
    let settings = get(&d, "allocator_settings");
    assert_eq!(text(get(settings, "PYTORCH_CUDA_ALLOC_CONF")), "");
    assert!(list(get(&d, "external_annotations")).is_empty());
    // A host device is device 0: one trace list, every segment on it.
    let traces = list(get(&d, "device_traces"));
    assert_eq!(traces.len(), 1, "a host replay is device 0");
    let trace = list(&traces[0]);

    let mut state = State::default();
    let mut live_requested: HashMap<u64, u64> = HashMap::new();
    for s in list(get(&d, "segments")) {
        f.segments += 1;
        assert_eq!(int(get(s, "device")), 0);
        let (address, total) = (int(get(s, "address")), int(get(s, "total_size")));
        let mapped = get(s, "is_expandable") == &Value::Bool(true);
        f.expandable += usize::from(mapped);
        f.segment_streams.insert(int(get(s, "stream")));
        let (mut at, mut allocated, mut active, mut requested) = (address, 0, 0, 0);
        let mut last_free = false;
        for b in list(get(s, "blocks")) {
            let (size, req) = (int(get(b, "size")), int(get(b, "requested_size")));
            assert_eq!(int(get(b, "address")), at, "blocks tile their segment");
            assert!(size > 0 && req <= size, "requested {req} of {size}");
            let state_name = text(get(b, "state"));
            match state_name {
                "active_allocated" => {
                    allocated += size;
                    active += size;
                    requested += req;
                    f.internal_free += size - req;
                    assert!(req > 0);
                    assert!(
                        get(b, "stream") != &Value::None,
                        "a live block has a stream"
                    );
                    live_requested.insert(at, req);
                }
                "active_pending_free" => active += size,
                "inactive" => {
                    assert_eq!(req, 0);
                    assert!(!last_free, "neighbouring free blocks at {at:#x} not merged");
                }
                other => panic!("state {other}"),
            }
            last_free = state_name == "inactive";
            if state_name != "inactive" {
                state.blocks.insert(at, at + size);
            }
            at += size;
        }
        assert_eq!(at, address + total, "blocks end at the segment's end");
        assert_eq!(int(get(s, "allocated_size")), allocated);
        assert_eq!(int(get(s, "active_size")), active);
        assert_eq!(int(get(s, "requested_size")), requested);
        if mapped {
            state.map(address, address + total, int(get(s, "stream")));
        } else {
            assert!(state.whole.insert(address, address + total).is_none());
        }
    }
    assert_eq!(
        get(settings, "expandable_segments"),
        &Value::Bool(f.expandable > 0),
        "expandable_segments is whether any segment is"
    );

    // Times never go back; a live block's requested size is its allocation's.
    let times: Vec<u64> = trace.iter().map(|e| int(get(e, "time_us"))).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "time_us goes back");
    let mut seen_alloc: HashMap<u64, u64> = HashMap::new();
    for e in trace.iter().rev() {
        if text(get(e, "action")) == "alloc" {
            seen_alloc
                .entry(int(get(e, "addr")))
                .or_insert(int(get(e, "size")));
        }
    }
    for (addr, req) in &live_requested {
        if let Some(size) = seen_alloc.get(addr) {
            assert_eq!(
                req, size,
                "block {addr:#x}: requested size is the allocation's"
            );
        }
    }
    // The segments' streams are their segment_alloc's.
    let seg_streams: HashMap<u64, u64> = list(get(&d, "segments"))
        .iter()
        .map(|s| (int(get(s, "address")), int(get(s, "stream"))))
        .collect();
    let mut alive_at_end: HashMap<u64, u64> = HashMap::new();
    for e in trace {
        match text(get(e, "action")) {
            "segment_alloc" => {
                alive_at_end.insert(int(get(e, "addr")), int(get(e, "stream")));
            }
            "segment_free" => {
                alive_at_end.remove(&int(get(e, "addr")));
            }
            _ => {}
        }
    }
    for (addr, stream) in alive_at_end {
        assert_eq!(seg_streams.get(&addr), Some(&stream), "segment {addr:#x}");
    }

    // Every block of the snapshot lies in a segment, then the viewer's history, backwards.
    for (&s, &e) in &state.blocks {
        assert!(state.covered(s, e), "block {s:#x} outside every segment");
    }
    for (i, e) in trace.iter().enumerate().rev() {
        let action = text(get(e, "action"));
        *f.actions.entry(action.to_owned()).or_default() += 1;
        if action == "oom" {
            continue;
        }
        let (addr, size) = (int(get(e, "addr")), int(get(e, "size")));
        let end = addr + size;
        let at = format!("entry {i} {action} {addr:#x}+{size}");
        match action {
            "free_completed" => {
                assert!(state.covered(addr, end), "{at}: outside every segment");
                state.blocks.insert(addr, end);
            }
            "free_requested" => assert!(state.blocks.contains_key(&addr), "{at}: no block"),
            "alloc" => {
                assert!(state.covered(addr, end), "{at}: outside every segment");
                assert!(state.blocks.remove(&addr).is_some(), "{at}: no block");
            }
            "segment_free" | "segment_unmap" => {
                assert!(!state.overlaps_segments(addr, end), "{at}: overlaps");
                if action == "segment_free" {
                    state.whole.insert(addr, end);
                } else {
                    state.map(addr, end, int(get(e, "stream")));
                }
            }
            "segment_alloc" | "segment_map" => {
                assert!(!state.holds_blocks(addr, end), "{at}: blocks in it");
                if action == "segment_alloc" {
                    assert_eq!(state.whole.remove(&addr), Some(end), "{at}: not a segment");
                } else {
                    state.unmap(addr, end);
                }
            }
            other => panic!("{at}: action {other}"),
        }
    }
    assert!(state.blocks.is_empty(), "the log starts with nothing live");
    f
}

/// Runs `tests/torch_viz_check.py` (what `_memory_viz.py`'s `segsum` and `trace` and the
/// viewer's history read, in Python's own `pickle`) on the export, where python3 exists.
fn python_check(bytes: &[u8], tag: &str) {
    // Embedded and written out beside the export: the test binary may run where the source
    // tree is not (the GPU bundle).
    let dir = std::env::temp_dir();
    let stem = format!("streamalloc-torch-{tag}-{}", std::process::id());
    let (script, path) = (
        dir.join(format!("{stem}.py")),
        dir.join(format!("{stem}.pickle")),
    );
    std::fs::write(&script, include_str!("../torch_viz_check.py")).unwrap();
    std::fs::write(&path, bytes).unwrap();
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(&path)
        .output();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&script);
    match out {
        Ok(out) => assert!(
            out.status.success() && out.stdout.starts_with(b"ok "),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => eprintln!("python3 not run ({e}): the Python check is skipped"),
    }
}

/// PyTorch's own `torch/cuda/_memory_viz.py`: the file `TORCH_MEMORY_VIZ` names, else the one
/// of an installed `torch` (found without importing it); `None` where neither is at hand.
fn pytorch_memory_viz() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("TORCH_MEMORY_VIZ") {
        return Some(path.into());
    }
    let find = "import importlib.util, os; s = importlib.util.find_spec('torch'); \
                print(os.path.join(os.path.dirname(s.origin), 'cuda', '_memory_viz.py') if s else '')";
    let out = std::process::Command::new("python3")
        .args(["-c", find])
        .output()
        .ok()?;
    let path = String::from_utf8(out.stdout).ok()?;
    let path = std::path::PathBuf::from(path.trim());
    path.is_file().then_some(path)
}

/// Runs PyTorch's `_memory_viz.py` where it is at hand: `stats` (its `segsum`, which asserts
/// that every segment's blocks add up) counts the snapshot's segments, `trace` its entries, and
/// `trace_plot` and `segment_plot` (the viewer's pages) read it.
fn pytorch_check(bytes: &[u8], f: &Figures, tag: &str) {
    let Some(script) = pytorch_memory_viz() else {
        eprintln!("PyTorch's _memory_viz.py is not at hand (TORCH_MEMORY_VIZ, torch): not run");
        return;
    };
    let dir = std::env::temp_dir();
    let stem = format!("streamalloc-pytorch-{tag}-{}", std::process::id());
    let (path, html) = (
        dir.join(format!("{stem}.pickle")),
        dir.join(format!("{stem}.html")),
    );
    std::fs::write(&path, bytes).unwrap();
    let run = |action: &str| {
        let mut command = std::process::Command::new("python3");
        command.arg(&script).arg(action).arg(&path);
        if action.ends_with("plot") {
            command.arg("-o").arg(&html);
        }
        let out = command.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{script:?} {action}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let stats = run("stats");
    assert!(
        stats.contains(&format!("segments: {}\n", f.segments)),
        "{stats}"
    );
    let trace = run("trace");
    let entries: usize = f.actions.values().sum();
    assert!(trace.contains(&format!("{entries} entries\n")), "{trace}");
    run("trace_plot");
    run("segment_plot");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&html);
}

fn host() -> Device {
    Device::host_with(HostConfig::default().capacity(16 << 30))
}

#[test]
fn a_replayed_pools_torch_snapshot_follows_the_viewers_rules() {
    let device = host();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
    let bytes = export(&pool, &device);
    python_check(&bytes, "pool");
    let f = check(&bytes);
    pytorch_check(&bytes, &f, "pool");
    assert_eq!(f.expandable, 0, "no large block is live at the peak: {f:?}");
    assert!(f.actions["segment_alloc"] >= f.segments, "{f:?}");
    // Its chunks are segments of their own; its large blocks live in its own address range,
    // whose pages it maps and unmaps (expandable segments).
    assert!(f.actions.contains_key("segment_map"), "{f:?}");
    // The log has 5 streams: its segments are not all one stream's.
    assert!(f.segment_streams.len() > 1, "{f:?}");
    assert!(!f.segment_streams.contains(&0), "{f:?}");
    // Rounding shows as internal fragmentation.
    assert!(f.internal_free > 0, "{f:?}");
}

#[test]
fn a_replayed_arenas_torch_snapshot_follows_the_viewers_rules() {
    let device = host();
    let arena = ArenaResource::new(CudaResource::new(&device).unwrap(), None).unwrap();
    let bytes = export(&arena, &device);
    python_check(&bytes, "arena");
    let f = check(&bytes);
    pytorch_check(&bytes, &f, "arena");
    assert_eq!(f.expandable, 0, "{f:?}");
    assert!(f.actions["segment_alloc"] >= f.segments, "{f:?}");
    assert!(f.internal_free > 0, "{f:?}");
}

#[test]
fn a_replayed_mapped_pools_torch_snapshot_maps_and_unmaps_pages() {
    let device = host();
    let mapped = MappedPoolResource::new(&device).unwrap();
    let bytes = export(&mapped, &device);
    python_check(&bytes, "mapped");
    let f = check(&bytes);
    pytorch_check(&bytes, &f, "mapped");
    assert_eq!(
        f.expandable, f.segments,
        "every segment is mapped pages: {f:?}"
    );
    assert!(f.actions["segment_map"] > 0, "{f:?}");
    assert!(!f.actions.contains_key("segment_alloc"), "{f:?}");
    assert!(f.internal_free > 0, "{f:?}");
}

/// Binning shows its bins as segments cut out of its upstream pool's memory; PyTorch's
/// segments are whole device allocations, so the export joins the parts again: the trace's
/// segment events are the pool's memory coming and going, never a part resized under live
/// blocks (which PyTorch's viewer could not step back through).
#[test]
fn a_replayed_binnings_torch_snapshot_joins_its_bins_into_the_pools_segments() {
    let device = host();
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, None).unwrap();
    let binning = BinningResource::with_range(pool, 18, 22).unwrap();
    let bytes = export(&binning, &device);
    python_check(&bytes, "binning");
    let f = check(&bytes);
    pytorch_check(&bytes, &f, "binning");
    // The bins' chunks and the large blocks are all large: the pool keeps them in mapped
    // pages, so every segment is a run of them, growing and shrinking by pages.
    assert_eq!(f.expandable, f.segments, "{f:?}");
    assert!(f.actions["segment_map"] > 0, "{f:?}");
    // Bins' rounding shows as internal fragmentation.
    assert!(f.internal_free > 0, "{f:?}");
}
