//! Human byte sizes: `128MiB`, `1GB`, `4096`, `1.5GiB`.

use crate::FormatError;

/// Parse a byte size. Binary (`KiB`, `MiB`, `GiB`, `TiB`) and decimal (`KB`,
/// `MB`, `GB`, `TB`) units are accepted, case-insensitively; a bare number is bytes.
pub fn parse_size(input: &str) -> Result<u64, FormatError> {
    let bad = |reason| FormatError::BadSize {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    if number.is_empty() {
        return Err(bad("expected a number, e.g. 128MiB"));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| bad("expected a number, e.g. 128MiB"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "tib" => 1 << 40,
        _ => {
            return Err(bad(
                "unknown unit; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB",
            ));
        }
    };
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(bad("too large"));
    }
    Ok(bytes.round() as u64)
}

/// Format a byte count with a binary unit, e.g. `1.50 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("128MiB").unwrap(), 128 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size(" 2 kib ").unwrap(), 2048);
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert_eq!(format_size(3 << 29), "1.50 GiB");
        assert_eq!(format_size(12), "12 B");
    }
}
