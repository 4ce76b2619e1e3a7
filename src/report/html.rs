//! A self-contained HTML report (inline SVG, no network): live and reserved bytes over time per
//! stream, and a segment map at the peak.
//!
//! [`HtmlReport`] gathers a title, notes, tables (a replay's what-if table) and one
//! [`ReportSection`] per resource (its [`Timeline`] and the [`MemorySnapshot`] taken at its
//! peak), and writes one page that opens anywhere: CSS and pictures inline, no script, no font
//! or image from elsewhere. Every text that comes from a log or a program (stream, resource and
//! section names, notes, table cells) is escaped, so a hostile log cannot put markup into the
//! page. [`timeline_svg`] and [`segment_map_svg`] draw the two pictures as standalone SVG files.

mod colours;
mod segment_map;
mod text;
mod timeline_svg;

#[cfg(test)]
mod tests;

use std::fmt::Write as _;
use std::io::{self, Write};

use colours::StreamColours;
use text::{bytes, escape};

use crate::resource::{MemorySnapshot, Timeline};

/// One resource's part of an [`HtmlReport`]: its timeline and, when it gives one, its snapshot
/// at the peak.
///
/// # Examples
///
/// ```
/// use streamalloc::report::html::ReportSection;
/// use streamalloc::Timeline;
///
/// let section = ReportSection { name: "pool".into(), timeline: Timeline::new(), peak: None };
/// assert!(section.peak.is_none()); // the page says the resource gives no snapshot
/// ```
#[derive(Debug, Clone)]
pub struct ReportSection {
    /// The heading: the resource's name.
    pub name: String,
    /// Its allocations and frees over time.
    pub timeline: Timeline,
    /// Its memory at the peak (from [`MemoryResource::snapshot`](crate::MemoryResource::snapshot)),
    /// `None` when the resource gives no snapshot.
    pub peak: Option<MemorySnapshot>,
}

#[derive(Debug, Clone)]
enum Item {
    Note(String),
    Table(Vec<String>, Vec<Vec<String>>),
    Section(Box<ReportSection>),
}

/// A self-contained HTML page about memory: notes, tables and a section per resource with its
/// timeline and segment map (see the [module](self)), in the order they were added.
///
/// # Examples
///
/// A running program's report: a [`TimelineAdaptor`](crate::TimelineAdaptor) over a pool
/// records the allocations and keeps the pool's snapshot near the peak.
///
/// ```
/// use streamalloc::report::html::{HtmlReport, ReportSection};
/// use streamalloc::{CudaResource, Device, MemoryResource, PoolResource, Stream, TimelineAdaptor};
///
/// let device = Device::host();
/// let (s1, s2) = (Stream::new(&device)?, Stream::new(&device)?);
/// let pool = PoolResource::new(CudaResource::new(&device)?, 1 << 20, Some(4 << 20))?;
/// let mr = TimelineAdaptor::new(pool);
/// mr.snapshot_peaks(true);
/// mr.name_stream(&s2, "copy");
///
/// let a = mr.try_allocate(256 << 10, &s1)?;
/// let b = mr.try_allocate(512 << 10, &s2)?;
/// unsafe { mr.deallocate(a, 256 << 10, &s1) };
/// unsafe { mr.deallocate(b, 512 << 10, &s2) };
///
/// let section = ReportSection {
///     name: "pool".into(),
///     timeline: mr.timeline(),
///     peak: mr.peak_snapshot(), // None where the resource gives no snapshot
/// };
/// let mut page = Vec::new();
/// HtmlReport::new("My service")
///     .note("recorded by a TimelineAdaptor".to_owned())
///     .section(section)
///     .write_to(&mut page)?;
/// let page = String::from_utf8(page).unwrap();
/// assert!(page.starts_with("<!DOCTYPE html>") && page.contains("<svg"));
/// assert!(page.contains("copy") && !page.contains("<script"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct HtmlReport {
    title: String,
    items: Vec<Item>,
}

/// Width of the pictures on the page, in CSS pixels.
const PAGE_WIDTH: u32 = 960;
/// Width of the pictures a phone shows instead (screens up to 600 pixels wide, as [`STYLE`]
/// says): the same pictures drawn again narrow, so their text keeps its size rather than
/// shrinking with a wide picture.
const PHONE_WIDTH: u32 = 360;
/// Height of a timeline on the page.
const TIMELINE_HEIGHT: u32 = 380;
/// Height of a timeline on a phone.
const PHONE_TIMELINE_HEIGHT: u32 = 320;

impl HtmlReport {
    /// An empty report titled `title`.
    pub fn new(title: impl Into<String>) -> Self {
        HtmlReport {
            title: title.into(),
            items: Vec::new(),
        }
    }

    /// Adds a table: `header`, then `rows` (a replay's what-if table). Cells that read as
    /// numbers are right-aligned.
    pub fn table(mut self, header: Vec<String>, rows: Vec<Vec<String>>) -> Self {
        self.items.push(Item::Table(header, rows));
        self
    }

    /// Adds a note ("12 lines skipped: …").
    pub fn note(mut self, text: String) -> Self {
        self.items.push(Item::Note(text));
        self
    }

    /// Adds a resource's section: its timeline and its segment map at the peak.
    pub fn section(mut self, section: ReportSection) -> Self {
        self.items.push(Item::Section(Box::new(section)));
        self
    }

    /// The page as a string.
    pub fn render(&self) -> String {
        let mut page = String::new();
        let title = escape(&self.title);
        let _ = write!(
            page,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n\
             <p class=\"meta\">streamalloc {} memory report</p>\n",
            env!("CARGO_PKG_VERSION")
        );
        let mut notes_open = false;
        for (n, item) in self.items.iter().enumerate() {
            if notes_open && !matches!(item, Item::Note(_)) {
                page.push_str("</ul>\n");
                notes_open = false;
            }
            match item {
                Item::Note(text) => {
                    if !notes_open {
                        page.push_str("<ul class=\"notes\">\n");
                        notes_open = true;
                    }
                    let _ = writeln!(page, "<li>{}</li>", escape(text));
                }
                Item::Table(header, rows) => write_table(&mut page, header, rows),
                Item::Section(section) => write_section(&mut page, section, n),
            }
        }
        if notes_open {
            page.push_str("</ul>\n");
        }
        page.push_str("</body>\n</html>\n");
        page
    }

    /// Writes the page to `w`.
    ///
    /// # Errors
    /// The writer's.
    pub fn write_to<W: Write>(&self, mut w: W) -> io::Result<()> {
        w.write_all(self.render().as_bytes())?;
        w.flush()
    }
}

/// The page's style. Up to 600 pixels wide (a phone) the body's margins shrink,
/// the narrow pictures replace the wide ones, and each table row becomes a card of
/// "header: cell" lines, as a table of many columns cannot fit.
const STYLE: &str = "\
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1000px;\
padding:0 1em;color:#202020;background:#fff}\
h1,h2,p,li{overflow-wrap:anywhere}\
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.3em;margin-top:2em;border-bottom:1px solid #ccc}\
h3{font-size:1.05em}.meta{color:#707070;margin-top:0}\
table{border-collapse:collapse;margin:1em 0;font-size:.92em}\
th,td{border:1px solid #d0d0d0;padding:.3em .6em;text-align:left}th{background:#f2f2f2}\
td.n{text-align:right;font-variant-numeric:tabular-nums}\
.notes{color:#6a4a00;background:#fff8e0;border:1px solid #f0dca0;padding:.6em 1.8em}\
figure{margin:1em 0}svg{max-width:100%;height:auto}.narrow{display:none}\
.none{color:#707070;font-style:italic}\
.summary{font-variant-numeric:tabular-nums}\
@media (max-width:600px){body{margin:1em auto;padding:0 .5em}h1{font-size:1.3em}\
.notes{padding:.5em .5em .5em 1.5em}.wide{display:none}.narrow{display:block}\
table,tbody,tr{display:block}thead{display:none}tr{border:1px solid #d0d0d0;margin:.6em 0}\
td{display:flex;justify-content:space-between;gap:1em;border:0;border-top:1px solid #eee}\
tr td:first-child{border-top:0;background:#f2f2f2;font-weight:600}\
td::before{content:attr(data-label);color:#505050;text-align:left;font-weight:400}}";

fn looks_numeric(cell: &str) -> bool {
    let c = cell.trim();
    c.chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '.')
        && c.chars().any(|c| c.is_ascii_digit())
        && c.chars()
            .all(|c| c.is_ascii_digit() || " .,-+%×xeE".contains(c) || c.is_ascii_alphabetic())
}

/// A table; each cell carries its column's header (`data-label`), which a phone prints before
/// it.
fn write_table(page: &mut String, header: &[String], rows: &[Vec<String>]) {
    page.push_str("<table>\n<thead><tr>");
    for h in header {
        let _ = write!(page, "<th>{}</th>", escape(h));
    }
    page.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        page.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            let class = if looks_numeric(cell) {
                " class=\"n\""
            } else {
                ""
            };
            let label = header.get(i).map_or(String::new(), |h| escape(h));
            let _ = write!(
                page,
                "<td{class} data-label=\"{label}\">{}</td>",
                escape(cell)
            );
        }
        page.push_str("</tr>\n");
    }
    page.push_str("</tbody>\n</table>\n");
}

fn write_section(page: &mut String, section: &ReportSection, n: usize) {
    let t = &section.timeline;
    let _ = writeln!(page, "<section>\n<h2>{}</h2>", escape(&section.name));
    let peak = t.series().into_iter().rev().max_by_key(|p| p.live_bytes);
    let _ = writeln!(
        page,
        "<p class=\"summary\">peak live {}{} · live at the end {} · reserved at the end {} · \
         {} events recorded{}</p>",
        bytes(t.peak_live_bytes()),
        peak.as_ref().map_or(String::new(), |p| format!(
            " (event {}, {} reserved then)",
            p.seq,
            bytes(p.reserved_bytes)
        )),
        bytes(t.live_bytes()),
        bytes(t.reserved_bytes()),
        t.recorded_events(),
        if t.dropped_events() > 0 {
            format!(" ({} latest kept)", t.events().count())
        } else {
            String::new()
        }
    );
    let mut colours = StreamColours::named(t.streams());
    for (class, width, height) in [
        ("wide", PAGE_WIDTH, TIMELINE_HEIGHT),
        ("narrow", PHONE_WIDTH, PHONE_TIMELINE_HEIGHT),
    ] {
        let (svg, _) = timeline_svg::draw(t, width, height, &mut colours, None);
        let _ = writeln!(page, "<figure class=\"{class}\">\n{svg}</figure>");
    }
    page.push_str("<h3>Memory near the peak</h3>\n");
    match &section.peak {
        Some(snapshot) => {
            for (class, width) in [("wide", PAGE_WIDTH), ("narrow", PHONE_WIDTH)] {
                let id = format!("s{n}{}-", &class[..1]);
                let (svg, _) = segment_map::draw(snapshot, width, &mut colours, &id);
                let _ = writeln!(page, "<figure class=\"{class}\">\n{svg}</figure>");
            }
            write_block_rounding(page, &section.name, snapshot, t.peak_live_bytes());
        }
        None => {
            let _ = writeln!(
                page,
                "<p class=\"none\">{} gives no snapshot: no segment map.</p>",
                escape(&section.name)
            );
        }
    }
    page.push_str("</section>\n");
}

/// Says why the map's live blocks hold more than the timeline's peak, where they do by more
/// than 1/64 (alignment alone rounds up a little): the resource hands out whole blocks, and the
/// map counts them, not the bytes requested.
fn write_block_rounding(page: &mut String, name: &str, snapshot: &MemorySnapshot, peak: usize) {
    let live = snapshot.live_bytes();
    if live.saturating_sub(peak) > peak / 64 {
        let _ = writeln!(
            page,
            "<p class=\"why\">The live blocks hold {}, more than the {} requested at the peak: \
             {} gives each request a whole block (a bin's block size, or a size rounded up), \
             and the map counts blocks, the timeline requests.</p>",
            bytes(live),
            bytes(peak),
            escape(name)
        );
    }
}

/// `timeline` as a standalone SVG document of `width` × `height` pixels (taller when its
/// legend needs it): live bytes per stream as stacked areas, one colour per stream with a
/// legend, reserved bytes as a line over them, byte and event axes, and the peak marked. Long
/// timelines are drawn from [`Timeline::series`], which is bounded and keeps the peak.
///
/// # Examples
///
/// ```
/// use streamalloc::report::html::timeline_svg;
/// use streamalloc::{DevicePtr, StreamId, Timeline, TraceAction};
///
/// let mut t = Timeline::new();
/// t.set_reserved(2 << 20);
/// t.record(TraceAction::Alloc, DevicePtr::from_raw(0x1000), 1 << 20, StreamId(1));
/// t.record(TraceAction::Free, DevicePtr::from_raw(0x1000), 1 << 20, StreamId(1));
/// let svg = timeline_svg(&t, 800, 300);
/// assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
/// assert!(svg.contains("peak 1 MiB live at event 0"));
/// ```
pub fn timeline_svg(timeline: &Timeline, width: u32, height: u32) -> String {
    let mut colours = StreamColours::named(timeline.streams());
    timeline_svg::draw(timeline, width, height, &mut colours, None).0
}

/// `snapshot` as a standalone SVG document `width` pixels wide: each segment a bar scaled to
/// its bytes (or, past 32 segments, all of them in rows that wrap), its blocks coloured by
/// state (live in its stream's colour, free grey, free on a stream hatched in that stream's
/// colour, pending dark grey; a pixel shows the state with the most bytes in it), with the
/// fragmentation figures ([`MemorySnapshot::fragmentation`]) under it.
///
/// # Examples
///
/// ```
/// use streamalloc::report::html::segment_map_svg;
/// use streamalloc::{Block, BlockState, Device, DevicePtr, MemorySnapshot, Segment, StreamId};
///
/// let base = DevicePtr::from_raw(0x10000);
/// let mut seg = Segment::new(base, 8192);
/// seg.blocks.push(Block::new(base, 4096, BlockState::Live).on_stream(StreamId(1)));
/// seg.blocks.push(Block::new(base.offset(4096), 4096, BlockState::Free));
/// let mut snap = MemorySnapshot::new(Device::host().id(), "pool");
/// snap.segments.push(seg);
/// let svg = segment_map_svg(&snap, 800);
/// assert!(svg.contains("largest free block 4 KiB"));
/// ```
pub fn segment_map_svg(snapshot: &MemorySnapshot, width: u32) -> String {
    segment_map::draw(snapshot, width, &mut StreamColours::default(), "").0
}

/// [`segment_map_svg`] with the streams named, and coloured, as in `timeline`'s picture
/// ([`timeline_svg`]): a replay's logged stream handles, a [`Timeline::name_stream`] name.
///
/// # Examples
///
/// ```
/// use streamalloc::report::html::{segment_map_svg, segment_map_svg_named};
/// use streamalloc::{Block, BlockState, Device, DevicePtr, MemorySnapshot, Segment, StreamId,
///                   Timeline};
///
/// let base = DevicePtr::from_raw(0x10000);
/// let mut seg = Segment::new(base, 8192);
/// seg.blocks.push(Block::new(base, 4096, BlockState::Live).on_stream(StreamId(1)));
/// let mut snap = MemorySnapshot::new(Device::host().id(), "pool");
/// snap.segments.push(seg);
/// let mut timeline = Timeline::new();
/// timeline.name_stream(StreamId(1), "copy stream");
/// assert!(segment_map_svg_named(&snap, &timeline, 800).contains("copy stream"));
/// assert!(!segment_map_svg(&snap, 800).contains("copy stream"));
/// ```
pub fn segment_map_svg_named(snapshot: &MemorySnapshot, timeline: &Timeline, width: u32) -> String {
    let mut colours = StreamColours::named(timeline.streams());
    segment_map::draw(snapshot, width, &mut colours, "").0
}
