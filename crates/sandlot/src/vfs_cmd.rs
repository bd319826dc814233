//! `sandlot vfs ...`: virtual read-only filesystems over document collections.
//!
//! By default every subcommand talks to the daemon (`SANDLOT_URL`, the operator
//! socket by default; `SANDLOT_TOKEN` over TCP): collections belong to the
//! caller's tenant, `create --from DIR` uploads a tar archive of the directory,
//! and `sh` runs in a daemon session (audited there). With `--local` they work on
//! a data directory directly, without a daemon (the operator's offline tool; its
//! collections are separate from the daemon's). `mount` is always local.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
mod remote;

use sandlot_client::vfs::{AuditEntry, IngestResult};
use sandlot_vfs::{
    format_utc, Acl, AclPolicy, AclRule, AuditFilter, IngestOptions, IngestReport, Limits,
    Principal, S3Options, ScratchLimits, Source, Store,
};

#[derive(Debug, clap::Args)]
pub struct VfsArgs {
    /// Work on a data directory directly instead of through the daemon.
    #[arg(long, global = true)]
    local: bool,
    #[command(flatten)]
    conn: crate::api_cmd::client_cmds::Conn,
    /// With --local: the data directory; collections live in its `vfs/` subdirectory.
    #[arg(
        long,
        global = true,
        env = "SANDLOT_DATA_DIR",
        default_value = "/var/lib/sandlot"
    )]
    data_dir: PathBuf,
    #[command(subcommand)]
    cmd: VfsCmd,
}

#[derive(Debug, clap::Args)]
pub(crate) struct SourceArgs {
    /// Source: DIR, git:DIR, s3://bucket/prefix or jsonl:FILE.
    #[arg(long = "from")]
    from: Option<String>,
    /// S3 endpoint URL for S3-compatible stores.
    #[arg(long)]
    s3_endpoint: Option<String>,
    /// S3 region (default: AWS_REGION, else us-east-1).
    #[arg(long)]
    s3_region: Option<String>,
    /// Allow a plain-http S3 endpoint.
    #[arg(long)]
    s3_allow_http: bool,
    /// ACL for documents no rule matches: public, none, or group:NAME[,group:NAME...].
    #[arg(long, default_value = "public")]
    default_acl: String,
    /// ACL rule GLOB=ACL (repeatable; the last matching rule wins), e.g. 'internal/**=group:eng'.
    #[arg(long = "acl")]
    acl: Vec<String>,
    /// Through the daemon: --from names a path on the daemon's host (which the
    /// operator must allow) instead of local files to upload.
    #[arg(long)]
    server_side: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct PrincipalArgs {
    /// Principal name (recorded in the audit log). Without it, the operator sees everything.
    #[arg(long)]
    principal: Option<String>,
    /// Group the principal belongs to (repeatable).
    #[arg(long = "group")]
    groups: Vec<String>,
}

/// A copy-on-write scratch area for the session's writes.
#[derive(Debug, clap::Args)]
pub(crate) struct ScratchArgs {
    /// Give the session a private, in-memory copy-on-write scratch area: `>`,
    /// `mkdir`, `rm`, `cp`, `mv`, `tee`, ... then work (on an overlay that is
    /// gone when the command ends) instead of failing with "Read-only file system".
    #[arg(long)]
    scratch: bool,
    /// Size of the scratch area, e.g. 4M (implies --scratch; default 16M, or the
    /// daemon's `vfs.scratch_default_size`).
    #[arg(long, value_parser = crate::spec_flags::parse_size)]
    scratch_size: Option<sandlot_proto::units::ByteSize>,
}

impl ScratchArgs {
    /// The library limits for a local session (None: no scratch area).
    fn local_limits(&self) -> anyhow::Result<Option<ScratchLimits>> {
        if !self.scratch && self.scratch_size.is_none() {
            return Ok(None);
        }
        let mut l = ScratchLimits::default();
        if let Some(b) = self.scratch_size {
            if b.0 == 0 {
                bail!("--scratch-size must be positive");
            }
            l.max_bytes = b.0;
        }
        Ok(Some(l))
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum VfsCmd {
    /// Create a collection from a source.
    Create {
        name: String,
        #[command(flatten)]
        source: SourceArgs,
        /// Print the ingest report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Re-ingest a collection (from its stored source unless --from is given); only changes are fetched.
    Update {
        name: String,
        #[command(flatten)]
        source: SourceArgs,
        /// Print the ingest report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List collections.
    Ls {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Run a command line in a virtual shell session (or read command lines from stdin).
    Sh {
        name: String,
        /// The command line, e.g. 'grep -rn "rate limit" / | head'. Omit to read lines from stdin.
        command: Option<String>,
        #[command(flatten)]
        principal: PrincipalArgs,
        /// Collection version (default: the latest).
        #[arg(long)]
        version: Option<u64>,
        /// With --local: output limit per command line, in bytes (default 1 MiB;
        /// through the daemon the operator's `vfs.max_output` applies).
        #[arg(long)]
        max_output: Option<usize>,
        /// With --local: time limit per command line, in seconds (default 10;
        /// through the daemon the operator's `vfs.command_timeout` applies).
        #[arg(long)]
        timeout: Option<f64>,
        #[command(flatten)]
        scratch: ScratchArgs,
    },
    /// Remove a collection and its content.
    Rm { name: String },
    /// Mount a collection read-only with FUSE (foreground; Ctrl-C or umount to stop).
    Mount {
        name: String,
        dir: PathBuf,
        #[command(flatten)]
        principal: PrincipalArgs,
        /// Let other users access the mount.
        #[arg(long)]
        allow_other: bool,
    },
    /// Show the audit log of session commands.
    Log {
        /// Only this collection.
        name: Option<String>,
        /// Only this principal.
        #[arg(long)]
        principal: Option<String>,
        /// Only the last N records.
        #[arg(long)]
        last: Option<usize>,
        /// JSON lines output.
        #[arg(long)]
        json: bool,
    },
}

fn open_store(data_dir: &std::path::Path) -> anyhow::Result<Store> {
    Store::open(data_dir.join("vfs"))
        .with_context(|| format!("open the vfs store in {}", data_dir.display()))
}

fn ingest_options(a: &SourceArgs) -> anyhow::Result<IngestOptions> {
    let default = Acl::parse(&a.default_acl).map_err(anyhow::Error::msg)?;
    let rules = a
        .acl
        .iter()
        .map(|r| AclRule::parse(r).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(IngestOptions {
        acl: AclPolicy { default, rules },
    })
}

fn source_of(a: &SourceArgs) -> anyhow::Result<Option<Source>> {
    let Some(spec) = &a.from else { return Ok(None) };
    let s3 = S3Options {
        endpoint: a.s3_endpoint.clone(),
        region: a.s3_region.clone(),
        allow_http: a.s3_allow_http,
        credentials: None,
        no_env_credentials: false,
    };
    Ok(Some(Source::parse(spec, s3)?))
}

impl PrincipalArgs {
    /// The principal's name and groups; `None`: the operator (the collection's owner),
    /// who sees everything.
    fn named(&self) -> Option<(String, Vec<String>)> {
        match &self.principal {
            Some(name) => Some((name.clone(), self.groups.clone())),
            None if !self.groups.is_empty() => Some(("cli".into(), self.groups.clone())),
            None => None,
        }
    }
}

impl SourceArgs {
    /// Whether an ACL flag was given (`update` keeps the collection's policy otherwise).
    fn acl_given(&self) -> bool {
        self.default_acl != "public" || !self.acl.is_empty()
    }
}

fn principal_of(p: &PrincipalArgs) -> Principal {
    match p.named() {
        Some((name, groups)) => Principal::new(name, groups),
        None => Principal::operator(),
    }
}

/// The text of an ingest of `collection`: one line, and the skipped entries on standard
/// error (the daemon's answer, or a local report converted to it).
fn print_ingest(collection: &str, r: &IngestResult) {
    if r.changed {
        println!(
            "{collection} v{}: {} documents, {} bytes ({} added, {} updated, {} removed, {} unchanged; fetched {} documents, {} bytes)",
            r.version, r.documents, r.bytes, r.added, r.updated, r.removed, r.unchanged, r.fetched, r.bytes_fetched
        );
    } else {
        println!(
            "{collection} v{}: unchanged ({} documents)",
            r.version, r.documents
        );
    }
    for s in &r.skipped {
        eprintln!("sandlot: skipped {s}");
    }
}

/// Prints a local ingest: pretty JSON of the library's report with `--json`, else its text.
fn print_report(r: IngestReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let collection = r.collection.clone();
        print_ingest(&collection, &sandlot_server::vfs::ingest_result(r));
    }
    Ok(())
}

/// One line of `vfs log`.
fn print_audit(r: &AuditEntry) {
    println!(
        "{} {} {}@v{} exit={} out={} err={}{} {:.3}ms {}",
        r.at,
        r.principal,
        r.collection,
        r.version,
        r.exit_code,
        r.stdout_bytes,
        r.stderr_bytes,
        if r.truncated { " truncated" } else { "" },
        r.duration_ms,
        r.command
    );
}

/// Writes one command line's output (standard output flushed first); returns its exit code.
fn print_run(stdout: &[u8], stderr: &[u8], exit_code: i32) -> anyhow::Result<i32> {
    let mut so = std::io::stdout().lock();
    so.write_all(stdout)?;
    so.flush()?;
    std::io::stderr().lock().write_all(stderr)?;
    Ok(exit_code)
}

pub fn run(args: VfsArgs) -> anyhow::Result<i32> {
    // A FUSE mount is always of this host's store.
    let is_mount = matches!(args.cmd, VfsCmd::Mount { .. });
    if !is_mount && !args.local {
        let client = args.conn.client()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        return rt.block_on(remote::run(client, args.cmd));
    }
    let store = open_store(&args.data_dir)?;
    match args.cmd {
        VfsCmd::Create { name, source, json } => {
            let opts = ingest_options(&source)?;
            let Some(src) = source_of(&source)? else {
                bail!("--from is required to create a collection")
            };
            let r = store.create(&name, src, opts)?;
            print_report(r, json)?;
            Ok(0)
        }
        VfsCmd::Update { name, source, json } => {
            let src = source_of(&source)?;
            let opts = if source.acl_given() {
                Some(ingest_options(&source)?)
            } else {
                None
            };
            let r = store.update(&name, src, opts)?;
            print_report(r, json)?;
            Ok(0)
        }
        VfsCmd::Ls { json } => {
            let list = store.list()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!(
                    "{:<24} {:>7} {:>9} {:>12}  {:<24} SOURCE",
                    "NAME", "VERSION", "DOCS", "BYTES", "UPDATED"
                );
                for c in list {
                    println!(
                        "{:<24} {:>7} {:>9} {:>12}  {:<24} {}",
                        c.name,
                        c.version,
                        c.documents,
                        c.bytes,
                        format_utc(c.updated.max(0) as u64 * 1000),
                        c.source
                    );
                }
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
            let scratch = scratch.local_limits()?;
            let max_output = max_output.unwrap_or(1 << 20);
            let timeout = timeout.unwrap_or(10.0);
            if !(timeout > 0.0 && timeout.is_finite()) {
                bail!("--timeout must be a positive number of seconds, got {timeout}");
            }
            let coll = store.collection(&name)?;
            let limits = Limits {
                max_output_bytes: max_output,
                max_run_time: Duration::from_secs_f64(timeout),
                ..Limits::default()
            };
            let p = principal_of(&principal);
            let mut session = match version {
                Some(v) => coll.open_session_at(v, p, limits)?,
                None => coll.open_session(p, limits)?,
            };
            if let Some(l) = scratch {
                session = session.with_scratch(l);
            }
            let mut run_one = |line: &str| -> anyhow::Result<i32> {
                let out = session.run(line)?;
                print_run(&out.stdout, &out.stderr, out.exit_code)
            };
            match command {
                Some(c) => run_one(&c),
                None => {
                    let mut last = 0;
                    for line in std::io::stdin().lock().lines() {
                        let line = line.context("read a command line from stdin")?;
                        if line.trim().is_empty() {
                            continue;
                        }
                        last = run_one(&line)?;
                    }
                    Ok(last)
                }
            }
        }
        VfsCmd::Rm { name } => {
            store.remove(&name)?;
            println!("removed {name}");
            Ok(0)
        }
        VfsCmd::Mount {
            name,
            dir,
            principal,
            allow_other,
        } => mount(&store, &name, &dir, &principal_of(&principal), allow_other),
        VfsCmd::Log {
            name,
            principal,
            last,
            json,
        } => {
            let recs = store.audit_log().read(&AuditFilter {
                collection: name,
                principal,
                last,
            })?;
            for r in recs {
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    print_audit(&sandlot_server::vfs::audit_entry(r));
                }
            }
            Ok(0)
        }
    }
}

fn mount(
    store: &Store,
    name: &str,
    dir: &std::path::Path,
    p: &Principal,
    allow_other: bool,
) -> anyhow::Result<i32> {
    use sandlot_vfs::fuse;
    let coll = store.collection(name)?;
    let view = coll.view(p)?;
    // SIGINT, SIGTERM and SIGHUP blocked in every thread (the FUSE thread started
    // below inherits the mask), then taken here.
    let stop = sandlot_runtime::helper_process::StopSignals::block()?;
    let m = fuse::mount(view.clone(), dir, &fuse::MountOptions { allow_other })?;
    eprintln!(
        "sandlot: mounted {name} v{} for {} at {} ({} documents); Ctrl-C or `umount {}` to stop",
        view.version(),
        p.name,
        dir.display(),
        view.tree().doc_count(),
        dir.display()
    );
    while m.is_alive() {
        if stop.wait(std::time::Duration::from_millis(200)).is_some() {
            break;
        }
    }
    m.unmount()?;
    Ok(0)
}
