//! Text filters and small utilities: uniq, cut, tr, basename, dirname,
//! seq, printf, xargs, test; and the write commands that fail read-only. `sort`
//! is in `cmd_sort.rs`.

use super::cmd_files::{lquote, usage_error};
use super::cmd_sort::is_blank;
use super::exec::{backslash_escapes, Abort, Ctx};
use super::getopt::{self, Arg, Spec};
use super::vpath::{quote, quotef, FsErr};

/// Read the named inputs (or stdin), reporting errors as `prog: NAME: error`.
pub(super) fn read_inputs(
    ctx: &mut Ctx,
    prog: &str,
    files: &[String],
) -> Result<(Vec<u8>, i32), Abort> {
    if files.is_empty() {
        return Ok((ctx.take_stdin(), 0));
    }
    let mut data = Vec::new();
    let mut status = 0;
    for f in files {
        if f == "-" {
            data.extend(ctx.take_stdin());
            continue;
        }
        match ctx.read_path(f) {
            Ok(d) => data.extend(d),
            Err(FsErr::IsDir) => {
                ctx.errln(&format!(
                    "{prog}: read failed: {}: Is a directory",
                    quotef(f)
                ))?;
                status = 2;
            }
            Err(e) => {
                ctx.errln(&format!("{prog}: cannot read: {}: {}", quotef(f), e.msg()))?;
                status = 2;
            }
        }
    }
    Ok((data, status))
}

pub(super) fn split_lines(data: &[u8]) -> Vec<&[u8]> {
    if data.is_empty() {
        return Vec::new();
    }
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    body.split(|b| *b == b'\n').collect()
}

// ---------------------------------------------------------------- uniq

const UNIQ_SPEC: Spec = Spec {
    short: "cdDuif:s:w:",
    long: &[
        ("count", Arg::No, "c"),
        ("repeated", Arg::No, "d"),
        ("unique", Arg::No, "u"),
        ("ignore-case", Arg::No, "i"),
        ("skip-fields", Arg::Required, "f"),
        ("skip-chars", Arg::Required, "s"),
        ("check-chars", Arg::Required, "w"),
    ],
    digits: false,
};

pub(crate) fn uniq(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, files) = match getopt::parse("uniq", &UNIQ_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let (mut count, mut dup, mut all_dup, mut uniq_only, mut icase) =
        (false, false, false, false, false);
    let (mut skip_f, mut skip_c, mut check) = (0usize, 0usize, None::<usize>);
    for (k, v) in &opts {
        let n = v.as_deref().and_then(|s| s.parse::<usize>().ok());
        match k.as_str() {
            "c" => count = true,
            "d" => dup = true,
            "D" => all_dup = true,
            "u" => uniq_only = true,
            "i" => icase = true,
            "f" => skip_f = n.unwrap_or(0),
            "s" => skip_c = n.unwrap_or(0),
            "w" => check = n,
            _ => {}
        }
    }
    if files.len() > 2 {
        ctx.errln(&format!(
            "uniq: extra operand {}\nTry 'uniq --help' for more information.",
            quote(&files[2])
        ))?;
        return Ok(1);
    }
    let out_file = files.get(1).cloned();
    if let Some(out) = &out_file {
        if !ctx.fs().writable() {
            ctx.errln(&format!("uniq: {}: Read-only file system", quotef(out)))?;
            return Ok(1);
        }
    }
    let data = match files.first().filter(|f| *f != "-") {
        None => ctx.take_stdin(),
        Some(f) => match ctx.read_path(f) {
            Ok(d) => d,
            Err(e) => {
                ctx.errln(&format!("uniq: {}: {}", quotef(f), e.msg()))?;
                return Ok(1);
            }
        },
    };
    let key = |l: &[u8]| -> Vec<u8> {
        let mut i = 0;
        for _ in 0..skip_f {
            while i < l.len() && is_blank(l[i]) {
                i += 1;
            }
            while i < l.len() && !is_blank(l[i]) {
                i += 1;
            }
        }
        let i = (i + skip_c).min(l.len());
        let mut k = &l[i..];
        if let Some(w) = check {
            k = &k[..w.min(k.len())];
        }
        if icase {
            k.to_ascii_lowercase()
        } else {
            k.to_vec()
        }
    };
    let lines = split_lines(&data);
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let k = key(lines[i]);
        let mut j = i + 1;
        while j < lines.len() && key(lines[j]) == k {
            j += 1;
        }
        let n = j - i;
        let show = (!dup || n > 1) && (!uniq_only || n == 1) && (!all_dup || n > 1);
        if show {
            let group: &[&[u8]] = if all_dup {
                &lines[i..j]
            } else {
                &lines[i..i + 1]
            };
            for l in group {
                if count {
                    out.extend_from_slice(format!("{n:>7} ").as_bytes());
                }
                out.extend_from_slice(l);
                out.push(b'\n');
            }
        }
        i = j;
    }
    if let Some(f) = out_file {
        return match super::cmd_write::write_file(ctx, &f, &out) {
            Ok(()) => Ok(0),
            Err((_, e)) => {
                ctx.errln(&format!("uniq: {}: {}", quotef(&f), e.msg()))?;
                Ok(1)
            }
        };
    }
    ctx.out(&out)?;
    Ok(0)
}

// ---------------------------------------------------------------- cut

const CUT_SPEC: Spec = Spec {
    short: "b:c:d:f:sz",
    long: &[
        ("bytes", Arg::Required, "b"),
        ("characters", Arg::Required, "c"),
        ("delimiter", Arg::Required, "d"),
        ("fields", Arg::Required, "f"),
        ("only-delimited", Arg::No, "s"),
        ("complement", Arg::No, "complement"),
        ("output-delimiter", Arg::Required, "od"),
    ],
    digits: false,
};

fn parse_list(s: &str, what: &str) -> Result<Vec<(usize, usize)>, String> {
    let mut v = Vec::new();
    for part in s.split([',', ' ']) {
        if part.is_empty() {
            return Err(format!("cut: invalid {what} list"));
        }
        let num = |x: &str| -> Result<usize, String> {
            x.parse::<usize>()
                .map_err(|_| format!("cut: invalid {what} value {}", lquote(part)))
        };
        let (lo, hi) = match part.split_once('-') {
            Some(("", "")) => return Err("cut: invalid range with no endpoint: -".into()),
            Some(("", h)) => (1, num(h)?),
            Some((l, "")) => (num(l)?, usize::MAX),
            Some((l, h)) => (num(l)?, num(h)?),
            None => {
                let n = num(part)?;
                (n, n)
            }
        };
        if lo == 0 || hi == 0 {
            let w = if what == "field" {
                "fields"
            } else {
                "byte/character positions"
            };
            return Err(format!("cut: {w} are numbered from 1"));
        }
        if lo > hi {
            return Err("cut: invalid decreasing range".into());
        }
        v.push((lo, hi));
    }
    Ok(v)
}

pub(crate) fn cut(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, files) = match getopt::parse("cut", &CUT_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let mut mode = None;
    let mut list = String::new();
    let mut delim = b'\t';
    let mut delim_set = false;
    let (mut only_delim, mut complement) = (false, false);
    let mut out_delim: Option<Vec<u8>> = None;
    for (k, v) in &opts {
        let v = v.clone().unwrap_or_default();
        match k.as_str() {
            "b" | "c" | "f" => {
                if mode.is_some() {
                    return usage_error(ctx, "cut: only one type of list may be specified\nTry 'cut --help' for more information.", 1);
                }
                mode = Some(if k == "f" { 'f' } else { 'b' });
                list = v;
            }
            "d" => {
                if v.len() != 1 {
                    return usage_error(ctx, "cut: the delimiter must be a single character\nTry 'cut --help' for more information.", 1);
                }
                delim = v.as_bytes()[0];
                delim_set = true;
            }
            "s" => only_delim = true,
            "complement" => complement = true,
            "od" => out_delim = Some(v.into_bytes()),
            _ => {}
        }
    }
    let Some(mode) = mode else {
        return usage_error(ctx, "cut: you must specify a list of bytes, characters, or fields\nTry 'cut --help' for more information.", 1);
    };
    if mode != 'f' && (delim_set || only_delim) {
        let m = if delim_set {
            "cut: an input delimiter may be specified only when operating on fields"
        } else {
            "cut: suppressing non-delimited lines makes sense\n\tonly when operating on fields"
        };
        return usage_error(
            ctx,
            &format!("{m}\nTry 'cut --help' for more information."),
            1,
        );
    }
    let ranges = match parse_list(
        &list,
        if mode == 'f' {
            "field"
        } else {
            "byte/character position"
        },
    ) {
        Ok(r) => r,
        Err(e) => {
            return usage_error(
                ctx,
                &format!("{e}\nTry 'cut --help' for more information."),
                1,
            )
        }
    };
    let selected = |i: usize| ranges.iter().any(|(lo, hi)| i >= *lo && i <= *hi) != complement;
    let mut status = 0;
    let inputs: Vec<String> = if files.is_empty() {
        vec!["-".into()]
    } else {
        files
    };
    let mut out = Vec::new();
    for f in &inputs {
        let data = if f == "-" {
            ctx.take_stdin()
        } else {
            match ctx.read_path(f) {
                Ok(d) => d,
                Err(e) => {
                    ctx.errln(&format!("cut: {}: {}", quotef(f), e.msg()))?;
                    status = 1;
                    continue;
                }
            }
        };
        for line in split_lines(&data) {
            if mode == 'b' {
                let mut first = true;
                let mut prev_sel = false;
                for (i, b) in line.iter().enumerate() {
                    let s = selected(i + 1);
                    if s {
                        if let Some(od) = &out_delim {
                            if !first && !prev_sel {
                                out.extend_from_slice(od);
                            }
                        }
                        out.push(*b);
                        first = false;
                    }
                    prev_sel = s;
                }
                out.push(b'\n');
            } else {
                if !line.contains(&delim) {
                    if !only_delim {
                        out.extend_from_slice(line);
                        out.push(b'\n');
                    }
                    continue;
                }
                let od = out_delim.clone().unwrap_or_else(|| vec![delim]);
                let mut first = true;
                for (i, field) in line.split(|b| *b == delim).enumerate() {
                    if selected(i + 1) {
                        if !first {
                            out.extend_from_slice(&od);
                        }
                        out.extend_from_slice(field);
                        first = false;
                    }
                }
                out.push(b'\n');
            }
        }
    }
    ctx.out(&out)?;
    Ok(status)
}

// ---------------------------------------------------------------- tr

fn tr_set(s: &str) -> Result<Vec<u8>, String> {
    let (b, _) = backslash_escapes(s, false);
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'[' && i + 1 < b.len() && b[i + 1] == b':' {
            if let Some(end) = b[i + 2..].windows(2).position(|w| w == b":]") {
                let name = std::str::from_utf8(&b[i + 2..i + 2 + end]).unwrap_or("");
                let pred: fn(&u8) -> bool = match name {
                    "lower" => |c| c.is_ascii_lowercase(),
                    "upper" => |c| c.is_ascii_uppercase(),
                    "digit" => |c| c.is_ascii_digit(),
                    "alpha" => |c| c.is_ascii_alphabetic(),
                    "alnum" => |c| c.is_ascii_alphanumeric(),
                    "space" => |c| c.is_ascii_whitespace() || *c == 0x0b,
                    "blank" => |c| *c == b' ' || *c == b'\t',
                    "punct" => |c| c.is_ascii_punctuation(),
                    "cntrl" => |c| c.is_ascii_control(),
                    "print" => |c| (32..127).contains(c),
                    "graph" => |c| (33..127).contains(c),
                    "xdigit" => |c| c.is_ascii_hexdigit(),
                    _ => return Err(format!("tr: invalid character class {}", lquote(name))),
                };
                out.extend((0u8..=255).filter(pred));
                i += end + 4;
                continue;
            }
        }
        if i + 2 < b.len() && b[i + 1] == b'-' {
            let (lo, hi) = (b[i], b[i + 2]);
            if hi < lo {
                return Err(format!(
                    "tr: range-endpoints of '{}-{}' are in reverse collating sequence order",
                    lo as char, hi as char
                ));
            }
            out.extend(lo..=hi);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    Ok(out)
}

pub(crate) fn tr(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    const SPEC: Spec = Spec {
        short: "cCdst",
        long: &[
            ("complement", Arg::No, "c"),
            ("delete", Arg::No, "d"),
            ("squeeze-repeats", Arg::No, "s"),
        ],
        digits: false,
    };
    let (opts, sets) = match getopt::parse("tr", &SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let (mut comp, mut del, mut squeeze) = (false, false, false);
    for (k, _) in &opts {
        match k.as_str() {
            "c" | "C" => comp = true,
            "d" => del = true,
            "s" => squeeze = true,
            _ => {}
        }
    }
    let need = if del && squeeze {
        2
    } else if del || (squeeze && sets.len() == 1) {
        1
    } else {
        2
    };
    if sets.is_empty() {
        return usage_error(
            ctx,
            "tr: missing operand\nTry 'tr --help' for more information.",
            1,
        );
    }
    if sets.len() < need {
        let m = format!("tr: missing operand after {}\nTwo strings must be given when translating.\nTry 'tr --help' for more information.", quote(&sets[0]));
        return usage_error(ctx, &m, 1);
    }
    let s1 = match tr_set(&sets[0]) {
        Ok(s) => s,
        Err(e) => return usage_error(ctx, &e, 1),
    };
    let s1: Vec<u8> = if comp {
        (0u8..=255).filter(|c| !s1.contains(c)).collect()
    } else {
        s1
    };
    let s2 = match sets.get(1).map(|s| tr_set(s)) {
        Some(Ok(s)) => s,
        Some(Err(e)) => return usage_error(ctx, &e, 1),
        None => Vec::new(),
    };
    let mut map: [Option<u8>; 256] = [None; 256];
    let translating = !del && sets.len() >= 2;
    if translating {
        if s2.is_empty() {
            return usage_error(
                ctx,
                "tr: when not truncating set1, string2 must be non-empty",
                1,
            );
        }
        for (i, c) in s1.iter().enumerate() {
            map[*c as usize] = Some(*s2.get(i).unwrap_or(s2.last().unwrap_or(c)));
        }
    }
    let in_set = |set: &[u8], c: u8| set.contains(&c);
    let squeeze_set: &[u8] = if translating || (del && squeeze) {
        &s2
    } else {
        &s1
    };
    let data = ctx.take_stdin();
    let mut out = Vec::with_capacity(data.len());
    for &b in &data {
        if del && in_set(&s1, b) {
            continue;
        }
        let c = if translating {
            map[b as usize].unwrap_or(b)
        } else {
            b
        };
        if squeeze && in_set(squeeze_set, c) && out.last() == Some(&c) {
            continue;
        }
        out.push(c);
    }
    ctx.out(&out)?;
    Ok(0)
}

// ---------------------------------------------------------------- basename / dirname / seq

pub(crate) fn basename(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    const SPEC: Spec = Spec {
        short: "as:z",
        long: &[("multiple", Arg::No, "a"), ("suffix", Arg::Required, "s")],
        digits: false,
    };
    let (opts, names) = match getopt::parse("basename", &SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let mut multiple = false;
    let mut suffix = None;
    for (k, v) in &opts {
        match k.as_str() {
            "a" => multiple = true,
            "s" => {
                multiple = true;
                suffix = v.clone()
            }
            _ => {}
        }
    }
    if names.is_empty() {
        return usage_error(
            ctx,
            "basename: missing operand\nTry 'basename --help' for more information.",
            1,
        );
    }
    let (names, suffix) = if multiple {
        (names, suffix)
    } else if names.len() > 2 {
        return usage_error(
            ctx,
            &format!(
                "basename: extra operand {}\nTry 'basename --help' for more information.",
                quote(&names[2])
            ),
            1,
        );
    } else {
        (vec![names[0].clone()], names.get(1).cloned())
    };
    let mut out = String::new();
    for n in names {
        let t = n.trim_end_matches('/');
        let mut b = if t.is_empty() {
            if n.is_empty() { "" } else { "/" }.to_string()
        } else {
            t.rsplit('/').next().unwrap_or(t).to_string()
        };
        if let Some(s) = &suffix {
            if b.len() > s.len() && b.ends_with(s.as_str()) {
                b.truncate(b.len() - s.len());
            }
        }
        out.push_str(&b);
        out.push('\n');
    }
    ctx.outs(&out)?;
    Ok(0)
}

pub(crate) fn dirname(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    if args.is_empty() {
        return usage_error(
            ctx,
            "dirname: missing operand\nTry 'dirname --help' for more information.",
            1,
        );
    }
    let mut out = String::new();
    for n in args {
        let t = n.trim_end_matches('/');
        let d = if t.is_empty() {
            if n.starts_with('/') { "/" } else { "." }.to_string()
        } else {
            match t.rfind('/') {
                None => ".".to_string(),
                Some(i) => {
                    let d = t[..i].trim_end_matches('/');
                    if d.is_empty() {
                        "/".into()
                    } else {
                        d.to_string()
                    }
                }
            }
        };
        out.push_str(&d);
        out.push('\n');
    }
    ctx.outs(&out)?;
    Ok(0)
}

pub(crate) fn seq(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let mut sep = "\n".to_string();
    let mut width = false;
    let mut nums = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "-s" && i + 1 < args.len() {
            sep = args[i + 1].clone();
            i += 2;
            continue;
        }
        if a == "-w" {
            width = true;
            i += 1;
            continue;
        }
        match a.parse::<i64>() {
            Ok(n) => nums.push(n),
            Err(_) => {
                return usage_error(ctx, &format!("seq: invalid floating point argument: {}\nTry 'seq --help' for more information.", quote(a)), 1)
            }
        }
        i += 1;
    }
    let (first, step, last) = match nums.as_slice() {
        [l] => (1, 1, *l),
        [f, l] => (*f, 1, *l),
        [f, s, l] => (*f, *s, *l),
        _ => {
            return usage_error(
                ctx,
                "seq: missing operand\nTry 'seq --help' for more information.",
                1,
            )
        }
    };
    if step == 0 {
        return usage_error(
            ctx,
            "seq: invalid Zero increment value: ‘0’\nTry 'seq --help' for more information.",
            1,
        );
    }
    let w = if width {
        first.to_string().len().max(last.to_string().len())
    } else {
        0
    };
    let mut out = String::new();
    let mut v = first;
    let mut n = 0u64;
    while (step > 0 && v <= last) || (step < 0 && v >= last) {
        if n > 0 {
            out.push_str(&sep);
        }
        out.push_str(&format!("{v:0w$}"));
        v += step;
        n += 1;
        if n.is_multiple_of(65_536) {
            ctx.check()?;
            ctx.outs(&out)?;
            out.clear();
        }
    }
    if n > 0 {
        out.push('\n');
    }
    ctx.outs(&out)?;
    Ok(0)
}

// ---------------------------------------------------------------- printf

fn printf_number(arg: &str) -> (i64, bool) {
    let t = arg.trim();
    if let Some(c) = t.strip_prefix('\'').or_else(|| t.strip_prefix('"')) {
        return (c.chars().next().map(|c| c as i64).unwrap_or(0), true);
    }
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let parsed = if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()
    } else if body.len() > 1 && body.starts_with('0') {
        i64::from_str_radix(&body[1..], 8).ok()
    } else {
        body.parse::<i64>().ok()
    };
    match parsed {
        Some(v) => (if neg { -v } else { v }, true),
        None => (0, t.is_empty()),
    }
}

pub(crate) fn printf(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let args: Vec<String> = if args.first().is_some_and(|a| a == "--") {
        args[1..].to_vec()
    } else {
        args.to_vec()
    };
    let Some(fmt) = args.first() else {
        return usage_error(
            ctx,
            "bash: printf: usage: printf [-v var] format [arguments]",
            2,
        );
    };
    let rest = &args[1..];
    let mut ai = 0;
    let mut out = Vec::new();
    let mut status = 0;
    let f: Vec<char> = fmt.chars().collect();
    loop {
        let mut consumed = false;
        let mut i = 0;
        while i < f.len() {
            let c = f[i];
            if c == '\\' {
                let mut j = i + 1;
                while j < f.len()
                    && j < i + 4
                    && (f[j].is_ascii_digit() || (j == i + 1 && f[j] != '\\'))
                {
                    j += 1;
                    if !f[j - 1].is_ascii_digit() {
                        break;
                    }
                }
                let esc: String = f[i..j.max(i + 2).min(f.len())].iter().collect();
                let (b, _) = backslash_escapes(&esc, false);
                out.extend(b);
                i = j.max(i + 2).min(f.len());
                continue;
            }
            if c != '%' {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                i += 1;
                continue;
            }
            if i + 1 < f.len() && f[i + 1] == '%' {
                out.push(b'%');
                i += 2;
                continue;
            }
            // %[flags][width][.prec]conv
            let mut j = i + 1;
            let mut flags = String::new();
            while j < f.len() && "-+ #0".contains(f[j]) {
                flags.push(f[j]);
                j += 1;
            }
            let mut width = String::new();
            while j < f.len() && f[j].is_ascii_digit() {
                width.push(f[j]);
                j += 1;
            }
            let mut prec = None;
            if j < f.len() && f[j] == '.' {
                j += 1;
                let mut p = String::new();
                while j < f.len() && f[j].is_ascii_digit() {
                    p.push(f[j]);
                    j += 1;
                }
                prec = Some(p.parse::<usize>().unwrap_or(0));
            }
            let Some(&conv) = f.get(j) else {
                out.extend_from_slice(f[i..].iter().collect::<String>().as_bytes());
                break;
            };
            i = j + 1;
            let arg = rest.get(ai).cloned();
            if arg.is_some() {
                consumed = true;
            }
            ai += 1;
            let arg = arg.unwrap_or_default();
            let w: usize = width.parse().unwrap_or(0);
            let left = flags.contains('-');
            let body: String = match conv {
                's' => {
                    let mut s = arg.clone();
                    if let Some(p) = prec {
                        s = s.chars().take(p).collect();
                    }
                    s
                }
                'b' => String::from_utf8_lossy(&backslash_escapes(&arg, true).0).to_string(),
                'c' => arg.chars().next().map(String::from).unwrap_or_default(),
                'd' | 'i' | 'u' | 'x' | 'X' | 'o' => {
                    let (n, ok) = printf_number(&arg);
                    if !ok {
                        ctx.errln(&format!(
                            "bash: line {}: printf: {arg}: invalid number",
                            ctx.line
                        ))?;
                        status = 1;
                    }
                    let s = match conv {
                        'x' => format!("{n:x}"),
                        'X' => format!("{n:X}"),
                        'o' => format!("{n:o}"),
                        _ => {
                            if flags.contains('+') && n >= 0 {
                                format!("+{n}")
                            } else {
                                n.to_string()
                            }
                        }
                    };
                    if flags.contains('0') && !left && s.len() < w {
                        let (sign, digits) = if let Some(d) = s.strip_prefix('-') {
                            ("-", d)
                        } else {
                            ("", s.as_str())
                        };
                        format!("{sign}{}{digits}", "0".repeat(w - s.len()))
                    } else {
                        s
                    }
                }
                'f' | 'e' | 'g' => {
                    let v: f64 = arg.trim().parse().unwrap_or(0.0);
                    let p = prec.unwrap_or(6);
                    match conv {
                        'f' => format!("{v:.p$}"),
                        'e' => format!("{v:.p$e}"),
                        _ => format!("{v}"),
                    }
                }
                other => {
                    ctx.errln(&format!(
                        "bash: line {}: printf: `{other}': invalid format character",
                        ctx.line
                    ))?;
                    return Ok(1);
                }
            };
            let pad = w.saturating_sub(body.chars().count());
            if left {
                out.extend_from_slice(body.as_bytes());
                out.extend(std::iter::repeat_n(b' ', pad));
            } else {
                out.extend(std::iter::repeat_n(b' ', pad));
                out.extend_from_slice(body.as_bytes());
            }
        }
        if !consumed || ai >= rest.len() {
            break;
        }
    }
    ctx.out(&out)?;
    Ok(status)
}

// ---------------------------------------------------------------- xargs

fn xargs_split(data: &[u8]) -> Result<Vec<String>, String> {
    let s = String::from_utf8_lossy(data);
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut has = false;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if has {
                    out.push(std::mem::take(&mut cur));
                    has = false;
                }
            }
            '\'' | '"' => {
                has = true;
                loop {
                    match chars.next() {
                        Some(q) if q == c => break,
                        Some('\n') | None => {
                            let kind = if c == '\'' { "single" } else { "double" };
                            return Err(format!("xargs: unmatched {kind} quote; by default quotes are special to xargs unless you use the -0 option"));
                        }
                        Some(x) => cur.push(x),
                    }
                }
            }
            '\\' => {
                has = true;
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            _ => {
                has = true;
                cur.push(c);
            }
        }
    }
    if has {
        out.push(cur);
    }
    Ok(out)
}

pub(crate) fn xargs(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    // Options end at the first non-option (the command).
    let mut i = 0;
    let (mut max_args, mut replace, mut null, mut no_empty, mut delim) =
        (None::<usize>, None::<String>, false, false, None::<u8>);
    while i < args.len() {
        let a = args[i].as_str();
        let val = |i: &mut usize, inline: &str| -> Option<String> {
            if !inline.is_empty() {
                Some(inline.to_string())
            } else {
                *i += 1;
                args.get(*i).cloned()
            }
        };
        match a {
            "-0" | "--null" => null = true,
            "-r" | "--no-run-if-empty" => no_empty = true,
            "-t" | "--verbose" | "-p" => {}
            _ if a.starts_with("-n") => {
                max_args = val(&mut i, &a[2..]).and_then(|v| v.parse().ok())
            }
            _ if a.starts_with("-L") => {
                max_args = val(&mut i, &a[2..]).and_then(|v| v.parse().ok())
            }
            _ if a.starts_with("-I") => {
                replace = val(&mut i, &a[2..]);
                max_args = Some(1);
            }
            _ if a.starts_with("-d") => {
                delim = val(&mut i, &a[2..])
                    .and_then(|v| backslash_escapes(&v, false).0.first().copied())
            }
            _ if a.starts_with('-') && a.len() > 1 => {
                return usage_error(ctx, &format!("xargs: invalid option -- '{}'\nUsage: xargs [OPTION]... COMMAND [INITIAL-ARGS]...\nTry 'xargs --help' for more information.", &a[1..2]), 1);
            }
            _ => break,
        }
        i += 1;
    }
    let cmd: Vec<String> = if i < args.len() {
        args[i..].to_vec()
    } else {
        vec!["echo".into()]
    };
    let data = ctx.take_stdin();
    let items: Vec<String> = if null || delim.is_some() {
        let d = if null { 0 } else { delim.unwrap_or(b'\n') };
        let mut v: Vec<String> = data
            .split(|b| *b == d)
            .map(|s| String::from_utf8_lossy(s).to_string())
            .collect();
        if v.last().is_some_and(|s| s.is_empty()) {
            v.pop();
        }
        v
    } else if replace.is_some() {
        String::from_utf8_lossy(&data)
            .lines()
            .map(|l| l.trim_start().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    } else {
        match xargs_split(&data) {
            Ok(v) => v,
            Err(e) => {
                ctx.errln(&e)?;
                return Ok(1);
            }
        }
    };
    if items.is_empty() {
        if no_empty || replace.is_some() {
            return Ok(0);
        }
        let s = ctx.run_child(&cmd, Vec::new())?;
        return Ok(xargs_status(s));
    }
    let chunk = max_args.unwrap_or(usize::MAX).max(1);
    let mut worst = 0;
    for group in items.chunks(chunk.min(items.len())) {
        ctx.check()?;
        let argv: Vec<String> = match &replace {
            Some(r) => cmd
                .iter()
                .map(|a| a.replace(r.as_str(), &group[0]))
                .collect(),
            None => cmd.iter().cloned().chain(group.iter().cloned()).collect(),
        };
        let s = ctx.run_child(&argv, Vec::new())?;
        if s == 255 {
            ctx.errln(&format!(
                "xargs: {}: exited with status 255; aborting",
                argv[0]
            ))?;
            return Ok(124);
        }
        worst = worst.max(xargs_status(s));
    }
    Ok(worst)
}

fn xargs_status(s: i32) -> i32 {
    match s {
        0 => 0,
        127 => 127,
        126 => 126,
        1..=125 => 123,
        _ => 125,
    }
}

// ---------------------------------------------------------------- test

pub(crate) fn test(ctx: &mut Ctx, args: &[String], bracket: bool) -> Result<i32, Abort> {
    let line = ctx.line;
    let name = if bracket { "[" } else { "test" };
    let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
    if bracket {
        if a.last() != Some(&"]") {
            ctx.errln(&format!("bash: line {line}: [: missing `]'"))?;
            return Ok(2);
        }
        a.pop();
    }
    match eval_test(ctx, &a) {
        Ok(b) => Ok(i32::from(!b)),
        Err(m) => {
            ctx.errln(&format!("bash: line {line}: {name}: {m}"))?;
            Ok(2)
        }
    }
}

fn eval_test(ctx: &Ctx, a: &[&str]) -> Result<bool, String> {
    // -o lowest, then -a, then !, then primaries.
    if let Some(i) = a.iter().rposition(|x| *x == "-o") {
        if i > 0 && i + 1 < a.len() {
            return Ok(eval_test(ctx, &a[..i])? || eval_test(ctx, &a[i + 1..])?);
        }
    }
    if let Some(i) = a.iter().rposition(|x| *x == "-a") {
        if i > 0 && i + 1 < a.len() {
            return Ok(eval_test(ctx, &a[..i])? && eval_test(ctx, &a[i + 1..])?);
        }
    }
    match a {
        [] => Ok(false),
        ["!", rest @ ..] => Ok(!eval_test(ctx, rest)?),
        ["(", inner @ .., ")"] => eval_test(ctx, inner),
        [s] => Ok(!s.is_empty()),
        [op, x] => {
            let node = ctx.resolve(x).ok();
            let tree = ctx.fs();
            Ok(match *op {
                "-n" => !x.is_empty(),
                "-z" => x.is_empty(),
                "-e" | "-a" => node.is_some(),
                "-f" => node.is_some_and(|n| !tree.is_dir(n)),
                "-d" => node.is_some_and(|n| tree.is_dir(n)),
                "-s" => node.is_some_and(|n| tree.is_dir(n) || tree.size(n) > 0),
                "-r" => node.is_some(),
                "-w" => false,
                "-x" => node.is_some_and(|n| tree.is_dir(n)),
                "-L" | "-h" | "-p" | "-S" | "-b" | "-c" => false,
                _ => return Err(format!("{op}: unary operator expected")),
            })
        }
        [x, op, y] => {
            let num = |s: &str| {
                s.trim()
                    .parse::<i64>()
                    .map_err(|_| format!("{s}: integer expression expected"))
            };
            Ok(match *op {
                "=" | "==" => x == y,
                "!=" => x != y,
                "<" => x < y,
                ">" => x > y,
                "-eq" => num(x)? == num(y)?,
                "-ne" => num(x)? != num(y)?,
                "-lt" => num(x)? < num(y)?,
                "-le" => num(x)? <= num(y)?,
                "-gt" => num(x)? > num(y)?,
                "-ge" => num(x)? >= num(y)?,
                _ => return Err(format!("{op}: binary operator expected")),
            })
        }
        _ => Err("too many arguments".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_lists() {
        assert_eq!(
            parse_list("1,3-4,6-", "field").unwrap(),
            vec![(1, 1), (3, 4), (6, usize::MAX)]
        );
        assert!(parse_list("0", "field").is_err());
        assert!(parse_list("3-1", "field").is_err());
    }

    #[test]
    fn tr_sets() {
        assert_eq!(tr_set("a-c").unwrap(), b"abc");
        assert_eq!(tr_set("\\n").unwrap(), b"\n");
        assert_eq!(tr_set("[:digit:]").unwrap(), b"0123456789");
    }

    #[test]
    fn xargs_quoting() {
        assert_eq!(
            xargs_split(b"a 'b c' \"d\"\ne\\ f").unwrap(),
            vec!["a", "b c", "d", "e f"]
        );
        assert!(xargs_split(b"'abc").is_err());
    }
}
