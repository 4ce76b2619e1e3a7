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
    fn byte_steps_are_round_in_their_unit() {
        assert_eq!(byte_step(64.0 * 1048576.0, 4), 16.0 * 1048576.0);
        assert_eq!(byte_step(2.4 * 1073741824.0, 4), 1073741824.0);
        assert_eq!(byte_step(4096.0, 4), 1024.0);
        assert_eq!(byte_step(0.0, 4), 1.0);
        assert_eq!(number_step(1000.0, 5), 200.0);
    }
}
