"""Reads a PyTorch memory snapshot (pickle) as torch/cuda/_memory_viz.py and the memory_viz
viewer do, without torch, and fails on what would make them fail or mislead.

Usage: python3 torch_viz_check.py SNAPSHOT.pickle  (exit 0 and "ok ..." when it passes)

- segsum ("stats"): per segment, the active blocks' requested sizes, their rounding and the
  free blocks add up to the segment's size; it prints the internal-fragmentation share.
- trace: every alloc lies in a segment the trace allocated or the snapshot holds.
- the viewer's "Allocator State History": from the snapshot's segments and active blocks,
  each trace entry undone from the last one back; at every step each block must lie in a
  segment, and an undone free_requested must find its block.
"""
import pickle
import sys


def segsum(data):
    internal = external = allocated = reserved = 0
    for seg in data["segments"]:
        reserved += seg["total_size"]
        s_int = s_ext = s_alloc = 0
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                s_alloc += b["requested_size"]
                s_int += b["size"] - b["requested_size"]
            else:
                s_ext += b["size"]
        assert s_int + s_ext + s_alloc == seg["total_size"], seg["address"]
        internal += s_int
        external += s_ext
        allocated += s_alloc
    assert internal + external + allocated == reserved
    total = internal + external
    return 100.0 * internal / total if total else 0.0


def find(segments, addr):
    for start, size in segments:
        if start <= addr < start + size:
            return (start, size)
    return None


def join(runs):
    """Touching mapped runs as one, as the viewer joins a segment_map with its neighbours."""
    out = []
    for s in sorted(runs):
        if out and out[-1][0] + out[-1][1] == s[0]:
            out[-1] = (out[-1][0], out[-1][1] + s[1])
        else:
            out.append(s)
    return out


def history(data, device):
    mine = [s for s in data["segments"] if s["device"] == device]
    whole = [(s["address"], s["total_size"]) for s in mine if not s["is_expandable"]]
    runs = join([(s["address"], s["total_size"]) for s in mine if s["is_expandable"]])
    blocks = {}
    for s in mine:
        for b in s["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[b["address"]] = b["size"]

    def inside(addr, size):
        seg = find(whole, addr) or find(runs, addr)
        return seg is not None and addr + size <= seg[0] + seg[1]

    for addr, size in blocks.items():
        assert inside(addr, size), f"snapshot: block {addr:#x} outside every segment"
    events = data["device_traces"][device]
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        a = e["action"]
        what = f"entry {i} {a}"
        if a == "oom":
            continue
        lo, hi = e["addr"], e["addr"] + e["size"]
        if a == "free_completed":
            assert inside(lo, e["size"]), f"{what}: block {lo:#x} outside every segment"
            blocks[lo] = e["size"]
        elif a == "free_requested":
            assert lo in blocks, f"{what}: no block at {lo:#x}"
        elif a == "alloc":
            assert inside(lo, e["size"]), f"{what}: block {lo:#x} outside every segment"
            blocks.pop(lo, None)
        elif a == "segment_free":
            whole.append((lo, e["size"]))
        elif a == "segment_unmap":
            runs = join(runs + [(lo, e["size"])])
        elif a == "segment_alloc":
            assert (lo, e["size"]) in whole, f"{what}: no segment at {lo:#x}"
            whole.remove((lo, e["size"]))
        elif a == "segment_map":
            seg = find(runs, lo)
            assert seg and hi <= seg[0] + seg[1], f"{what}: outside a mapped run"
            runs.remove(seg)
            runs = join(runs + [r for r in ((seg[0], lo - seg[0]),
                                            (hi, seg[0] + seg[1] - hi)) if r[1] > 0])
        if a in ("segment_alloc", "segment_map"):
            lost = [b for b, n in blocks.items() if b < hi and b + n > lo]
            assert not lost, f"{what}: blocks {lost[:3]} lose their segment"
    assert not blocks, f"{len(blocks)} blocks live before the first entry"
    return len(events)


def main(path):
    with open(path, "rb") as f:
        data = pickle.load(f)
    for key in ("segments", "device_traces", "allocator_settings", "external_annotations"):
        assert key in data, f"no {key}"
    internal = segsum(data)
    entries = 0
    for device, trace in enumerate(data["device_traces"]):
        if trace:
            entries += history(data, device)
    times = [e["time_us"] for t in data["device_traces"] for e in t]
    assert all(a <= b for a, b in zip(times, times[1:])), "time_us goes back"
    print(f"ok {len(data['segments'])} segments {entries} entries {internal:.1f}% internal")


if __name__ == "__main__":
    main(sys.argv[1])
