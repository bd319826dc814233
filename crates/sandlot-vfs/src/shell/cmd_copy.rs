//! `cp` and `mv` in a session's scratch area (GNU coreutils 9.1 behaviour and
//! diagnostics). Only called when the session has a scratch area.

use super::cmd_files::usage_error;
use super::cmd_write::{missing_operand, target, with_scratch};
use super::exec::{Abort, Ctx};
use super::getopt::{self, Arg, Spec};
use super::vpath::{quote, FsErr};
use crate::manifest::{NodeId, ROOT};

/// `DIR/NAME` the way GNU joins a target directory and a source's base name.
fn join(dir: &str, base: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{base}")
    } else {
        format!("{dir}/{base}")
    }
}

fn base_name(path: &str) -> &str {
    let t = path.trim_end_matches('/');
    if t.is_empty() {
        return "/";
    }
    t.rsplit('/').next().unwrap_or(t)
}

/// The (source, destination) pairs of a `cp`/`mv` command line, or the exit
/// status after a diagnostic.
fn plan(
    ctx: &mut Ctx,
    prog: &str,
    operands: &[String],
    target_dir: Option<&str>,
    no_target_dir: bool,
) -> Result<Result<Vec<(String, String)>, i32>, Abort> {
    let as_dir = |ctx: &Ctx, t: &str| -> Result<(), FsErr> {
        let n = ctx.resolve(t)?;
        if ctx.fs().is_dir(n) {
            Ok(())
        } else {
            Err(FsErr::NotDir)
        }
    };
    if let Some(t) = target_dir {
        if operands.is_empty() {
            return missing_operand(ctx, prog, "file operand").map(Err);
        }
        if let Err(e) = as_dir(ctx, t) {
            ctx.errln(&format!(
                "{prog}: target directory {}: {}",
                quote(t),
                e.msg()
            ))?;
            return Ok(Err(1));
        }
        return Ok(Ok(operands
            .iter()
            .map(|s| (s.clone(), join(t, base_name(s))))
            .collect()));
    }
    match operands {
        [] => return missing_operand(ctx, prog, "file operand").map(Err),
        [one] => {
            ctx.errln(&format!(
                "{prog}: missing destination file operand after {}\nTry '{prog} --help' for more information.",
                quote(one)
            ))?;
            return Ok(Err(1));
        }
        _ => {}
    }
    let (dest, sources) = operands.split_last().expect("two or more operands");
    if no_target_dir {
        if sources.len() > 1 {
            ctx.errln(&format!(
                "{prog}: extra operand {}\nTry '{prog} --help' for more information.",
                quote(dest)
            ))?;
            return Ok(Err(1));
        }
        return Ok(Ok(vec![(sources[0].clone(), dest.clone())]));
    }
    if sources.len() > 1 {
        if let Err(e) = as_dir(ctx, dest) {
            ctx.errln(&format!("{prog}: target {}: {}", quote(dest), e.msg()))?;
            return Ok(Err(1));
        }
    }
    let into = as_dir(ctx, dest).is_ok();
    Ok(Ok(sources
        .iter()
        .map(|s| {
            let d = if into {
                join(dest, base_name(s))
            } else {
                dest.clone()
            };
            (s.clone(), d)
        })
        .collect()))
}

// ---------------------------------------------------------------- cp

const CP_SPEC: Spec = Spec {
    short: "adfHLnPpRrt:Tuvx",
    long: &[
        ("archive", Arg::No, "a"),
        ("force", Arg::No, "f"),
        ("dereference", Arg::No, "L"),
        ("no-dereference", Arg::No, "P"),
        ("no-clobber", Arg::No, "n"),
        ("preserve", Arg::Optional, "p"),
        ("recursive", Arg::No, "r"),
        ("target-directory", Arg::Required, "t"),
        ("no-target-directory", Arg::No, "T"),
        ("update", Arg::Optional, "u"),
        ("verbose", Arg::No, "v"),
        ("one-file-system", Arg::No, "x"),
    ],
    digits: false,
};

struct CpOpts {
    recursive: bool,
    no_clobber: bool,
    preserve: bool,
    update: bool,
    verbose: bool,
}

pub(crate) fn cp(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, operands) = match getopt::parse("cp", &CP_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let mut o = CpOpts {
        recursive: false,
        no_clobber: false,
        preserve: false,
        update: false,
        verbose: false,
    };
    let mut target_dir = None;
    let mut no_target = false;
    for (k, v) in &opts {
        match k.as_str() {
            "a" => {
                o.recursive = true;
                o.preserve = true;
            }
            "r" | "R" => o.recursive = true,
            "n" => o.no_clobber = true,
            "f" => o.no_clobber = false,
            "p" => o.preserve = true,
            "u" => o.update = true,
            "v" => o.verbose = true,
            "t" => target_dir = v.clone(),
            "T" => no_target = true,
            _ => {}
        }
    }
    let pairs = match plan(ctx, "cp", &operands, target_dir.as_deref(), no_target)? {
        Ok(p) => p,
        Err(status) => return Ok(status),
    };
    let mut status = 0;
    for (src, dst) in pairs {
        let s = match ctx.resolve(&src) {
            Ok(n) => n,
            Err(e) => {
                ctx.errln(&format!("cp: cannot stat {}: {}", quote(&src), e.msg()))?;
                status = 1;
                continue;
            }
        };
        let tg = match target(ctx, &dst) {
            Ok(tg) if tg.slash && tg.node.is_some_and(|n| !ctx.fs().is_dir(n)) => {
                Err(FsErr::NotDir)
            }
            Ok(tg) if tg.slash && tg.node.is_none() && !ctx.fs().is_dir(s) => {
                ctx.errln(&format!(
                    "cp: cannot create regular file {}: Not a directory",
                    quote(&dst)
                ))?;
                status = 1;
                continue;
            }
            other => other,
        };
        let tg = match tg {
            Ok(tg) => tg,
            Err(FsErr::NotFound) => {
                let what = if ctx.fs().is_dir(s) {
                    "directory"
                } else {
                    "regular file"
                };
                ctx.errln(&format!(
                    "cp: cannot create {what} {}: No such file or directory",
                    quote(&dst)
                ))?;
                status = 1;
                continue;
            }
            Err(e) => {
                ctx.errln(&format!("cp: cannot stat {}: {}", quote(&dst), e.msg()))?;
                status = 1;
                continue;
            }
        };
        if !copy(ctx, &o, s, &src, tg.dir, &tg.name, &dst, tg.node)? {
            status = 1;
        }
    }
    Ok(status)
}

/// Copy node `s` (shown as `sl`) to `name` in `dir` (shown as `dl`), which is
/// `existing` if it exists. Returns whether everything was copied.
#[allow(clippy::too_many_arguments)]
fn copy(
    ctx: &mut Ctx,
    o: &CpOpts,
    s: NodeId,
    sl: &str,
    dir: NodeId,
    name: &str,
    dl: &str,
    existing: Option<NodeId>,
) -> Result<bool, Abort> {
    ctx.check()?;
    let fs = ctx.fs();
    let src_mtime = fs.stat(s).mtime;
    if fs.is_dir(s) {
        if !o.recursive {
            ctx.errln(&format!(
                "cp: -r not specified; omitting directory {}",
                quote(sl)
            ))?;
            return Ok(false);
        }
        if let Some(d) = existing {
            if !fs.is_dir(d) {
                ctx.errln(&format!(
                    "cp: cannot overwrite non-directory {} with directory {}",
                    quote(dl),
                    quote(sl)
                ))?;
                return Ok(false);
            }
        }
        if fs.is_ancestor(s, dir) || existing == Some(s) {
            ctx.errln(&format!(
                "cp: cannot copy a directory, {}, into itself, {}",
                quote(sl),
                quote(dl)
            ))?;
            return Ok(false);
        }
        let kids: Vec<(NodeId, String)> = fs
            .children(s)
            .iter()
            .map(|c| (*c, fs.name(*c).to_string()))
            .collect();
        let d = match existing {
            Some(d) => d,
            None => match with_scratch(ctx, |view, sc| sc.mkdir(view, dir, name)) {
                Ok(d) => {
                    if o.verbose {
                        ctx.outs(&format!("{} -> {}\n", quote(sl), quote(dl)))?;
                    }
                    d
                }
                Err(e) => {
                    ctx.errln(&format!(
                        "cp: cannot create directory {}: {}",
                        quote(dl),
                        e.msg()
                    ))?;
                    return Ok(false);
                }
            },
        };
        let mut ok = true;
        for (c, cname) in kids {
            let ex = ctx.fs().child(d, &cname);
            ok &= copy(
                ctx,
                o,
                c,
                &join(sl, &cname),
                d,
                &cname,
                &join(dl, &cname),
                ex,
            )?;
        }
        if o.preserve {
            let _ = with_scratch(ctx, |view, sc| sc.set_mtime(view, d, src_mtime));
        }
        return Ok(ok);
    }
    let d = match existing {
        Some(d) if d == s => {
            ctx.errln(&format!(
                "cp: {} and {} are the same file",
                quote(sl),
                quote(dl)
            ))?;
            return Ok(false);
        }
        Some(d) if fs.is_dir(d) => {
            ctx.errln(&format!(
                "cp: cannot overwrite directory {} with non-directory",
                quote(dl)
            ))?;
            return Ok(false);
        }
        Some(_) if o.no_clobber => return Ok(true),
        Some(d) if o.update && fs.stat(d).mtime >= src_mtime => return Ok(true),
        Some(d) => d,
        None => match with_scratch(ctx, |view, sc| sc.create_file(view, dir, name)) {
            Ok(d) => d,
            Err(e) => {
                ctx.errln(&format!(
                    "cp: cannot create regular file {}: {}",
                    quote(dl),
                    e.msg()
                ))?;
                return Ok(false);
            }
        },
    };
    if let Err(e) = with_scratch(ctx, |view, sc| sc.copy_content(view, s, d)) {
        ctx.errln(&format!("cp: error writing {}: {}", quote(dl), e.msg()))?;
        return Ok(false);
    }
    if o.preserve {
        let _ = with_scratch(ctx, |view, sc| sc.set_mtime(view, d, src_mtime));
    }
    if o.verbose {
        ctx.outs(&format!("{} -> {}\n", quote(sl), quote(dl)))?;
    }
    Ok(true)
}

// ---------------------------------------------------------------- mv

const MV_SPEC: Spec = Spec {
    short: "fnt:Tuv",
    long: &[
        ("force", Arg::No, "f"),
        ("no-clobber", Arg::No, "n"),
        ("target-directory", Arg::Required, "t"),
        ("no-target-directory", Arg::No, "T"),
        ("update", Arg::Optional, "u"),
        ("verbose", Arg::No, "v"),
    ],
    digits: false,
};

pub(crate) fn mv(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
    let (opts, operands) = match getopt::parse("mv", &MV_SPEC, args) {
        Ok(x) => x,
        Err(m) => return usage_error(ctx, &m, 1),
    };
    let (mut no_clobber, mut update, mut verbose, mut no_target) = (false, false, false, false);
    let mut target_dir = None;
    for (k, v) in &opts {
        match k.as_str() {
            "n" => no_clobber = true,
            "f" => no_clobber = false,
            "u" => update = true,
            "v" => verbose = true,
            "t" => target_dir = v.clone(),
            "T" => no_target = true,
            _ => {}
        }
    }
    let pairs = match plan(ctx, "mv", &operands, target_dir.as_deref(), no_target)? {
        Ok(p) => p,
        Err(status) => return Ok(status),
    };
    let mut status = 0;
    for (src, dst) in pairs {
        let cannot =
            |why: &str| format!("mv: cannot move {} to {}: {why}", quote(&src), quote(&dst));
        let s = match ctx.resolve(&src) {
            Ok(n) => n,
            Err(e) => {
                ctx.errln(&format!("mv: cannot stat {}: {}", quote(&src), e.msg()))?;
                status = 1;
                continue;
            }
        };
        if s == ROOT || matches!(base_name(&src), "." | "..") {
            ctx.errln(&cannot(FsErr::Busy.msg()))?;
            status = 1;
            continue;
        }
        let tg = match target(ctx, &dst) {
            Ok(tg) => tg,
            Err(e) => {
                ctx.errln(&cannot(e.msg()))?;
                status = 1;
                continue;
            }
        };
        let fs = ctx.fs();
        let src_dir = fs.is_dir(s);
        if tg.slash && !src_dir && tg.node.is_none_or(|n| !fs.is_dir(n)) {
            ctx.errln(&cannot(FsErr::NotDir.msg()))?;
            status = 1;
            continue;
        }
        if tg.node == Some(s) {
            ctx.errln(&format!(
                "mv: {} and {} are the same file",
                quote(&src),
                quote(&dst)
            ))?;
            status = 1;
            continue;
        }
        if src_dir && fs.is_ancestor(s, tg.dir) {
            ctx.errln(&format!(
                "mv: cannot move {} to a subdirectory of itself, {}",
                quote(&src),
                quote(&dst)
            ))?;
            status = 1;
            continue;
        }
        if let Some(d) = tg.node {
            let dst_dir = fs.is_dir(d);
            let msg = if src_dir && !dst_dir {
                Some(format!(
                    "mv: cannot overwrite non-directory {} with directory {}",
                    quote(&dst),
                    quote(&src)
                ))
            } else if !src_dir && dst_dir {
                Some(format!(
                    "mv: cannot overwrite directory {} with non-directory",
                    quote(&dst)
                ))
            } else if src_dir && !fs.children(d).is_empty() {
                Some(cannot(FsErr::NotEmpty.msg()))
            } else {
                None
            };
            if let Some(m) = msg {
                ctx.errln(&m)?;
                status = 1;
                continue;
            }
            if no_clobber || (update && fs.stat(d).mtime >= fs.stat(s).mtime) {
                continue;
            }
            if let Err(e) = with_scratch(ctx, |view, sc| sc.remove(view, d)) {
                ctx.errln(&cannot(e.msg()))?;
                status = 1;
                continue;
            }
        }
        match with_scratch(ctx, |view, sc| sc.rename(view, s, tg.dir, &tg.name)) {
            Ok(()) => {
                if verbose {
                    ctx.outs(&format!("renamed {} -> {}\n", quote(&src), quote(&dst)))?;
                }
            }
            Err(e) => {
                ctx.errln(&cannot(e.msg()))?;
                status = 1;
            }
        }
    }
    Ok(status)
}
