//! Commands that modify the tree. Without a scratch area they fail the way GNU
//! coreutils do on a read-only mount; with one, `touch`, `mkdir`, `rm`,
//! `rmdir`, `tee` and `truncate` change the session's overlay (`cp` and `mv`
//! are in `cmd_copy`). Links, modes and owners cannot be changed either way.

use super::cmd_files::{lquote, usage_error};
use super::exec::{Abort, Ctx};
use super::getopt::{self, Arg, Spec};
use super::overlay::{self, Fs, Scratch, Target};
use super::vpath::{quote, quotef, FsErr};
use crate::manifest::{NodeId, ROOT};
use crate::store::View;

/// Commands that would modify the tree: they fail the way GNU coreutils do on
/// a read-only mount.
pub(crate) fn write_denied(ctx: &mut Ctx, prog: &str, args: &[String]) -> Result<i32, Abort> {
    write_refused(ctx, prog, args, "Read-only file system")
}

/// Refuse a write with `ro` as the reason: the read-only wording, or
/// "Operation not permitted" for links, modes and owners in a scratch area.
fn write_refused(ctx: &mut Ctx, prog: &str, args: &[String], ro: &str) -> Result<i32, Abort> {
    let ops: Vec<&String> = args
        .iter()
        .filter(|a| !a.starts_with('-') || a.as_str() == "-")
        .collect();
    let exists = |ctx: &Ctx, p: &str| ctx.resolve(p).ok();
    let mut status = 0;
    match prog {
        "tee" => {
            let data = ctx.take_stdin();
            for f in &ops {
                if f.as_str() == "/dev/null" {
                    continue;
                }
                ctx.errln(&format!("tee: {}: {ro}", quotef(f)))?;
                status = 1;
            }
            ctx.out(&data)?;
            return Ok(status);
        }
        "touch" | "mkdir" | "rmdir" | "rm" | "chmod" | "chown" | "truncate" if ops.is_empty() => {
            ctx.errln(&format!(
                "{prog}: missing operand\nTry '{prog} --help' for more information."
            ))?;
            return Ok(1);
        }
        _ => {}
    }
    let operands: &[&String] = if matches!(prog, "chmod" | "chown") && !ops.is_empty() {
        &ops[1..]
    } else {
        &ops
    };
    match prog {
        "cp" | "mv" | "ln" => {
            if ops.len() < 2 {
                ctx.errln(&format!("{prog}: missing destination file operand after {}\nTry '{prog} --help' for more information.", quote(ops.first().map(|s| s.as_str()).unwrap_or(""))))?;
                return Ok(1);
            }
            let (src, dst) = (ops[0], ops[ops.len() - 1]);
            if prog != "ln" && exists(ctx, src).is_none() {
                let m = if prog == "cp" {
                    format!("cp: cannot stat {}: No such file or directory", quote(src))
                } else {
                    format!("mv: cannot stat {}: No such file or directory", quote(src))
                };
                ctx.errln(&m)?;
                return Ok(1);
            }
            let m = match prog {
                "cp" => format!("cp: cannot create regular file {}: {ro}", quote(dst)),
                "mv" => format!("mv: cannot move {} to {}: {ro}", quote(src), quote(dst)),
                _ => format!("ln: failed to create symbolic link {}: {ro}", quote(dst)),
            };
            ctx.errln(&m)?;
            return Ok(1);
        }
        _ => {}
    }
    for f in operands {
        let node = exists(ctx, f);
        let m = match prog {
            "touch" => format!(
                "touch: cannot touch {}: {}",
                quote(f),
                if node.is_some() || super::vpath::parent_exists(&ctx.fs(), ctx.cwd(), f) {
                    ro
                } else {
                    "No such file or directory"
                }
            ),
            "mkdir" => format!(
                "mkdir: cannot create directory {}: {}",
                lquote(f),
                if node.is_some() { "File exists" } else { ro }
            ),
            "rmdir" => format!(
                "rmdir: failed to remove {}: {}",
                quote(f),
                if node.is_some() {
                    ro
                } else {
                    "No such file or directory"
                }
            ),
            "rm" => {
                let recursive = args.iter().any(|a| {
                    a.starts_with('-')
                        && !a.starts_with("--")
                        && (a.contains('r') || a.contains('R'))
                });
                let force = args
                    .iter()
                    .any(|a| a.starts_with('-') && !a.starts_with("--") && a.contains('f'));
                match node {
                    None if force => continue,
                    None => format!("rm: cannot remove {}: No such file or directory", quote(f)),
                    Some(n) if ctx.fs().is_dir(n) && !recursive => {
                        format!("rm: cannot remove {}: Is a directory", quote(f))
                    }
                    Some(n) if ctx.fs().is_dir(n) => {
                        // GNU rm -r reports every file it fails to unlink, depth first;
                        // directories left non-empty are not reported.
                        let mut files = Vec::new();
                        collect_files(&ctx.fs(), n, f.trim_end_matches('/'), &mut files);
                        for p in files {
                            ctx.errln(&format!("rm: cannot remove {}: {ro}", quote(&p)))?;
                        }
                        status = 1;
                        continue;
                    }
                    Some(_) => format!("rm: cannot remove {}: {ro}", quote(f)),
                }
            }
            "chmod" => match node {
                None => format!(
                    "chmod: cannot access {}: No such file or directory",
                    quote(f)
                ),
                Some(_) => format!("chmod: changing permissions of {}: {ro}", quote(f)),
            },
            "chown" => match node {
                None => format!(
                    "chown: cannot access {}: No such file or directory",
                    quote(f)
                ),
                Some(_) => format!("chown: changing ownership of {}: {ro}", quote(f)),
            },
            _ => format!("{prog}: cannot open {} for writing: {ro}", quote(f)),
        };
        ctx.errln(&m)?;
        status = 1;
    }
    Ok(status)
}

fn collect_files(fs: &Fs, dir: NodeId, path: &str, out: &mut Vec<String>) {
    for &c in fs.children(dir) {
        let p = format!("{path}/{}", fs.name(c));
        if fs.is_dir(c) {
            collect_files(fs, c, &p, out);
        } else {
            out.push(p);
        }
    }
}

/// Each write command: the scratch implementation when the session has a
/// scratch area, the read-only refusal otherwise.
macro_rules! write_cmd {
    ($($name:ident => $prog:literal, $imp:path);* $(;)?) => {
        $(pub(crate) fn $name(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
            if ctx.fs().writable() {
                $imp(ctx, args)
            } else {
                write_denied(ctx, $prog, args)
            }
        })*
    };
}

write_cmd!(
    touch => "touch", scratch_touch;
    mkdir => "mkdir", scratch_mkdir;
    rm => "rm", scratch_rm;
    rmdir => "rmdir", scratch_rmdir;
    cp => "cp", super::cmd_copy::cp;
    mv => "mv", super::cmd_copy::mv;
    truncate => "truncate", scratch_truncate;
    tee => "tee", scratch_tee;
    ln => "ln", not_permitted_ln;
    chmod => "chmod", not_permitted_chmod;
    chown => "chown", not_permitted_chown;
);

const EPERM: &str = "Operation not permitted";

fn not_permitted_ln(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    write_refused(ctx, "ln", args, EPERM)
}

fn not_permitted_chmod(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    write_refused(ctx, "chmod", args, EPERM)
}

fn not_permitted_chown(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    write_refused(ctx, "chown", args, EPERM)
}

/// Run `f` on the scratch area (callers check `writable()` first).
pub(crate) fn with_scratch<T>(
    ctx: &mut Ctx,
    f: impl FnOnce(&View, &mut Scratch) -> Result<T, FsErr>,
) -> Result<T, FsErr> {
    match ctx.scratch() {
        Some((view, sc)) => f(view, sc),
        None => Err(FsErr::ReadOnly),
    }
}

/// Where `path` points for a write.
pub(crate) fn target(ctx: &Ctx, path: &str) -> Result<Target, FsErr> {
    overlay::target(&ctx.fs(), ctx.cwd(), path)
}

pub(crate) fn missing_operand(ctx: &mut Ctx, prog: &str, what: &str) -> Result<i32, Abort> {
    ctx.errln(&format!(
        "{prog}: missing {what}\nTry '{prog} --help' for more information."
    ))?;
    Ok(1)
}

// ---------------------------------------------------------------- touch

const TOUCH_SPEC: Spec = Spec {
    short: "acd:fhmr:t:",
    long: &[
        ("no-create", Arg::No, "c"),
        ("date", Arg::Required, "d"),
        ("no-dereference", Arg::No, "h"),
        ("reference", Arg::Required, "r"),
        ("time", Arg::Required, "time"),
    ],
    digits: false,
};

/// Days since 1970-01-01 of a civil date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_seconds(y: i64, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> Option<i64> {
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    Some(days_from_civil(y, mo, d) * 86_400 + i64::from(h * 3600 + mi * 60 + s))
}

/// `touch -d`: `@SECONDS`, `YYYY-MM-DD`, `YYYY-MM-DD HH:MM[:SS]` (UTC).
fn parse_date(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Some(n) = s.strip_prefix('@') {
        return n.parse().ok();
    }
    let (date, time) = match s.split_once([' ', 'T']) {
        Some((d, t)) => (d, Some(t.trim())),
        None => (s, None),
    };
    let mut dp = date.splitn(3, '-');
    let y: i64 = dp.next()?.parse().ok()?;
    let mo: u32 = dp.next()?.parse().ok()?;
    let d: u32 = dp.next()?.parse().ok()?;
    let (h, mi, sec) = match time {
        None => (0, 0, 0),
        Some(t) => {
            let mut tp = t.splitn(3, ':');
            let h = tp.next()?.parse().ok()?;
            let mi = tp.next()?.parse().ok()?;
            let sec = match tp.next() {
                Some(x) => x.parse().ok()?,
                None => 0,
            };
            (h, mi, sec)
        }
    };
    civil_seconds(y, mo, d, h, mi, sec)
}

/// `touch -t [[CC]YY]MMDDhhmm[.ss]` (UTC).
fn parse_stamp(s: &str) -> Option<i64> {
    let (main, secs) = match s.split_once('.') {
        Some((m, x)) if x.len() == 2 => (m, x.parse().ok()?),
        Some(_) => return None,
        None => (s, 0),
    };
    if !main.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let num = |r: std::ops::Range<usize>| main[r].parse::<u32>().ok();
    let (y, rest) = match main.len() {
        8 => (
            super::civil_from_days(Scratch::now().div_euclid(86_400)).0,
            0,
        ),
        10 => {
            let yy = i64::from(num(0..2)?);
            (if yy < 69 { 2000 + yy } else { 1900 + yy }, 2)
        }
        12 => (i64::from(num(0..4)?), 4),
        _ => return None,
    };
    civil_seconds(
        y,
        num(rest..rest + 2)?,
        num(rest + 2..rest + 4)?,
        num(rest + 4..rest + 6)?,
        num(rest + 6..rest + 8)?,
        secs,
    )
}

fn scratch_touch(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, files) = match getopt::parse("touch", &TOUCH_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let mut no_create = false;
    let mut only_atime = false;
    let mut mtime = None;
    for (k, v) in &opts {
        let v = v.clone().unwrap_or_default();
        match k.as_str() {
            "c" => no_create = true,
            "a" => only_atime = true,
            "m" => only_atime = false,
            "time" => only_atime = matches!(v.as_str(), "atime" | "access" | "use"),
            "d" | "t" => {
                let t = if k == "d" {
                    parse_date(&v)
                } else {
                    parse_stamp(&v)
                };
                match t {
                    Some(t) => mtime = Some(t),
                    None => {
                        ctx.errln(&format!("touch: invalid date format {}", lquote(&v)))?;
                        return Ok(1);
                    }
                }
            }
            "r" => match ctx.resolve(&v) {
                Ok(n) => mtime = Some(ctx.fs().stat(n).mtime),
                Err(e) => {
                    ctx.errln(&format!(
                        "touch: failed to get attributes of {}: {}",
                        quote(&v),
                        e.msg()
                    ))?;
                    return Ok(1);
                }
            },
            _ => {}
        }
    }
    if files.is_empty() {
        return missing_operand(ctx, "touch", "file operand");
    }
    let when = mtime.unwrap_or_else(Scratch::now);
    let mut status = 0;
    for f in &files {
        let res = match target(ctx, f) {
            Ok(tg) => match tg.node {
                Some(n) if tg.slash && !ctx.fs().is_dir(n) => Err(FsErr::NotDir),
                Some(_) if only_atime => Ok(()),
                Some(n) => with_scratch(ctx, |view, sc| sc.set_mtime(view, n, when)),
                None if tg.slash => Err(FsErr::NotFound),
                None if no_create => Ok(()),
                None => with_scratch(ctx, |view, sc| {
                    let n = sc.create_file(view, tg.dir, &tg.name)?;
                    sc.set_mtime(view, n, when)
                }),
            },
            Err(e) => Err(e),
        };
        match res {
            Ok(()) => {}
            Err(FsErr::NotFound) if no_create => {}
            Err(e) => {
                let m = if f.ends_with('/') && matches!(e, FsErr::NotDir | FsErr::NotFound) {
                    format!("touch: setting times of {}: {}", quote(f), e.msg())
                } else {
                    format!("touch: cannot touch {}: {}", quote(f), e.msg())
                };
                ctx.errln(&m)?;
                status = 1;
            }
        }
    }
    Ok(status)
}

// ---------------------------------------------------------------- mkdir

const MKDIR_SPEC: Spec = Spec {
    short: "m:pvZ",
    long: &[
        ("mode", Arg::Required, "m"),
        ("parents", Arg::No, "p"),
        ("verbose", Arg::No, "v"),
        ("context", Arg::Optional, "Z"),
    ],
    digits: false,
};

fn scratch_mkdir(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, dirs) = match getopt::parse("mkdir", &MKDIR_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let parents = opts.iter().any(|(k, _)| k == "p");
    let verbose = opts.iter().any(|(k, _)| k == "v");
    if dirs.is_empty() {
        return missing_operand(ctx, "mkdir", "operand");
    }
    let mut status = 0;
    for d in &dirs {
        let res = if parents {
            mkdir_parents(ctx, d, verbose)?
        } else {
            match target(ctx, d) {
                Ok(Target { node: Some(_), .. }) => Err((d.clone(), FsErr::Exists)),
                Ok(tg) => match with_scratch(ctx, |view, sc| sc.mkdir(view, tg.dir, &tg.name)) {
                    Ok(_) => {
                        if verbose {
                            ctx.outs(&format!("mkdir: created directory {}\n", quote(d)))?;
                        }
                        Ok(())
                    }
                    Err(e) => Err((d.clone(), e)),
                },
                Err(e) => Err((d.clone(), e)),
            }
        };
        if let Err((shown, e)) = res {
            ctx.errln(&format!(
                "mkdir: cannot create directory {}: {}",
                lquote(&shown),
                e.msg()
            ))?;
            status = 1;
        }
    }
    Ok(status)
}

/// `mkdir -p`: create each missing component; an error names the component.
fn mkdir_parents(
    ctx: &mut Ctx,
    path: &str,
    verbose: bool,
) -> Result<Result<(), (String, FsErr)>, Abort> {
    if path.is_empty() {
        return Ok(Err((String::new(), FsErr::NotFound)));
    }
    let mut cur = if path.starts_with('/') {
        ROOT
    } else {
        ctx.cwd()
    };
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut shown = if path.starts_with('/') {
        String::from("/")
    } else {
        String::new()
    };
    for (i, comp) in comps.iter().enumerate() {
        if !shown.is_empty() && !shown.ends_with('/') {
            shown.push('/');
        }
        shown.push_str(comp);
        let last = i + 1 == comps.len();
        let fs = ctx.fs();
        let next = match *comp {
            "." => Some(cur),
            ".." => Some(fs.parent(cur)),
            name => fs.child(cur, name),
        };
        match next {
            Some(n) if fs.is_dir(n) => cur = n,
            Some(_) => {
                let e = if last { FsErr::Exists } else { FsErr::NotDir };
                return Ok(Err((shown, e)));
            }
            None => match with_scratch(ctx, |view, sc| sc.mkdir(view, cur, comp)) {
                Ok(n) => {
                    cur = n;
                    if verbose {
                        ctx.outs(&format!("mkdir: created directory {}\n", quote(&shown)))?;
                    }
                }
                Err(e) => return Ok(Err((shown, e))),
            },
        }
    }
    Ok(Ok(()))
}

// ---------------------------------------------------------------- rmdir

const RMDIR_SPEC: Spec = Spec {
    short: "pv",
    long: &[
        ("ignore-fail-on-non-empty", Arg::No, "ignore"),
        ("parents", Arg::No, "p"),
        ("verbose", Arg::No, "v"),
    ],
    digits: false,
};

fn rmdir_one(ctx: &mut Ctx, path: &str, ignore_nonempty: bool) -> Result<(), FsErr> {
    let tg = target(ctx, path)?;
    let Some(n) = tg.node else {
        return Err(FsErr::NotFound);
    };
    let fs = ctx.fs();
    if !fs.is_dir(n) {
        return Err(FsErr::NotDir);
    }
    if tg.name == "." {
        return Err(FsErr::Invalid);
    }
    if n == ROOT {
        return Err(FsErr::Busy);
    }
    if tg.name == ".." || !fs.children(n).is_empty() {
        return if ignore_nonempty {
            Ok(())
        } else {
            Err(FsErr::NotEmpty)
        };
    }
    with_scratch(ctx, |view, sc| sc.remove(view, n))
}

fn scratch_rmdir(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, dirs) = match getopt::parse("rmdir", &RMDIR_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let parents = opts.iter().any(|(k, _)| k == "p");
    let verbose = opts.iter().any(|(k, _)| k == "v");
    let ignore = opts.iter().any(|(k, _)| k == "ignore");
    if dirs.is_empty() {
        return missing_operand(ctx, "rmdir", "operand");
    }
    let mut status = 0;
    for d in &dirs {
        let mut path = d.clone();
        loop {
            if verbose {
                ctx.outs(&format!("rmdir: removing directory, {}\n", quote(&path)))?;
            }
            if let Err(e) = rmdir_one(ctx, &path, ignore) {
                ctx.errln(&format!(
                    "rmdir: failed to remove {}: {}",
                    quote(&path),
                    e.msg()
                ))?;
                status = 1;
                break;
            }
            if !parents {
                break;
            }
            // `rmdir -p a/b/c` then removes a/b and a.
            let trimmed = path.trim_end_matches('/');
            match trimmed.rfind('/') {
                Some(i) if !trimmed[..i].trim_end_matches('/').is_empty() => {
                    path = trimmed[..i].trim_end_matches('/').to_string();
                }
                _ => break,
            }
        }
    }
    Ok(status)
}

// ---------------------------------------------------------------- rm

const RM_SPEC: Spec = Spec {
    short: "dfrRv",
    long: &[
        ("dir", Arg::No, "d"),
        ("force", Arg::No, "f"),
        ("recursive", Arg::No, "r"),
        ("verbose", Arg::No, "v"),
        ("no-preserve-root", Arg::No, "no-preserve-root"),
        ("preserve-root", Arg::Optional, "preserve-root"),
        ("one-file-system", Arg::No, "one-file-system"),
    ],
    digits: false,
};

struct RmOpts {
    force: bool,
    recursive: bool,
    dir: bool,
    verbose: bool,
}

fn scratch_rm(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, files) = match getopt::parse("rm", &RM_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let mut o = RmOpts {
        force: false,
        recursive: false,
        dir: false,
        verbose: false,
    };
    let mut preserve_root = true;
    for (k, _) in &opts {
        match k.as_str() {
            "f" => o.force = true,
            "r" | "R" => o.recursive = true,
            "d" => o.dir = true,
            "v" => o.verbose = true,
            "no-preserve-root" => preserve_root = false,
            "preserve-root" => preserve_root = true,
            _ => {}
        }
    }
    if files.is_empty() {
        if o.force {
            return Ok(0);
        }
        return missing_operand(ctx, "rm", "operand");
    }
    let mut status = 0;
    for f in &files {
        let trimmed = f.trim_end_matches('/');
        let last = trimmed.rsplit('/').next().unwrap_or("");
        if matches!(last, "." | "..") {
            ctx.errln(&format!(
                "rm: refusing to remove '.' or '..' directory: skipping {}",
                quote(f)
            ))?;
            status = 1;
            continue;
        }
        let tg = match target(ctx, f) {
            Ok(tg) => tg,
            Err(FsErr::NotFound) if o.force => continue,
            Err(e) => {
                ctx.errln(&format!("rm: cannot remove {}: {}", quote(f), e.msg()))?;
                status = 1;
                continue;
            }
        };
        let Some(n) = tg.node else {
            if !o.force {
                ctx.errln(&format!(
                    "rm: cannot remove {}: No such file or directory",
                    quote(f)
                ))?;
                status = 1;
            }
            continue;
        };
        if n == ROOT && o.recursive && preserve_root {
            ctx.errln(&format!(
                "rm: it is dangerous to operate recursively on {}\nrm: use --no-preserve-root to override this failsafe",
                quote(f)
            ))?;
            status = 1;
            continue;
        }
        let is_dir = ctx.fs().is_dir(n);
        if tg.slash && !is_dir {
            ctx.errln(&format!("rm: cannot remove {}: Not a directory", quote(f)))?;
            status = 1;
            continue;
        }
        if is_dir && !o.recursive {
            let why = if !o.dir {
                Some(FsErr::IsDir)
            } else if !ctx.fs().children(n).is_empty() {
                Some(FsErr::NotEmpty)
            } else {
                None
            };
            if let Some(why) = why {
                ctx.errln(&format!("rm: cannot remove {}: {}", quote(f), why.msg()))?;
                status = 1;
                continue;
            }
        }
        if !rm_tree(ctx, &o, n, f)? {
            status = 1;
        }
    }
    Ok(status)
}

/// Remove `n` (shown as `shown`), depth first, reporting like `rm -v`.
fn rm_tree(ctx: &mut Ctx, o: &RmOpts, n: NodeId, shown: &str) -> Result<bool, Abort> {
    ctx.check()?;
    let fs = ctx.fs();
    let is_dir = fs.is_dir(n);
    if is_dir && (o.verbose || n == ROOT) {
        let kids: Vec<(NodeId, String)> = fs
            .children(n)
            .iter()
            .map(|c| (*c, fs.name(*c).to_string()))
            .collect();
        let base = shown.trim_end_matches('/');
        let mut ok = true;
        for (c, name) in kids {
            ok &= rm_tree(ctx, o, c, &format!("{base}/{name}"))?;
        }
        if n == ROOT {
            // --no-preserve-root empties the root; the root itself stays.
            ctx.errln(&format!(
                "rm: cannot remove {}: {}",
                quote(shown),
                FsErr::Busy.msg()
            ))?;
            return Ok(false);
        }
        if !ok {
            return Ok(false);
        }
    }
    match with_scratch(ctx, |view, sc| sc.remove(view, n)) {
        Ok(()) => {
            if o.verbose {
                let what = if is_dir {
                    "removed directory"
                } else {
                    "removed"
                };
                ctx.outs(&format!("{what} {}\n", quote(shown)))?;
            }
            Ok(true)
        }
        Err(e) => {
            ctx.errln(&format!("rm: cannot remove {}: {}", quote(shown), e.msg()))?;
            Ok(false)
        }
    }
}

// ---------------------------------------------------------------- tee

const TEE_SPEC: Spec = Spec {
    short: "aip",
    long: &[
        ("append", Arg::No, "a"),
        ("ignore-interrupts", Arg::No, "i"),
        ("output-error", Arg::Optional, "p"),
    ],
    digits: false,
};

/// Open `f` for writing in the scratch area (create, or truncate unless `append`).
pub(crate) fn open_file(ctx: &mut Ctx, f: &str, append: bool) -> Result<NodeId, FsErr> {
    let tg = target(ctx, f)?;
    if tg.slash || tg.node.is_some_and(|n| ctx.fs().is_dir(n)) {
        return Err(FsErr::IsDir);
    }
    with_scratch(ctx, |view, sc| match tg.node {
        Some(n) if append => Ok(n),
        Some(n) => sc.write(view, n, &[], false).map(|()| n),
        None => sc.create_file(view, tg.dir, &tg.name),
    })
}

/// Replace the content of file `f` (created if needed) with `data`. The error
/// says whether the file was opened (a write error) or not (an open error).
pub(crate) fn write_file(ctx: &mut Ctx, f: &str, data: &[u8]) -> Result<(), (bool, FsErr)> {
    let n = open_file(ctx, f, false).map_err(|e| (false, e))?;
    with_scratch(ctx, |view, sc| sc.write(view, n, data, true)).map_err(|e| (true, e))
}

fn scratch_tee(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, files) = match getopt::parse("tee", &TEE_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let append = opts.iter().any(|(k, _)| k == "a");
    let mut status = 0;
    // Open every file first (as tee does), then copy standard input.
    let mut open = Vec::new();
    for f in &files {
        if f == "/dev/null" {
            continue;
        }
        match open_file(ctx, f, append) {
            Ok(n) => open.push((f, n)),
            Err(e) => {
                ctx.errln(&format!("tee: {}: {}", quotef(f), e.msg()))?;
                status = 1;
            }
        }
    }
    let data = ctx.take_stdin();
    for (f, n) in open {
        match with_scratch(ctx, |view, sc| sc.write(view, n, &data, true)) {
            Ok(()) | Err(FsErr::IsDir) | Err(FsErr::NotFound) => {}
            Err(e) => {
                ctx.errln(&format!("tee: {}: {}", quotef(f), e.msg()))?;
                status = 1;
            }
        }
    }
    ctx.out(&data)?;
    Ok(status)
}

// ---------------------------------------------------------------- truncate

const TRUNCATE_SPEC: Spec = Spec {
    short: "cor:s:",
    long: &[
        ("no-create", Arg::No, "c"),
        ("io-blocks", Arg::No, "o"),
        ("reference", Arg::Required, "r"),
        ("size", Arg::Required, "s"),
    ],
    digits: false,
};

/// `truncate -s`: `[+-<>/%]N[K|M|G|KB|MB|GB]` as (operator, bytes).
fn parse_size(s: &str) -> Option<(char, u64)> {
    let (op, rest) = match s.chars().next()? {
        c @ ('+' | '-' | '<' | '>' | '/' | '%') => (c, &s[1..]),
        _ => ('=', s),
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let n: u64 = rest[..digits].parse().ok()?;
    let mult: u64 = match &rest[digits..] {
        "" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "KB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    Some((op, n.checked_mul(mult)?))
}

fn scratch_truncate(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, files) = match getopt::parse("truncate", &TRUNCATE_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let no_create = opts.iter().any(|(k, _)| k == "c");
    let mut size = None;
    for (k, v) in &opts {
        let v = v.clone().unwrap_or_default();
        match k.as_str() {
            "s" => match parse_size(&v) {
                Some(x) => size = Some(x),
                None => {
                    ctx.errln(&format!("truncate: Invalid number: {}", lquote(&v)))?;
                    return Ok(1);
                }
            },
            "r" => match ctx.resolve(&v) {
                Ok(n) => size = Some(('=', ctx.fs().size(n))),
                Err(e) => {
                    ctx.errln(&format!("truncate: cannot stat {}: {}", quote(&v), e.msg()))?;
                    return Ok(1);
                }
            },
            _ => {}
        }
    }
    let Some((op, n)) = size else {
        ctx.errln(&format!(
            "truncate: you must specify either {} or {}\nTry 'truncate --help' for more information.",
            lquote("--size"),
            lquote("--reference")
        ))?;
        return Ok(1);
    };
    if files.is_empty() {
        return missing_operand(ctx, "truncate", "file operand");
    }
    let mut status = 0;
    for f in &files {
        let node = match target(ctx, f) {
            Ok(tg) => match tg.node {
                Some(x) if ctx.fs().is_dir(x) => Err(FsErr::IsDir),
                Some(x) => Ok(Some(x)),
                None if tg.slash => Err(FsErr::IsDir),
                None if no_create => Ok(None),
                None => {
                    with_scratch(ctx, |view, sc| sc.create_file(view, tg.dir, &tg.name)).map(Some)
                }
            },
            Err(e) => Err(e),
        };
        let res = match node {
            Ok(Some(node)) => {
                let cur = ctx.fs().size(node);
                let want = match op {
                    '+' => cur.saturating_add(n),
                    '-' => cur.saturating_sub(n),
                    '<' => cur.min(n),
                    '>' => cur.max(n),
                    '/' if n > 0 => cur / n * n,
                    '%' if n > 0 => cur.div_ceil(n) * n,
                    '/' | '%' => cur,
                    _ => n,
                };
                resize(ctx, node, cur, want)
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = res {
            ctx.errln(&format!(
                "truncate: cannot open {} for writing: {}",
                quote(f),
                e.msg()
            ))?;
            status = 1;
        }
    }
    Ok(status)
}

fn resize(ctx: &mut Ctx, node: NodeId, cur: u64, want: u64) -> Result<(), FsErr> {
    if want == cur {
        return Ok(());
    }
    let usage = ctx.scratch().map(|(_, sc)| sc.usage());
    if let Some(u) = usage {
        // Refuse before allocating what cannot be stored anyway.
        if want > cur && u.bytes - cur.min(u.bytes) + want > u.limits.max_bytes {
            return Err(FsErr::NoSpace);
        }
    }
    let mut data = ctx.fs().read(node)?;
    data.resize(usize::try_from(want).map_err(|_| FsErr::NoSpace)?, 0);
    with_scratch(ctx, |view, sc| sc.write(view, node, &data, false))
}
