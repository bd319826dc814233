//! `sort`: keys, fields and the orderings of GNU sort.

use super::cmd_files::{lquote, usage_error};
use super::cmd_text::{read_inputs, split_lines};
use super::exec::{Abort, Ctx};
use super::getopt::{self, Arg, Spec};
use super::vpath::quotef;

const SORT_SPEC: Spec = Spec {
    short: "bdfghik:MnRrst:uVo:cCz",
    long: &[
        ("ignore-leading-blanks", Arg::No, "b"),
        ("dictionary-order", Arg::No, "d"),
        ("ignore-case", Arg::No, "f"),
        ("general-numeric-sort", Arg::No, "g"),
        ("human-numeric-sort", Arg::No, "h"),
        ("numeric-sort", Arg::No, "n"),
        ("reverse", Arg::No, "r"),
        ("stable", Arg::No, "s"),
        ("unique", Arg::No, "u"),
        ("key", Arg::Required, "k"),
        ("field-separator", Arg::Required, "t"),
        ("version-sort", Arg::No, "V"),
        ("output", Arg::Required, "o"),
        ("check", Arg::Optional, "c"),
    ],
    digits: false,
};

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct KeyFlags {
    numeric: bool,
    human: bool,
    fold: bool,
    reverse: bool,
    blanks: bool,
    version: bool,
    dict: bool,
}

impl KeyFlags {
    fn any(&self) -> bool {
        *self != KeyFlags::default()
    }
}

#[derive(Debug, Clone)]
struct Key {
    sf: usize,
    sc: usize,
    ef: Option<usize>,
    ec: usize,
    flags: KeyFlags,
}

fn parse_key(spec: &str, global: KeyFlags) -> Result<Key, String> {
    let bad = || {
        format!(
            "sort: invalid number at field start: invalid count at start of {}",
            lquote(spec)
        )
    };
    let (start, end) = match spec.split_once(',') {
        Some((a, b)) => (a, Some(b)),
        None => (spec, None),
    };
    let mut flags = KeyFlags::default();
    let parse_pos = |s: &str, flags: &mut KeyFlags| -> Result<(usize, usize), String> {
        let digits_end = s
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len());
        let (pos, opts) = s.split_at(digits_end);
        for c in opts.chars() {
            match c {
                'n' => flags.numeric = true,
                'h' => flags.human = true,
                'f' => flags.fold = true,
                'r' => flags.reverse = true,
                'b' => flags.blanks = true,
                'V' => flags.version = true,
                'd' => flags.dict = true,
                'g' => flags.numeric = true,
                _ => {
                    return Err(format!(
                        "sort: stray character in field spec: invalid field specification {}",
                        lquote(spec)
                    ))
                }
            }
        }
        let (f, c) = match pos.split_once('.') {
            Some((f, c)) => (f, c),
            None => (pos, ""),
        };
        let f: usize = f.parse().map_err(|_| bad())?;
        let c: usize = if c.is_empty() {
            0
        } else {
            c.parse().map_err(|_| bad())?
        };
        Ok((f, c))
    };
    let (sf, sc) = parse_pos(start, &mut flags)?;
    if sf == 0 {
        return Err(format!(
            "sort: field number is zero: invalid field specification {}",
            lquote(spec)
        ));
    }
    let (ef, ec) = match end {
        Some(e) => {
            let (f, c) = parse_pos(e, &mut flags)?;
            (Some(f), c)
        }
        None => (None, 0),
    };
    if !flags.any() {
        flags = global;
    }
    Ok(Key {
        sf,
        sc: sc.max(1),
        ef,
        ec,
        flags,
    })
}

pub(super) fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Field boundaries: (start, end) byte ranges.
fn fields(line: &[u8], sep: Option<u8>) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    match sep {
        Some(t) => {
            let mut s = 0;
            for (i, b) in line.iter().enumerate() {
                if *b == t {
                    v.push((s, i));
                    s = i + 1;
                }
            }
            v.push((s, line.len()));
        }
        None => {
            // A field is leading blanks plus non-blanks.
            let mut i = 0;
            while i < line.len() {
                let s = i;
                while i < line.len() && is_blank(line[i]) {
                    i += 1;
                }
                while i < line.len() && !is_blank(line[i]) {
                    i += 1;
                }
                v.push((s, i));
            }
        }
    }
    v
}

fn key_slice<'a>(line: &'a [u8], k: &Key, sep: Option<u8>) -> &'a [u8] {
    let fs = fields(line, sep);
    let Some(&(fstart, fend)) = fs.get(k.sf - 1) else {
        return &[];
    };
    let mut s = fstart;
    if k.flags.blanks {
        while s < fend && is_blank(line[s]) {
            s += 1;
        }
    }
    let s = (s + k.sc - 1).min(line.len());
    let e = match k.ef {
        None => line.len(),
        Some(ef) => match fs.get(ef - 1) {
            None => line.len(),
            Some(&(es, ee)) => {
                if k.ec == 0 {
                    ee
                } else {
                    let mut st = es;
                    if k.flags.blanks {
                        while st < ee && is_blank(line[st]) {
                            st += 1;
                        }
                    }
                    (st + k.ec).min(ee)
                }
            }
        },
    };
    if e <= s {
        &[]
    } else {
        &line[s..e]
    }
}

fn num_prefix(s: &[u8]) -> f64 {
    let mut i = 0;
    while i < s.len() && is_blank(s[i]) {
        i += 1;
    }
    let start = i;
    if i < s.len() && s[i] == b'-' {
        i += 1;
    }
    while i < s.len() && s[i].is_ascii_digit() {
        i += 1;
    }
    if i < s.len() && s[i] == b'.' {
        i += 1;
        while i < s.len() && s[i].is_ascii_digit() {
            i += 1;
        }
    }
    std::str::from_utf8(&s[start..i])
        .ok()
        .and_then(|t| t.parse::<f64>().ok())
        .unwrap_or(0.0)
}

fn human_value(s: &[u8]) -> f64 {
    let n = num_prefix(s);
    let t: Vec<u8> = s.iter().copied().skip_while(|b| is_blank(*b)).collect();
    let end = t
        .iter()
        .position(|b| !(b.is_ascii_digit() || *b == b'.' || *b == b'-'))
        .unwrap_or(t.len());
    let mult = match t.get(end) {
        Some(b'K') | Some(b'k') => 1e3,
        Some(b'M') => 1e6,
        Some(b'G') => 1e9,
        Some(b'T') => 1e12,
        Some(b'P') => 1e15,
        _ => 1.0,
    };
    n * mult
}

fn version_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i].is_ascii_digit() && b[j].is_ascii_digit() {
            let si = i;
            while i < a.len() && a[i].is_ascii_digit() {
                i += 1;
            }
            let sj = j;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            let na = std::str::from_utf8(&a[si..i])
                .unwrap_or("0")
                .trim_start_matches('0');
            let nb = std::str::from_utf8(&b[sj..j])
                .unwrap_or("0")
                .trim_start_matches('0');
            let o = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
            if o.is_ne() {
                return o;
            }
        } else {
            let o = a[i].cmp(&b[j]);
            if o.is_ne() {
                return o;
            }
            i += 1;
            j += 1;
        }
    }
    (a.len() - i).cmp(&(b.len() - j))
}

fn cmp_with(a: &[u8], b: &[u8], f: &KeyFlags) -> std::cmp::Ordering {
    let (a2, b2);
    let (mut a, mut b) = (a, b);
    if f.blanks {
        a = &a[a.iter().position(|c| !is_blank(*c)).unwrap_or(a.len())..];
        b = &b[b.iter().position(|c| !is_blank(*c)).unwrap_or(b.len())..];
    }
    let o = if f.numeric {
        num_prefix(a)
            .partial_cmp(&num_prefix(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    } else if f.human {
        human_value(a)
            .partial_cmp(&human_value(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    } else if f.version {
        version_cmp(a, b)
    } else {
        if f.fold || f.dict {
            let t = |s: &[u8]| -> Vec<u8> {
                s.iter()
                    .filter(|c| !f.dict || c.is_ascii_alphanumeric() || is_blank(**c))
                    .map(|c| if f.fold { c.to_ascii_uppercase() } else { *c })
                    .collect()
            };
            a2 = t(a);
            b2 = t(b);
            a = &a2;
            b = &b2;
        }
        a.cmp(b)
    };
    if f.reverse {
        o.reverse()
    } else {
        o
    }
}

pub(crate) fn sort(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, files) = match getopt::parse("sort", &SORT_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 2),
    };
    let mut g = KeyFlags::default();
    let (mut stable, mut unique) = (false, false);
    let mut sep = None;
    let mut out_file = None;
    let mut key_specs = Vec::new();
    for (k, v) in &opts {
        let v = v.clone().unwrap_or_default();
        match k.as_str() {
            "b" => g.blanks = true,
            "d" => g.dict = true,
            "f" => g.fold = true,
            "g" | "n" => g.numeric = true,
            "h" => g.human = true,
            "r" => g.reverse = true,
            "V" => g.version = true,
            "s" => stable = true,
            "u" => unique = true,
            "k" => key_specs.push(v),
            "t" => {
                if v.len() != 1 {
                    let msg = if v.is_empty() {
                        "sort: empty tab".to_string()
                    } else {
                        format!("sort: multi-character tab {}", lquote(&v))
                    };
                    ctx.errln(&msg)?;
                    return Ok(2);
                }
                sep = Some(v.as_bytes()[0]);
            }
            "o" if ctx.fs().writable() => out_file = Some(v),
            "o" => {
                ctx.errln(&format!(
                    "sort: open failed: {}: Read-only file system",
                    quotef(&v)
                ))?;
                return Ok(2);
            }
            _ => {}
        }
    }
    let mut keys = Vec::new();
    for ks in &key_specs {
        match parse_key(ks, g) {
            Ok(k) => keys.push(k),
            Err(e) => {
                ctx.errln(&e)?;
                return Ok(2);
            }
        }
    }
    let (data, status) = read_inputs(ctx, "sort", &files)?;
    if status != 0 {
        return Ok(status);
    }
    ctx.check()?;
    let mut lines = split_lines(&data);
    let global_reverse = g.reverse;
    let compare = |a: &[u8], b: &[u8]| -> std::cmp::Ordering {
        if keys.is_empty() {
            if g.any() {
                let o = cmp_with(
                    a,
                    b,
                    &KeyFlags {
                        reverse: false,
                        ..g
                    },
                );
                if o.is_ne() {
                    return if global_reverse { o.reverse() } else { o };
                }
                return std::cmp::Ordering::Equal;
            }
            return a.cmp(b);
        }
        for k in &keys {
            let o = cmp_with(key_slice(a, k, sep), key_slice(b, k, sep), &k.flags);
            if o.is_ne() {
                return o;
            }
        }
        std::cmp::Ordering::Equal
    };
    let full = |a: &[u8], b: &[u8]| -> std::cmp::Ordering {
        let o = compare(a, b);
        if o.is_ne() || stable || unique {
            return o;
        }
        let last = a.cmp(b);
        if global_reverse {
            last.reverse()
        } else {
            last
        }
    };
    lines.sort_by(|a, b| full(a, b));
    if keys.is_empty() && !g.any() && global_reverse {
        // plain -r: handled by full() via last resort
    }
    let mut out = Vec::with_capacity(data.len() + 1);
    let mut prev: Option<&[u8]> = None;
    for l in lines {
        if unique {
            if let Some(p) = prev {
                if compare(p, l).is_eq() {
                    continue;
                }
            }
        }
        out.extend_from_slice(l);
        out.push(b'\n');
        prev = Some(l);
    }
    if let Some(f) = out_file {
        // `-o` is opened after every input is read, so `sort -o f f` works.
        return match super::cmd_write::write_file(ctx, &f, &out) {
            Ok(()) => Ok(0),
            Err((opened, e)) => {
                let what = if opened { "write" } else { "open" };
                ctx.errln(&format!("sort: {what} failed: {}: {}", quotef(&f), e.msg()))?;
                Ok(2)
            }
        };
    }
    ctx.out(&out)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_keys_and_fields() {
        let k = parse_key("2,2n", KeyFlags::default()).unwrap();
        assert!(k.flags.numeric);
        assert_eq!(key_slice(b"a 10 x", &k, None), b" 10");
        let k = parse_key("2", KeyFlags::default()).unwrap();
        assert_eq!(key_slice(b"a:b:c", &k, Some(b':')), b"b:c");
        assert!(parse_key("0", KeyFlags::default()).is_err());
        assert_eq!(version_cmp(b"a9", b"a10"), std::cmp::Ordering::Less);
        assert_eq!(num_prefix(b"  -3.5x"), -3.5);
    }
}
