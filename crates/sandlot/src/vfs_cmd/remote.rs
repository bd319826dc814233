//! `sandlot vfs ...` through the daemon.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use bytes::Bytes;
use sandlot_client::vfs::{
    CollectionView, CreateCollection, IngestAnswer, IngestCollection, OpenSession, UploadFormat,
    VfsAcl, VfsAclRule, VfsSource,
};
use sandlot_client::Client;

use super::{print_audit, print_ingest, print_run, PrincipalArgs, ScratchArgs, SourceArgs, VfsCmd};
use crate::api_cmd::client_cmds::{file_stream, tar_stream};

/// What `--from` means through the daemon.
#[derive(Debug, PartialEq)]
enum Plan {
    /// A daemon-side source (JSON).
    Server(VfsSource),
    /// Upload these files (relative paths) under `root` as a tar archive.
    Tar { root: PathBuf, files: Vec<String> },
    /// Upload a JSONL export.
    Jsonl(PathBuf),
}

fn acl_of(a: &SourceArgs) -> anyhow::Result<VfsAcl> {
    sandlot_vfs::Acl::parse(&a.default_acl).map_err(anyhow::Error::msg)?;
    let mut rules = Vec::new();
    for r in &a.acl {
        let rule = sandlot_vfs::AclRule::parse(r).map_err(anyhow::Error::msg)?;
        let (_, acl) = r.rsplit_once('=').unwrap_or(("", ""));
        rules.push(VfsAclRule {
            pattern: rule.pattern,
            acl: acl.to_string(),
        });
    }
    Ok(VfsAcl {
        default: Some(a.default_acl.clone()),
        rules,
    })
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// Every regular file under `root` (sorted; `.git` and symbolic links left out).
fn walk(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for e in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
            let e = e.with_context(|| format!("read {}", dir.display()))?;
            let name = e.file_name();
            let r = rel.join(&name);
            let ft = e.file_type()?;
            if ft.is_dir() {
                if name != ".git" {
                    stack.push(r);
                }
            } else if ft.is_file() {
                match r.to_str() {
                    Some(s) => out.push(s.to_string()),
                    None => eprintln!("sandlot: skipped {}: not UTF-8", r.display()),
                }
            } else if ft.is_symlink() {
                eprintln!("sandlot: skipped {}: symbolic link", r.display());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The tracked files of a git work tree that exist on disk.
fn git_files(root: &Path) -> anyhow::Result<Vec<String>> {
    let o = std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output()
        .context("run git ls-files")?;
    if !o.status.success() {
        bail!(
            "git ls-files in {}: {}",
            root.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let mut files = Vec::new();
    for f in o.stdout.split(|&b| b == 0).filter(|f| !f.is_empty()) {
        let f = String::from_utf8(f.to_vec()).context("git ls-files: a path is not UTF-8")?;
        if std::fs::symlink_metadata(root.join(&f)).is_ok_and(|m| m.is_file()) {
            files.push(f);
        }
    }
    files.sort();
    Ok(files)
}

fn plan(a: &SourceArgs) -> anyhow::Result<Option<Plan>> {
    let Some(spec) = &a.from else { return Ok(None) };
    if let Some(rest) = spec.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let Some(endpoint) = a.s3_endpoint.clone() else {
            bail!(
                "an s3:// source through the daemon needs --s3-endpoint (one the operator allows)"
            )
        };
        return Ok(Some(Plan::Server(VfsSource::S3 {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            endpoint,
            region: a.s3_region.clone().or_else(|| env("AWS_REGION")),
            access_key_id: env("AWS_ACCESS_KEY_ID"),
            secret_access_key: env("AWS_SECRET_ACCESS_KEY"),
            session_token: env("AWS_SESSION_TOKEN"),
        })));
    }
    let (kind, path) = if let Some(p) = spec.strip_prefix("git:") {
        ("git", p)
    } else if let Some(p) = spec.strip_prefix("jsonl:") {
        ("jsonl", p)
    } else if spec.contains("://") {
        bail!("--from {spec:?}: unknown scheme (expected DIR, git:DIR, jsonl:FILE or s3://bucket/prefix)")
    } else {
        ("dir", spec.as_str())
    };
    if a.server_side {
        let path = path.to_string();
        return Ok(Some(Plan::Server(match kind {
            "git" => VfsSource::Git { path },
            "jsonl" => VfsSource::Jsonl { path },
            _ => VfsSource::Dir { path },
        })));
    }
    let p = PathBuf::from(path);
    Ok(Some(match kind {
        "jsonl" => Plan::Jsonl(p),
        "git" => Plan::Tar {
            files: git_files(&p)?,
            root: p,
        },
        _ => {
            if !p.is_dir() {
                bail!("--from {}: not a directory", p.display());
            }
            Plan::Tar {
                files: walk(&p)?,
                root: p,
            }
        }
    }))
}

/// A tar archive of `files` under `root`, built in a thread and streamed.
fn tar_of_files(
    root: PathBuf,
    files: Vec<String>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static {
    tar_stream(move |b| {
        for f in &files {
            let p = root.join(f);
            b.append_path_with_name(&p, f)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
        }
        Ok(())
    })
}

async fn upload(
    c: &Client,
    name: &str,
    plan: Plan,
    acl: Option<&VfsAcl>,
    create: bool,
) -> anyhow::Result<IngestAnswer> {
    let empty = VfsAcl::default();
    Ok(match plan {
        Plan::Server(source) if create => {
            c.create_collection(&CreateCollection {
                name: name.to_string(),
                source,
                acl: acl.cloned(),
            })
            .await?
        }
        Plan::Server(source) => {
            c.ingest_collection(
                name,
                &IngestCollection {
                    source: Some(source),
                    acl: acl.cloned(),
                },
            )
            .await?
        }
        Plan::Tar { root, files } => {
            let s = tar_of_files(root, files);
            if create {
                c.create_collection_upload(name, UploadFormat::Tar, acl.unwrap_or(&empty), s)
                    .await?
            } else {
                c.ingest_collection_upload(name, UploadFormat::Tar, acl, s)
                    .await?
            }
        }
        Plan::Jsonl(p) => {
            let f = tokio::fs::File::open(&p)
                .await
                .with_context(|| format!("open {}", p.display()))?;
            let s = file_stream(f);
            if create {
                c.create_collection_upload(name, UploadFormat::Jsonl, acl.unwrap_or(&empty), s)
                    .await?
            } else {
                c.ingest_collection_upload(name, UploadFormat::Jsonl, acl, s)
                    .await?
            }
        }
    })
}

fn print_answer(a: &IngestAnswer, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(a)?);
        return Ok(());
    }
    print_ingest(&a.collection.name, &a.ingest);
    Ok(())
}

fn print_list(list: &[CollectionView]) {
    println!(
        "{:<24} {:>7} {:>9} {:>12} {:>8}  {:<24} SOURCE",
        "NAME", "VERSION", "DOCS", "BYTES", "SESSIONS", "UPDATED"
    );
    for c in list {
        println!(
            "{:<24} {:>7} {:>9} {:>12} {:>8}  {:<24} {}",
            c.name, c.version, c.documents, c.bytes, c.sessions, c.updated_at, c.source
        );
    }
}

fn session_req(p: &PrincipalArgs, version: Option<u64>, scratch: &ScratchArgs) -> OpenSession {
    let base = OpenSession {
        version,
        scratch: scratch.scratch || scratch.scratch_size.is_some(),
        scratch_max_bytes: scratch.scratch_size.map(|b| b.0),
        ..OpenSession::default()
    };
    match p.named() {
        Some((principal, groups)) => OpenSession {
            principal,
            groups,
            ..base
        },
        // The collection's owner, seeing everything.
        None => OpenSession {
            principal: "cli".into(),
            all_access: true,
            ..base
        },
    }
}

pub(super) async fn run(c: Client, cmd: VfsCmd) -> anyhow::Result<i32> {
    match cmd {
        VfsCmd::Create { name, source, json } => {
            let acl = acl_of(&source)?;
            let Some(p) = plan(&source)? else {
                bail!("--from is required to create a collection")
            };
            let a = upload(&c, &name, p, Some(&acl), true).await?;
            print_answer(&a, json)?;
            Ok(0)
        }
        VfsCmd::Update { name, source, json } => {
            let acl = if source.acl_given() {
                Some(acl_of(&source)?)
            } else {
                None
            };
            let a = match plan(&source)? {
                Some(p) => upload(&c, &name, p, acl.as_ref(), false).await?,
                None => {
                    c.ingest_collection(&name, &IngestCollection { source: None, acl })
                        .await?
                }
            };
            print_answer(&a, json)?;
            Ok(0)
        }
        VfsCmd::Ls { json } => {
            let list = c.list_collections().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print_list(&list);
            }
            Ok(0)
        }
        VfsCmd::Sh {
            name,
            command,
            principal,
            version,
            max_output,
            timeout,
            scratch,
        } => {
            if max_output.is_some() || timeout.is_some() {
                bail!("--max-output and --timeout are for --local: through the daemon, the operator's [vfs] limits apply");
            }
            let s = c
                .open_vfs_session(&name, &session_req(&principal, version, &scratch))
                .await?;
            let res = shell(&c, &name, &s.id, command).await;
            // Close even after an error; the daemon's idle expiry is the backstop.
            let _ = c.close_vfs_session(&name, &s.id).await;
            res
        }
        VfsCmd::Rm { name } => {
            c.delete_collection(&name).await?;
            println!("removed {name}");
            Ok(0)
        }
        VfsCmd::Log {
            name,
            principal,
            last,
            json,
        } => {
            let Some(name) = name else {
                bail!("through the daemon, `vfs log` needs a collection name")
            };
            for r in c.vfs_audit(&name, principal.as_deref(), last).await? {
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    print_audit(&r);
                }
            }
            Ok(0)
        }
        VfsCmd::Mount { .. } => unreachable!("mount is local"),
    }
}

async fn shell(c: &Client, name: &str, sid: &str, command: Option<String>) -> anyhow::Result<i32> {
    let run_one = |line: String| async move {
        let out = c.vfs_run(name, sid, &line).await?;
        print_run(out.stdout.as_bytes(), out.stderr.as_bytes(), out.exit_code)
    };
    match command {
        Some(line) => run_one(line).await,
        None => {
            let mut last = 0;
            let lines: Vec<String> = std::io::stdin()
                .lock()
                .lines()
                .collect::<Result<_, _>>()
                .context("read command lines from stdin")?;
            for line in lines {
                if !line.trim().is_empty() {
                    last = run_one(line).await?;
                }
            }
            Ok(last)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(from: &str, server_side: bool) -> SourceArgs {
        SourceArgs {
            from: Some(from.into()),
            s3_endpoint: Some("http://127.0.0.1:9000".into()),
            s3_region: None,
            s3_allow_http: false,
            default_acl: "public".into(),
            acl: vec!["internal/**=group:eng".into()],
            server_side,
        }
    }

    #[test]
    fn from_plans_an_upload_or_a_daemon_side_source() {
        let dir = std::env::temp_dir().join(format!("vfs-remote-plan-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a/.git")).unwrap();
        std::fs::create_dir_all(dir.join(".git")).unwrap();
        std::fs::write(dir.join("a/x.md"), "x").unwrap();
        std::fs::write(dir.join("b.md"), "b").unwrap();
        std::fs::write(dir.join(".git/HEAD"), "h").unwrap();
        std::os::unix::fs::symlink("b.md", dir.join("l.md")).unwrap();
        let d = dir.display().to_string();
        assert_eq!(
            plan(&args(&d, false)).unwrap(),
            Some(Plan::Tar {
                root: dir.clone(),
                files: vec!["a/x.md".into(), "b.md".into()]
            })
        );
        assert_eq!(
            plan(&args(&d, true)).unwrap(),
            Some(Plan::Server(VfsSource::Dir { path: d.clone() }))
        );
        assert_eq!(
            plan(&args("jsonl:/x/y.jsonl", false)).unwrap(),
            Some(Plan::Jsonl("/x/y.jsonl".into()))
        );
        assert!(matches!(
            plan(&args("s3://bucket/pre/fix", false)).unwrap(),
            Some(Plan::Server(VfsSource::S3 { ref bucket, ref prefix, .. })) if bucket == "bucket" && prefix == "pre/fix"
        ));
        assert!(plan(&args("ftp://x", false)).is_err());
        assert!(plan(&args(&format!("{d}/b.md"), false)).is_err());
        let acl = acl_of(&args(&d, false)).unwrap();
        assert_eq!(acl.rules[0].pattern, "internal/**");
        assert_eq!(acl.rules[0].acl, "group:eng");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
