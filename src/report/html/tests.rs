//! The pictures rendered (resvg, shapes only) and read back by pixel; the page checked for
//! balanced pictures and escaped text.

use resvg::{tiny_skia, usvg};

use super::colours::{hex, StreamColours, FREE, OOM, PALETTE, PENDING, RESERVED};
use super::{segment_map, segment_map_svg, timeline_svg, HtmlReport, ReportSection};
use crate::{
    Block, BlockState, Device, DevicePtr, MemorySnapshot, Segment, StreamId, Timeline, TraceAction,
};

const MIB: usize = 1 << 20;

struct Picture {
    pixmap: tiny_skia::Pixmap,
}

impl Picture {
    fn render(svg: &str) -> Picture {
        let tree = usvg::Tree::from_str(svg, &usvg::Options::default())
            .unwrap_or_else(|e| panic!("the SVG does not parse: {e}\n{svg}"));
        let size = tree.size().to_int_size();
        let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
        resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
        Picture { pixmap }
    }

    fn rgb(&self, x: u32, y: u32) -> (u8, u8, u8) {
        let p = self.pixmap.pixel(x, y).unwrap().demultiply();
        (p.red(), p.green(), p.blue())
    }

    /// The rows of column `x` between `top` and `bottom` whose pixel is `colour`.
    fn rows_of(&self, x: f64, top: f64, bottom: f64, colour: (u8, u8, u8)) -> Vec<u32> {
        (top.ceil() as u32..bottom.floor() as u32)
            .filter(|&y| self.rgb(x as u32, y) == colour)
            .collect()
    }

    /// Pixels of `colour` in the band of rows `top..bottom`.
    fn count_in_band(&self, top: f64, bottom: f64, colour: (u8, u8, u8)) -> usize {
        let mut n = 0;
        for y in top.ceil() as u32..bottom.floor() as u32 {
            for x in 0..self.pixmap.width() {
                n += usize::from(self.rgb(x, y) == colour);
            }
        }
        n
    }
}

/// Stream 1 holds 2, then 4 MiB; stream 2 holds 4 MiB only at event 2 (the peak, 8 MiB);
/// 10 MiB reserved throughout; a request of 16 MiB refused at event 5.
fn known_timeline() -> Timeline {
    let mut t = Timeline::new();
    let (a, b) = (StreamId(1), StreamId(2));
    t.name_stream(a, "compute");
    t.set_reserved(10 * MIB);
    let at = |n: u64| DevicePtr::from_raw(0x10_0000 * (n + 1));
    t.record(TraceAction::Alloc, at(0), 2 * MIB, a);
    t.record(TraceAction::Alloc, at(1), 2 * MIB, a);
    t.record(TraceAction::Alloc, at(2), 4 * MIB, b);
    t.record(TraceAction::Free, at(2), 4 * MIB, b);
    t.record(TraceAction::Free, at(1), 2 * MIB, a);
    t.record(TraceAction::Oom, DevicePtr::NULL, 16 * MIB, a);
    t
}

/// The timeline shows each stream's live bytes where it held them and nowhere else, stacked
/// in proportion, with the reserved line over them.
#[test]
fn the_timeline_renders_the_expected_series() {
    let t = known_timeline();
    let mut colours = StreamColours::named(t.streams());
    let (svg, frame) = timeline_svg::draw(&t, 600, 300, &mut colours, None);
    assert_eq!(svg, timeline_svg(&t, 600, 300));
    let picture = Picture::render(&svg);
    let (a, b) = (PALETTE[0], PALETTE[1]);
    let (top, bottom) = (frame.top, frame.top + frame.height);
    let px_per_mib = frame.height / (frame.max_bytes / MIB as f64);
    assert_eq!(frame.max_bytes, 12.0 * MIB as f64); // 10 MiB reserved + 5%, in 4 MiB steps

    // Before the peak (event 0) and after it (events 4, 5): stream 1's 2 MiB, nothing of
    // stream 2.
    for seq in [0.5, 4.5, 5.5] {
        let x = frame.x(seq);
        let rows_a = picture.rows_of(x, top, bottom, a);
        assert!(
            (rows_a.len() as f64 - 2.0 * px_per_mib).abs() <= 2.0,
            "event {seq}: {} rows of stream 1, want {:.0}",
            rows_a.len(),
            2.0 * px_per_mib
        );
        assert!(picture.rows_of(x, top, bottom, b).is_empty(), "event {seq}");
    }
    // At the peak: 4 MiB of each, stream 2 stacked over stream 1.
    let x = frame.x(2.5);
    let (rows_a, rows_b) = (
        picture.rows_of(x, top, bottom, a),
        picture.rows_of(x, top, bottom, b),
    );
    for rows in [&rows_a, &rows_b] {
        assert!(
            (rows.len() as f64 - 4.0 * px_per_mib).abs() <= 2.0,
            "{}",
            rows.len()
        );
    }
    assert!(rows_b.iter().max() < rows_a.iter().min());
    // The reserved line (10 MiB) lies over the stacked area, at its height.
    let dark: Vec<u32> = (top.ceil() as u32..bottom as u32)
        .filter(|&y| {
            let (r, g, bl) = picture.rgb(x as u32, y);
            r.max(g).max(bl) < 0x50
        })
        .collect();
    let line = *dark.first().expect("no reserved line at the peak");
    assert!(
        (f64::from(line) - frame.y(10.0 * MIB as f64)).abs() <= 2.0,
        "{line}"
    );
    assert!(line < *rows_b.iter().min().unwrap());
    assert_eq!(hex(RESERVED), "#202020");
    // The refusal is marked under the axis at its event, and nowhere else.
    let marked = |seq: f64| {
        picture
            .rows_of(frame.x(seq), bottom, bottom + 8.0, OOM)
            .len()
    };
    assert!(marked(5.5) >= 3, "{}", marked(5.5));
    assert_eq!(marked(2.5), 0);
}

/// One 16 MiB segment: 8 MiB live on stream 1, 4 MiB free, 4 MiB live on stream 2; one of
/// 8 MiB: 4 MiB free on stream 2, 4 MiB pending.
fn known_snapshot() -> MemorySnapshot {
    let (a, b) = (StreamId(1), StreamId(2));
    let base = DevicePtr::from_raw(0x1000_0000);
    let mut first = Segment::new(base, 16 * MIB);
    first.blocks = vec![
        Block::new(base, 8 * MIB, BlockState::Live).on_stream(a),
        Block::new(base.offset(8 * MIB), 4 * MIB, BlockState::Free),
        Block::new(base.offset(12 * MIB), 4 * MIB, BlockState::Live).on_stream(b),
    ];
    let second_at = base.offset(64 * MIB);
    let mut second = Segment::new(second_at, 8 * MIB);
    second.blocks = vec![
        Block::new(second_at, 4 * MIB, BlockState::FreeOnStream).on_stream(b),
        Block::new(second_at.offset(4 * MIB), 4 * MIB, BlockState::Pending).on_stream(a),
    ];
    let mut snap = MemorySnapshot::new(Device::host().id(), "pool");
    snap.segments = vec![first, second];

    snap
}

/// The segment map shows block states in proportion to their bytes: live in the stream's
/// colour, free grey, pending dark grey, free-on-stream in the stream's hatching.
#[test]
fn the_segment_map_shows_block_states_in_proportion() {
    let snap = known_snapshot();
    let mut colours = StreamColours::default();
    let (svg, frame) = segment_map::draw(&snap, 800, &mut colours, "");
    assert_eq!(svg, segment_map_svg(&snap, 800));
    let picture = Picture::render(&svg);
    let bar_columns = 800.0 - frame.left - 16.0;
    let row = |i: f64| {
        let top = frame.top + i * (frame.row_height + 6.0) + 1.0;
        (top, top + frame.row_height - 2.0)
    };
    let rows = frame.row_height - 2.0;
    let share = |n: usize| n as f64 / (bar_columns * rows);

    let (top, bottom) = row(0.0);
    let (live_a, free, live_b) = (
        picture.count_in_band(top, bottom, PALETTE[0]),
        picture.count_in_band(top, bottom, FREE),
        picture.count_in_band(top, bottom, PALETTE[1]),
    );
    for (got, want) in [(live_a, 0.5), (free, 0.25), (live_b, 0.25)] {
        assert!(
            (share(got) - want).abs() < 0.02,
            "{got} pixels, want {want}"
        );
    }
    // Half the width: the second segment is half the first.
    let (top, bottom) = row(1.0);
    let pending = picture.count_in_band(top, bottom, PENDING);
    assert!((share(pending) - 0.25).abs() < 0.02, "{pending}");
    let hatch = picture.count_in_band(top, bottom, PALETTE[1]);
    let tint = picture.count_in_band(top, bottom, super::colours::tint(PALETTE[1]));
    assert!(hatch > 0 && tint > 0 && tint > hatch, "{hatch} {tint}");
    assert!(share(hatch + tint) < 0.25);
    assert_eq!(picture.count_in_band(top, bottom, FREE), 0);
    assert_eq!(picture.count_in_band(top, bottom, PALETTE[0]), 0);
    // The figures are printed under the map.
    assert!(svg.contains("largest free block 4 MiB"), "{svg}");
    assert!(svg.contains("pending 4 MiB"));
}

/// Every picture of the page parses as XML on its own, every `<svg>` closes, and names from
/// a hostile log (markup, control characters) come out as text.
#[test]
fn the_page_escapes_hostile_names_and_balances_its_pictures() {
    let hostile = "<script>alert(1)</script>\u{1}";
    let mut t = known_timeline();
    t.name_stream(StreamId(2), hostile);
    let base = DevicePtr::from_raw(0x1000_0000);
    let mut seg = Segment::new(base, 4 * MIB);
    seg.blocks
        .push(Block::new(base, 4 * MIB, BlockState::Live).on_stream(StreamId(2)));
    let mut snap = MemorySnapshot::new(Device::host().id(), format!("pool {hostile}"));
    snap.segments.push(seg);
    let page = HtmlReport::new(format!("report {hostile}"))
        .note(format!("skipped {hostile}"))
        .table(
            vec!["resource".into(), hostile.into()],
            vec![vec!["pool".into(), "1.5 MiB".into()]],
        )
        .section(ReportSection {
            name: format!("</svg>{hostile}"),
            timeline: t.clone(),
            peak: Some(snap),
        })
        .section(ReportSection {
            name: "cuda".into(),
            timeline: t,
            peak: None,
        })
        .render();
    assert!(!page.to_lowercase().contains("<script"), "{page}");
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;\u{fffd}"));
    assert!(!page.contains('\u{1}'));
    assert!(page.contains("cuda gives no snapshot"));
    assert!(page.contains(
        "<td class=\"n\" data-label=\"&lt;script&gt;alert(1)&lt;/script&gt;\u{fffd}\">1.5 MiB</td>"
    ));
    // Each picture twice: wide, and narrow for a phone.
    let opens = page.matches("<svg").count();
    assert_eq!(opens, 6);
    assert_eq!(page.matches("<figure class=\"wide\">").count(), 3);
    assert_eq!(page.matches("<figure class=\"narrow\">").count(), 3);
    assert_eq!(opens, page.matches("</svg>").count());
    let mut rest = page.as_str();
    while let Some(start) = rest.find("<svg") {
        let end = rest[start..].find("</svg>").unwrap() + start + "</svg>".len();
        let svg = &rest[start..end];
        usvg::Tree::from_str(svg, &usvg::Options::default())
            .unwrap_or_else(|e| panic!("{e}: {svg}"));
        rest = &rest[end..];
    }
    // Ids are unique on the page: the hatch patterns of two maps would clash otherwise.
    assert!(!page.contains("id=\"fos"));
}

/// Long timelines and many segments draw in bounded size.
#[test]
fn pictures_stay_bounded() {
    let mut t = Timeline::new();
    for i in 0..200_000u64 {
        let s = StreamId(i % 40);
        t.record(TraceAction::Alloc, DevicePtr::from_raw(i * 256), 256, s);
        if i % 3 == 0 {
            t.record(TraceAction::Free, DevicePtr::from_raw(i * 256), 256, s);
        }
    }
    let svg = timeline_svg(&t, 1000, 400);
    assert!(svg.len() < 4 << 20, "{} bytes", svg.len());
    Picture::render(&svg);

    let mut snap = MemorySnapshot::new(Device::host().id(), "arena");
    for i in 0..20_000u64 {
        let base = DevicePtr::from_raw(0x1_0000_0000 + i * 0x10_0000);
        let mut seg = Segment::new(base, 0x10_0000);
        for j in 0..16u64 {
            let state = if j % 2 == 0 {
                BlockState::Live
            } else {
                BlockState::Free
            };
            seg.blocks.push(
                Block::new(base.offset(j as usize * 0x1_0000), 0x1_0000, state)
                    .on_stream(StreamId(j % 3)),
            );
        }
        snap.segments.push(seg);
    }
    let svg = segment_map_svg(&snap, 1000);
    assert!(svg.len() < 4 << 20, "{} bytes", svg.len());
    let picture = Picture::render(&svg);
    assert!(picture.pixmap.height() < 1000);
}

/// A run the book can show: three streams whose live bytes rise to a peak and fall, in a
/// pool that grows by 64 MiB chunks and keeps them. Deterministic.
fn example_timeline() -> Timeline {
    let streams = [
        (StreamId(1), "compute"),
        (StreamId(2), "copy in"),
        (StreamId(3), "copy out"),
    ];
    let mut t = Timeline::new();
    for (s, name) in streams {
        t.name_stream(s, name);
    }
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut live: Vec<Vec<(DevicePtr, usize)>> = vec![Vec::new(); 3];
    let (mut reserved, mut address) = (0usize, 0x7f00_0000_0000u64);
    for step in 0..600u64 {
        let k = (next() % 3) as usize;
        // Allocations held per stream rise to a plateau around step 300, then fall.
        let target = (14.0 * (1.0 - ((step as f64 - 300.0) / 300.0).powi(2))) as usize + 1;
        let time = std::time::Duration::from_millis(step * 5);
        if live[k].len() < target * (k + 1) / 2 + 1 && next() % 4 != 0 {
            let bytes = (1usize << (next() % 5)) * MIB;
            let ptr = DevicePtr::from_raw(address);
            address += bytes as u64;
            live[k].push((ptr, bytes));
            let total: usize = live.iter().flatten().map(|&(_, b)| b).sum();
            reserved = reserved.max(total.div_ceil(64 * MIB) * 64 * MIB);
            t.set_reserved(reserved);
            t.record_at(time, TraceAction::Alloc, ptr, bytes, streams[k].0);
        } else if !live[k].is_empty() {
            let at = (next() as usize) % live[k].len();
            let (ptr, bytes) = live[k].remove(at);
            t.record_at(time, TraceAction::Free, ptr, bytes, streams[k].0);
        }
    }
    t
}

/// A pool at its peak: a 128 MiB and a 64 MiB chunk, live blocks of three streams between
/// free ones, memory free on the copy stream and a pending free. Deterministic.
fn example_snapshot() -> MemorySnapshot {
    use BlockState::{Free, FreeOnStream, Live, Pending};
    let (compute, copy_in, copy_out) = (StreamId(1), StreamId(2), StreamId(3));
    type Blocks<'a> = &'a [(usize, BlockState, Option<StreamId>)];
    let chunks: [(u64, Blocks); 2] = [
        (
            0x7f00_0000_0000,
            &[
                (16, Live, Some(compute)),
                (8, Live, Some(copy_in)),
                (4, Free, None),
                (24, Live, Some(compute)),
                (8, FreeOnStream, Some(copy_in)),
                (16, Live, Some(copy_out)),
                (8, Free, None),
                (32, Live, Some(compute)),
                (4, Pending, Some(copy_out)),
                (8, Free, None),
            ],
        ),
        (
            0x7f00_1000_0000,
            &[
                (8, Live, Some(copy_in)),
                (16, FreeOnStream, Some(copy_out)),
                (8, Live, Some(compute)),
                (32, Free, None),
            ],
        ),
    ];
    let mut snap = MemorySnapshot::new(Device::host().id(), "pool");
    snap.capacity = Some(256 * MIB);
    for (at, blocks) in chunks {
        let base = DevicePtr::from_raw(at);
        let total = blocks.iter().map(|b| b.0).sum::<usize>() * MIB;
        let mut seg = Segment::new(base, total);
        let mut offset = 0;
        for &(mib, state, stream) in blocks {
            let mut b = Block::new(base.offset(offset), mib * MIB, state);
            b.stream = stream;
            seg.blocks.push(b);
            offset += mib * MIB;
        }
        snap.segments.push(seg);
    }
    snap
}

/// The example pictures in `src/report/html/examples/` (which the book can show) are what the
/// code draws; `STREAMALLOC_SVG_OUT=src/report/html/examples cargo test --lib
/// example_pictures` writes them anew.
#[test]
fn example_pictures_are_current() {
    let mut colours = StreamColours::named(example_timeline().streams());
    let timeline = timeline_svg::draw(&example_timeline(), 800, 320, &mut colours, None).0;
    let map = segment_map::draw(&example_snapshot(), 800, &mut colours, "").0;
    Picture::render(&timeline);
    Picture::render(&map);
    match std::env::var_os("STREAMALLOC_SVG_OUT") {
        Some(dir) => {
            let dir = std::path::PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("timeline.svg"), &timeline).unwrap();
            std::fs::write(dir.join("segment-map.svg"), &map).unwrap();
        }
        None => {
            let stale = "stale: regenerate with STREAMALLOC_SVG_OUT=src/report/html/examples \
                         cargo test --lib example_pictures";
            assert!(timeline == include_str!("examples/timeline.svg"), "{stale}");
            assert!(map == include_str!("examples/segment-map.svg"), "{stale}");
        }
    }
}

/// Degenerate inputs still draw a picture that parses: nothing recorded, sizes at
/// `usize::MAX`, empty and zero-byte segments, blocks outside their segment, tiny widths.
#[test]
fn degenerate_inputs_draw_parseable_pictures() {
    let mut huge = Timeline::with_limits(0, 4);
    huge.set_reserved(usize::MAX);
    huge.record(
        TraceAction::Alloc,
        DevicePtr::NULL,
        usize::MAX,
        StreamId(u64::MAX),
    );
    huge.record(TraceAction::Oom, DevicePtr::NULL, usize::MAX, StreamId(0));
    for (t, w, h) in [(Timeline::new(), 0, 0), (huge, 1, 1)] {
        let svg = timeline_svg(&t, w, h);
        Picture::render(&svg);
    }
    let mut snap = MemorySnapshot::new(Device::host().id(), "odd");
    assert!(segment_map_svg(&snap, 0).contains("no segments"));
    let base = DevicePtr::from_raw(u64::MAX - 4096);
    let mut seg = Segment::new(base, 0);
    seg.blocks
        .push(Block::new(base, usize::MAX, BlockState::Live).on_stream(StreamId(3)));
    seg.blocks.push(Block::new(
        DevicePtr::from_raw(1),
        4096,
        BlockState::Pending,
    ));
    snap.segments.push(seg);
    snap.segments
        .push(Segment::new(DevicePtr::from_raw(0x1000), usize::MAX));
    Picture::render(&segment_map_svg(&snap, 10));
}
