//! `sandlot memory ...`: memory stores (Markdown in git) with offline hybrid search.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Subcommand, ValueEnum};
use sandlot_memory::{
    memory_tool, Author, Embedder, HttpEmbedder, MemoryPatch, MiniLmEmbedder, NewMemory,
    SearchMode, SearchQuery, Store, Validity,
};
use serde_json::json;

use crate::memory_output::{Origin, Printer};

#[derive(Debug, clap::Args)]
pub struct MemoryArgs {
    /// The store directory (a git work tree of Markdown memories).
    #[arg(long, global = true, env = "SANDLOT_MEMORY_STORE", default_value = ".")]
    store: PathBuf,
    /// Machine-readable output.
    #[arg(long, global = true)]
    json: bool,
    /// Author recorded in commits (tenant or agent name).
    #[arg(
        long,
        global = true,
        env = "SANDLOT_MEMORY_AUTHOR",
        default_value = "sandlot"
    )]
    author: String,
    /// Author e-mail recorded in commits.
    #[arg(
        long,
        global = true,
        env = "SANDLOT_MEMORY_EMAIL",
        default_value = "sandlot@localhost"
    )]
    email: String,
    /// Embedding backend.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "SANDLOT_EMBEDDER",
        default_value = "minilm"
    )]
    embedder: EmbedderKind,
    /// Base URL of an OpenAI-compatible embedding endpoint (with --embedder http).
    #[arg(long, global = true, env = "SANDLOT_EMBED_URL")]
    embed_url: Option<String>,
    /// Model name sent to the endpoint (with --embedder http).
    #[arg(long, global = true, env = "SANDLOT_EMBED_MODEL")]
    embed_model: Option<String>,
    /// Vector dimension of the endpoint's model (with --embedder http).
    #[arg(long, global = true, env = "SANDLOT_EMBED_DIM")]
    embed_dim: Option<usize>,
    #[command(flatten)]
    remote: crate::memory_remote::RemoteArgs,
    #[command(subcommand)]
    cmd: MemoryCmd,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum EmbedderKind {
    /// all-MiniLM-L6-v2 on the CPU (weights from scripts/setup.d/40-memory.sh).
    Minilm,
    /// An OpenAI-compatible HTTP endpoint.
    Http,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum ModeArg {
    Hybrid,
    Bm25,
    Vector,
}

#[derive(Debug, Subcommand)]
pub(crate) enum MemoryCmd {
    /// Create a store (git init + index) in --store.
    Init,
    /// Add a memory (or supersede one with --supersedes).
    Add {
        #[arg(long)]
        title: String,
        /// Body text; `-` reads standard input.
        #[arg(long, conflicts_with = "body_file")]
        body: Option<String>,
        #[arg(long)]
        body_file: Option<PathBuf>,
        /// Entity class folder, e.g. people.
        #[arg(long)]
        folder: Option<String>,
        /// Explicit path (ends in .md).
        #[arg(long)]
        path: Option<String>,
        #[arg(long)]
        id: Option<String>,
        #[arg(long = "type")]
        kind: Option<String>,
        #[arg(long = "tag")]
        tags: Vec<String>,
        #[arg(long = "link")]
        links: Vec<String>,
        #[arg(long)]
        valid_from: Option<String>,
        #[arg(long)]
        valid_to: Option<String>,
        /// Record this memory as the successor of an existing one (path or id).
        #[arg(long)]
        supersedes: Option<String>,
    },
    /// Print a memory (path or id), optionally as it was at a revision.
    Get {
        key: String,
        #[arg(long)]
        rev: Option<String>,
    },
    /// Change a memory's fields; without field flags, opens $EDITOR on the file.
    Edit {
        key: String,
        #[arg(long)]
        title: Option<String>,
        #[arg(long, conflicts_with = "body_file")]
        body: Option<String>,
        #[arg(long)]
        body_file: Option<PathBuf>,
        #[arg(long = "type")]
        kind: Option<String>,
        #[arg(long = "add-tag")]
        add_tags: Vec<String>,
        #[arg(long = "rm-tag")]
        remove_tags: Vec<String>,
        #[arg(long = "link")]
        links: Vec<String>,
        /// Empty string clears it.
        #[arg(long)]
        valid_from: Option<String>,
        /// Empty string clears it.
        #[arg(long)]
        valid_to: Option<String>,
    },
    /// Move or rename a memory (no re-embedding).
    Mv { from: String, to: String },
    /// Delete a memory.
    Rm { key: String },
    /// Hybrid search (BM25 + vectors, weighed by similarity and keyword coverage).
    Search {
        query: String,
        #[arg(short = 'n', long, default_value_t = 10)]
        limit: usize,
        #[arg(long = "tag")]
        tags: Vec<String>,
        #[arg(long = "type")]
        kind: Option<String>,
        #[arg(long)]
        folder: Option<String>,
        /// Only memories valid at this time (RFC 3339 or YYYY-MM-DD); default: now.
        #[arg(long, conflicts_with = "all_time")]
        at: Option<String>,
        /// Include superseded and expired memories.
        #[arg(long)]
        all_time: bool,
        #[arg(long, value_enum, default_value = "hybrid")]
        mode: ModeArg,
        /// Follow each hit's links one hop.
        #[arg(long)]
        expand: bool,
    },
    /// History of the store or of one memory.
    Log {
        key: Option<String>,
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: usize,
    },
    /// Diff of the store or one memory between revisions (default: HEAD to the work tree).
    Diff {
        key: Option<String>,
        #[arg(long, default_value = "HEAD")]
        from: String,
        #[arg(long)]
        to: Option<String>,
    },
    /// Undo a store commit (--commit REV) or restore one memory to a revision (KEY --to REV).
    Revert {
        key: Option<String>,
        #[arg(long, conflicts_with = "key")]
        commit: Option<String>,
        #[arg(long, requires = "key")]
        to: Option<String>,
    },
    /// Per-file index freshness and git state.
    Status {
        /// List fresh files too.
        #[arg(long)]
        all: bool,
    },
    /// Rebuild the index from the files.
    Reindex {
        /// Also drop stored vectors (re-embed everything).
        #[arg(long)]
        fresh: bool,
    },
    /// Watch the store and index direct edits until interrupted.
    Watch,
    /// Run one Anthropic memory tool command given as JSON (`-` reads standard input).
    Tool { input: String },
    /// With --remote: list the tenant's memory stores in the daemon.
    Stores,
    /// With --remote: delete the store and its history from the daemon.
    DeleteStore,
}

fn embedder(a: &MemoryArgs) -> anyhow::Result<Arc<dyn Embedder>> {
    Ok(match a.embedder {
        EmbedderKind::Minilm => Arc::new(MiniLmEmbedder::load_default()?),
        EmbedderKind::Http => {
            let url = a
                .embed_url
                .as_deref()
                .context("--embedder http needs --embed-url")?;
            let model = a
                .embed_model
                .as_deref()
                .context("--embedder http needs --embed-model")?;
            let dim = a.embed_dim.context("--embedder http needs --embed-dim")?;
            let key = std::env::var("SANDLOT_EMBED_API_KEY").ok();
            Arc::new(HttpEmbedder::new(url, model, dim, key))
        }
    })
}

fn read_body(body: Option<String>, file: Option<PathBuf>) -> anyhow::Result<Option<String>> {
    if let Some(f) = file {
        return Ok(Some(
            std::fs::read_to_string(&f)
                .with_context(|| format!("read body file {}", f.display()))?,
        ));
    }
    match body.as_deref() {
        Some("-") => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("read body from standard input")?;
            Ok(Some(s))
        }
        _ => Ok(body),
    }
}

pub(crate) fn parse_at(s: &str) -> anyhow::Result<i64> {
    sandlot_memory::doc::parse_time(s)
        .with_context(|| format!("--at {s:?} is not RFC 3339 or YYYY-MM-DD"))
}

impl From<ModeArg> for SearchMode {
    fn from(m: ModeArg) -> SearchMode {
        match m {
            ModeArg::Hybrid => SearchMode::Hybrid,
            ModeArg::Bm25 => SearchMode::Bm25,
            ModeArg::Vector => SearchMode::Vector,
        }
    }
}

/// A command with its arguments checked and its inputs read: what both modes carry out, on
/// a store directory ([`run`]) or through the daemon ([`crate::memory_remote`]).
#[derive(Debug)]
pub(crate) enum Request {
    Init,
    Add {
        new: NewMemory,
        /// Key of the memory the new one supersedes.
        supersedes: Option<String>,
    },
    Get {
        key: String,
        rev: Option<String>,
    },
    /// An empty patch (no field flags): an editor session, which only the local mode has.
    Edit {
        key: String,
        patch: MemoryPatch,
    },
    Mv {
        from: String,
        to: String,
    },
    Rm {
        key: String,
    },
    Search(SearchQuery),
    Log {
        key: Option<String>,
        limit: usize,
    },
    Diff {
        key: Option<String>,
        from: String,
        to: Option<String>,
    },
    RevertCommit {
        commit: String,
    },
    RevertMemory {
        key: String,
        to: String,
    },
    Status {
        all: bool,
    },
    Reindex {
        fresh: bool,
    },
    Watch,
    /// One memory tool call's input.
    Tool(serde_json::Value),
    Stores,
    DeleteStore,
}

/// Whether `p` changes nothing (`edit` without field flags).
pub(crate) fn patch_is_empty(p: &MemoryPatch) -> bool {
    p.title.is_none()
        && p.body.is_none()
        && p.kind.is_none()
        && p.tags.is_none()
        && p.add_tags.is_empty()
        && p.remove_tags.is_empty()
        && p.links.is_none()
        && p.add_links.is_empty()
        && p.valid_from.is_none()
        && p.valid_to.is_none()
}

impl MemoryCmd {
    /// Reads the command's text input: the body of `add` and `edit` (`--body`, `-` for
    /// standard input, or `--body-file`), the call of `tool` (`-` for standard input).
    pub(crate) fn read_input(&self) -> anyhow::Result<Option<String>> {
        match self {
            MemoryCmd::Add {
                body, body_file, ..
            }
            | MemoryCmd::Edit {
                body, body_file, ..
            } => read_body(body.clone(), body_file.clone()),
            MemoryCmd::Tool { input } if input == "-" => {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                Ok(Some(s))
            }
            MemoryCmd::Tool { input } => Ok(Some(input.clone())),
            _ => Ok(None),
        }
    }

    /// The request of this command, given its text input (see [`MemoryCmd::read_input`]).
    pub(crate) fn request(&self, input: Option<String>) -> anyhow::Result<Request> {
        Ok(match self {
            MemoryCmd::Init => Request::Init,
            MemoryCmd::Stores => Request::Stores,
            MemoryCmd::DeleteStore => Request::DeleteStore,
            MemoryCmd::Add {
                title,
                folder,
                path,
                id,
                kind,
                tags,
                links,
                valid_from,
                valid_to,
                supersedes,
                ..
            } => Request::Add {
                new: NewMemory {
                    title: title.clone(),
                    body: input.unwrap_or_default(),
                    folder: folder.clone(),
                    path: path.clone(),
                    id: id.clone(),
                    kind: kind.clone(),
                    tags: tags.clone(),
                    links: links.clone(),
                    valid_from: valid_from.clone(),
                    valid_to: valid_to.clone(),
                },
                supersedes: supersedes.clone(),
            },
            MemoryCmd::Get { key, rev } => Request::Get {
                key: key.clone(),
                rev: rev.clone(),
            },
            MemoryCmd::Edit {
                key,
                title,
                kind,
                add_tags,
                remove_tags,
                links,
                valid_from,
                valid_to,
                ..
            } => Request::Edit {
                key: key.clone(),
                patch: MemoryPatch {
                    title: title.clone(),
                    body: input,
                    kind: kind.clone(),
                    add_tags: add_tags.clone(),
                    remove_tags: remove_tags.clone(),
                    add_links: links.clone(),
                    valid_from: valid_from.clone(),
                    valid_to: valid_to.clone(),
                    ..Default::default()
                },
            },
            MemoryCmd::Mv { from, to } => Request::Mv {
                from: from.clone(),
                to: to.clone(),
            },
            MemoryCmd::Rm { key } => Request::Rm { key: key.clone() },
            MemoryCmd::Search {
                query,
                limit,
                tags,
                kind,
                folder,
                at,
                all_time,
                mode,
                expand,
            } => Request::Search(SearchQuery {
                text: query.clone(),
                limit: *limit,
                tags: tags.clone(),
                kind: kind.clone(),
                folder: folder.clone(),
                valid: match (at, all_time) {
                    (Some(t), _) => Validity::At(parse_at(t)?),
                    (None, true) => Validity::Any,
                    (None, false) => Validity::Now,
                },
                mode: (*mode).into(),
                expand: *expand,
            }),
            MemoryCmd::Log { key, limit } => Request::Log {
                key: key.clone(),
                limit: *limit,
            },
            MemoryCmd::Diff { key, from, to } => Request::Diff {
                key: key.clone(),
                from: from.clone(),
                to: to.clone(),
            },
            MemoryCmd::Revert { key, commit, to } => match (key, commit, to) {
                (None, Some(c), _) => Request::RevertCommit { commit: c.clone() },
                (Some(k), None, Some(rev)) => Request::RevertMemory {
                    key: k.clone(),
                    to: rev.clone(),
                },
                _ => bail!(
                    "use `revert --commit REV` (whole store) or `revert KEY --to REV` (one memory)"
                ),
            },
            MemoryCmd::Status { all } => Request::Status { all: *all },
            MemoryCmd::Reindex { fresh } => Request::Reindex { fresh: *fresh },
            MemoryCmd::Watch => Request::Watch,
            MemoryCmd::Tool { .. } => Request::Tool(
                serde_json::from_str(&input.unwrap_or_default())
                    .context("parse memory tool input as JSON")?,
            ),
        })
    }
}

/// `init`'s answer with `--json`.
#[derive(serde::Serialize)]
struct Initialised<'a> {
    store: &'a Path,
}

pub fn run(args: MemoryArgs) -> anyhow::Result<i32> {
    let input = args.cmd.read_input()?;
    if let Some(name) = &args.remote.remote {
        return crate::memory_remote::run(&args.remote, name, &args.cmd, input, args.json);
    }
    if matches!(args.cmd, MemoryCmd::Stores | MemoryCmd::DeleteStore) {
        bail!(
            "`stores` and `delete-store` manage a daemon's stores: add --remote NAME (and --host)"
        );
    }
    let req = args.cmd.request(input)?;
    let author = Author::new(args.author.clone(), args.email.clone());
    let out = Printer {
        cmd: &args.cmd,
        json: args.json,
        origin: Origin::Local,
    };
    let open = || -> anyhow::Result<Store> {
        let e = embedder(&args)?;
        Store::open(&args.store, e)
            .with_context(|| format!("open memory store {}", args.store.display()))
    };
    match req {
        Request::Init => {
            let store = Store::init(&args.store, embedder(&args)?, &author)?;
            let root = store.root();
            out.print(&Initialised { store: root }, || {
                Ok(json!({ "store": root.display().to_string() }))
            })?;
        }
        Request::Add { new, supersedes } => {
            let store = open()?;
            let o = match supersedes {
                Some(old) => store.supersede(&old, new, &author)?,
                None => store.add(new, &author)?,
            };
            out.print_answer(&o)?;
        }
        Request::Get { key, rev: Some(r) } => {
            let text = open()?.show(&key, &r)?;
            out.print_answer(&json!({"key": key, "rev": r, "text": text}))?;
        }
        Request::Get { key, rev: None } => out.print_answer(&open()?.get(&key)?)?,
        Request::Edit { key, patch } => {
            let store = open()?;
            let o = if patch_is_empty(&patch) {
                edit_in_editor(&store, &key, &author)?
            } else {
                store.edit(&key, patch, &author)?
            };
            out.print_answer(&o)?;
        }
        Request::Mv { from, to } => out.print_answer(&open()?.rename(&from, &to, &author)?)?,
        Request::Rm { key } => out.print_answer(&open()?.remove(&key, &author)?)?,
        Request::Search(q) => {
            let hits = open()?.search(&q)?;
            out.print(&hits, || {
                Ok(json!({ "hits": serde_json::to_value(&hits)? }))
            })?;
        }
        Request::Log { key, limit } => {
            let commits = open()?.log(key.as_deref(), limit)?;
            out.print(&commits, || {
                Ok(json!({ "commits": serde_json::to_value(&commits)? }))
            })?;
        }
        Request::Diff { key, from, to } => {
            let d = open()?.diff(&from, to.as_deref(), key.as_deref())?;
            out.print_answer(&json!({"from": from, "to": to, "diff": d}))?;
        }
        Request::RevertCommit { commit } => {
            out.print_answer(&open()?.revert_commit(&commit, &author)?)?
        }
        Request::RevertMemory { key, to } => {
            out.print_answer(&open()?.revert_memory(&key, &to, &author)?)?
        }
        Request::Status { all } => {
            let store = open_without_sync(&args)?;
            let st = store.status()?;
            // The daemon's answer: the files worth showing, and the index's counts.
            out.print(&st, || {
                let shown: Vec<_> = st.iter().filter(|f| all || f.needs_attention()).collect();
                let (files, chunks, vectors) = store.counts()?;
                Ok(json!({
                    "files": serde_json::to_value(shown)?,
                    "indexed_files": files, "chunks": chunks, "vectors": vectors
                }))
            })?;
        }
        Request::Reindex { fresh } => {
            let store = open()?;
            let r = store.reindex(!fresh)?;
            while store.embed_pending(256)? > 0 {}
            out.print(&r, || {
                let (files, chunks, vectors) = store.counts()?;
                let mut v = serde_json::to_value(&r)?;
                v["files"] = files.into();
                v["chunks"] = chunks.into();
                v["vectors"] = vectors.into();
                Ok(v)
            })?;
        }
        Request::Watch => {
            let store = Arc::new(open()?);
            let _w = sandlot_memory::watch(
                store.clone(),
                sandlot_memory::WatchOptions {
                    on_sync: Some(Box::new(move |r| match r {
                        Ok(r) if r.changed() => {
                            eprintln!("indexed {:?}, removed {:?}", r.indexed, r.removed)
                        }
                        Ok(_) => {}
                        Err(e) => eprintln!("sandlot: sync failed: {e}"),
                    })),
                    ..Default::default()
                },
            )?;
            eprintln!("watching {} (Ctrl-C to stop)", store.root().display());
            loop {
                std::thread::park();
            }
        }
        Request::Stores | Request::DeleteStore => unreachable!("refused above"),
        Request::Tool(v) => {
            let o = memory_tool::execute_json(&open()?, &v, &author);
            out.print_answer(&o)?;
            return Ok(if o.is_error { 1 } else { 0 });
        }
    }
    Ok(0)
}

/// `status` must not change the index, so it opens without the initial reconcile.
fn open_without_sync(args: &MemoryArgs) -> anyhow::Result<Store> {
    let e = embedder(args)?;
    Store::open_unsynced(&args.store, e)
        .with_context(|| format!("open memory store {}", args.store.display()))
}

fn edit_in_editor(
    store: &Store,
    key: &str,
    author: &Author,
) -> anyhow::Result<sandlot_memory::WriteOutcome> {
    let path = store.resolve(key)?;
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .context("no field flags given and neither $VISUAL nor $EDITOR is set")?;
    let before = store.read_file(&path)?;
    let tmp = std::env::temp_dir().join(format!(
        "sandlot-memory-{}-{}",
        std::process::id(),
        path.replace('/', "_")
    ));
    std::fs::write(&tmp, &before).with_context(|| format!("write {}", tmp.display()))?;
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(&tmp)
        .status()
        .with_context(|| format!("run editor {editor}"));
    let after = std::fs::read_to_string(&tmp);
    let _ = std::fs::remove_file(&tmp);
    if !status?.success() {
        bail!("editor {editor} failed; {path} left unchanged");
    }
    let after = after.context("read edited file")?;
    sandlot_memory::Document::parse(&path, &after)
        .with_context(|| format!("edited {path} has invalid front matter; nothing was saved"))?;
    Ok(store.write_file(&path, &after, &format!("edit {path}"), author)?)
}
