//! File commands: ls, cat, head, tail, wc, tree.

use super::exec::{Abort, Ctx};
use super::getopt::{self, Arg, Spec};
use super::vpath::{quote, quotef, FsErr};
use crate::manifest::NodeId;

/// Print a getopt error and return the command's usage status.
pub(crate) fn usage_error(ctx: &mut Ctx, msg: &str, status: i32) -> Result<i32, Abort> {
    ctx.errln(msg)?;
    Ok(status)
}

/// GNU `quote()` in a UTF-8 locale: curly quotes.
pub(crate) fn lquote(s: &str) -> String {
    format!("\u{2018}{s}\u{2019}")
}

// ---------------------------------------------------------------- stat model

/// What `stat` reports for virtual nodes (shared with the FUSE mount).
pub(crate) struct VStat {
    pub is_dir: bool,
    pub size: u64,
    pub mtime: i64,
    pub nlink: u64,
    /// 512-byte blocks.
    pub blocks: u64,
}

pub(crate) const DIR_SIZE: u64 = 4096;

pub(crate) fn vstat(ctx: &Ctx, n: NodeId) -> VStat {
    ctx.fs().stat(n)
}

// ---------------------------------------------------------------- dates

/// (year, month 1-12, day) from days since 1970-01-01.
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

fn ls_date(t: i64, now: i64) -> String {
    let (y, m, d) = civil_from_days(t.div_euclid(86_400));
    let secs = t.rem_euclid(86_400);
    let six_months = 31_556_952 / 2;
    let recent = now - six_months < t && t < now + 1;
    if recent {
        format!(
            "{} {:>2} {:02}:{:02}",
            MONTHS[(m - 1) as usize],
            d,
            secs / 3600,
            secs % 3600 / 60
        )
    } else {
        format!("{} {:>2}  {}", MONTHS[(m - 1) as usize], d, y)
    }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn human(n: u64) -> String {
    // GNU ls -h: powers of 1024, one decimal below 10, rounded up.
    if n < 1024 {
        return n.to_string();
    }
    let units = ['K', 'M', 'G', 'T', 'P', 'E'];
    let mut v = n as f64;
    let mut u = 0;
    v /= 1024.0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if v < 10.0 {
        let r = (v * 10.0).ceil() / 10.0;
        if r >= 10.0 {
            format!("{}{}", r.ceil() as u64, units[u])
        } else {
            format!("{:.1}{}", r, units[u])
        }
    } else {
        let r = v.ceil();
        if r >= 1024.0 && u + 1 < units.len() {
            format!("1.0{}", units[u + 1])
        } else {
            format!("{}{}", r as u64, units[u])
        }
    }
}

// ---------------------------------------------------------------- ls

const LS_SPEC: Spec = Spec {
    short: "aAlR1dFprSthUgon",
    long: &[
        ("all", Arg::No, "a"),
        ("almost-all", Arg::No, "A"),
        ("recursive", Arg::No, "R"),
        ("directory", Arg::No, "d"),
        ("classify", Arg::Optional, "F"),
        ("reverse", Arg::No, "r"),
        ("human-readable", Arg::No, "h"),
        ("color", Arg::Optional, "color"),
        ("numeric-uid-gid", Arg::No, "n"),
        ("group-directories-first", Arg::No, "gdf"),
    ],
    digits: false,
};

#[derive(Default, Clone, Copy)]
struct LsOpts {
    all: bool,
    almost: bool,
    long: bool,
    recursive: bool,
    dir_only: bool,
    classify: bool,
    slash: bool,
    reverse: bool,
    by_size: bool,
    by_time: bool,
    unsorted: bool,
    human: bool,
    no_owner: bool,
    no_group: bool,
    numeric: bool,
    dirs_first: bool,
}

struct LsEntry {
    name: String,
    node: NodeId,
}

fn ls_sort(ctx: &Ctx, o: &LsOpts, v: &mut [LsEntry]) {
    if o.unsorted {
        return;
    }
    v.sort_by(|a, b| {
        let (sa, sb) = (vstat(ctx, a.node), vstat(ctx, b.node));
        let ord = if o.by_size {
            sb.size
                .cmp(&sa.size)
                .then_with(|| a.name.as_bytes().cmp(b.name.as_bytes()))
        } else if o.by_time {
            sb.mtime
                .cmp(&sa.mtime)
                .then_with(|| a.name.as_bytes().cmp(b.name.as_bytes()))
        } else {
            a.name.as_bytes().cmp(b.name.as_bytes())
        };
        if o.reverse {
            ord.reverse()
        } else {
            ord
        }
    });
    if o.dirs_first {
        v.sort_by_key(|e| !ctx.fs().is_dir(e.node));
    }
}

fn ls_print(ctx: &mut Ctx, o: &LsOpts, entries: &[LsEntry], total: bool) -> Result<(), Abort> {
    let now = now_secs();
    let suffix = |ctx: &Ctx, e: &LsEntry| {
        if (o.classify || o.slash) && ctx.fs().is_dir(e.node) {
            "/"
        } else {
            ""
        }
    };
    if !o.long {
        let mut s = String::new();
        for e in entries {
            s.push_str(&e.name);
            s.push_str(suffix(ctx, e));
            s.push('\n');
        }
        return ctx.outs(&s);
    }
    let stats: Vec<VStat> = entries.iter().map(|e| vstat(ctx, e.node)).collect();
    let size_str = |s: &VStat| {
        if o.human {
            human(s.size)
        } else {
            s.size.to_string()
        }
    };
    let wl = stats
        .iter()
        .map(|s| s.nlink.to_string().len())
        .max()
        .unwrap_or(1);
    let ws = stats.iter().map(|s| size_str(s).len()).max().unwrap_or(1);
    let mut s = String::new();
    if total {
        let blocks: u64 = stats.iter().map(|s| s.blocks / 2).sum();
        if o.human {
            s.push_str(&format!("total {}\n", human(blocks * 1024)));
        } else {
            s.push_str(&format!("total {blocks}\n"));
        }
    }
    let owner = if o.numeric { "0" } else { "root" };
    for (e, st) in entries.iter().zip(&stats) {
        let mode = if st.is_dir {
            "dr-xr-xr-x"
        } else {
            "-r--r--r--"
        };
        s.push_str(&format!("{mode} {:>wl$} ", st.nlink));
        if !o.no_owner {
            s.push_str(owner);
            s.push(' ');
        }
        if !o.no_group {
            s.push_str(owner);
            s.push(' ');
        }
        s.push_str(&format!(
            "{:>ws$} {} {}{}\n",
            size_str(st),
            ls_date(st.mtime, now),
            e.name,
            suffix(ctx, e)
        ));
    }
    ctx.outs(&s)
}

fn ls_dir_entries(ctx: &Ctx, o: &LsOpts, dir: NodeId) -> Vec<LsEntry> {
    let tree = ctx.fs();
    let mut v = Vec::new();
    if o.all {
        v.push(LsEntry {
            name: ".".into(),
            node: dir,
        });
        v.push(LsEntry {
            name: "..".into(),
            node: tree.parent(dir),
        });
    }
    for &c in tree.children(dir) {
        let name = tree.name(c).to_string();
        if name.starts_with('.') && !o.all && !o.almost {
            continue;
        }
        v.push(LsEntry { name, node: c });
    }
    ls_sort(ctx, o, &mut v);
    v
}

fn ls_dir(
    ctx: &mut Ctx,
    o: &LsOpts,
    dir: NodeId,
    label: &str,
    header: bool,
    first: &mut bool,
) -> Result<(), Abort> {
    ctx.check()?;
    if !*first {
        ctx.outs("\n")?;
    }
    *first = false;
    if header {
        ctx.outs(&format!("{label}:\n"))?;
    }
    let entries = ls_dir_entries(ctx, o, dir);
    ls_print(ctx, o, &entries, true)?;
    if o.recursive {
        for e in &entries {
            if e.name == "." || e.name == ".." || !ctx.fs().is_dir(e.node) {
                continue;
            }
            let sub = if label.ends_with('/') {
                format!("{label}{}", e.name)
            } else {
                format!("{label}/{}", e.name)
            };
            ls_dir(ctx, o, e.node, &sub, true, first)?;
        }
    }
    Ok(())
}

pub(crate) fn ls(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, mut operands) = match getopt::parse("ls", &LS_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 2),
    };
    let mut o = LsOpts::default();
    for (k, _) in &opts {
        match k.as_str() {
            "a" => {
                o.all = true;
                o.almost = false
            }
            "A" => {
                o.almost = true;
                o.all = false
            }
            "l" => o.long = true,
            "R" => o.recursive = true,
            "1" => {}
            "d" => o.dir_only = true,
            "F" => o.classify = true,
            "p" => o.slash = true,
            "r" => o.reverse = true,
            "S" => {
                o.by_size = true;
                o.by_time = false
            }
            "t" => {
                o.by_time = true;
                o.by_size = false
            }
            "U" => o.unsorted = true,
            "h" => o.human = true,
            "g" => {
                o.long = true;
                o.no_owner = true
            }
            "o" => {
                o.long = true;
                o.no_group = true
            }
            "n" => {
                o.long = true;
                o.numeric = true
            }
            "gdf" => o.dirs_first = true,
            _ => {}
        }
    }
    let explicit = !operands.is_empty();
    if operands.is_empty() {
        operands.push(".".into());
    }
    let mut status = 0;
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    for op in &operands {
        match ctx.resolve(op) {
            Ok(n) => {
                if ctx.fs().is_dir(n) && !o.dir_only {
                    dirs.push(LsEntry {
                        name: op.clone(),
                        node: n,
                    });
                } else {
                    files.push(LsEntry {
                        name: op.clone(),
                        node: n,
                    });
                }
            }
            Err(e) => {
                ctx.errln(&format!("ls: cannot access {}: {}", quote(op), e.msg()))?;
                status = 2;
            }
        }
    }
    ls_sort(ctx, &o, &mut files);
    ls_sort(ctx, &o, &mut dirs);
    let mut first = true;
    if !files.is_empty() {
        ls_print(ctx, &o, &files, false)?;
        first = false;
    }
    let header = o.recursive || operands.len() > 1 || (explicit && operands.len() > 1);
    for d in &dirs {
        ls_dir(ctx, &o, d.node, &d.name, header, &mut first)?;
    }
    Ok(status)
}

// ---------------------------------------------------------------- cat

const CAT_SPEC: Spec = Spec {
    short: "nbsETAvetu",
    long: &[
        ("number", Arg::No, "n"),
        ("number-nonblank", Arg::No, "b"),
        ("squeeze-blank", Arg::No, "s"),
        ("show-ends", Arg::No, "E"),
        ("show-tabs", Arg::No, "T"),
        ("show-all", Arg::No, "A"),
        ("show-nonprinting", Arg::No, "v"),
    ],
    digits: false,
};

fn nonprinting(b: u8, out: &mut Vec<u8>, tabs: bool) {
    let mut c = b;
    if c >= 128 {
        out.extend_from_slice(b"M-");
        c -= 128;
    }
    if c < 32 {
        if c == b'\t' && !tabs && b < 128 {
            out.push(b'\t');
        } else {
            out.push(b'^');
            out.push(c + 64);
        }
    } else if c == 127 {
        out.extend_from_slice(b"^?");
    } else {
        out.push(c);
    }
}

pub(crate) fn cat(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, mut files) = match getopt::parse("cat", &CAT_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let (mut number, mut nonblank, mut squeeze, mut ends, mut tabs, mut nonprint) =
        (false, false, false, false, false, false);
    for (k, _) in &opts {
        match k.as_str() {
            "n" => number = true,
            "b" => nonblank = true,
            "s" => squeeze = true,
            "E" => ends = true,
            "T" => tabs = true,
            "A" => {
                nonprint = true;
                ends = true;
                tabs = true
            }
            "v" => nonprint = true,
            "e" => {
                nonprint = true;
                ends = true
            }
            "t" => {
                nonprint = true;
                tabs = true
            }
            _ => {}
        }
    }
    if nonblank {
        number = true;
    }
    let plain = !(number || squeeze || ends || tabs || nonprint);
    if files.is_empty() {
        files.push("-".into());
    }
    let mut status = 0;
    let mut lineno = 0u64;
    let mut blank_run = 0;
    let mut at_line_start = true;
    for f in &files {
        ctx.check()?;
        let data = if f == "-" {
            ctx.take_stdin()
        } else {
            let same = ctx
                .resolve(f)
                .ok()
                .filter(|n| ctx.out_file() == Some(*n) && ctx.fs().size(*n) > 0);
            if same.is_some() {
                ctx.errln(&format!("cat: {}: input file is output file", quotef(f)))?;
                status = 1;
                continue;
            }
            match ctx.read_path(f) {
                Ok(d) => d,
                Err(e) => {
                    ctx.errln(&format!("cat: {}: {}", quotef(f), e.msg()))?;
                    status = 1;
                    continue;
                }
            }
        };
        if plain {
            ctx.out(&data)?;
            continue;
        }
        let mut out = Vec::with_capacity(data.len() + data.len() / 8);
        let mut i = 0;
        while i < data.len() {
            let end = data[i..]
                .iter()
                .position(|b| *b == b'\n')
                .map(|p| i + p + 1)
                .unwrap_or(data.len());
            let line = &data[i..end];
            i = end;
            let has_nl = line.last() == Some(&b'\n');
            let body = if has_nl {
                &line[..line.len() - 1]
            } else {
                line
            };
            if at_line_start {
                let blank = body.is_empty() && has_nl;
                if blank {
                    blank_run += 1;
                    if squeeze && blank_run > 1 {
                        continue;
                    }
                } else {
                    blank_run = 0;
                }
                if number && !(nonblank && blank) {
                    lineno += 1;
                    out.extend_from_slice(format!("{lineno:>6}\t").as_bytes());
                }
            }
            for &b in body {
                if nonprint && b != b'\t' {
                    nonprinting(b, &mut out, tabs);
                } else if b == b'\t' && tabs {
                    out.extend_from_slice(b"^I");
                } else {
                    out.push(b);
                }
            }
            if has_nl {
                if ends {
                    out.push(b'$');
                }
                out.push(b'\n');
            }
            at_line_start = has_nl;
        }
        ctx.out(&out)?;
    }
    Ok(status)
}

// ---------------------------------------------------------------- head / tail

const HEAD_SPEC: Spec = Spec {
    short: "n:c:qvz",
    long: &[
        ("lines", Arg::Required, "n"),
        ("bytes", Arg::Required, "c"),
        ("quiet", Arg::No, "q"),
        ("silent", Arg::No, "q"),
        ("verbose", Arg::No, "v"),
    ],
    digits: true,
};

const TAIL_SPEC: Spec = Spec {
    short: "n:c:qvfF",
    long: &[
        ("lines", Arg::Required, "n"),
        ("bytes", Arg::Required, "c"),
        ("quiet", Arg::No, "q"),
        ("silent", Arg::No, "q"),
        ("verbose", Arg::No, "v"),
        ("follow", Arg::Optional, "f"),
    ],
    digits: true,
};

/// Parse a head/tail count with optional multiplier suffix.
fn parse_count(s: &str) -> Option<u64> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return None;
    }
    let n: u64 = s[..digits_end].parse().ok()?;
    let mult: u64 = match &s[digits_end..] {
        "" => 1,
        "b" => 512,
        "kB" => 1000,
        "K" | "KiB" | "k" => 1024,
        "MB" => 1_000_000,
        "M" | "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "G" | "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[derive(Clone, Copy)]
enum Count {
    /// First/last N.
    Plain(u64),
    /// head: all but the last N; tail: from the Nth on.
    Signed(u64),
}

/// Parsed head/tail arguments: (bytes, count, quiet, verbose, files).
type HeadTailArgs = (bool, Count, bool, bool, Vec<String>);

fn head_tail_setup(
    ctx: &mut Ctx,
    prog: &str,
    spec: &Spec,
    args: &[String],
) -> Result<Result<HeadTailArgs, i32>, Abort> {
    let (opts, files) = match getopt::parse(prog, spec, args) {
        Ok(x) => x,
        Err(m) => return Ok(Err(usage_error(ctx, &m, 1)?)),
    };
    let mut bytes = false;
    let mut count = Count::Plain(10);
    let (mut quiet, mut verbose) = (false, false);
    for (k, v) in &opts {
        match k.as_str() {
            "n" | "c" | "#" => {
                let v = v.clone().unwrap_or_default();
                bytes = k == "c";
                let (signed, num) = if prog == "head" {
                    match v.strip_prefix('-') {
                        Some(r) => (true, r),
                        None => (false, v.as_str()),
                    }
                } else {
                    match v.strip_prefix('+') {
                        Some(r) => (true, r),
                        None => (false, v.strip_prefix('-').unwrap_or(&v)),
                    }
                };
                match parse_count(num) {
                    Some(n) => {
                        count = if signed {
                            Count::Signed(n)
                        } else {
                            Count::Plain(n)
                        }
                    }
                    None => {
                        let what = if bytes { "bytes" } else { "lines" };
                        ctx.errln(&format!("{prog}: invalid number of {what}: {}", lquote(&v)))?;
                        return Ok(Err(1));
                    }
                }
            }
            "q" => {
                quiet = true;
                verbose = false
            }
            "v" => {
                verbose = true;
                quiet = false
            }
            _ => {}
        }
    }
    Ok(Ok((bytes, count, quiet, verbose, files)))
}

fn line_starts(data: &[u8]) -> Vec<usize> {
    let mut v = vec![0];
    for (i, b) in data.iter().enumerate() {
        if *b == b'\n' && i + 1 < data.len() {
            v.push(i + 1);
        }
    }
    if data.is_empty() {
        v.clear();
    }
    v
}

fn head_slice(data: &[u8], bytes: bool, count: Count) -> &[u8] {
    let len = data.len();
    if bytes {
        return match count {
            Count::Plain(n) => &data[..len.min(n as usize)],
            Count::Signed(n) => &data[..len.saturating_sub(n as usize)],
        };
    }
    let starts = line_starts(data);
    match count {
        Count::Plain(n) => {
            if (n as usize) < starts.len() {
                &data[..starts[n as usize]]
            } else {
                data
            }
        }
        Count::Signed(n) => {
            let keep = starts.len().saturating_sub(n as usize);
            if keep < starts.len() {
                &data[..starts[keep]]
            } else {
                data
            }
        }
    }
}

fn tail_slice(data: &[u8], bytes: bool, count: Count) -> &[u8] {
    let len = data.len();
    if bytes {
        return match count {
            Count::Plain(n) => &data[len.saturating_sub(n as usize)..],
            Count::Signed(n) => &data[(n.max(1) as usize - 1).min(len)..],
        };
    }
    let starts = line_starts(data);
    match count {
        Count::Plain(n) => {
            let from = starts.len().saturating_sub(n as usize);
            if from < starts.len() {
                &data[starts[from]..]
            } else {
                &data[len..]
            }
        }
        Count::Signed(n) => {
            let from = n.max(1) as usize - 1;
            if from < starts.len() {
                &data[starts[from]..]
            } else {
                &data[len..]
            }
        }
    }
}

fn head_or_tail(ctx: &mut Ctx, args: &[String], is_head: bool) -> Result<i32, Abort> {
    let prog = if is_head { "head" } else { "tail" };
    let spec = if is_head { &HEAD_SPEC } else { &TAIL_SPEC };
    let (bytes, count, quiet, verbose, mut files) = match head_tail_setup(ctx, prog, spec, args)? {
        Ok(x) => x,
        Err(s) => return Ok(s),
    };
    if files.is_empty() {
        files.push("-".into());
    }
    let headers = verbose || (files.len() > 1 && !quiet);
    let mut status = 0;
    let mut first = true;
    for f in &files {
        ctx.check()?;
        let shown = if f == "-" {
            "standard input"
        } else {
            f.as_str()
        };
        let data = if f == "-" {
            Ok(ctx.take_stdin())
        } else {
            match ctx.resolve(f) {
                Ok(n) if ctx.fs().is_dir(n) => Err(None),
                Ok(n) => ctx.read(n).map_err(Some),
                Err(e) => {
                    ctx.errln(&format!(
                        "{prog}: cannot open {} for reading: {}",
                        quote(f),
                        e.msg()
                    ))?;
                    status = 1;
                    continue;
                }
            }
        };
        if headers {
            let sep = if first { "" } else { "\n" };
            ctx.outs(&format!("{sep}==> {shown} <==\n"))?;
        }
        first = false;
        match data {
            Ok(d) => {
                let s = if is_head {
                    head_slice(&d, bytes, count)
                } else {
                    tail_slice(&d, bytes, count)
                };
                ctx.out(s)?;
            }
            Err(e) => {
                let msg = e
                    .map(|e| e.msg().to_string())
                    .unwrap_or_else(|| FsErr::IsDir.msg().to_string());
                ctx.flush()?;
                ctx.errln(&format!("{prog}: error reading {}: {msg}", quote(f)))?;
                status = 1;
            }
        }
    }
    Ok(status)
}

pub(crate) fn head(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    head_or_tail(ctx, args, true)
}

pub(crate) fn tail(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    head_or_tail(ctx, args, false)
}

// ---------------------------------------------------------------- wc

const WC_SPEC: Spec = Spec {
    short: "clmwL",
    long: &[
        ("bytes", Arg::No, "c"),
        ("lines", Arg::No, "l"),
        ("chars", Arg::No, "m"),
        ("words", Arg::No, "w"),
        ("max-line-length", Arg::No, "L"),
    ],
    digits: false,
};

#[derive(Default, Clone, Copy)]
struct WcCounts {
    lines: u64,
    words: u64,
    chars: u64,
    bytes: u64,
    maxlen: u64,
}

fn is_wc_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r')
        || (c as u32 > 127
            && c.is_whitespace()
            && c != '\u{a0}'
            && c != '\u{2007}'
            && c != '\u{202f}')
}

fn wc_count(data: &[u8]) -> WcCounts {
    let mut c = WcCounts {
        bytes: data.len() as u64,
        ..Default::default()
    };
    let mut in_word = false;
    let mut col = 0u64;
    for chunk in data.utf8_chunks() {
        for ch in chunk.valid().chars() {
            c.chars += 1;
            match ch {
                '\n' => {
                    c.lines += 1;
                    c.maxlen = c.maxlen.max(col);
                    col = 0;
                }
                '\t' => col = (col / 8 + 1) * 8,
                '\r' | '\u{c}' => {
                    c.maxlen = c.maxlen.max(col);
                    col = 0;
                }
                _ if ch.is_control() => {}
                _ => col += 1,
            }
            if is_wc_space(ch) {
                in_word = false;
            } else if !in_word {
                in_word = true;
                c.words += 1;
            }
        }
        // Invalid bytes are neither characters nor word constituents, and do
        // not end a word either (GNU wc).
    }
    c.maxlen = c.maxlen.max(col);
    c
}

pub(crate) fn wc(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, files) = match getopt::parse("wc", &WC_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let (mut l, mut w, mut m, mut c, mut big_l) = (false, false, false, false, false);
    for (k, _) in &opts {
        match k.as_str() {
            "l" => l = true,
            "w" => w = true,
            "m" => m = true,
            "c" => c = true,
            "L" => big_l = true,
            _ => {}
        }
    }
    if !(l || w || m || c || big_l) {
        l = true;
        w = true;
        c = true;
    }
    let n_counts = [l, w, m, c, big_l].iter().filter(|x| **x).count();
    let names: Vec<String> = if files.is_empty() {
        vec!["-".into()]
    } else {
        files.clone()
    };
    // Gather inputs first: GNU computes the column width from stat() of all inputs.
    enum In {
        Data(Vec<u8>, bool),
        Dir,
        Missing(FsErr),
    }
    let mut inputs = Vec::new();
    for f in &names {
        if f == "-" {
            let regular = ctx.stdin_file;
            inputs.push(In::Data(ctx.take_stdin(), regular));
        } else {
            match ctx.resolve(f) {
                Ok(n) if ctx.fs().is_dir(n) => inputs.push(In::Dir),
                Ok(n) => match ctx.read(n) {
                    Ok(d) => inputs.push(In::Data(d, true)),
                    Err(e) => inputs.push(In::Missing(e)),
                },
                Err(e) => inputs.push(In::Missing(e)),
            }
        }
    }
    let width = if names.len() == 1 && n_counts == 1 {
        1
    } else {
        let mut min = 1;
        let mut total = 0u64;
        for i in &inputs {
            match i {
                In::Data(d, true) => total += d.len() as u64,
                In::Data(_, false) | In::Dir => min = 7,
                In::Missing(_) => {}
            }
        }
        (total.max(1).ilog10() as usize + 1).max(min)
    };
    let fmt = |k: &WcCounts| {
        let mut parts = Vec::new();
        if l {
            parts.push(k.lines);
        }
        if w {
            parts.push(k.words);
        }
        if m {
            parts.push(k.chars);
        }
        if c {
            parts.push(k.bytes);
        }
        if big_l {
            parts.push(k.maxlen);
        }
        parts
            .iter()
            .map(|p| format!("{p:>width$}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut total = WcCounts::default();
    let mut status = 0;
    for (f, input) in names.iter().zip(inputs) {
        ctx.check()?;
        let counts = match input {
            In::Data(d, _) => wc_count(&d),
            In::Dir => {
                ctx.flush()?;
                ctx.errln(&format!("wc: {}: Is a directory", quotef(f)))?;
                status = 1;
                WcCounts::default()
            }
            In::Missing(e) => {
                ctx.flush()?;
                ctx.errln(&format!("wc: {}: {}", quotef(f), e.msg()))?;
                status = 1;
                continue;
            }
        };
        total.lines += counts.lines;
        total.words += counts.words;
        total.chars += counts.chars;
        total.bytes += counts.bytes;
        total.maxlen = total.maxlen.max(counts.maxlen);
        let label = if files.is_empty() {
            String::new()
        } else {
            format!(" {f}")
        };
        ctx.outs(&format!("{}{label}\n", fmt(&counts)))?;
    }
    if names.len() > 1 {
        ctx.outs(&format!("{} total\n", fmt(&total)))?;
    }
    Ok(status)
}

// ---------------------------------------------------------------- tree

const TREE_SPEC: Spec = Spec {
    short: "adL:fFP:I:",
    long: &[
        ("noreport", Arg::No, "noreport"),
        ("dirsfirst", Arg::No, "dirsfirst"),
    ],
    digits: false,
};

struct TreeOpts {
    all: bool,
    dirs_only: bool,
    max_depth: Option<usize>,
    full: bool,
    classify: bool,
    pattern: Option<crate::glob::Pattern>,
    ignore: Option<crate::glob::Pattern>,
    dirs_first: bool,
}

fn tree_walk(
    ctx: &mut Ctx,
    o: &TreeOpts,
    dir: NodeId,
    path: &str,
    prefix: &str,
    depth: usize,
    counts: &mut (u64, u64),
) -> Result<(), Abort> {
    ctx.check()?;
    if o.max_depth.is_some_and(|m| depth > m) {
        return Ok(());
    }
    let tree = ctx.fs();
    let mopts = crate::glob::MatchOptions::default();
    let mut kids: Vec<NodeId> = tree
        .children(dir)
        .iter()
        .copied()
        .filter(|&c| {
            let n = tree.name(c);
            let is_dir = tree.is_dir(c);
            (o.all || !n.starts_with('.'))
                && (!o.dirs_only || is_dir)
                && (is_dir || o.pattern.as_ref().is_none_or(|p| p.matches(n, mopts)))
                && o.ignore.as_ref().is_none_or(|p| !p.matches(n, mopts))
        })
        .collect();
    if o.dirs_first {
        kids.sort_by_key(|c| !tree.is_dir(*c));
    }
    let n = kids.len();
    let mut out = String::new();
    let mut subs = Vec::new();
    for (i, c) in kids.into_iter().enumerate() {
        let last = i + 1 == n;
        let name = ctx.fs().name(c).to_string();
        let is_dir = ctx.fs().is_dir(c);
        let child_path = format!("{path}/{name}");
        let shown = if o.full { child_path.clone() } else { name };
        out.clear();
        out.push_str(prefix);
        out.push_str(if last { "└── " } else { "├── " });
        out.push_str(&shown);
        if o.classify && is_dir {
            out.push('/');
        }
        out.push('\n');
        ctx.outs(&out)?;
        if is_dir {
            counts.0 += 1;
            let p = format!("{prefix}{}", if last { "    " } else { "│\u{a0}\u{a0} " });
            tree_walk(ctx, o, c, &child_path, &p, depth + 1, counts)?;
        } else {
            counts.1 += 1;
        }
        subs.push(c);
    }
    Ok(())
}

pub(crate) fn tree(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, mut roots) = match getopt::parse("tree", &TREE_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let mut o = TreeOpts {
        all: false,
        dirs_only: false,
        max_depth: None,
        full: false,
        classify: false,
        pattern: None,
        ignore: None,
        dirs_first: false,
    };
    let mut report = true;
    for (k, v) in &opts {
        match k.as_str() {
            "a" => o.all = true,
            "d" => o.dirs_only = true,
            "L" => match v
                .as_deref()
                .and_then(|s| s.parse::<usize>().ok())
                .filter(|n| *n > 0)
            {
                Some(n) => o.max_depth = Some(n),
                None => {
                    ctx.errln("tree: Invalid level, must be greater than 0.")?;
                    return Ok(1);
                }
            },
            "f" => o.full = true,
            "F" => o.classify = true,
            "P" => o.pattern = v.as_deref().map(crate::glob::Pattern::new),
            "I" => o.ignore = v.as_deref().map(crate::glob::Pattern::new),
            "noreport" => report = false,
            "dirsfirst" => o.dirs_first = true,
            _ => {}
        }
    }
    if roots.is_empty() {
        roots.push(".".into());
    }
    let mut counts = (0u64, 0u64);
    let mut status = 0;
    for r in &roots {
        match ctx.resolve(r) {
            Ok(n) if ctx.fs().is_dir(n) => {
                let shown = if o.classify && !r.ends_with('/') {
                    format!("{r}/")
                } else {
                    r.clone()
                };
                ctx.outs(&format!("{shown}\n"))?;
                counts.0 += 1;
                let base = r.trim_end_matches('/').to_string();
                let base = if base.is_empty() { "/".into() } else { base };
                tree_walk(
                    ctx,
                    &o,
                    n,
                    if base == "/" { "" } else { &base },
                    "",
                    1,
                    &mut counts,
                )?;
            }
            Ok(_) => {
                ctx.outs(&format!("{r}  [error opening dir]\n"))?;
                counts.1 += 1;
            }
            Err(_) => {
                ctx.outs(&format!("{r}  [error opening dir]\n"))?;
                status = 2;
            }
        }
    }
    if report {
        let d = if counts.0 == 1 {
            "directory"
        } else {
            "directories"
        };
        if o.dirs_only {
            ctx.outs(&format!("\n{} {d}\n", counts.0))?;
        } else {
            let f = if counts.1 == 1 { "file" } else { "files" };
            ctx.outs(&format!("\n{} {d}, {} {f}\n", counts.0, counts.1))?;
        }
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        let now = 1_700_000_000;
        assert_eq!(ls_date(now - 60, now), "Nov 14 22:12");
        assert_eq!(ls_date(0, now), "Jan  1  1970");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512");
        assert_eq!(human(1024), "1.0K");
        assert_eq!(human(1500), "1.5K");
        assert_eq!(human(10 * 1024 + 1), "11K");
        assert_eq!(human(5 << 20), "5.0M");
    }

    #[test]
    fn wc_counts() {
        let c = wc_count(b"hello world\nfoo\tbar baz\n");
        assert_eq!((c.lines, c.words, c.bytes), (2, 5, 24));
        assert_eq!(c.maxlen, 15);
        let c = wc_count("h\u{e9}llo".as_bytes());
        assert_eq!((c.chars, c.bytes, c.lines), (5, 6, 0));
    }

    #[test]
    fn head_tail_slices() {
        let d = b"a\nb\nc\n";
        assert_eq!(head_slice(d, false, Count::Plain(2)), b"a\nb\n");
        assert_eq!(head_slice(d, false, Count::Signed(1)), b"a\nb\n");
        assert_eq!(tail_slice(d, false, Count::Plain(1)), b"c\n");
        assert_eq!(tail_slice(d, false, Count::Signed(2)), b"b\nc\n");
        assert_eq!(tail_slice(b"a\nb", false, Count::Plain(1)), b"b");
        assert_eq!(head_slice(d, true, Count::Plain(3)), b"a\nb");
        assert_eq!(tail_slice(d, true, Count::Signed(5)), b"c\n");
    }
}
