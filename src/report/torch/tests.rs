use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_pickle::{HashableValue, Value};

use std::backtrace::Backtrace;

use super::frames::parse_frames;
use super::*;
use crate::resource::{DevicePtr, TraceAction};
use crate::{BackendKind, DeviceId, StreamId};

const HIGH: u64 = 0x7f12_3456_0000; // above 2^32: must come back exact

#[inline(never)]
fn allocation_site_for_the_test() -> Arc<Backtrace> {
    Arc::new(Backtrace::force_capture())
}

/// A snapshot with every state, a gap, a block reaching past its segment, a site, a segment
/// that ends at 2^64, and a non-ASCII resource name, on device ordinal 2.
fn sample() -> MemorySnapshot {
    let device = DeviceId {
        backend: BackendKind::Cuda,
        ordinal: 2,
    };
    let mut snap = MemorySnapshot::new(device, "pool ünïcødé");
    snap.capacity = Some(usize::MAX);
    let base = DevicePtr::from_raw(HIGH);
    let mut a = Segment::new(base, 8192);
    a.stream = Some(StreamId(5));
    let mut live = Block::new(base, 1024, BlockState::Live)
        .on_stream(StreamId(5))
        .with_requested(1000);
    live.site = Some(allocation_site_for_the_test());
    a.blocks.push(live);
    a.blocks
        .push(Block::new(base.offset(1024), 1024, BlockState::Pending).on_stream(StreamId(6)));
    a.blocks
        .push(Block::new(base.offset(2048), 1024, BlockState::FreeOnStream).on_stream(StreamId(6)));
    // 3072..4096 undescribed: a gap.
    a.blocks
        .push(Block::new(base.offset(4096), 2048, BlockState::Free));
    // Reaches 1 KiB past the segment's end: clipped.
    a.blocks
        .push(Block::new(base.offset(6144), 3072, BlockState::Live).on_stream(StreamId(5)));
    // The top of the address space, to 2^64 exactly.
    let top = DevicePtr::from_raw(u64::MAX - 4095);
    let mut b = Segment::new(top, 4096);
    b.blocks.push(Block::new(top, 4096, BlockState::Live));
    snap.segments.push(b); // out of order on purpose: written in address order
    snap.segments.push(a);
    snap
}

fn sample_trace() -> Timeline {
    let mut t = Timeline::new();
    let base = DevicePtr::from_raw(HIGH);
    t.record_at(
        Duration::from_micros(10),
        TraceAction::SegmentAlloc,
        base,
        8192,
        StreamId(5),
    );
    t.record_at(
        Duration::from_micros(20),
        TraceAction::Alloc,
        base,
        1000,
        StreamId(5),
    );
    t.record_at(
        Duration::from_micros(30),
        TraceAction::Alloc,
        base.offset(1024),
        1024,
        StreamId(6),
    );
    t.record_at(
        Duration::from_micros(40),
        TraceAction::Free,
        base.offset(1024),
        1024,
        StreamId(6),
    );
    t.record_at(
        Duration::from_micros(50),
        TraceAction::Oom,
        DevicePtr::NULL,
        usize::MAX,
        StreamId(5),
    );
    t
}

fn pickled(snap: &MemorySnapshot, trace: Option<&Timeline>) -> Vec<u8> {
    let mut out = Vec::new();
    write_torch_snapshot(&mut out, snap, trace).unwrap();
    out
}

/// What both decoders must read, one line per item, in Python's `repr` of each value.
const EXPECTED: &str = "\
keys ['allocator_settings', 'device_traces', 'external_annotations', 'segments', 'streamalloc']
segment 2 139716164190208 8192 3072 4096 3048 5 'small' (0, 0) False 0
  block 139716164190208 1024 1000 'active_allocated' 5
  block 139716164191232 1024 1024 'active_pending_free' 6
  block 139716164192256 4096 0 'inactive' None
  block 139716164196352 2048 2048 'active_allocated' 5
segment 2 18446744073709547520 4096 4096 4096 4096 0 'small' (0, 0) False 0
  block 18446744073709547520 4096 4096 'active_allocated' None
traces 3 [0, 0, 5]
  entry 'segment_alloc' 139716164190208 None 8192 5 10
  entry 'alloc' 139716164190208 None 1000 5 20
  entry 'alloc' 139716164191232 None 1024 6 30
  entry 'free_requested' 139716164191232 None 1024 6 40
  entry 'oom' None 0 18446744073709551615 5 50
streamalloc 'pool ünïcødé' 'cuda:2' 18446744073709551615 0
";

/// The Python side of the summary (it prints what [`summary`] prints).
const PYTHON_SUMMARY: &str = r#"
import pickle, sys
with open(sys.argv[1], 'rb') as f:
    d = pickle.load(f)
out = [f"keys {sorted(d.keys())!r}"]
for s in d['segments']:
    out.append("segment " + " ".join(repr(s[k]) for k in ['device', 'address', 'total_size',
        'allocated_size', 'active_size', 'requested_size', 'stream', 'segment_type',
        'segment_pool_id', 'is_expandable']) + f" {len(s['frames'])}")
    for b in s['blocks']:
        out.append("  block " + " ".join(repr(b[k]) for k in ['address', 'size',
            'requested_size', 'state', 'stream']))
out.append(f"traces {len(d['device_traces'])} {[len(t) for t in d['device_traces']]!r}")
for e in d['device_traces'][-1]:
    out.append("  entry " + " ".join(repr(e.get(k)) for k in ['action', 'addr',
        'device_free', 'size', 'stream', 'time_us']))
x = d['streamalloc']
out.append("streamalloc " + " ".join(repr(x[k]) for k in ['resource', 'device', 'capacity',
    'dropped_events']))
sys.stdout.buffer.write(("\n".join(out) + "\n").encode())
"#;

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    match v {
        Value::Dict(d) => d
            .get(&HashableValue::String(key.to_owned()))
            .unwrap_or(&Value::None),
        other => panic!("not a dict: {other:?}"),
    }
}

fn list(v: &Value) -> &[Value] {
    match v {
        Value::List(l) => l,
        other => panic!("not a list: {other:?}"),
    }
}

/// Python's `repr` of the scalars and tuples the summary prints.
fn repr(v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::I64(i) => i.to_string(),
        Value::Int(i) => i.to_string(),
        Value::String(s) => format!("'{s}'"),
        Value::Tuple(t) => format!("({})", t.iter().map(repr).collect::<Vec<_>>().join(", ")),
        Value::List(l) => format!("[{}]", l.iter().map(repr).collect::<Vec<_>>().join(", ")),
        other => panic!("unexpected {other:?}"),
    }
}

fn reprs(v: &Value, keys: &[&str]) -> String {
    keys.iter()
        .map(|k| repr(get(v, k)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The summary, read with serde-pickle.
fn summary(bytes: &[u8]) -> String {
    let d = serde_pickle::value_from_slice(bytes, serde_pickle::DeOptions::new()).unwrap();
    let Value::Dict(top) = &d else {
        panic!("not a dict")
    };
    let keys: Vec<_> = top
        .keys()
        .map(|k| match k {
            HashableValue::String(s) => format!("'{s}'"),
            other => panic!("key {other:?}"),
        })
        .collect();
    let mut out = vec![format!("keys [{}]", keys.join(", "))];
    for s in list(get(&d, "segments")) {
        out.push(format!(
            "segment {} {}",
            reprs(
                s,
                &[
                    "device",
                    "address",
                    "total_size",
                    "allocated_size",
                    "active_size",
                    "requested_size",
                    "stream",
                    "segment_type",
                    "segment_pool_id",
                    "is_expandable"
                ]
            ),
            list(get(s, "frames")).len()
        ));
        for b in list(get(s, "blocks")) {
            let keys = ["address", "size", "requested_size", "state", "stream"];
            out.push(format!("  block {}", reprs(b, &keys)));
        }
    }
    let traces = list(get(&d, "device_traces"));
    let lens: Vec<_> = traces.iter().map(|t| list(t).len().to_string()).collect();
    out.push(format!("traces {} [{}]", traces.len(), lens.join(", ")));
    for e in list(traces.last().unwrap()) {
        let keys = ["action", "addr", "device_free", "size", "stream", "time_us"];
        out.push(format!("  entry {}", reprs(e, &keys)));
    }
    let x = get(&d, "streamalloc");
    out.push(format!(
        "streamalloc {}",
        reprs(x, &["resource", "device", "capacity", "dropped_events"])
    ));
    out.join("\n") + "\n"
}

fn temp_file(bytes: &[u8], tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "streamalloc-torch-{tag}-{}.pickle",
        std::process::id()
    ));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Python's reading of `bytes`, or `None` (with a note) where there is no `python3`.
fn python_summary(bytes: &[u8], tag: &str) -> Option<String> {
    let path = temp_file(bytes, tag);
    let out = Command::new("python3")
        .arg("-c")
        .arg(PYTHON_SUMMARY)
        .arg(&path)
        .output();
    let _ = std::fs::remove_file(&path);
    match out {
        Err(e) => {
            eprintln!("note: python3 not run ({e}): the pickle is checked with serde-pickle only");
            None
        }
        Ok(out) => {
            assert!(
                out.status.success(),
                "python3 failed to load the pickle: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(String::from_utf8(out.stdout).unwrap())
        }
    }
}

#[test]
fn serde_pickle_reads_the_segments_blocks_and_traces() {
    let bytes = pickled(&sample(), Some(&sample_trace()));
    assert_eq!(summary(&bytes), EXPECTED);
}

#[test]
fn only_opcodes_the_viewer_reads_are_written() {
    let bytes = pickled(&sample(), Some(&sample_trace()));
    assert_eq!(pickle::first_foreign_opcode(&bytes), None);
    // The check itself: a protocol-5 opcode (BYTEARRAY8) is caught.
    assert_eq!(
        pickle::first_foreign_opcode(b"\x80\x04\x96"),
        Some((2, 0x96))
    );
}

#[test]
fn python_reads_the_segments_blocks_and_traces() {
    let bytes = pickled(&sample(), Some(&sample_trace()));
    if let Some(py) = python_summary(&bytes, "sample") {
        assert_eq!(py, EXPECTED);
    }
}

#[test]
fn blocks_tile_their_segment() {
    let bytes = pickled(&sample(), None);
    let d = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).unwrap();
    let int = |v: &Value| repr(v).parse::<u128>().unwrap();
    for s in list(get(&d, "segments")) {
        let mut addr = int(get(s, "address"));
        for b in list(get(s, "blocks")) {
            assert_eq!(int(get(b, "address")), addr);
            addr += int(get(b, "size"));
        }
        assert_eq!(addr, int(get(s, "address")) + int(get(s, "total_size")));
    }
}

#[test]
fn a_live_blocks_site_becomes_its_frames() {
    let bytes = pickled(&sample(), None);
    let d = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).unwrap();
    let segments = list(get(&d, "segments"));
    let blocks = list(get(&segments[0], "blocks"));
    let frames = list(get(&blocks[0], "frames"));
    assert!(!frames.is_empty());
    // Blocks without a site, and free blocks, have none.
    assert!(list(get(&blocks[1], "frames")).is_empty());
    assert!(list(get(&blocks[2], "frames")).is_empty());
    assert!(list(get(&blocks[3], "frames")).is_empty());
    if !crate::test_support::backtraces_have_symbols() {
        eprintln!("frame names not checked: this binary's backtraces have no symbols");
        return;
    }
    let site = frames
        .iter()
        .find(|f| repr(get(f, "name")).contains("allocation_site_for_the_test"))
        .expect("the allocating function is a frame");
    if !crate::test_support::backtraces_have_locations() {
        eprintln!("frame files and lines not checked: this binary has no debug info");
        return;
    }
    assert!(
        repr(get(site, "filename")).ends_with("torch/tests.rs'"),
        "{site:?}"
    );
    assert!(matches!(get(site, "line"), Value::I64(l) if *l > 0));
}

#[test]
fn frames_are_read_from_std_backtrace_text() {
    let text = "   0: streamalloc::adaptor::tracking::Inner<R>::record_slow\n\
                \x20            at ./src/adaptor/tracking.rs:311:13\n\
                \x20  1: my_app::load::{{closure}}\n\
                \x20            at ./src/main.rs:42:9\n\
                \x20     my_app::inlined_helper\n\
                \x20            at C:\\work\\app\\src\\lib.rs:7:1\n\
                \x20  2: main\n";
    let frames = parse_frames(text);
    let got: Vec<_> = frames
        .iter()
        .map(|f| (f.name.as_str(), f.filename.as_str(), f.line))
        .collect();
    assert_eq!(
        got,
        [
            (
                "streamalloc::adaptor::tracking::Inner<R>::record_slow",
                "./src/adaptor/tracking.rs",
                311
            ),
            ("my_app::load::{{closure}}", "./src/main.rs", 42),
            ("my_app::inlined_helper", "C:\\work\\app\\src\\lib.rs", 7),
            ("main", "??", 0),
        ]
    );
    assert!(super::frames(&Backtrace::disabled()).is_empty());
}

#[test]
fn an_empty_snapshot_has_no_segments_and_one_empty_trace_per_ordinal() {
    let snap = MemorySnapshot::new(crate::Device::host().id(), "");
    let bytes = pickled(&snap, None);
    let expected = "keys ['allocator_settings', 'device_traces', 'external_annotations', \
                    'segments', 'streamalloc']\n\
                    traces 1 [0]\n\
                    streamalloc '' 'host:0' None 0\n";
    assert_eq!(summary(&bytes), expected);
    if let Some(py) = python_summary(&bytes, "empty") {
        assert_eq!(py, expected);
    }
}

#[test]
fn a_tiny_snapshot_has_these_exact_bytes() {
    let mut snap = MemorySnapshot::new(crate::Device::host().id(), "p");
    let mut seg = Segment::new(DevicePtr::from_raw(0x100), 0x200);
    seg.blocks.push(Block::new(
        DevicePtr::from_raw(0x100),
        0x100,
        BlockState::Live,
    ));
    snap.segments.push(seg);
    let bytes = pickled(&snap, None);
    // PROTO 4, {, MARK, "segments" (memoized), [, MARK, {, MARK, "device": 0, "address":
    // 0x100, "total_size": 0x200, ...
    let head: &[u8] = b"\x80\x04}(\x8c\x08segmentsq\x00](}(\x8c\x06deviceq\x01K\x00\
\x8c\x07addressq\x02M\x00\x01\x8c\x0atotal_sizeq\x03M\x00\x02";
    assert_eq!(&bytes[..head.len()], head);
    assert_eq!(bytes.last(), Some(&b'.'));
}

#[test]
fn huge_values_and_long_traces_round_trip() {
    let mut snap = MemorySnapshot::new(crate::Device::host().id(), "x".repeat(300));
    let mut seg = Segment::new(DevicePtr::from_raw(0), usize::MAX);
    seg.blocks.push(Block::new(
        DevicePtr::from_raw(0),
        usize::MAX,
        BlockState::Live,
    ));
    snap.segments.push(seg);
    let mut t = Timeline::with_limits(3000, 16);
    for i in 0..2500u64 {
        t.record(
            TraceAction::Alloc,
            DevicePtr::from_raw(i << 8),
            256,
            StreamId(i % 3),
        );
    }
    let bytes = pickled(&snap, Some(&t));
    let s = summary(&bytes);
    assert!(
        s.contains(&format!(
            "segment 0 0 {m} {m} {m} {m} 0 'large'",
            m = usize::MAX
        )),
        "{s}"
    );
    assert!(s.contains("traces 1 [2500]"));
    assert!(s.contains(&format!("'{}'", "x".repeat(300))));
    if let Some(py) = python_summary(&bytes, "huge") {
        assert_eq!(py, s);
    }
}

#[test]
fn an_absurd_device_ordinal_is_an_error_not_a_huge_file() {
    let snap = MemorySnapshot::new(
        DeviceId {
            backend: BackendKind::Cuda,
            ordinal: u32::MAX,
        },
        "x",
    );
    let err = write_torch_snapshot(Vec::new(), &snap, None).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("4294967295"), "{err}");
}

#[test]
fn a_tracked_allocation_shows_its_caller_first_not_the_tracking_adaptor() {
    use crate::{CudaResource, Device, MemoryResource, Stream, TrackingAdaptor};
    let device = Device::host();
    let stream = Stream::new(&device).unwrap();
    let mr = TrackingAdaptor::with_backtraces(CudaResource::new(&device).unwrap());
    let p = mr.try_allocate(1000, &stream).unwrap();
    let snap = mr.snapshot().unwrap();
    crate::test_support::free(&mr, p, 1000, &stream);
    let bytes = pickled(&snap, None);
    let d = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).unwrap();
    let block = &list(get(&list(get(&d, "segments"))[0], "blocks"))[0];
    let names: Vec<_> = list(get(block, "frames"))
        .iter()
        .map(|f| repr(get(f, "name")))
        .collect();
    assert!(!names.is_empty());
    if !crate::test_support::backtraces_have_symbols() {
        eprintln!("frame names not checked: this binary's backtraces have no symbols");
        return;
    }
    assert!(!names[0].contains("adaptor::tracking"), "{names:?}");
    assert!(
        names[..3]
            .iter()
            .any(|n| n.contains("a_tracked_allocation_shows_its_caller_first")),
        "{names:?}"
    );
}

#[test]
fn a_live_blocks_allocation_entry_carries_its_sites_frames() {
    let bytes = pickled(&sample(), Some(&sample_trace()));
    let d = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).unwrap();
    let traces = list(get(&d, "device_traces"));
    let entries = list(traces.last().unwrap());
    let frames = |i: usize| list(get(&entries[i], "frames")).len();
    // The alloc of the live, tracked block at the segment's base has the site's frames;
    // the segment's, and the freed block's, have none.
    assert_eq!(repr(get(&entries[1], "action")), "'alloc'");
    assert!(frames(1) > 0);
    assert_eq!((frames(0), frames(2), frames(3)), (0, 0, 0));
}
