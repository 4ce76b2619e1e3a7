//! The timeline picture: live bytes per stream as stacked areas, reserved bytes as a line over
//! them, the peak marked.

use std::fmt::Write as _;

use super::colours::{hex, StreamColours, GRID, OOM, PEAK, RESERVED};
use super::text::{
    byte_step, bytes, bytes_f, escape, fit, number_step, svg_lines, text_width, wrap,
};
use crate::resource::{SeriesPoint, Timeline, TraceAction};

const LEFT: f64 = 76.0;
const RIGHT: f64 = 16.0;
/// Left of the heading, and of the legend and the caption in narrow pictures.
const MARGIN: f64 = 16.0;
/// The font sizes of the heading and of every other text.
const HEADING_PX: f64 = 13.0;
const TEXT_PX: f64 = 11.0;
/// From the top of one heading line to the next.
const HEADING_LINE: f64 = 16.0;
/// Under the heading, a band for the peak's label: nothing else is drawn there, so the label
/// crosses no line of the plot.
const PEAK_BAND: f64 = 28.0;
/// Under the axis: the tick labels, then the caption's lines (`CAPTION_LINE` apart).
const X_TICKS: f64 = 32.0;
const CAPTION_LINE: f64 = 14.0;
const LEGEND_ROW: f64 = 18.0;
/// Legend names longer than this are cut (the hover title has them whole).
const LEGEND_NAME: usize = 32;
/// Pictures narrower than this start their legend at the left margin, not under the plot.
const NARROW: f64 = 600.0;

/// Where the plot lies in the picture: what the render test reads pixels against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame {
    pub(crate) left: f64,
    pub(crate) top: f64,
    pub(crate) width: f64,
    pub(crate) height: f64,
    pub(crate) first_seq: f64,
    pub(crate) end_seq: f64,
    pub(crate) max_bytes: f64,
}

impl Frame {
    pub(crate) fn x(&self, seq: f64) -> f64 {
        self.left + (seq - self.first_seq) / (self.end_seq - self.first_seq) * self.width
    }

    pub(crate) fn y(&self, bytes: f64) -> f64 {
        self.top + self.height - bytes / self.max_bytes * self.height
    }
}

struct Entry {
    name: String,
    colour: (u8, u8, u8),
}

/// Draws `timeline` in `colours` (streams it lacks get the next ones), headed by `title`.
/// Also returns the plot's frame.
pub(crate) fn draw(
    timeline: &Timeline,
    width: u32,
    height: u32,
    colours: &mut StreamColours,
    title: Option<&str>,
) -> (String, Frame) {
    let width = f64::from(width.max(320));
    let series = timeline.series();
    let streams: Vec<(usize, String)> = timeline
        .streams()
        .map(|(s, name)| (colours.index(s), name.to_owned()))
        .collect();
    let entries: Vec<Entry> = streams
        .iter()
        .map(|(i, name)| Entry {
            name: name.clone(),
            colour: StreamColours::of_index(*i),
        })
        .collect();
    // The legend: stream swatches, then the reserved line and the peak, flowing in rows.
    let legend_left = if width < NARROW { MARGIN } else { LEFT };
    let name_room = width - RIGHT - legend_left - 18.0;
    let shown: Vec<String> = entries
        .iter()
        .map(|e| {
            let name: String = if e.name.chars().count() > LEGEND_NAME {
                e.name.chars().take(LEGEND_NAME).chain(['…']).collect()
            } else {
                e.name.clone()
            };
            fit(&name, name_room, TEXT_PX)
        })
        .collect();
    let mut legend = Vec::new();
    let (mut lx, mut row) = (legend_left, 0usize);
    let mut place = |label: &str| {
        let w = 32.0 + text_width(label, TEXT_PX, false);
        if lx + w - 14.0 > width - RIGHT && lx > legend_left {
            lx = legend_left;
            row += 1;
        }
        let at = (lx, row);
        lx += w;
        at
    };
    for name in &shown {
        legend.push(place(name));
    }
    let reserved_at = place("reserved");
    let peak_at = place("peak");
    // Refused allocations among the kept events, one mark per pixel column at most.
    let first_kept = timeline.series().first().map_or(0, |p| p.seq);
    let oom_seqs: Vec<u64> = timeline
        .events()
        .filter(|e| e.action == TraceAction::Oom && e.seq >= first_kept)
        .map(|e| e.seq)
        .collect();
    let oom_at = (!oom_seqs.is_empty()).then(|| place("out of memory"));
    let legend_height = (row + 1) as f64 * LEGEND_ROW + 8.0;

    let heading = match title {
        Some(t) => format!("{t}: live bytes per stream, reserved bytes"),
        None => "Live bytes per stream, reserved bytes".to_owned(),
    };
    let heading_lines = wrap(&heading, (width - 2.0 * MARGIN) / 1.1, HEADING_PX);
    let top = 18.0 + HEADING_LINE * (heading_lines.len() - 1) as f64 + PEAK_BAND;
    let caption = caption(timeline, &series);
    let caption_lines = wrap(&caption, width - 2.0 * MARGIN, TEXT_PX);
    let x_axis = X_TICKS + CAPTION_LINE * caption_lines.len() as f64;
    let height = f64::from(height.max(160)).max(top + 80.0 + x_axis + legend_height);
    let plot_height = height - top - x_axis - legend_height;

    let max_bytes = series
        .iter()
        .map(|p| p.live_bytes.max(p.reserved_bytes))
        .max()
        .unwrap_or(0) as f64;
    let step = byte_step(max_bytes.max(1.0), 4);
    // Headroom, so that a flat reserved line does not run along the frame.
    let top_bytes = ((max_bytes * 1.05 / step).ceil().max(1.0)) * step;
    let first_seq = series.first().map_or(0, |p| p.seq) as f64;
    let end_seq = series.last().map_or(1, |p| p.seq + 1) as f64;
    let frame = Frame {
        left: LEFT,
        top,
        width: width - LEFT - RIGHT,
        height: plot_height,
        first_seq,
        end_seq,
        max_bytes: top_bytes,
    };

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"sans-serif\" font-size=\"11\">"
    );
    let _ = writeln!(svg, "<title>{}</title>", escape(&heading));
    let _ = writeln!(
        svg,
        "<rect width=\"{width:.0}\" height=\"{height:.0}\" fill=\"#ffffff\"/>"
    );
    let bold = format!(" font-size=\"{HEADING_PX}\" font-weight=\"bold\"");
    svg_lines(&mut svg, &heading_lines, MARGIN, 18.0, HEADING_LINE, &bold);

    // Grid and byte axis.
    let mut tick = 0.0;
    while tick <= top_bytes + step / 2.0 {
        let y = frame.y(tick);
        let _ = writeln!(
            svg,
            "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{}\" \
             stroke-width=\"1\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT,
            LEFT + frame.width,
            hex(GRID),
            LEFT - 6.0,
            y + 4.0,
            bytes_f(tick)
        );
        tick += step;
    }
    // Event axis.
    // As many ticks as their widest label leaves room for, up to six.
    let span = end_seq - first_seq;
    let label_room = text_width(&format!("{end_seq:.0}"), TEXT_PX, false) + 24.0;
    let xstep = number_step(span, ((frame.width / label_room) as usize).clamp(2, 6));
    let mut seq = (first_seq / xstep).ceil() * xstep;
    let axis_y = top + plot_height;
    while seq <= end_seq {
        let x = frame.x(seq);
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{axis_y:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#606060\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{seq:.0}</text>",
            axis_y + 4.0,
            axis_y + 18.0
        );
        seq += xstep;
    }
    // The caption, centred under the plot where it fits, else under the whole picture.
    let centre = if caption_lines.len() == 1
        && text_width(&caption_lines[0], TEXT_PX, false) / 2.0 + MARGIN
            <= (LEFT + frame.width / 2.0).min(width - LEFT - frame.width / 2.0)
    {
        LEFT + frame.width / 2.0
    } else {
        width / 2.0
    };
    svg_lines(
        &mut svg,
        &caption_lines,
        centre,
        axis_y + X_TICKS + 2.0,
        CAPTION_LINE,
        " text-anchor=\"middle\" fill=\"#404040\"",
    );
    if series.is_empty() {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">no events recorded</text>",
            LEFT + frame.width / 2.0,
            top + plot_height / 2.0
        );
    }

    // Stacked areas, bottom stream first.
    let mut below = vec![0f64; series.len()];
    for (column, ((_, name), entry)) in streams.iter().zip(&entries).enumerate() {
        let values: Vec<f64> = series
            .iter()
            .map(|p| p.live_by_stream.get(column).copied().unwrap_or(0) as f64)
            .collect();
        let peak = values.iter().copied().fold(0.0, f64::max);
        let above: Vec<f64> = below.iter().zip(&values).map(|(b, v)| b + v).collect();
        if peak > 0.0 {
            let mut points = steps(&series, &above, &frame);
            let mut lower = steps(&series, &below, &frame);
            lower.reverse();
            points.extend(lower);
            let _ = write!(svg, "<polygon fill=\"{}\" points=\"", hex(entry.colour));
            for (x, y) in points {
                let _ = write!(svg, "{x:.1},{y:.1} ");
            }
            let _ = writeln!(
                svg,
                "\"><title>{}: up to {} live</title></polygon>",
                escape(name),
                bytes_f(peak)
            );
        }
        below = above;
    }

    // Reserved bytes over the areas.
    if !series.is_empty() {
        let reserved: Vec<f64> = series.iter().map(|p| p.reserved_bytes as f64).collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"",
            hex(RESERVED)
        );
        for (x, y) in steps(&series, &reserved, &frame) {
            let _ = write!(svg, "{x:.1},{y:.1} ");
        }
        let _ = writeln!(
            svg,
            "\"><title>reserved: up to {}</title></polyline>",
            bytes_f(reserved.iter().copied().fold(0.0, f64::max))
        );
    }

    // The peak: the first point with the most live bytes.
    if let Some(peak) = series
        .iter()
        .rev()
        .max_by_key(|p| p.live_bytes)
        .filter(|p| p.live_bytes > 0)
    {
        let x = frame.x(peak.seq as f64);
        let y = frame.y(peak.live_bytes as f64);
        let label = format!("peak {} live at event {}", bytes(peak.live_bytes), peak.seq);
        // In the band over the plot, centred on the peak as far as the plot's edges let it.
        let w = text_width(&label, TEXT_PX, false);
        let start = (x - w / 2.0).min(LEFT + frame.width - w).max(LEFT);
        let _ = writeln!(
            svg,
            "<g><title>{label}</title><line x1=\"{x:.1}\" y1=\"{top:.1}\" x2=\"{x:.1}\" \
             y2=\"{axis_y:.1}\" stroke=\"{c}\" stroke-width=\"1\" stroke-dasharray=\"4 3\"/>\
             <circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\" fill=\"{c}\"/>\
             <text x=\"{start:.1}\" y=\"{:.1}\" fill=\"{c}\">{label}</text></g>",
            top - 10.0,
            c = hex(PEAK)
        );
    }

    // Out-of-memory marks under the axis, one per pixel column.
    let mut last_column = None;
    for &seq in &oom_seqs {
        let x = frame.x(seq as f64 + 0.5);
        if last_column == Some(x.round() as i64) {
            continue;
        }
        last_column = Some(x.round() as i64);
        let _ = writeln!(
            svg,
            "<path d=\"M{x:.1},{axis_y:.1} l-4,8 h8 z\" fill=\"{}\"><title>out of memory at \
             event {seq}</title></path>",
            hex(OOM)
        );
    }

    // Axis lines over the areas.
    let _ = writeln!(
        svg,
        "<path d=\"M{LEFT:.1},{top:.1} V{axis_y:.1} H{:.1}\" fill=\"none\" stroke=\"#606060\"/>",
        LEFT + frame.width
    );

    // Legend.
    let legend_top = axis_y + x_axis + 4.0;
    for ((e, shown), (x, row)) in entries.iter().zip(&shown).zip(&legend) {
        let y = legend_top + *row as f64 * LEGEND_ROW;
        let _ = writeln!(
            svg,
            "<g><title>{}</title><rect x=\"{x:.1}\" y=\"{:.1}\" width=\"14\" height=\"10\" \
             fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text></g>",
            escape(&e.name),
            y - 9.0,
            hex(e.colour),
            x + 18.0,
            y,
            escape(shown)
        );
    }
    let (x, row) = reserved_at;
    let y = legend_top + row as f64 * LEGEND_ROW;
    let _ = writeln!(
        svg,
        "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{}\" \
         stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{y:.1}\">reserved</text>",
        y - 4.0,
        x + 14.0,
        y - 4.0,
        hex(RESERVED),
        x + 18.0
    );
    let (x, row) = peak_at;
    let y = legend_top + row as f64 * LEGEND_ROW;
    let _ = writeln!(
        svg,
        "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{}\"/><text x=\"{:.1}\" \
         y=\"{y:.1}\">peak</text>",
        x + 7.0,
        y - 4.0,
        hex(PEAK),
        x + 18.0
    );
    if let Some((x, row)) = oom_at {
        let y = legend_top + row as f64 * LEGEND_ROW;
        let _ = writeln!(
            svg,
            "<path d=\"M{:.1},{:.1} l-4,8 h8 z\" fill=\"{}\"/><text x=\"{:.1}\" \
             y=\"{y:.1}\">out of memory</text>",
            x + 7.0,
            y - 9.0,
            hex(OOM),
            x + 18.0
        );
    }
    svg.push_str("</svg>\n");
    (svg, frame)
}

/// The event axis's caption: how many events, over what time, how they are drawn.
fn caption(timeline: &Timeline, series: &[SeriesPoint]) -> String {
    format!(
        "event ({} recorded{}{})",
        timeline.recorded_events(),
        match (series.first(), series.last()) {
            (Some(a), Some(b)) if b.time > a.time => format!(
                ", {} to {}",
                seconds(a.time.as_secs_f64()),
                seconds(b.time.as_secs_f64())
            ),
            _ => String::new(),
        },
        if series.len() as u64 + 1 < timeline.recorded_events() {
            format!(
                ", drawn as {} points keeping each window's peak",
                series.len()
            )
        } else {
            String::new()
        }
    )
}

/// The step line through `values` (one per point of `series`, holding until the next point),
/// left to right, as picture coordinates; only the corners.
fn steps(series: &[SeriesPoint], values: &[f64], frame: &Frame) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let Some(&first) = values.first() else {
        return out;
    };
    out.push((frame.x(series[0].seq as f64), frame.y(first)));
    for i in 1..values.len() {
        if values[i] != values[i - 1] {
            let x = frame.x(series[i].seq as f64);
            out.push((x, frame.y(values[i - 1])));
            out.push((x, frame.y(values[i])));
        }
    }
    out.push((frame.x(frame.end_seq), frame.y(values[values.len() - 1])));
    out
}

/// `s` seconds with three significant digits: "0 s", "12.3 ms", "4.56 s", "1234 s".
fn seconds(s: f64) -> String {
    let (value, unit) = if s == 0.0 || s >= 1.0 {
        (s, "s")
    } else if s >= 1e-3 {
        (s * 1e3, "ms")
    } else {
        (s * 1e6, "µs")
    };
    let digits = if value >= 100.0 || value == 0.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.digits$} {unit}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn seconds_read_in_their_unit() {
        assert_eq!(super::seconds(0.0), "0 s");
        assert_eq!(super::seconds(0.0123), "12.3 ms");
        assert_eq!(super::seconds(4.567), "4.57 s");
        assert_eq!(super::seconds(0.000_05), "50.0 µs");
        assert_eq!(super::seconds(1234.0), "1234 s");
    }
}
