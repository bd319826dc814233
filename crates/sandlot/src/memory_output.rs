//! What `sandlot memory ...` prints, the same for a store directory and for a daemon's store
//! (`--remote`). Both modes hand [`Printer::print`] a command's result twice: as `--json`
//! prints it, and in the shape of the daemon's answer to the command (the library's types
//! serialize to what the daemon sends), from which [`render`] writes the text.

use serde::Serialize;
use serde_json::Value;

use crate::memory_cmd::MemoryCmd;

/// Where the store is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Origin<'a> {
    /// A store directory on this host.
    Local,
    /// Store NAME of a daemon.
    Remote(&'a str),
}

/// Prints the results of one command.
pub(crate) struct Printer<'a> {
    pub cmd: &'a MemoryCmd,
    /// `--json`: machine-readable output.
    pub json: bool,
    pub origin: Origin<'a>,
}

impl Printer<'_> {
    /// Prints `machine` as pretty JSON with `--json`, else the text of `answer()`, the
    /// daemon's answer to the command (only built when the text is printed).
    pub fn print<T: Serialize + ?Sized>(
        &self,
        machine: &T,
        answer: impl FnOnce() -> anyhow::Result<Value>,
    ) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(machine)?);
        } else {
            render(self.cmd, &answer()?, self.origin);
        }
        Ok(())
    }

    /// [`Printer::print`] for a result that is the daemon's answer as it is.
    pub fn print_answer<T: Serialize + ?Sized>(&self, result: &T) -> anyhow::Result<()> {
        self.print(result, || Ok(serde_json::to_value(result)?))
    }
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// Writes the text of `cmd`'s answer `v`. `init` and `reindex` report different facts in
/// the two modes: the directory and the index's counts locally, the store name and the
/// reindex report through the daemon.
pub(crate) fn render(cmd: &MemoryCmd, v: &Value, origin: Origin<'_>) {
    match cmd {
        MemoryCmd::Init => match origin {
            Origin::Local => println!("initialised memory store {}", s(&v["store"])),
            Origin::Remote(store) => println!("created memory store {store}"),
        },
        MemoryCmd::Stores => {
            for st in v["stores"].as_array().into_iter().flatten() {
                println!("{}", s(&st["name"]));
            }
        }
        MemoryCmd::DeleteStore => {
            if let Origin::Remote(store) = origin {
                println!("deleted memory store {store}");
            }
        }
        MemoryCmd::Add { .. } => println!("added {} (id {})", s(&v["path"]), s(&v["id"])),
        MemoryCmd::Get { .. } => print!("{}", s(&v["text"])),
        MemoryCmd::Edit { .. } => {
            if v["commit"].is_null() {
                println!("no change to {}", s(&v["path"]));
            } else {
                println!("edited {}", s(&v["path"]));
            }
        }
        MemoryCmd::Mv { from, .. } => println!("moved {from} -> {}", s(&v["path"])),
        MemoryCmd::Rm { .. } => println!("removed {}", s(&v["path"])),
        MemoryCmd::Search { .. } => {
            let hits = v["hits"].as_array().map(Vec::as_slice).unwrap_or_default();
            if hits.is_empty() {
                println!("no matches");
            }
            for h in hits {
                println!(
                    "{}:{}  {:.4}  {}",
                    s(&h["path"]),
                    h["line"],
                    h["score"].as_f64().unwrap_or(0.0),
                    s(&h["title"])
                );
                println!("    {}", s(&h["snippet"]));
                for r in h["related"].as_array().into_iter().flatten() {
                    println!("    -> {} ({})", s(&r["path"]), s(&r["title"]));
                }
            }
        }
        MemoryCmd::Log { .. } => {
            for c in v["commits"].as_array().into_iter().flatten() {
                let short: String = s(&c["rev"]).chars().take(12).collect();
                println!(
                    "{short}  {}  {} <{}>  {}",
                    s(&c["time"]),
                    s(&c["author"]),
                    s(&c["email"]),
                    s(&c["message"]).lines().next().unwrap_or("")
                );
            }
        }
        MemoryCmd::Diff { .. } => print!("{}", s(&v["diff"])),
        MemoryCmd::Revert { .. } => println!(
            "reverted: commit {}",
            v["commit"].as_str().unwrap_or("(none)")
        ),
        MemoryCmd::Status { .. } => {
            let files = v["files"].as_array().map(Vec::as_slice).unwrap_or_default();
            for f in files {
                print!(
                    "{:<10} {:<3} {}",
                    s(&f["index"]),
                    s(&f["git"]),
                    s(&f["path"])
                );
                if f["missing_vectors"].as_u64().unwrap_or(0) > 0 {
                    print!("  ({} chunks awaiting vectors)", f["missing_vectors"]);
                }
                if let Some(e) = f["error"].as_str() {
                    print!("  [{e}]");
                }
                println!();
            }
            if files.is_empty() {
                println!("index fresh");
            }
            println!(
                "{} files, {} chunks, {} with vectors",
                v["indexed_files"], v["chunks"], v["vectors"]
            );
        }
        MemoryCmd::Reindex { .. } => match origin {
            Origin::Local => println!(
                "reindexed {} files, {} chunks ({} with vectors, {} texts embedded)",
                v["files"], v["chunks"], v["vectors"], v["texts_embedded"]
            ),
            Origin::Remote(_) => println!(
                "reindexed: {} files indexed, {} texts embedded",
                v["indexed"].as_array().map(Vec::len).unwrap_or(0),
                v["texts_embedded"]
            ),
        },
        MemoryCmd::Tool { .. } => println!("{}", s(&v["text"])),
        MemoryCmd::Watch => {}
    }
}
