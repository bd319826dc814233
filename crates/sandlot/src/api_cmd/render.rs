//! Human output: aligned tables and durations.

/// `cell` as it may be shown on a terminal: control characters (escape
/// sequences, carriage returns, newlines) and bidirectional overrides written as
/// `\u{..}`. Cells carry what tenants and sandboxes wrote (names, server names
/// from a sandbox's traffic, reasons quoting them), which must not move the
/// cursor, rewrite earlier lines or talk to the terminal.
pub fn printable(cell: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !cell.chars().any(unsafe_char) {
        return cell.into();
    }
    cell.chars()
        .map(|c| {
            if unsafe_char(c) {
                format!("\\u{{{:x}}}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// Prints a table with a header row, columns padded to their widest cell; each
/// cell as [`printable`] shows it.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| printable(c).into_owned()).collect())
        .collect();
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<width$}  ", width = w[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// `42s`, `3m05s`, `2h01m`.
pub fn human_secs(s: f64) -> String {
    let s = s.max(0.0) as u64;
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

/// A size in one style for every value of a column: the largest unit (`K`, `M`,
/// `G`, `T`, powers of 1024) it reaches, with one decimal below 10 (`1.9M`, `40K`,
/// `512M`, `1G` when exact), bytes below 1K (`512B`). (The exact form of a spec,
/// `1948K` or `2006528`, mixed styles in one column.)
pub fn human_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    let Some((unit, m)) = UNITS.into_iter().find(|(_, m)| b >= *m) else {
        return format!("{b}B");
    };
    if b.is_multiple_of(m) {
        return format!("{}{unit}", b / m);
    }
    let v = b as f64 / m as f64;
    if v < 9.95 {
        format!("{v:.1}{unit}")
    } else if v < 1023.5 || unit == "T" {
        format!("{}{unit}", v.round() as u64)
    } else {
        // Rounds up to the next unit (1023.7K is 1.0M).
        let (next, nm) = UNITS[UNITS.iter().position(|(u, _)| *u == unit).unwrap() - 1];
        format!("{:.1}{next}", b as f64 / nm as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_one_unit_style() {
        assert_eq!(human_bytes(0), "0B");
        assert_eq!(human_bytes(512), "512B");
        assert_eq!(human_bytes(40448), "40K");
        assert_eq!(human_bytes(1948 << 10), "1.9M");
        assert_eq!(human_bytes(2006528), "1.9M");
        assert_eq!(human_bytes(512 << 20), "512M");
        assert_eq!(human_bytes(1 << 30), "1G");
        assert_eq!(human_bytes((1 << 30) + 1), "1.0G");
        assert_eq!(human_bytes((1 << 20) - 100), "1.0M");
        assert_eq!(human_bytes(3 << 40), "3T");
    }

    #[test]
    fn cells_never_carry_terminal_controls() {
        assert_eq!(printable("a.test"), "a.test");
        assert_eq!(printable("caf\u{e9}.test"), "caf\u{e9}.test");
        assert_eq!(
            printable("a\x1b]52;c;Zm9v\x07b\r\nc"),
            "a\\u{1b}]52;c;Zm9v\\u{7}b\\u{d}\\u{a}c"
        );
        assert_eq!(printable("x\u{202e}gpj.exe"), "x\\u{202e}gpj.exe");
    }
}
