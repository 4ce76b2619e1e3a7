//! A self-contained HTML report (inline SVG, no network): live and reserved bytes over time per stream, and a segment map.
