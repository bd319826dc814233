//! `grep` (GNU 3.x behaviour) and `rg` (ripgrep behaviour, non-tty output),
//! accelerated by the collection's trigram index.

use regex::bytes::{Regex, RegexBuilder};

use super::cmd_files::usage_error;
use super::exec::{Abort, Ctx};
use super::getopt::{self, Arg, Spec};
use super::regex_posix::{check_class_syntax, translate, Dialect};
use crate::glob::{MatchOptions, Pattern};
use crate::index::{query_any, query_for_hir, Query};
use crate::manifest::NodeId;

// ---------------------------------------------------------------- matcher

/// Compiled patterns with GNU/rg line-matching semantics.
pub(crate) struct Matcher {
    /// Per-line regex (already wrapped for -x).
    line: Regex,
    /// Same, multi-line, to skip quickly to candidate lines.
    multi: Regex,
    /// Anchored whole-string form for -w shortest-match retries.
    anchored: Option<Regex>,
    word: bool,
    /// Trigram query for the index.
    pub query: Query,
}

fn is_word_byte_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn char_before(line: &[u8], i: usize) -> Option<char> {
    if i == 0 {
        return None;
    }
    let start = i.saturating_sub(4);
    let s = &line[start..i];
    for k in 0..s.len() {
        if let Ok(t) = std::str::from_utf8(&s[k..]) {
            return t.chars().last();
        }
    }
    None
}

fn char_at(line: &[u8], i: usize) -> Option<char> {
    let end = (i + 4).min(line.len());
    for k in (i + 1..=end).rev() {
        if let Ok(t) = std::str::from_utf8(&line[i..k]) {
            return t.chars().next();
        }
    }
    None
}

fn next_char_boundary(line: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    while j < line.len() && (line[j] & 0xC0) == 0x80 {
        j += 1;
    }
    j
}

impl Matcher {
    /// Build from already-translated regex sources.
    pub(crate) fn new(
        sources: &[String],
        icase: bool,
        word: bool,
        whole_line: bool,
    ) -> Result<Matcher, String> {
        let alts: Vec<String> = sources.iter().map(|s| format!("(?:{s})")).collect();
        let combined = if alts.is_empty() {
            "[^\\s\\S]".to_string()
        } else {
            alts.join("|")
        };
        let src = if whole_line {
            format!("^(?:{combined})$")
        } else {
            combined.clone()
        };
        let build = |s: &str, ml: bool| {
            RegexBuilder::new(s)
                .case_insensitive(icase)
                .multi_line(ml)
                .unicode(true)
                .size_limit(64 << 20)
                .build()
                .map_err(|e| regex_error(&e))
        };
        let line = build(&src, false)?;
        let multi = build(&src, true)?;
        let anchored = if word {
            Some(build(&format!("^(?:{combined})$"), false)?)
        } else {
            None
        };
        let mut queries = Vec::new();
        for s in sources {
            let hir = regex_syntax::ParserBuilder::new()
                .case_insensitive(icase)
                .unicode(true)
                .utf8(false)
                .build()
                .parse(s);
            queries.push(match hir {
                Ok(h) => query_for_hir(&h),
                Err(_) => Query::All,
            });
        }
        let query = if sources.is_empty() {
            Query::Nothing
        } else {
            query_any(queries)
        };
        Ok(Matcher {
            line,
            multi,
            anchored,
            word,
            query,
        })
    }

    fn word_ok(line: &[u8], s: usize, e: usize) -> bool {
        !char_before(line, s).is_some_and(is_word_byte_char)
            && !char_at(line, e).is_some_and(is_word_byte_char)
    }

    /// First match in `line` at or after `from` (with -w rules).
    fn find_at(&self, line: &[u8], from: usize) -> Option<(usize, usize)> {
        if !self.word {
            return self.line.find_at(line, from).map(|m| (m.start(), m.end()));
        }
        let mut pos = from;
        while pos <= line.len() {
            let m = self.line.find_at(line, pos)?;
            let (s, e) = (m.start(), m.end());
            if Self::word_ok(line, s, e) {
                return Some((s, e));
            }
            // Try shorter matches starting at s.
            if let Some(a) = &self.anchored {
                let mut e2 = e;
                while e2 > s {
                    e2 -= 1;
                    while e2 > s && (line[e2] & 0xC0) == 0x80 {
                        e2 -= 1;
                    }
                    if a.is_match(&line[s..e2]) && Self::word_ok(line, s, e2) {
                        return Some((s, e2));
                    }
                }
            }
            if s >= line.len() {
                return None;
            }
            pos = next_char_boundary(line, s);
        }
        None
    }

    pub(crate) fn is_match(&self, line: &[u8]) -> bool {
        self.find_at(line, 0).is_some()
    }

    /// Non-empty matches for -o.
    pub(crate) fn matches(&self, line: &[u8]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos <= line.len() {
            let Some((s, e)) = self.find_at(line, pos) else {
                break;
            };
            if e > s {
                out.push((s, e));
                pos = e;
            } else {
                if s >= line.len() {
                    break;
                }
                pos = next_char_boundary(line, s);
            }
        }
        out
    }

    /// Whether the buffer may contain a matching line (cheap whole-buffer test).
    pub(crate) fn buffer_may_match(&self, data: &[u8]) -> bool {
        self.multi.is_match(data)
    }
}

fn regex_error(e: &regex::Error) -> String {
    match e {
        regex::Error::CompiledTooBig(_) => "regular expression is too big".into(),
        regex::Error::Syntax(s) => {
            let last = s
                .lines()
                .rev()
                .find(|l| l.starts_with("error:"))
                .unwrap_or("error: invalid regular expression");
            last.trim_start_matches("error: ").to_string()
        }
        _ => "invalid regular expression".into(),
    }
}

// ---------------------------------------------------------------- line iteration

/// (start, end-without-newline) of each line.
fn lines_of(data: &[u8], nul_too: bool) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let mut s = 0;
    while s < data.len() {
        let next = if nul_too {
            data[s..].iter().position(|c| *c == b'\n' || *c == 0)
        } else {
            memchr_nl(&data[s..])
        };
        match next {
            Some(p) => {
                v.push((s, s + p));
                s += p + 1;
            }
            None => {
                v.push((s, data.len()));
                break;
            }
        }
    }
    v
}

fn memchr_nl(b: &[u8]) -> Option<usize> {
    b.iter().position(|c| *c == b'\n')
}

// ---------------------------------------------------------------- output

/// How a searched file's lines are printed.
#[derive(Clone)]
pub(crate) struct Printer {
    pub with_name: bool,
    pub line_numbers: bool,
    pub byte_offset: bool,
    pub null_after_name: bool,
    pub only_matching: bool,
    pub invert: bool,
    pub before: usize,
    pub after: usize,
    pub max_count: Option<u64>,
    pub count_only: bool,
    pub list: Option<bool>,
    pub quiet: bool,
    /// GNU prints lines with encoding errors as "binary file matches"; rg prints them.
    pub gnu_binary: bool,
    pub heading: bool,
}

/// Per-file result.
pub(crate) struct FileResult {
    pub selected: u64,
    pub binary_suppressed: bool,
}

/// Shared output state across files (context separators).
#[derive(Default)]
pub(crate) struct OutState {
    pub printed_any: bool,
}

fn prefix(p: &Printer, name: &str, lineno: usize, offset: usize, sep: u8, out: &mut Vec<u8>) {
    if p.with_name && !p.heading {
        out.extend_from_slice(name.as_bytes());
        if p.null_after_name {
            out.push(0);
        } else {
            out.push(sep);
        }
    }
    if p.line_numbers {
        out.extend_from_slice(lineno.to_string().as_bytes());
        out.push(sep);
    }
    if p.byte_offset {
        out.extend_from_slice(offset.to_string().as_bytes());
        out.push(sep);
    }
}

/// Search one buffer and print per `p`. Returns the number of selected lines.
pub(crate) fn search_buffer(
    ctx: &mut Ctx,
    m: &Matcher,
    p: &Printer,
    data: &[u8],
    name: &str,
    st: &mut OutState,
) -> Result<FileResult, Abort> {
    let binary = p.gnu_binary && data.contains(&0);
    let mut res = FileResult {
        selected: 0,
        binary_suppressed: false,
    };
    if !p.invert && !m.buffer_may_match(data) {
        return Ok(res);
    }
    let counting = p.count_only || p.list.is_some() || p.quiet;
    // GNU grep treats NUL bytes in binary files as line terminators.
    let lines = lines_of(data, binary);
    let mut out: Vec<u8> = Vec::new();
    let mut last_printed: Option<usize> = None;
    let mut after_left = 0usize;
    let ctx_lines = !p.only_matching && (p.before > 0 || p.after > 0) && !counting;
    let mut stop_selecting = false;
    let mut heading_done = false;
    let mut i = 0;
    // Fast skip to the next candidate line when not inverting and no context is pending.
    let mut skip_to = 0usize;
    while i < lines.len() {
        if i % 4096 == 0 {
            ctx.check()?;
        }
        let (s, e) = lines[i];
        if !binary && !p.invert && !stop_selecting && after_left == 0 && s >= skip_to {
            match m.multi.find_at(data, s) {
                None => break,
                Some(mm) => {
                    // Jump to the line containing the match start.
                    let j = lines.partition_point(|l| l.1 < mm.start());
                    if j >= lines.len() {
                        break;
                    }
                    if j > i {
                        i = j;
                        continue;
                    }
                    skip_to = e + 1;
                }
            }
        }
        let line = &data[s..e];
        let selected = !stop_selecting && (m.is_match(line) != p.invert);
        if selected {
            res.selected += 1;
            if counting {
                if p.quiet || p.list.is_some() {
                    return Ok(res);
                }
                if p.max_count.is_some_and(|mc| res.selected >= mc) {
                    break;
                }
                i += 1;
                continue;
            }
            let bad_text = |t: &[u8]| p.gnu_binary && std::str::from_utf8(t).is_err();
            let printable = if p.only_matching {
                !m.matches(line)
                    .iter()
                    .any(|&(ms, me)| bad_text(&line[ms..me]))
            } else {
                !bad_text(line)
            };
            if binary || !printable {
                res.binary_suppressed = true;
                if binary {
                    return Ok(res);
                }
            } else {
                if p.heading && !heading_done {
                    if st.printed_any {
                        out.push(b'\n');
                    }
                    out.extend_from_slice(name.as_bytes());
                    out.push(b'\n');
                    heading_done = true;
                }
                // Before-context and group separator.
                if ctx_lines {
                    let from = i.saturating_sub(p.before);
                    let from = match last_printed {
                        Some(lp) => from.max(lp + 1),
                        None => from,
                    };
                    let gap = match last_printed {
                        Some(lp) => from > lp + 1,
                        None => st.printed_any,
                    };
                    if gap {
                        out.extend_from_slice(b"--\n");
                    }
                    for (k, &(cs, ce)) in lines.iter().enumerate().take(i).skip(from) {
                        prefix(p, name, k + 1, cs, b'-', &mut out);
                        out.extend_from_slice(&data[cs..ce]);
                        out.push(b'\n');
                    }
                }
                if p.only_matching {
                    if !p.invert {
                        for (ms, me) in m.matches(line) {
                            prefix(p, name, i + 1, s + ms, b':', &mut out);
                            out.extend_from_slice(&line[ms..me]);
                            out.push(b'\n');
                        }
                    }
                } else {
                    prefix(p, name, i + 1, s, b':', &mut out);
                    out.extend_from_slice(line);
                    out.push(b'\n');
                }
                st.printed_any = true;
                last_printed = Some(i);
                after_left = p.after;
            }
            if p.max_count.is_some_and(|mc| res.selected >= mc) {
                stop_selecting = true;
                if after_left == 0 || !ctx_lines {
                    break;
                }
            }
        } else if ctx_lines && after_left > 0 {
            if !(p.gnu_binary && std::str::from_utf8(line).is_err()) {
                prefix(p, name, i + 1, s, b'-', &mut out);
                out.extend_from_slice(line);
                out.push(b'\n');
            }
            last_printed = Some(i);
            after_left -= 1;
            if stop_selecting && after_left == 0 {
                break;
            }
        }
        if out.len() >= 1 << 16 {
            ctx.out(&out)?;
            out.clear();
        }
        i += 1;
    }
    ctx.out(&out)?;
    Ok(res)
}

// ---------------------------------------------------------------- include/exclude

#[derive(Clone)]
enum Filter {
    Include(Pattern),
    Exclude(Pattern),
}

/// GNU grep: does any "name suffix" (whole name, or part after a '/') match?
fn suffix_matches(p: &Pattern, name: &str) -> bool {
    let o = MatchOptions::default();
    if p.matches(name, o) {
        return true;
    }
    name.match_indices('/').any(|(i, _)| {
        i + 1 < name.len() && name.as_bytes()[i + 1] != b'/' && p.matches(&name[i + 1..], o)
    })
}

fn file_included(filters: &[Filter], name: &str) -> bool {
    let mut verdict = None;
    for f in filters {
        match f {
            Filter::Include(p) if suffix_matches(p, name) => verdict = Some(true),
            Filter::Exclude(p) if suffix_matches(p, name) => verdict = Some(false),
            _ => {}
        }
    }
    verdict.unwrap_or(!matches!(filters.first(), Some(Filter::Include(_))))
}

// ---------------------------------------------------------------- grep

const GREP_SPEC: Spec = Spec {
    short: "EFGPe:f:iyvwxcLlm:oqsbHhnrRA:B:C:aIZzTUu",
    long: &[
        ("extended-regexp", Arg::No, "E"),
        ("fixed-strings", Arg::No, "F"),
        ("basic-regexp", Arg::No, "G"),
        ("perl-regexp", Arg::No, "P"),
        ("regexp", Arg::Required, "e"),
        ("file", Arg::Required, "f"),
        ("ignore-case", Arg::No, "i"),
        ("no-ignore-case", Arg::No, "no-i"),
        ("invert-match", Arg::No, "v"),
        ("word-regexp", Arg::No, "w"),
        ("line-regexp", Arg::No, "x"),
        ("count", Arg::No, "c"),
        ("files-without-match", Arg::No, "L"),
        ("files-with-matches", Arg::No, "l"),
        ("max-count", Arg::Required, "m"),
        ("only-matching", Arg::No, "o"),
        ("quiet", Arg::No, "q"),
        ("silent", Arg::No, "q"),
        ("no-messages", Arg::No, "s"),
        ("byte-offset", Arg::No, "b"),
        ("with-filename", Arg::No, "H"),
        ("no-filename", Arg::No, "h"),
        ("label", Arg::Required, "label"),
        ("line-number", Arg::No, "n"),
        ("recursive", Arg::No, "r"),
        ("dereference-recursive", Arg::No, "R"),
        ("include", Arg::Required, "include"),
        ("exclude", Arg::Required, "exclude"),
        ("exclude-dir", Arg::Required, "exclude-dir"),
        ("after-context", Arg::Required, "A"),
        ("before-context", Arg::Required, "B"),
        ("context", Arg::Required, "C"),
        ("text", Arg::No, "a"),
        ("binary-files", Arg::Required, "binary-files"),
        ("null", Arg::No, "Z"),
        ("null-data", Arg::No, "z"),
        ("color", Arg::Optional, "color"),
        ("colour", Arg::Optional, "color"),
        ("initial-tab", Arg::No, "T"),
        ("line-buffered", Arg::No, "line-buffered"),
        ("binary", Arg::No, "U"),
    ],
    digits: true,
};

pub(crate) fn egrep(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let mut a = vec!["-E".to_string()];
    a.extend(args.iter().cloned());
    grep_main(ctx, &a)
}

pub(crate) fn fgrep(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let mut a = vec!["-F".to_string()];
    a.extend(args.iter().cloned());
    grep_main(ctx, &a)
}

pub(crate) fn grep(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    grep_main(ctx, args)
}

fn parse_context(ctx: &mut Ctx, v: &str) -> Result<Option<usize>, Abort> {
    match v.parse::<usize>() {
        Ok(n) => Ok(Some(n)),
        Err(_) => {
            ctx.errln(&format!("grep: {v}: invalid context length argument"))?;
            Ok(None)
        }
    }
}

fn grep_main(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, mut operands) = match getopt::parse("grep", &GREP_SPEC, args) {
        Ok(x) => x,
        Err(m) => {
            return usage_error(
                ctx,
                &m.replace(
                    "Try 'grep --help'",
                    "Usage: grep [OPTION]... PATTERNS [FILE]...\nTry 'grep --help'",
                ),
                2,
            )
        }
    };
    let mut dialect = 'G';
    let mut patterns: Option<Vec<String>> = None;
    let (mut icase, mut invert, mut word, mut line_x) = (false, false, false, false);
    let mut p = Printer {
        with_name: false,
        line_numbers: false,
        byte_offset: false,
        null_after_name: false,
        only_matching: false,
        invert: false,
        before: 0,
        after: 0,
        max_count: None,
        count_only: false,
        list: None,
        quiet: false,
        gnu_binary: true,
        heading: false,
    };
    let (mut force_name, mut no_name, mut recursive, mut no_messages) =
        (None::<bool>, false, false, false);
    let mut filters = Vec::new();
    let mut exclude_dirs = Vec::new();
    let mut label = "(standard input)".to_string();
    let (mut before, mut after, mut both) = (None, None, None::<usize>);
    let mut binary_mode = "binary".to_string();
    for (k, v) in &opts {
        let val = v.clone().unwrap_or_default();
        match k.as_str() {
            "E" | "F" | "G" | "P" => dialect = k.chars().next().unwrap_or('G'),
            "e" => patterns
                .get_or_insert_with(Vec::new)
                .extend(val.split('\n').map(str::to_string)),
            "f" => {
                let data = if val == "-" {
                    Ok(ctx.take_stdin())
                } else {
                    ctx.read_path(&val)
                };
                match data {
                    Ok(d) => {
                        let text = String::from_utf8_lossy(&d).to_string();
                        let list = patterns.get_or_insert_with(Vec::new);
                        let body = text.strip_suffix('\n').unwrap_or(&text);
                        if !d.is_empty() {
                            list.extend(body.split('\n').map(str::to_string));
                        }
                    }
                    Err(e) => {
                        ctx.errln(&format!("grep: {val}: {}", e.msg()))?;
                        return Ok(2);
                    }
                }
            }
            "i" | "y" => icase = true,
            "no-i" => icase = false,
            "v" => invert = true,
            "w" => word = true,
            "x" => line_x = true,
            "c" => p.count_only = true,
            "L" => p.list = Some(false),
            "l" => p.list = Some(true),
            "m" => match val.parse::<i64>() {
                Ok(n) if n < 0 => p.max_count = None,
                Ok(n) => p.max_count = Some(n as u64),
                Err(_) => {
                    ctx.errln("grep: invalid max count")?;
                    return Ok(2);
                }
            },
            "o" => p.only_matching = true,
            "q" => p.quiet = true,
            "s" => no_messages = true,
            "b" => p.byte_offset = true,
            "H" => force_name = Some(true),
            "h" => {
                force_name = Some(false);
                no_name = true
            }
            "label" => label = val,
            "n" => p.line_numbers = true,
            "r" | "R" => recursive = true,
            "include" => filters.push(Filter::Include(Pattern::new(&val))),
            "exclude" => filters.push(Filter::Exclude(Pattern::new(&val))),
            "exclude-dir" => exclude_dirs.push(Pattern::new(&val)),
            "A" => match parse_context(ctx, &val)? {
                Some(n) => after = Some(n),
                None => return Ok(2),
            },
            "B" => match parse_context(ctx, &val)? {
                Some(n) => before = Some(n),
                None => return Ok(2),
            },
            "C" | "#" => match parse_context(ctx, &val)? {
                Some(n) => both = Some(n),
                None => return Ok(2),
            },
            "a" => binary_mode = "text".into(),
            "I" => binary_mode = "without-match".into(),
            "binary-files" => match val.as_str() {
                "binary" | "text" | "without-match" => binary_mode = val,
                _ => {
                    ctx.errln("grep: unknown binary-files type")?;
                    return Ok(2);
                }
            },
            "Z" => p.null_after_name = true,
            "z" => {
                ctx.errln("grep: -z/--null-data is not supported by the virtual shell")?;
                return Ok(2);
            }
            _ => {}
        }
    }
    let _ = no_name;
    p.invert = invert;
    p.before = before.or(both).unwrap_or(0);
    p.after = after.or(both).unwrap_or(0);
    p.gnu_binary = binary_mode != "text";
    let patterns = match patterns {
        Some(pats) => pats,
        None => {
            if operands.is_empty() {
                ctx.errln("Usage: grep [OPTION]... PATTERNS [FILE]...\nTry 'grep --help' for more information.")?;
                return Ok(2);
            }
            let first = operands.remove(0);
            first.split('\n').map(str::to_string).collect()
        }
    };
    // Translate patterns.
    let mut sources = Vec::new();
    for pat in &patterns {
        if dialect != 'F' && dialect != 'P' {
            if let Err(e) = check_class_syntax(pat) {
                ctx.errln(&format!("grep: {e}"))?;
                return Ok(2);
            }
        }
        let src = match dialect {
            'F' => Ok(regex::escape(pat)),
            'P' => Ok(pat.clone()),
            'E' => translate(pat, Dialect::Extended),
            _ => translate(pat, Dialect::Basic),
        };
        match src {
            Ok(s) => sources.push(s),
            Err(e) => {
                ctx.errln(&format!("grep: {e}"))?;
                return Ok(2);
            }
        }
    }
    let m = match Matcher::new(&sources, icase, word, line_x) {
        Ok(m) => m,
        Err(e) => {
            ctx.errln(&format!("grep: {e}"))?;
            return Ok(2);
        }
    };
    let implicit_dot = operands.is_empty() && recursive;
    if operands.is_empty() {
        operands.push(if recursive { ".".into() } else { "-".into() });
    }
    let searches_dir = recursive
        && operands
            .iter()
            .any(|o| o != "-" && ctx.resolve(o).is_ok_and(|n| ctx.fs().is_dir(n)));
    p.with_name = force_name.unwrap_or(operands.len() > 1 || searches_dir);
    let cands = ctx
        .view()
        .candidates(&if invert { Query::All } else { m.query.clone() });
    let mut st = OutState::default();
    let mut any_selected = false;
    let mut error = false;
    let mut g = GrepRun {
        m: &m,
        p: &p,
        cands: &cands,
        binary_mode: &binary_mode,
        any_selected: &mut any_selected,
        st: &mut st,
    };
    for op in &operands {
        if op == "-" {
            let data = ctx.take_stdin();
            if g.file(ctx, &data, &label)? {
                return Ok(0);
            }
            continue;
        }
        let is_dir = ctx.resolve(op).is_ok_and(|n| ctx.fs().is_dir(n));
        let searched = file_included(&filters, op) || (recursive && is_dir);
        if !searched {
            continue;
        }
        match ctx.resolve(op) {
            Err(e) => {
                if !no_messages {
                    ctx.errln(&format!("grep: {op}: {}", e.msg()))?;
                }
                error = true;
            }
            Ok(n) if ctx.fs().is_dir(n) => {
                if !recursive {
                    if !no_messages {
                        ctx.flush()?;
                        ctx.errln(&format!("grep: {op}: Is a directory"))?;
                    }
                    if g.p.count_only {
                        let mut out = Vec::new();
                        if g.p.with_name {
                            out.extend_from_slice(op.as_bytes());
                            out.push(if g.p.null_after_name { 0 } else { b':' });
                        }
                        out.extend_from_slice(b"0\n");
                        ctx.out(&out)?;
                    }
                    error = true;
                    continue;
                }
                if exclude_dirs.iter().any(|p| suffix_matches(p, op)) && op != "." {
                    continue;
                }
                let base = if implicit_dot {
                    String::new()
                } else {
                    op.clone()
                };
                if g.walk(ctx, n, &base, &filters, &exclude_dirs)? {
                    return Ok(0);
                }
            }
            Ok(n) => {
                if !g.cands_ok(ctx, n) {
                    g.emit_zero(ctx, op)?;
                    continue;
                }
                let data = match ctx.read(n) {
                    Ok(d) => d,
                    Err(e) => {
                        ctx.errln(&format!("grep: {op}: {}", e.msg()))?;
                        error = true;
                        continue;
                    }
                };
                if g.file(ctx, &data, op)? {
                    return Ok(0);
                }
            }
        }
    }
    let selected = *g.any_selected;
    if error && !(p.quiet && selected) {
        return Ok(2);
    }
    Ok(if selected { 0 } else { 1 })
}

struct GrepRun<'a> {
    m: &'a Matcher,
    p: &'a Printer,
    cands: &'a Option<Vec<bool>>,
    binary_mode: &'a str,
    any_selected: &'a mut bool,
    st: &'a mut OutState,
}

impl GrepRun<'_> {
    fn cands_ok(&self, ctx: &Ctx, n: NodeId) -> bool {
        ctx.fs().is_candidate(n, self.cands)
    }

    /// Output for a file known to have no selected line.
    fn emit_zero(&mut self, ctx: &mut Ctx, name: &str) -> Result<(), Abort> {
        let p = self.p;
        if p.quiet {
            return Ok(());
        }
        let mut out = Vec::new();
        if p.count_only {
            if p.with_name {
                out.extend_from_slice(name.as_bytes());
                out.push(if p.null_after_name { 0 } else { b':' });
            }
            out.extend_from_slice(b"0\n");
        } else if p.list == Some(false) {
            out.extend_from_slice(name.as_bytes());
            out.push(if p.null_after_name { 0 } else { b'\n' });
            *self.any_selected = true;
        }
        ctx.out(&out)
    }

    /// Search one file's data; returns true when -q found a match (stop).
    fn file(&mut self, ctx: &mut Ctx, data: &[u8], name: &str) -> Result<bool, Abort> {
        let p = self.p;
        if self.binary_mode == "without-match" && data.contains(&0) {
            return self.emit_zero(ctx, name).map(|_| false);
        }
        let r = search_buffer(ctx, self.m, p, data, name, self.st)?;
        if p.quiet {
            if r.selected > 0 {
                *self.any_selected = true;
                return Ok(true);
            }
            return Ok(false);
        }
        let mut out = Vec::new();
        let term = if p.null_after_name { 0 } else { b'\n' };
        match p.list {
            Some(true) => {
                if r.selected > 0 {
                    out.extend_from_slice(name.as_bytes());
                    out.push(term);
                    *self.any_selected = true;
                }
            }
            Some(false) => {
                if r.selected == 0 {
                    out.extend_from_slice(name.as_bytes());
                    out.push(term);
                    *self.any_selected = true;
                }
            }
            None => {
                if r.selected > 0 {
                    *self.any_selected = true;
                }
                if p.count_only {
                    if p.with_name {
                        out.extend_from_slice(name.as_bytes());
                        out.push(if p.null_after_name { 0 } else { b':' });
                    }
                    let n = match p.max_count {
                        Some(m) => r.selected.min(m),
                        None => r.selected,
                    };
                    out.extend_from_slice(format!("{n}\n").as_bytes());
                }
            }
        }
        ctx.out(&out)?;
        if r.binary_suppressed && p.list.is_none() && !p.count_only {
            ctx.flush()?;
            ctx.errln(&format!("grep: {name}: binary file matches"))?;
        }
        Ok(false)
    }

    fn walk(
        &mut self,
        ctx: &mut Ctx,
        dir: NodeId,
        base: &str,
        filters: &[Filter],
        exclude_dirs: &[Pattern],
    ) -> Result<bool, Abort> {
        let kids: Vec<NodeId> = ctx.fs().children(dir).to_vec();
        for c in kids {
            ctx.check()?;
            let name = ctx.fs().name(c).to_string();
            let path = if base.is_empty() {
                name.clone()
            } else if base.ends_with('/') {
                format!("{base}{name}")
            } else {
                format!("{base}/{name}")
            };
            if ctx.fs().is_dir(c) {
                if exclude_dirs
                    .iter()
                    .any(|p| p.matches(&name, MatchOptions::default()))
                {
                    continue;
                }
                if self.walk(ctx, c, &path, filters, exclude_dirs)? {
                    return Ok(true);
                }
                continue;
            }
            if !file_included(filters, &name) {
                continue;
            }
            if !self.cands_ok(ctx, c) {
                self.emit_zero(ctx, &path)?;
                continue;
            }
            let data = match ctx.read(c) {
                Ok(d) => d,
                Err(e) => {
                    ctx.errln(&format!("grep: {path}: {}", e.msg()))?;
                    continue;
                }
            };
            if self.file(ctx, &data, &path)? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(p: &str, word: bool) -> Matcher {
        Matcher::new(&[translate(p, Dialect::Basic).unwrap()], false, word, false).unwrap()
    }

    #[test]
    fn word_matching_retries_shorter() {
        let m = matcher("foo.*", true);
        assert!(m.is_match(b"foo bar"));
        let m = matcher("limit", true);
        assert!(!m.is_match(b"limited"));
        assert!(m.is_match(b"limited limit"));
        assert_eq!(m.matches(b"a limit, limit"), vec![(2, 7), (9, 14)]);
    }

    #[test]
    fn include_exclude_semantics() {
        let inc = vec![Filter::Include(Pattern::new("*.md"))];
        assert!(file_included(&inc, "a.md"));
        assert!(!file_included(&inc, "a.txt"));
        assert!(file_included(&inc, "dir/a.md"));
        let exc = vec![Filter::Exclude(Pattern::new("*.md"))];
        assert!(!file_included(&exc, "a.md"));
        assert!(file_included(&exc, "a.txt"));
    }
}
