//! Buffer sizes on the command line: parsing `64K`-style sizes and the default sweep of sizes
//! from a minimum to a maximum.

/// Parses a size: digits, then optionally K/M/G (powers of 1024), with or without "iB" or "B".
pub(crate) fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: usize =
        number.parse().map_err(|_| format!("{text:?} is not a size such as 4096, 64K or 2M"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("{text:?} has an unknown unit (use K, M or G)")),
    };
    number.checked_mul(1 << shift).ok_or_else(|| format!("{text:?} is too large"))
}

/// The sweep from `min` to `max`, each size `factor` times the one before, and `max` last (so
/// the default, 8 B to 64 MiB by 8, is the peers' list: …, 2 MiB, 16 MiB, 64 MiB).
pub(crate) fn ladder(min: usize, max: usize, factor: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut size = min;
    while size <= max {
        sizes.push(size);
        match size.checked_mul(factor) {
            Some(next) => size = next,
            None => break,
        }
    }
    if sizes.last() != Some(&max) {
        sizes.push(max);
    }
    sizes
}
