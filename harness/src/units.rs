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

/// A signed change in decimal gigabytes, three decimals: "+0.052", "-1.200".
pub fn signed_gb(delta: i128) -> String {
    format!("{:+.3}", delta as f64 / GB)
}

/// A signed change in binary gibibytes, three decimals.
pub fn signed_gib(delta: i128) -> String {
    format!("{:+.3}", delta as f64 / GIB)
}

/// A signed percentage with two decimals: "+2.00%".
pub fn signed_pct(pct: f64) -> String {
    format!("{pct:+.2}%")
}

/// Bytes with thousands separators: "85,045,477,376".
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
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

/// Parses a size: plain bytes, or a number with B, KB, MB, GB, TB (powers of 1000) or KiB, MiB,
/// GiB, TiB (powers of 1024), case-insensitive: "2GiB", "512MiB", "1.5GB", "1000000".
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (expected e.g. 2GiB, 512MiB, 1.5GB or bytes)"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        other => {
            return Err(format!(
                "unknown size unit `{other}` in `{s}` (use B, KB, MB, GB, KiB, MiB, GiB)"
            ))
        }
    };
    let bytes = v * mult;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{s}` is not a positive size"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn design_guide_example() {
        // 13e9 params x 2 B (docs/src/concepts/memory-terms.md).
        assert_eq!(gb_gib(13_000_000_000 * 2), "26.0 GB (24.2 GiB)");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("2 GiBs").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn human_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536 * 1024), "1.50 MiB");
    }
}
