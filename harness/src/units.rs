//! The one place that formats bytes for people. CSV and JSON hold raw integer bytes.

pub const GB: f64 = 1e9;
pub const GIB: f64 = (1u64 << 30) as f64;

/// "26.0 GB (24.2 GiB)".
pub fn gb_gib(bytes: u64) -> String {
    format!(
        "{:.1} GB ({:.1} GiB)",
        bytes as f64 / GB,
        bytes as f64 / GIB
    )
}

/// Decimal gigabytes with three decimals, for tables.
pub fn gb(bytes: u64) -> String {
    format!("{:.3}", bytes as f64 / GB)
}

/// Binary gibibytes with three decimals, for tables.
pub fn gib(bytes: u64) -> String {
    format!("{:.3}", bytes as f64 / GIB)
}

/// Human size with a binary unit, for short messages: "1.50 MiB".
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn design_guide_example() {
        // 13e9 params x 2 B (DESIGN.md §9).
        assert_eq!(gb_gib(13_000_000_000 * 2), "26.0 GB (24.2 GiB)");
    }

    #[test]
    fn human_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536 * 1024), "1.50 MiB");
    }
}
