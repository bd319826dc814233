//! `rg` with ripgrep 13's non-tty output, sharing grep's matcher and the
//! trigram index.

use super::exec::{Abort, Ctx};
use super::getopt::{self, Arg, Spec};
use super::grep::{search_buffer, Matcher, OutState, Printer};
use crate::glob::{MatchOptions, Pattern};
use crate::index::Query;
use crate::manifest::NodeId;

const RG_SPEC: Spec = Spec {
    short: "e:f:iSsvwxFclLm:oqnNHIA:B:C:g:t:T:uaz0.",
    long: &[
        ("regexp", Arg::Required, "e"),
        ("file", Arg::Required, "f"),
        ("ignore-case", Arg::No, "i"),
        ("smart-case", Arg::No, "S"),
        ("case-sensitive", Arg::No, "s"),
        ("invert-match", Arg::No, "v"),
        ("word-regexp", Arg::No, "w"),
        ("line-regexp", Arg::No, "x"),
        ("fixed-strings", Arg::No, "F"),
        ("count", Arg::No, "c"),
        ("files-with-matches", Arg::No, "l"),
        ("files-without-match", Arg::No, "L"),
        ("max-count", Arg::Required, "m"),
        ("only-matching", Arg::No, "o"),
        ("quiet", Arg::No, "q"),
        ("line-number", Arg::No, "n"),
        ("no-line-number", Arg::No, "N"),
        ("with-filename", Arg::No, "H"),
        ("no-filename", Arg::No, "I"),
        ("after-context", Arg::Required, "A"),
        ("before-context", Arg::Required, "B"),
        ("context", Arg::Required, "C"),
        ("glob", Arg::Required, "g"),
        ("iglob", Arg::Required, "iglob"),
        ("type", Arg::Required, "t"),
        ("type-not", Arg::Required, "T"),
        ("hidden", Arg::No, "."),
        ("no-ignore", Arg::No, "no-ignore"),
        ("text", Arg::No, "a"),
        ("files", Arg::No, "files"),
        ("heading", Arg::No, "heading"),
        ("no-heading", Arg::No, "no-heading"),
        ("color", Arg::Required, "color"),
        ("sort", Arg::Required, "sort"),
        ("null", Arg::No, "0"),
        ("search-zip", Arg::No, "z"),
        ("max-depth", Arg::Required, "max-depth"),
    ],
    digits: false,
};

fn rg_type_globs(t: &str) -> Option<&'static [&'static str]> {
    Some(match t {
        "md" | "markdown" => &[
            "*.markdown",
            "*.md",
            "*.mdown",
            "*.mdwn",
            "*.mkd",
            "*.mkdn",
            "*.mdx",
            "*.ron",
        ][..7],
        "txt" => &["*.txt"],
        "py" => &["*.py", "*.pyi"],
        "rust" => &["*.rs"],
        "js" => &["*.cjs", "*.js", "*.jsx", "*.mjs", "*.vue"],
        "ts" => &["*.cts", "*.mts", "*.ts", "*.tsx"],
        "json" => &["*.json", "*.sarif", "composer.lock"],
        "yaml" => &["*.yaml", "*.yml"],
        "toml" => &["*.toml", "Cargo.lock"],
        "html" => &["*.ejs", "*.htm", "*.html"],
        "css" => &["*.css", "*.scss"],
        "go" => &["*.go"],
        "java" => &["*.java", "*.jsp", "*.jspx", "*.properties"],
        "c" => &["*.[chH]", "*.[chH].in", "*.cats"],
        "cpp" => &["*.[ChH]", "*.cc", "*.[ch]pp", "*.[ch]xx", "*.hh", "*.inl"],
        "sh" => &[
            "*.bash", "*.bashrc", "*.csh", "*.ksh", "*.sh", "*.tcsh", "*.zsh",
        ],
        "xml" => &["*.xml", "*.xml.dist", "*.xsd", "*.xsl", "*.xslt"],
        "csv" => &["*.csv"],
        "rst" => &["*.rst"],
        "sql" => &["*.psql", "*.sql"],
        _ => return None,
    })
}

struct RgGlob {
    pat: Pattern,
    negate: bool,
    has_slash: bool,
    casefold: bool,
}

impl RgGlob {
    fn new(g: &str, casefold: bool) -> RgGlob {
        let (negate, g) = match g.strip_prefix('!') {
            Some(r) => (true, r),
            None => (false, g),
        };
        let g = g.strip_prefix('/').unwrap_or(g);
        RgGlob {
            pat: Pattern::new_recursive(g),
            negate,
            has_slash: g.trim_end_matches('/').contains('/'),
            casefold,
        }
    }

    fn matches(&self, rel: &str, name: &str) -> bool {
        let o = MatchOptions {
            pathname: true,
            casefold: self.casefold,
            period: false,
        };
        if self.has_slash {
            self.pat.matches(rel, o)
        } else {
            self.pat.matches(name, o)
        }
    }
}

/// ripgrep glob semantics: the last matching glob wins; with any positive
/// glob, unmatched files are excluded (directories are only pruned by negations).
fn rg_included(globs: &[RgGlob], rel: &str, name: &str, is_dir: bool) -> bool {
    let mut verdict = None;
    for g in globs {
        if g.matches(rel, name) {
            verdict = Some(!g.negate);
        }
    }
    match verdict {
        Some(v) => v || (is_dir && !globs.iter().any(|g| g.negate && g.matches(rel, name))),
        None => is_dir || !globs.iter().any(|g| !g.negate),
    }
}

struct RgRun<'a> {
    m: &'a Matcher,
    p: &'a Printer,
    cands: &'a Option<Vec<bool>>,
    globs: &'a [RgGlob],
    types: &'a [Pattern],
    types_not: &'a [Pattern],
    hidden: bool,
    files_mode: bool,
    text: bool,
    max_depth: Option<usize>,
    st: OutState,
    any: bool,
}

impl RgRun<'_> {
    fn type_ok(&self, name: &str) -> bool {
        let o = MatchOptions::default();
        (self.types.is_empty() || self.types.iter().any(|p| p.matches(name, o)))
            && !self.types_not.iter().any(|p| p.matches(name, o))
    }

    fn search_file(
        &mut self,
        ctx: &mut Ctx,
        n: Option<NodeId>,
        data: &[u8],
        name: &str,
        explicit: bool,
    ) -> Result<bool, Abort> {
        let p = self.p;
        if self.files_mode {
            ctx.outs(&format!("{name}\n"))?;
            self.any = true;
            return Ok(false);
        }
        if let Some(node) = n {
            if !ctx.fs().is_candidate(node, self.cands) {
                if p.list == Some(false) {
                    ctx.outs(&format!("{name}\n"))?;
                    self.any = true;
                }
                return Ok(false);
            }
        }
        if !self.text {
            if let Some(off) = data.iter().position(|b| *b == 0) {
                if !explicit {
                    return Ok(false);
                }
                // Explicit file: search the part before the NUL, then report.
                let r = search_buffer(
                    ctx,
                    self.m,
                    &Printer {
                        count_only: true,
                        ..p.clone()
                    },
                    &data[..off],
                    name,
                    &mut self.st,
                )?;
                if r.selected > 0 || self.m.buffer_may_match(data) {
                    self.any = true;
                    if p.quiet {
                        return Ok(true);
                    }
                    let pre = if p.with_name {
                        format!("{name}: ")
                    } else {
                        String::new()
                    };
                    ctx.outs(&format!(
                        "{pre}binary file matches (found \"\\0\" byte around offset {off})\n"
                    ))?;
                }
                return Ok(false);
            }
        }
        let r = search_buffer(ctx, self.m, p, data, name, &mut self.st)?;
        if r.selected > 0 {
            self.any = true;
        }
        if p.quiet && r.selected > 0 {
            return Ok(true);
        }
        let mut out = String::new();
        match p.list {
            Some(true) if r.selected > 0 => out = format!("{name}\n"),
            Some(false) if r.selected == 0 => {
                out = format!("{name}\n");
                self.any = true;
            }
            _ => {}
        }
        if p.count_only && r.selected > 0 {
            let n = p.max_count.map(|m| r.selected.min(m)).unwrap_or(r.selected);
            out = if p.with_name {
                format!("{name}:{n}\n")
            } else {
                format!("{n}\n")
            };
        }
        ctx.outs(&out)?;
        Ok(false)
    }

    fn walk(
        &mut self,
        ctx: &mut Ctx,
        dir: NodeId,
        base: &str,
        rel: &str,
        depth: usize,
    ) -> Result<bool, Abort> {
        if self.max_depth.is_some_and(|m| depth >= m) {
            return Ok(false);
        }
        let kids: Vec<NodeId> = ctx.fs().children(dir).to_vec();
        for c in kids {
            ctx.check()?;
            let name = ctx.fs().name(c).to_string();
            if name.starts_with('.') && !self.hidden {
                continue;
            }
            let path = if base.is_empty() {
                name.clone()
            } else if base.ends_with('/') {
                format!("{base}{name}")
            } else {
                format!("{base}/{name}")
            };
            let relp = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let is_dir = ctx.fs().is_dir(c);
            if !rg_included(self.globs, &relp, &name, is_dir) {
                continue;
            }
            if is_dir {
                if self.walk(ctx, c, &path, &relp, depth + 1)? {
                    return Ok(true);
                }
                continue;
            }
            if !self.type_ok(&name) {
                continue;
            }
            let data = if self.files_mode {
                Vec::new()
            } else {
                match ctx.read(c) {
                    Ok(d) => d,
                    Err(e) => {
                        ctx.errln(&format!("{path}: {} (os error 5)", e.msg()))?;
                        continue;
                    }
                }
            };
            if self.search_file(ctx, Some(c), &data, &path, false)? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

pub(crate) fn rg(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, mut operands) = match getopt::parse("rg", &RG_SPEC, args) {
        Ok(x) => x,
        Err(m) => {
            let first = m
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("rg: ")
                .to_string();
            ctx.errln(&format!("error: {first}"))?;
            return Ok(2);
        }
    };
    let mut patterns: Option<Vec<String>> = None;
    let (mut icase, mut smart, mut invert, mut word, mut line_x, mut fixed) =
        (false, false, false, false, false, false);
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
        gnu_binary: false,
        heading: false,
    };
    let (mut force_name, mut hidden, mut files_mode, mut text) =
        (None::<bool>, false, false, false);
    let mut globs = Vec::new();
    let mut types = Vec::new();
    let mut types_not = Vec::new();
    let (mut before, mut after, mut both) = (None, None, None::<usize>);
    let mut max_depth = None;
    let mut unrestricted = 0;
    for (k, v) in &opts {
        let val = v.clone().unwrap_or_default();
        match k.as_str() {
            "e" => patterns.get_or_insert_with(Vec::new).push(val),
            "f" => match ctx.read_path(&val) {
                Ok(d) => {
                    let t = String::from_utf8_lossy(&d).to_string();
                    patterns
                        .get_or_insert_with(Vec::new)
                        .extend(t.lines().map(str::to_string));
                }
                Err(e) => {
                    ctx.errln(&format!("{val}: {} (os error 2)", e.msg()))?;
                    return Ok(2);
                }
            },
            "i" => {
                icase = true;
                smart = false
            }
            "S" => {
                smart = true;
                icase = false
            }
            "s" => {
                icase = false;
                smart = false
            }
            "v" => invert = true,
            "w" => word = true,
            "x" => line_x = true,
            "F" => fixed = true,
            "c" => p.count_only = true,
            "l" => p.list = Some(true),
            "L" => p.list = Some(false),
            "m" => p.max_count = val.parse().ok(),
            "o" => p.only_matching = true,
            "q" => p.quiet = true,
            "n" => p.line_numbers = true,
            "N" => p.line_numbers = false,
            "H" => force_name = Some(true),
            "I" => force_name = Some(false),
            "A" => after = val.parse().ok(),
            "B" => before = val.parse().ok(),
            "C" => both = val.parse().ok(),
            "g" => globs.push(RgGlob::new(&val, false)),
            "iglob" => globs.push(RgGlob::new(&val, true)),
            "t" | "T" => match rg_type_globs(&val) {
                Some(gs) => {
                    let dst = if k == "t" { &mut types } else { &mut types_not };
                    dst.extend(gs.iter().map(|g| Pattern::new(g)));
                }
                None => {
                    ctx.errln(&format!("error: unrecognized file type: {val}"))?;
                    return Ok(2);
                }
            },
            "." => hidden = true,
            "u" => {
                unrestricted += 1;
                if unrestricted >= 2 {
                    hidden = true;
                }
                if unrestricted >= 3 {
                    text = true;
                }
            }
            "a" => text = true,
            "files" => files_mode = true,
            "heading" => p.heading = true,
            "no-heading" => p.heading = false,
            "0" => p.null_after_name = true,
            "max-depth" => max_depth = val.parse().ok(),
            _ => {}
        }
    }
    let patterns = if files_mode {
        Vec::new()
    } else {
        match patterns {
            Some(p) => p,
            None => {
                if operands.is_empty() {
                    ctx.errln("error: The following required arguments were not provided:\n    <PATTERN>\n\nUSAGE:\n    \n    rg [OPTIONS] PATTERN [PATH ...]\n    rg [OPTIONS] -e PATTERN ... [PATH ...]\n    rg [OPTIONS] -f PATTERNFILE ... [PATH ...]\n    rg [OPTIONS] --files [PATH ...]\n    rg [OPTIONS] --type-list\n    command | rg [OPTIONS] PATTERN\n    rg [OPTIONS] --help\n    rg [OPTIONS] --version\n\nFor more information try --help")?;
                    return Ok(2);
                }
                vec![operands.remove(0)]
            }
        }
    };
    if smart {
        icase = !patterns.iter().any(|p| p.chars().any(|c| c.is_uppercase()));
    }
    p.invert = invert;
    p.before = before.or(both).unwrap_or(0);
    p.after = after.or(both).unwrap_or(0);
    let sources: Vec<String> = patterns
        .iter()
        .map(|s| if fixed { regex::escape(s) } else { s.clone() })
        .collect();
    let m = match Matcher::new(&sources, icase, word, line_x) {
        Ok(m) => m,
        Err(e) => {
            ctx.errln(&format!(
                "regex parse error:\n    {}\nerror: {e}",
                patterns.join("|")
            ))?;
            return Ok(2);
        }
    };
    let single_file =
        operands.len() == 1 && ctx.resolve(&operands[0]).is_ok_and(|n| !ctx.fs().is_dir(n));
    p.with_name = force_name.unwrap_or(!single_file);
    let implicit = operands.is_empty();
    if implicit {
        operands.push(".".into());
    }
    let cands = ctx.view().candidates(if invert || files_mode {
        &Query::All
    } else {
        &m.query
    });
    let mut run = RgRun {
        m: &m,
        p: &p,
        cands: &cands,
        globs: &globs,
        types: &types,
        types_not: &types_not,
        hidden,
        files_mode,
        text,
        max_depth,
        st: OutState::default(),
        any: false,
    };
    let mut error = false;
    for op in &operands {
        match ctx.resolve(op) {
            Err(e) => {
                ctx.errln(&format!(
                    "{op}: {} (os error {})",
                    e.msg(),
                    if e == super::vpath::FsErr::NotDir {
                        20
                    } else {
                        2
                    }
                ))?;
                error = true;
            }
            Ok(n) if ctx.fs().is_dir(n) => {
                let base = if implicit { String::new() } else { op.clone() };
                if run.walk(ctx, n, &base, "", 0)? {
                    return Ok(0);
                }
            }
            Ok(n) => {
                let data = if files_mode {
                    Vec::new()
                } else {
                    ctx.read(n).unwrap_or_default()
                };
                if run.search_file(ctx, Some(n), &data, op, true)? {
                    return Ok(0);
                }
            }
        }
    }
    if error {
        return Ok(2);
    }
    Ok(if run.any { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rg_globs() {
        let g = vec![RgGlob::new("*.md", false)];
        assert!(rg_included(&g, "docs/a.md", "a.md", false));
        assert!(!rg_included(&g, "docs/a.txt", "a.txt", false));
        assert!(rg_included(&g, "docs", "docs", true));
        let g = vec![RgGlob::new("!docs", false)];
        assert!(!rg_included(&g, "docs", "docs", true));
        assert!(rg_included(&g, "x.txt", "x.txt", false));
    }
}
