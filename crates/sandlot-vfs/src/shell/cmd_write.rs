//! Commands that would modify the tree: they fail the way GNU coreutils do
//! on a read-only mount.

use super::cmd_files::lquote;
use super::exec::{Abort, Ctx};
use super::vpath::{quote, quotef};

/// Commands that would modify the tree: they fail the way GNU coreutils do on
/// a read-only mount.
pub(crate) fn write_denied(ctx: &mut Ctx, prog: &str, args: &[String]) -> Result<i32, Abort> {
    let ops: Vec<&String> = args
        .iter()
        .filter(|a| !a.starts_with('-') || a.as_str() == "-")
        .collect();
    let exists = |ctx: &Ctx, p: &str| ctx.resolve(p).ok();
    let ro = "Read-only file system";
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
                if node.is_some() || super::vpath::parent_exists(ctx.tree(), ctx.cwd(), f) {
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
                    Some(n) if ctx.tree().is_dir(n) && !recursive => {
                        format!("rm: cannot remove {}: Is a directory", quote(f))
                    }
                    Some(n) if ctx.tree().is_dir(n) => {
                        // GNU rm -r reports every file it fails to unlink, depth first;
                        // directories left non-empty are not reported.
                        let mut files = Vec::new();
                        collect_files(ctx.tree(), n, f.trim_end_matches('/'), &mut files);
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

fn collect_files(
    tree: &crate::manifest::Tree,
    dir: crate::manifest::NodeId,
    path: &str,
    out: &mut Vec<String>,
) {
    for &c in tree.children(dir) {
        let p = format!("{path}/{}", tree.node(c).name);
        if tree.is_dir(c) {
            collect_files(tree, c, &p, out);
        } else {
            out.push(p);
        }
    }
}

macro_rules! denied {
    ($($name:ident => $prog:literal),* $(,)?) => {
        $(pub(crate) fn $name(ctx: &mut Ctx, args: &[String]) -> Result<i32, Abort> {
            write_denied(ctx, $prog, args)
        })*
    };
}

denied!(touch => "touch", mkdir => "mkdir", rm => "rm", rmdir => "rmdir", cp => "cp", mv => "mv", ln => "ln",
    chmod => "chmod", chown => "chown", truncate => "truncate", tee => "tee");
