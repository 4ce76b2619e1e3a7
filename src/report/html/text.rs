//! Text for the page and its pictures: escaping (names come from user logs) and byte sizes.

use std::fmt::Write as _;

/// `s` as text content or a quoted attribute value of HTML or XML (SVG): markup characters
/// become entities, and characters XML 1.0 forbids (most control characters, which a hostile
/// log may hold) become U+FFFD, so that an SVG file still parses.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || ('\u{7f}'..='\u{9f}').contains(&c) => out.push('\u{fffd}'),
            '\u{fffe}' | '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// `bytes` in binary units with up to three significant digits: "512 B", "1.5 KiB",
/// "64 MiB", "12.3 GiB".
pub(crate) fn bytes(bytes: usize) -> String {
    bytes_f(bytes as f64)
}

pub(crate) fn bytes_f(bytes: f64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let mut out = String::new();
    if unit == 0 || value >= 100.0 || value.fract() == 0.0 {
        let _ = write!(out, "{value:.0} {}", UNITS[unit]);
    } else if value >= 10.0 {
        let _ = write!(out, "{} {}", trim(format!("{value:.1}")), UNITS[unit]);
    } else {
        let _ = write!(out, "{} {}", trim(format!("{value:.2}")), UNITS[unit]);
    }
    out
}

fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// The width of `s` in pixels at `font_px`, estimated from DejaVu Sans (the sans-serif of
/// most Linux systems, and wider than the sans-serif of macOS and Windows), so that text laid
/// out by this estimate fits where the browser draws it. `bold` widens it by a tenth.
pub(crate) fn text_width(s: &str, font_px: f64, bold: bool) -> f64 {
    let ems: f64 = s
        .chars()
        .map(|c| match c {
            'i' | 'j' | 'l' | '.' | ',' | ':' | ';' | '\'' | '|' | '!' | '·' => 0.3,
            ' ' | '\u{a0}' | 'f' | 't' | 'r' | 'I' | '(' | ')' | '[' | ']' | '-' | '/' => 0.42,
            'm' | 'w' | 'M' | 'W' | '%' | '@' => 1.0,
            '×' | '≥' | '≤' | '+' | '=' | '<' | '>' | '~' => 0.84,
            'A'..='Z' => 0.78,
            'a'..='z' | '0'..='9' => 0.64,
            c if c.is_ascii() => 0.64,
            _ => 1.0,
        })
        .sum();
    ems * font_px * if bold { 1.1 } else { 1.0 }
}

/// `s` cut into lines no wider than `max_px` at `font_px` ([`text_width`]): at spaces (not at
/// no-break spaces), and inside a word only when the word alone is wider than a line. Always
/// at least one line.
pub(crate) fn wrap(s: &str, max_px: f64, font_px: f64) -> Vec<String> {
    let fits = |line: &str| text_width(line, font_px, false) <= max_px;
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in s.split(' ') {
        let joined = if line.is_empty() {
            word.to_owned()
        } else {
            format!("{line} {word}")
        };
        if fits(&joined) {
            line = joined;
            continue;
        }
        if !line.is_empty() {
            lines.push(std::mem::take(&mut line));
        }
        // A word wider than a line: as many characters as fit, then the rest.
        for c in word.chars() {
            line.push(c);
            if !fits(&line) && line.chars().count() > 1 {
                line.pop();
                lines.push(std::mem::replace(&mut line, c.to_string()));
            }
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// `s`, cut to fit `max_px` at `font_px` with "…" at the end where it had to be cut.
pub(crate) fn fit(s: &str, max_px: f64, font_px: f64) -> String {
    if text_width(s, font_px, false) <= max_px {
        return s.to_owned();
    }
    let mut out = String::new();
    for c in s.chars() {
        out.push(c);
        if text_width(&out, font_px, false) + text_width("…", font_px, false) > max_px {
            out.pop();
            break;
        }
    }
    out.push('…');
    out
}

/// Writes `lines` as SVG `<text>` elements at `x`, the first at `y`, each `step` under the
/// one before, with `attributes` (` fill="…"`, or empty); returns where a next line would go.
pub(crate) fn svg_lines(
    svg: &mut String,
    lines: &[String],
    x: f64,
    y: f64,
    step: f64,
    attributes: &str,
) -> f64 {
    let mut y = y;
    for line in lines {
        let _ = writeln!(
            svg,
            "<text x=\"{x:.1}\" y=\"{y:.1}\"{attributes}>{}</text>",
            escape(line)
        );
        y += step;
    }
    y
}

/// A byte step for about `ticks` ticks up to `max`: a power of two (256 MiB, 512 MiB, 1 GiB,
/// …), so that every tick reads as a round figure in binary units.
pub(crate) fn byte_step(max: f64, ticks: usize) -> f64 {
    let raw = (max / ticks.max(1) as f64).max(1.0);
    2f64.powf(raw.log2().ceil())
}

/// A plain number step (1, 2, 5 × 10ⁿ) for about `ticks` ticks up to `max`.
pub(crate) fn number_step(max: f64, ticks: usize) -> f64 {
    let raw = (max / ticks.max(1) as f64).max(1.0);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * magnitude)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup_and_no_character_xml_forbids() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(escape("a\u{1}b\u{0}c\u{85}"), "a\u{fffd}b\u{fffd}c\u{fffd}");
        assert_eq!(escape("tab\there"), "tab\there");
    }

    #[test]
    fn byte_sizes_read_in_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(64 << 20), "64 MiB");
        assert_eq!(bytes((12.3 * (1u64 << 30) as f64) as usize), "12.3 GiB");
        assert_eq!(bytes(usize::MAX), "16 EiB");
    }

    #[test]
    fn wrapping_keeps_every_line_within_its_width_and_every_word() {
        let s = "largest request each stream gets now: stream 0x5560f474fff0 6 MiB, \
                 stream 0x5560f4b0b660 4 MiB";
        let lines = wrap(s, 200.0, 11.0);
        assert!(lines.len() > 1, "{lines:?}");
        assert!(
            lines.iter().all(|l| text_width(l, 11.0, false) <= 200.0),
            "{lines:?}"
        );
        assert_eq!(lines.join(" "), s);
        // A word wider than the line is cut inside, and nothing is lost.
        let long = "0x".repeat(40);
        let lines = wrap(&long, 100.0, 11.0);
        assert!(lines.iter().all(|l| text_width(l, 11.0, false) <= 100.0));
        assert_eq!(lines.concat(), long);
        assert_eq!(wrap("", 10.0, 11.0), [""]);
        // No-break spaces hold an item together; a line breaks between items.
        let items = "stream\u{a0}a\u{a0}14.5\u{a0}MiB, stream\u{a0}b\u{a0}17\u{a0}MiB";
        let width = text_width("stream\u{a0}a\u{a0}14.5\u{a0}MiB,", 11.0, false);
        assert_eq!(
            wrap(items, width + 1.0, 11.0),
            [
                "stream\u{a0}a\u{a0}14.5\u{a0}MiB,",
                "stream\u{a0}b\u{a0}17\u{a0}MiB"
            ]
        );
        // Wider characters are wider: a line of digits is wider than one of dots.
        assert!(text_width("0000", 11.0, false) > text_width("....", 11.0, false));
        assert!(text_width("Ab", 13.0, true) > text_width("Ab", 13.0, false));
        assert_eq!(
            fit("stream 0x5560f474fff0", 1000.0, 11.0),
            "stream 0x5560f474fff0"
        );
        let cut = fit("stream 0x5560f474fff0", 60.0, 11.0);
        assert!(
            cut.ends_with('…') && text_width(&cut, 11.0, false) <= 60.0,
            "{cut}"
        );
    }

    #[test]
    fn byte_steps_are_round_in_their_unit() {
        assert_eq!(byte_step(64.0 * 1048576.0, 4), 16.0 * 1048576.0);
        assert_eq!(byte_step(2.4 * 1073741824.0, 4), 1073741824.0);
        assert_eq!(byte_step(4096.0, 4), 1024.0);
        assert_eq!(byte_step(0.0, 4), 1.0);
        assert_eq!(number_step(1000.0, 5), 200.0);
    }
}
