//! The segment map: a snapshot's segments as bars scaled to bytes, their blocks coloured by
//! state, with the fragmentation figures under them.

use std::fmt::Write as _;

use super::colours::{hex, tint, StreamColours, FREE, PENDING};
use super::text::{bytes, escape, fit, svg_lines, text_width, wrap};
use crate::resource::{BlockState, MemorySnapshot, Segment};

const MARGIN: f64 = 16.0;
/// The font sizes of the heading and of every other text.
const HEADING_PX: f64 = 13.0;
const TEXT_PX: f64 = 11.0;
/// From one heading line to the next.
const HEADING_LINE: f64 = 16.0;
const ROW: f64 = 14.0;
const ROW_GAP: f64 = 6.0;
const LINE: f64 = 16.0;
/// Up to this many segments get a bar each; more share rows that wrap like text, so the
/// picture stays bounded whatever the snapshot's size.
const BARS: usize = 32;
/// Rows of the wrapped layout.
const WRAPPED_ROWS: usize = 32;
/// In the wrapped layout, segments at least this many pixels wide get an outline.
const OUTLINED: usize = 16;
/// Entries of a per-stream list printed before "…".
const LISTED: usize = 8;

/// A live block with no stream.
const LIVE_UNKNOWN: (u8, u8, u8) = (0x44, 0x55, 0x66);

/// What a column of a bar shows: the state with the most bytes in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    Live(Option<usize>),
    FreeOnStream(usize),
    Free,
    Pending,
    /// A range no block describes.
    Undescribed,
}

/// Where the bars lie: what the render test reads pixels against.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct MapFrame {
    /// The first bar's left, top, and its row height.
    pub(crate) left: f64,
    pub(crate) top: f64,
    pub(crate) row_height: f64,
}

/// One bar, or a bar's part in one row: `columns` columns from `column` of row `row`, showing
/// `segment`'s addresses from `start` on, `per_column` bytes each.
struct Piece {
    row: usize,
    column: usize,
    columns: usize,
    segment: usize,
    start: u64,
    per_column: f64,
}

/// Draws `snapshot`, live blocks in their stream's colour of `colours` (streams it lacks get
/// the next ones); `id` prefixes the ids it defines, unique on a page.
pub(crate) fn draw(
    snapshot: &MemorySnapshot,
    width: u32,
    colours: &mut StreamColours,
    id: &str,
) -> (String, MapFrame) {
    let width = f64::from(width.max(320));
    let segments = &snapshot.segments;
    let wrapped = segments.len() > BARS;
    // Each bar's label left of it, in room for the widest, at most a third of the picture:
    // address and size, or the size alone where those do not fit (the hover title has both).
    let labels: Vec<String> = if wrapped {
        Vec::new()
    } else {
        let room = (width / 3.0).floor();
        let full: Vec<String> = segments
            .iter()
            .map(|s| format!("{:#x} · {}", s.address.addr(), bytes(s.bytes)))
            .collect();
        if full.iter().all(|l| text_width(l, TEXT_PX, false) <= room) {
            full
        } else {
            segments
                .iter()
                .map(|s| fit(&bytes(s.bytes), room, TEXT_PX))
                .collect()
        }
    };
    let left = MARGIN
        + labels
            .iter()
            .map(|l| text_width(l, TEXT_PX, false) + 8.0)
            .fold(0.0, f64::max);
    let bar_columns = (width - left - MARGIN).floor().max(1.0) as usize;
    let pieces = layout(segments, wrapped, bar_columns);
    let rows = pieces.iter().map(|p| p.row + 1).max().unwrap_or(0);

    // The heading, then what a row is, over the bars.
    let heading = format!(
        "Memory of {} on {}: {}, {} held",
        snapshot.resource,
        snapshot.device,
        plural(segments.len(), "segment"),
        bytes(snapshot.reserved_bytes())
    );
    let heading_lines = wrap(&heading, (width - 2.0 * MARGIN) / 1.1, HEADING_PX);
    let what = if wrapped {
        format!(
            "The {} segments laid end to end in rows that wrap like text, a pixel {}; \
             outlined where {OUTLINED} pixels or wider.",
            segments.len(),
            bytes(pieces.first().map_or(0.0, |p| p.per_column) as usize)
        )
    } else if segments.is_empty() {
        String::new()
    } else {
        "A bar per segment (memory taken at once from the device or the upstream), to scale."
            .to_owned()
    };
    let what_lines: Vec<String> = if what.is_empty() {
        Vec::new()
    } else {
        wrap(&what, width - 2.0 * MARGIN, TEXT_PX)
    };
    let top = 18.0
        + HEADING_LINE * (heading_lines.len() - 1) as f64
        + LINE * what_lines.len() as f64
        + 12.0;

    let mut svg = String::new();
    let mut body = String::new();
    let mut used_patterns: Vec<usize> = Vec::new();
    let mut live_streams: Vec<Option<usize>> = Vec::new();
    let (mut any_free, mut any_pending) = (false, false);
    // Runs of equal fill, merged across pieces of a row (tiny segments in the wrapped layout),
    // so the rectangles stay fewer than the pixels.
    let mut rects: Vec<(usize, usize, usize, Fill)> = Vec::new();
    for piece in &pieces {
        for (fill, from, to) in runs(&segments[piece.segment], piece, colours) {
            let (from, to) = (piece.column + from, piece.column + to);
            match rects.last_mut() {
                Some(last) if last.0 == piece.row && last.2 == from && last.3 == fill => {
                    last.2 = to
                }
                _ => rects.push((piece.row, from, to, fill)),
            }
        }
    }
    for &(row, from, to, fill) in &rects {
        let y = top + row as f64 * (ROW + ROW_GAP);
        let paint = match fill {
            Fill::Live(Some(i)) => hex(StreamColours::of_index(i)),
            Fill::Live(None) => hex(LIVE_UNKNOWN),
            Fill::FreeOnStream(i) => {
                if !used_patterns.contains(&i) {
                    used_patterns.push(i);
                }
                format!("url(#{id}fos{i})")
            }
            Fill::Free => hex(FREE),
            Fill::Pending => hex(PENDING),
            Fill::Undescribed => continue,
        };
        match fill {
            Fill::Live(s) if !live_streams.contains(&s) => live_streams.push(s),
            Fill::Free => any_free = true,
            Fill::Pending => any_pending = true,
            _ => {}
        }
        let _ = writeln!(
            body,
            "<rect x=\"{:.0}\" y=\"{y:.0}\" width=\"{}\" height=\"{ROW}\" fill=\"{paint}\"/>",
            left + from as f64,
            to - from
        );
    }
    // Segment outlines with their figures on hover; in the wrapped layout only for segments
    // wide enough to see, the others sharing their row's outline.
    for piece in &pieces {
        let segment = &segments[piece.segment];
        let x0 = left + piece.column as f64;
        let y = top + piece.row as f64 * (ROW + ROW_GAP);
        if wrapped && piece.columns < OUTLINED {
            continue;
        }
        let _ = writeln!(
            body,
            "<rect x=\"{x0:.0}\" y=\"{y:.0}\" width=\"{}\" height=\"{ROW}\" fill=\"none\" \
             stroke=\"#606060\" stroke-width=\"0.6\"><title>segment {:#x}: {}, {} live, {} \
             free, {} blocks</title></rect>",
            piece.columns,
            segment.address.addr(),
            bytes(segment.bytes),
            bytes(segment.live_bytes()),
            bytes(segment.free_bytes()),
            segment.blocks.len()
        );
        if !wrapped {
            let _ = writeln!(
                body,
                "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>",
                left - 8.0,
                y + 11.0,
                escape(&labels[piece.segment])
            );
        }
    }
    if wrapped {
        for row in 0..rows {
            let columns = pieces
                .iter()
                .filter(|p| p.row == row)
                .map(|p| p.column + p.columns)
                .max()
                .unwrap_or(0);
            let _ = writeln!(
                body,
                "<rect x=\"{left:.0}\" y=\"{:.0}\" width=\"{columns}\" height=\"{ROW}\" \
                 fill=\"none\" stroke=\"#606060\" stroke-width=\"0.6\"/>",
                top + row as f64 * (ROW + ROW_GAP)
            );
        }
    }
    if segments.is_empty() {
        let _ = writeln!(
            body,
            "<text x=\"{MARGIN}\" y=\"{:.0}\">no segments: the resource holds no memory</text>",
            top + 11.0
        );
    }

    // The legend, then the fragmentation figures.
    let mut y = top + rows.max(1) as f64 * (ROW + ROW_GAP) + 12.0;
    let mut x = MARGIN;
    let mut swatch = |body: &mut String, x: &mut f64, paint: String, label: String| {
        let label = fit(&label, width - 2.0 * MARGIN - 18.0, TEXT_PX);
        let w = 32.0 + text_width(&label, TEXT_PX, false);
        if *x + w - 14.0 > width - MARGIN && *x > MARGIN {
            *x = MARGIN;
            y += LINE;
        }
        let _ = writeln!(
            body,
            "<rect x=\"{x:.0}\" y=\"{:.0}\" width=\"14\" height=\"10\" fill=\"{paint}\" \
             stroke=\"#606060\" stroke-width=\"0.5\"/><text x=\"{:.0}\" y=\"{y:.0}\">{}</text>",
            y - 9.0,
            *x + 18.0,
            escape(&label)
        );
        *x += w;
    };
    let names = colours.names().to_vec();
    for s in &live_streams {
        let (paint, label) = match s {
            Some(i) => (
                hex(StreamColours::of_index(*i)),
                format!("live, {}", names[*i]),
            ),
            None => (hex(LIVE_UNKNOWN), "live, stream not recorded".to_owned()),
        };
        swatch(&mut body, &mut x, paint, label);
    }
    for &i in &used_patterns {
        swatch(
            &mut body,
            &mut x,
            format!("url(#{id}fos{i})"),
            format!("free on {}", names[i]),
        );
    }
    if any_free {
        swatch(&mut body, &mut x, hex(FREE), "free".to_owned());
    }
    if any_pending {
        swatch(&mut body, &mut x, hex(PENDING), "pending".to_owned());
    }
    y += LINE + 4.0;
    let lines: Vec<String> = figures(snapshot, &names, colours)
        .iter()
        .flat_map(|line| wrap(line, width - 2.0 * MARGIN, TEXT_PX))
        .collect();
    let height = svg_lines(&mut body, &lines, MARGIN, y, LINE, "") + 4.0;

    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"sans-serif\" font-size=\"11\">"
    );
    let _ = writeln!(svg, "<title>{}</title>", escape(&heading));
    if !used_patterns.is_empty() {
        svg.push_str("<defs>\n");
        for &i in &used_patterns {
            let c = StreamColours::of_index(i);
            let _ = writeln!(
                svg,
                "<pattern id=\"{id}fos{i}\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" \
                 patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"{}\"/>\
                 <rect width=\"2\" height=\"6\" fill=\"{}\"/></pattern>",
                hex(tint(c)),
                hex(c)
            );
        }
        svg.push_str("</defs>\n");
    }
    let _ = writeln!(
        svg,
        "<rect width=\"{width:.0}\" height=\"{height:.0}\" fill=\"#ffffff\"/>"
    );
    let bold = format!(" font-size=\"{HEADING_PX}\" font-weight=\"bold\"");
    let y = svg_lines(&mut svg, &heading_lines, MARGIN, 18.0, HEADING_LINE, &bold);
    svg_lines(&mut svg, &what_lines, MARGIN, y, LINE, " fill=\"#404040\"");
    svg.push_str(&body);
    svg.push_str("</svg>\n");
    (
        svg,
        MapFrame {
            left,
            top,
            row_height: ROW,
        },
    )
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// The fragmentation figures, a line each.
fn figures(snapshot: &MemorySnapshot, names: &[String], colours: &StreamColours) -> Vec<String> {
    let f = snapshot.fragmentation();
    let name = |s: crate::ids::StreamId| {
        colours
            .position(s)
            .map_or_else(|| s.to_string(), |i| names[i].clone())
    };
    // Items of a list: a line breaks between items, not inside one (a stream's name from its
    // figure), so their spaces do not break.
    let list = |items: Vec<String>| {
        let more = items.len().saturating_sub(LISTED);
        let mut s = items
            .into_iter()
            .map(|item| item.replace(' ', "\u{a0}"))
            .take(LISTED)
            .collect::<Vec<_>>()
            .join(", ");
        if more > 0 {
            let _ = write!(s, ", … {more} more");
        }
        s
    };
    let pending: usize = f
        .pending_bytes
        .iter()
        .fold(0usize, |a, &(_, b)| a.saturating_add(b));
    let mut lines = vec![format!(
        "held {}{} · in live blocks {} · free {} ({} of it free for every stream now) · \
         pending {} (freed, not yet reached by its stream)",
        bytes(f.reserved_bytes),
        snapshot
            .capacity
            .map_or(String::new(), |c| format!(" of at most {}", bytes(c))),
        bytes(f.live_bytes),
        bytes(f.free_bytes()),
        bytes(f.free_now_bytes),
        bytes(pending)
    )];
    let unknown: usize = f
        .live_by_stream
        .iter()
        .filter(|(s, _)| s.is_none())
        .map(|&(_, b)| b)
        .sum();
    if unknown > 0 {
        lines.push(format!(
            "live blocks of {} have no stream: {} does not record which stream holds them",
            bytes(unknown),
            snapshot.resource
        ));
    }
    lines.push(format!(
        "largest free block {} (once other streams' frees are reached) · largest free block \
         any stream gets now {} · fragmentation {:.2} (0: the free memory is one block, \
         towards 1: many small ones)",
        bytes(f.largest_free_block),
        bytes(f.largest_free_now),
        f.fragmentation_ratio()
    ));
    if !f.free_on_stream.is_empty() {
        lines.push(format!(
            "free for its stream only (freed there, others wait for it): {}",
            list(
                f.free_on_stream
                    .iter()
                    .map(|&(s, b)| format!("{} {}", name(s), bytes(b)))
                    .collect()
            )
        ));
        lines.push(format!(
            "largest block each stream gets now: {}",
            list(
                f.largest_free_by_stream
                    .iter()
                    .map(|&(s, b)| format!("{} {}", name(s), bytes(b)))
                    .collect()
            )
        ));
    }
    if !f.free_extents.is_empty() {
        lines.push(format!(
            "free blocks by size: {}",
            list(
                f.free_extents
                    .iter()
                    .map(|b| format!("{} × {} or more", b.count, bytes(b.min_bytes)))
                    .collect()
            )
        ));
    }
    lines
}

/// The pieces of the bars: a bar per segment on one scale (the largest segment fills a row),
/// or, `wrapped`, every segment after the other in rows that wrap.
fn layout(segments: &[Segment], wrapped: bool, bar_columns: usize) -> Vec<Piece> {
    let mut pieces = Vec::new();
    if !wrapped {
        let largest = segments.iter().map(|s| s.bytes).max().unwrap_or(0).max(1);
        let per_column = largest as f64 / bar_columns as f64;
        for (i, s) in segments.iter().enumerate() {
            let columns = ((s.bytes as f64 / per_column).round() as usize).clamp(1, bar_columns);
            pieces.push(Piece {
                row: i,
                column: 0,
                columns,
                segment: i,
                start: s.address.addr(),
                per_column,
            });
        }
        return pieces;
    }
    let total: f64 = segments.iter().map(|s| s.bytes as f64).sum();
    let per_column = (total / (WRAPPED_ROWS * bar_columns) as f64).max(1.0);
    let mut at = 0usize; // columns used, over all rows
    for (i, s) in segments.iter().enumerate() {
        let mut columns = ((s.bytes as f64 / per_column).round() as usize).max(1);
        let mut start = s.address.addr();
        while columns > 0 {
            let (row, column) = (at / bar_columns, at % bar_columns);
            let here = columns.min(bar_columns - column);
            pieces.push(Piece {
                row,
                column,
                columns: here,
                segment: i,
                start,
                per_column,
            });
            start = start.saturating_add((here as f64 * per_column) as u64);
            columns -= here;
            at += here;
        }
    }
    pieces
}

/// The runs of equal fill along `piece`: (fill, first column, end column). Each column shows
/// the state with the most bytes in it.
fn runs(
    segment: &Segment,
    piece: &Piece,
    colours: &mut StreamColours,
) -> Vec<(Fill, usize, usize)> {
    let mut tally: Vec<Vec<(Fill, f64)>> = vec![Vec::new(); piece.columns];
    let begin = piece.start as f64;
    let end = begin + piece.columns as f64 * piece.per_column;
    for block in &segment.blocks {
        let (a, b) = (block.address.addr() as f64, block.end() as f64);
        if b <= begin || a >= end {
            continue;
        }
        let fill = match (block.state, block.stream) {
            (BlockState::Live, s) => Fill::Live(s.map(|s| colours.index(s))),
            (BlockState::FreeOnStream, Some(s)) => Fill::FreeOnStream(colours.index(s)),
            (BlockState::Free, _) | (BlockState::FreeOnStream, None) => Fill::Free,
            (BlockState::Pending, _) => Fill::Pending,
        };
        let first = ((a.max(begin) - begin) / piece.per_column).floor() as usize;
        let last = (((b.min(end) - begin) / piece.per_column).ceil() as usize).min(piece.columns);
        for (c, column) in tally.iter_mut().enumerate().take(last).skip(first) {
            let lo = begin + c as f64 * piece.per_column;
            let hi = lo + piece.per_column;
            let overlap = b.min(hi) - a.max(lo);
            if overlap <= 0.0 {
                continue;
            }
            match column.iter_mut().find(|(f, _)| *f == fill) {
                Some((_, bytes)) => *bytes += overlap,
                None => column.push((fill, overlap)),
            }
        }
    }
    let mut out: Vec<(Fill, usize, usize)> = Vec::new();
    for (c, column) in tally.iter().enumerate() {
        let covered: f64 = column.iter().map(|(_, b)| b).sum();
        let fill = column
            .iter()
            .copied()
            .chain([(Fill::Undescribed, piece.per_column - covered)])
            .fold((Fill::Undescribed, f64::MIN), |best, x| {
                if x.1 > best.1 {
                    x
                } else {
                    best
                }
            })
            .0;
        match out.last_mut() {
            Some(run) if run.0 == fill && run.2 == c => run.2 = c + 1,
            _ => out.push((fill, c, c + 1)),
        }
    }
    out
}
