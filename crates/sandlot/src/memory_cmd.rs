//! `sandlot memory ...`: memory stores (Markdown in git) with offline hybrid search.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Subcommand, ValueEnum};
use sandlot_memory::{
    memory_tool, Author, Embedder, Freshness, HttpEmbedder, MemoryPatch, MiniLmEmbedder, NewMemory,
    SearchMode, SearchQuery, Store, Validity,
};

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
    /// Hybrid search (BM25 + vectors, reciprocal rank fusion).
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

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub(crate) fn parse_at(s: &str) -> anyhow::Result<i64> {
    sandlot_memory::doc::parse_time(s)
        .with_context(|| format!("--at {s:?} is not RFC 3339 or YYYY-MM-DD"))
}

pub fn run(args: MemoryArgs) -> anyhow::Result<i32> {
    if let Some(name) = &args.remote.remote {
        let body = match &args.cmd {
            MemoryCmd::Add {
                body, body_file, ..
            }
            | MemoryCmd::Edit {
                body, body_file, ..
            } => read_body(body.clone(), body_file.clone())?,
            MemoryCmd::Tool { input } if input == "-" => {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                Some(s)
            }
            MemoryCmd::Tool { input } => Some(input.clone()),
            _ => None,
        };
        return crate::memory_remote::run(&args.remote, name, &args.cmd, body, args.json);
    }
    if matches!(args.cmd, MemoryCmd::Stores | MemoryCmd::DeleteStore) {
        bail!(
            "`stores` and `delete-store` manage a daemon's stores: add --remote NAME (and --host)"
        );
    }
    let author = Author::new(args.author.clone(), args.email.clone());
    let json = args.json;
    let open = || -> anyhow::Result<Store> {
        let e = embedder(&args)?;
        Store::open(&args.store, e)
            .with_context(|| format!("open memory store {}", args.store.display()))
    };
    match &args.cmd {
        MemoryCmd::Init => {
            let store = Store::init(&args.store, embedder(&args)?, &author)?;
            if json {
                print_json(&serde_json::json!({"store": store.root()}))?;
            } else {
                println!("initialised memory store {}", store.root().display());
            }
        }
        MemoryCmd::Add {
            title,
            body,
            body_file,
            folder,
            path,
            id,
            kind,
            tags,
            links,
            valid_from,
            valid_to,
            supersedes,
        } => {
            let store = open()?;
            let new = NewMemory {
                title: title.clone(),
                body: read_body(body.clone(), body_file.clone())?.unwrap_or_default(),
                folder: folder.clone(),
                path: path.clone(),
                id: id.clone(),
                kind: kind.clone(),
                tags: tags.clone(),
                links: links.clone(),
                valid_from: valid_from.clone(),
                valid_to: valid_to.clone(),
            };
            let out = match supersedes {
                Some(old) => store.supersede(old, new, &author)?,
                None => store.add(new, &author)?,
            };
            if json {
                print_json(&out)?;
            } else {
                println!("added {} (id {})", out.path, out.id);
            }
        }
        MemoryCmd::Get { key, rev } => {
            let store = open()?;
            match rev {
                Some(r) => {
                    let text = store.show(key, r)?;
                    if json {
                        print_json(&serde_json::json!({"key": key, "rev": r, "text": text}))?;
                    } else {
                        print!("{text}");
                    }
                }
                None => {
                    let m = store.get(key)?;
                    if json {
                        print_json(&m)?;
                    } else {
                        print!("{}", m.text);
                    }
                }
            }
        }
        MemoryCmd::Edit {
            key,
            title,
            body,
            body_file,
            kind,
            add_tags,
            remove_tags,
            links,
            valid_from,
            valid_to,
        } => {
            let store = open()?;
            let body = read_body(body.clone(), body_file.clone())?;
            let no_flags = title.is_none()
                && body.is_none()
                && kind.is_none()
                && add_tags.is_empty()
                && remove_tags.is_empty()
                && links.is_empty()
                && valid_from.is_none()
                && valid_to.is_none();
            let out = if no_flags {
                edit_in_editor(&store, key, &author)?
            } else {
                store.edit(
                    key,
                    MemoryPatch {
                        title: title.clone(),
                        body,
                        kind: kind.clone(),
                        add_tags: add_tags.clone(),
                        remove_tags: remove_tags.clone(),
                        add_links: links.clone(),
                        valid_from: valid_from.clone(),
                        valid_to: valid_to.clone(),
                        ..Default::default()
                    },
                    &author,
                )?
            };
            if json {
                print_json(&out)?;
            } else if out.commit.is_some() {
                println!("edited {}", out.path);
            } else {
                println!("no change to {}", out.path);
            }
        }
        MemoryCmd::Mv { from, to } => {
            let store = open()?;
            let out = store.rename(from, to, &author)?;
            if json {
                print_json(&out)?;
            } else {
                println!("moved {from} -> {}", out.path);
            }
        }
        MemoryCmd::Rm { key } => {
            let store = open()?;
            let out = store.remove(key, &author)?;
            if json {
                print_json(&out)?;
            } else {
                println!("removed {}", out.path);
            }
        }
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
        } => {
            let store = open()?;
            let valid = match (at, all_time) {
                (Some(t), _) => Validity::At(parse_at(t)?),
                (None, true) => Validity::Any,
                (None, false) => Validity::Now,
            };
            let q = SearchQuery {
                text: query.clone(),
                limit: *limit,
                tags: tags.clone(),
                kind: kind.clone(),
                folder: folder.clone(),
                valid,
                mode: match mode {
                    ModeArg::Hybrid => SearchMode::Hybrid,
                    ModeArg::Bm25 => SearchMode::Bm25,
                    ModeArg::Vector => SearchMode::Vector,
                },
                expand: *expand,
            };
            let hits = store.search(&q)?;
            if json {
                print_json(&hits)?;
            } else if hits.is_empty() {
                println!("no matches");
            } else {
                for h in &hits {
                    println!("{}:{}  {:.4}  {}", h.path, h.line, h.score, h.title);
                    println!("    {}", h.snippet);
                    for r in &h.related {
                        println!("    -> {} ({})", r.path, r.title);
                    }
                }
            }
        }
        MemoryCmd::Log { key, limit } => {
            let store = open()?;
            let commits = store.log(key.as_deref(), *limit)?;
            if json {
                print_json(&commits)?;
            } else {
                for c in &commits {
                    let short: String = c.rev.chars().take(12).collect();
                    println!(
                        "{short}  {}  {} <{}>  {}",
                        c.time,
                        c.author,
                        c.email,
                        c.message.lines().next().unwrap_or("")
                    );
                }
            }
        }
        MemoryCmd::Diff { key, from, to } => {
            let store = open()?;
            let d = store.diff(from, to.as_deref(), key.as_deref())?;
            if json {
                print_json(&serde_json::json!({"from": from, "to": to, "diff": d}))?;
            } else {
                print!("{d}");
            }
        }
        MemoryCmd::Revert { key, commit, to } => {
            let store = open()?;
            let out = match (key, commit, to) {
                (None, Some(c), _) => store.revert_commit(c, &author)?,
                (Some(k), None, Some(rev)) => store.revert_memory(k, rev, &author)?,
                _ => bail!(
                    "use `revert --commit REV` (whole store) or `revert KEY --to REV` (one memory)"
                ),
            };
            if json {
                print_json(&out)?;
            } else {
                println!(
                    "reverted: commit {}",
                    out.commit.as_deref().unwrap_or("(none)")
                );
            }
        }
        MemoryCmd::Status { all } => {
            let store = open_without_sync(&args)?;
            let st = store.status()?;
            if json {
                print_json(&st)?;
            } else {
                let mut shown = 0;
                for s in &st {
                    let interesting = s.index != Freshness::Fresh
                        || s.git.is_some()
                        || s.error.is_some()
                        || s.missing_vectors > 0;
                    if !*all && !interesting {
                        continue;
                    }
                    shown += 1;
                    let idx = serde_json::to_value(s.index)?
                        .as_str()
                        .unwrap_or("")
                        .to_string();
                    print!(
                        "{:<10} {:<3} {}",
                        idx,
                        s.git.as_deref().unwrap_or(""),
                        s.path
                    );
                    if s.missing_vectors > 0 {
                        print!("  ({} chunks awaiting vectors)", s.missing_vectors);
                    }
                    if let Some(e) = &s.error {
                        print!("  [{e}]");
                    }
                    println!();
                }
                let (files, chunks, vectors) = store.counts()?;
                if shown == 0 {
                    println!("index fresh");
                }
                println!("{files} files, {chunks} chunks, {vectors} with vectors");
            }
        }
        MemoryCmd::Reindex { fresh } => {
            let store = open()?;
            let r = store.reindex(!fresh)?;
            while store.embed_pending(256)? > 0 {}
            if json {
                print_json(&r)?;
            } else {
                let (files, chunks, vectors) = store.counts()?;
                println!("reindexed {files} files, {chunks} chunks ({vectors} with vectors, {} texts embedded)", r.texts_embedded);
            }
        }
        MemoryCmd::Watch => {
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
        MemoryCmd::Stores | MemoryCmd::DeleteStore => unreachable!("refused above"),
        MemoryCmd::Tool { input } => {
            let text = if input == "-" {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                s
            } else {
                input.clone()
            };
            let v: serde_json::Value =
                serde_json::from_str(&text).context("parse memory tool input as JSON")?;
            let store = open()?;
            let out = memory_tool::execute_json(&store, &v, &author);
            if json {
                print_json(&out)?;
            } else {
                println!("{}", out.text);
            }
            return Ok(if out.is_error { 1 } else { 0 });
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
