//! `sandlot memory --remote NAME ...`: the same commands against store NAME of a daemon
//! (`/v1/memory/NAME/...`). Each command is first planned as a request (method, path, body),
//! then sent; the answer is printed as JSON (`--json`) or in the local mode's format.

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::memory_cmd::{MemoryCmd, ModeArg};

/// One API request.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub method: &'static str,
    pub path: String,
    pub body: Option<Value>,
}

/// Percent-encodes a path segment (keeping `/`, since memory keys are paths).
fn seg(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (k, v) in pairs {
        if let Some(v) = v {
            q.append_pair(k, v);
            any = true;
        }
    }
    if any {
        format!("?{}", q.finish())
    } else {
        String::new()
    }
}

fn parse_time(s: &str) -> anyhow::Result<i64> {
    crate::memory_cmd::parse_at(s)
}

/// The request for `cmd` on store `store`.
pub fn plan(store: &str, cmd: &MemoryCmd, body_text: Option<String>) -> anyhow::Result<Planned> {
    let base = format!("/v1/memory/{}", seg(store));
    let p = |method, path: String, body| Planned { method, path, body };
    Ok(match cmd {
        MemoryCmd::Init => p("POST", "/v1/memory".into(), Some(json!({ "name": store }))),
        MemoryCmd::Stores => p("GET", "/v1/memory".into(), None),
        MemoryCmd::DeleteStore => p("DELETE", base, None),
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
        } => {
            let mut b = json!({ "title": title, "body": body_text.unwrap_or_default() });
            let opt = |b: &mut Value, k: &str, v: &Option<String>| {
                if let Some(v) = v {
                    b[k] = json!(v);
                }
            };
            opt(&mut b, "folder", folder);
            opt(&mut b, "path", path);
            opt(&mut b, "id", id);
            opt(&mut b, "type", kind);
            opt(&mut b, "valid_from", valid_from);
            opt(&mut b, "valid_to", valid_to);
            opt(&mut b, "supersedes", supersedes);
            if !tags.is_empty() {
                b["tags"] = json!(tags);
            }
            if !links.is_empty() {
                b["links"] = json!(links);
            }
            p("POST", format!("{base}/memories"), Some(b))
        }
        MemoryCmd::Get { key, rev } => p(
            "GET",
            format!(
                "{base}/memories/{}{}",
                seg(key),
                query(&[("rev", rev.clone())])
            ),
            None,
        ),
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
        } => {
            let mut b = json!({});
            for (k, v) in [
                ("title", title),
                ("type", kind),
                ("valid_from", valid_from),
                ("valid_to", valid_to),
            ] {
                if let Some(v) = v {
                    b[k] = json!(v);
                }
            }
            if let Some(t) = body_text {
                b["body"] = json!(t);
            }
            if !add_tags.is_empty() {
                b["add_tags"] = json!(add_tags);
            }
            if !remove_tags.is_empty() {
                b["remove_tags"] = json!(remove_tags);
            }
            if !links.is_empty() {
                b["add_links"] = json!(links);
            }
            if b.as_object().is_some_and(|o| o.is_empty()) {
                bail!("with --remote, `edit` needs at least one change flag (no editor session)");
            }
            p("PATCH", format!("{base}/memories/{}", seg(key)), Some(b))
        }
        MemoryCmd::Mv { from, to } => p(
            "POST",
            format!("{base}/move"),
            Some(json!({ "from": from, "to": to })),
        ),
        MemoryCmd::Rm { key } => p("DELETE", format!("{base}/memories/{}", seg(key)), None),
        MemoryCmd::Search {
            query: text,
            limit,
            tags,
            kind,
            folder,
            at,
            all_time,
            mode,
            expand,
        } => {
            let valid = match (at, all_time) {
                (Some(t), _) => json!({ "at": parse_time(t)? }),
                (None, true) => json!("any"),
                (None, false) => json!("now"),
            };
            let mode = match mode {
                ModeArg::Hybrid => "hybrid",
                ModeArg::Bm25 => "bm25",
                ModeArg::Vector => "vector",
            };
            let mut b = json!({
                "text": text, "limit": limit, "valid": valid, "mode": mode, "expand": expand
            });
            if !tags.is_empty() {
                b["tags"] = json!(tags);
            }
            if let Some(k) = kind {
                b["type"] = json!(k);
            }
            if let Some(f) = folder {
                b["folder"] = json!(f);
            }
            p("POST", format!("{base}/search"), Some(b))
        }
        MemoryCmd::Log { key, limit } => p(
            "GET",
            format!(
                "{base}/log{}",
                query(&[("key", key.clone()), ("limit", Some(limit.to_string()))])
            ),
            None,
        ),
        MemoryCmd::Diff { key, from, to } => p(
            "GET",
            format!(
                "{base}/diff{}",
                query(&[
                    ("key", key.clone()),
                    ("from", Some(from.clone())),
                    ("to", to.clone())
                ])
            ),
            None,
        ),
        MemoryCmd::Revert { key, commit, to } => {
            let b = match (key, commit, to) {
                (None, Some(c), _) => json!({ "commit": c }),
                (Some(k), None, Some(rev)) => json!({ "key": k, "to": rev }),
                _ => bail!(
                    "use `revert --commit REV` (whole store) or `revert KEY --to REV` (one memory)"
                ),
            };
            p("POST", format!("{base}/revert"), Some(b))
        }
        MemoryCmd::Status { all } => p(
            "GET",
            format!("{base}/status{}", query(&[("all", Some(all.to_string()))])),
            None,
        ),
        MemoryCmd::Reindex { fresh } => p(
            "POST",
            format!("{base}/reindex"),
            Some(json!({ "fresh": fresh })),
        ),
        MemoryCmd::Tool { .. } => {
            let text = body_text.unwrap_or_default();
            let v: Value =
                serde_json::from_str(&text).context("parse memory tool input as JSON")?;
            p("POST", format!("{base}/tool"), Some(v))
        }
        MemoryCmd::Watch => {
            bail!("with --remote the daemon watches its stores itself; `watch` is local only")
        }
    })
}

/// Connection to the daemon.
#[derive(Debug, Clone, clap::Args)]
pub struct RemoteArgs {
    /// Use memory store NAME of the daemon (at --host) instead of a local directory.
    #[arg(
        long,
        global = true,
        env = "SANDLOT_MEMORY_REMOTE",
        value_name = "NAME"
    )]
    pub remote: Option<String>,
    /// Daemon address: unix:///path.sock, /path.sock or HOST:PORT (with --remote).
    #[arg(long, global = true, env = "SANDLOT_URL", default_value = sandlot_client::DEFAULT_HOST)]
    pub host: String,
    /// Bearer token (required over TCP).
    #[arg(long, global = true, env = "SANDLOT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// On the operator socket: act as this tenant.
    #[arg(long, global = true)]
    pub tenant: Option<String>,
    /// With --remote: the agent commits are attributed to (default: the tenant).
    #[arg(long, global = true, env = "SANDLOT_MEMORY_AGENT")]
    pub agent: Option<String>,
}

/// Runs `cmd` against the daemon; returns the exit code.
pub fn run(
    conn: &RemoteArgs,
    store: &str,
    cmd: &MemoryCmd,
    body_text: Option<String>,
    json_out: bool,
) -> anyhow::Result<i32> {
    let planned = plan(store, cmd, body_text)?;
    let client = sandlot_client::Client::new(&conn.host, conn.token.clone())?
        .with_tenant(conn.tenant.clone())
        .with_agent(conn.agent.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let v = rt
        .block_on(client.call_json(planned.method, &planned.path, planned.body.as_ref()))
        .with_context(|| format!("memory store {store} on {}", conn.host))?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(tool_exit(cmd, &v));
    }
    render(store, cmd, &v);
    Ok(tool_exit(cmd, &v))
}

fn tool_exit(cmd: &MemoryCmd, v: &Value) -> i32 {
    match cmd {
        MemoryCmd::Tool { .. } if v["is_error"] == json!(true) => 1,
        _ => 0,
    }
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// Human output, like the local mode's.
fn render(store: &str, cmd: &MemoryCmd, v: &Value) {
    match cmd {
        MemoryCmd::Init => println!("created memory store {store}"),
        MemoryCmd::Stores => {
            for st in v["stores"].as_array().into_iter().flatten() {
                println!("{}", s(&st["name"]));
            }
        }
        MemoryCmd::DeleteStore => println!("deleted memory store {store}"),
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
            let hits = v["hits"].as_array().cloned().unwrap_or_default();
            if hits.is_empty() {
                println!("no matches");
            }
            for h in &hits {
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
            let files = v["files"].as_array().cloned().unwrap_or_default();
            for f in &files {
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
        MemoryCmd::Reindex { .. } => println!(
            "reindexed: {} files indexed, {} texts embedded",
            v["indexed"].as_array().map(Vec::len).unwrap_or(0),
            v["texts_embedded"]
        ),
        MemoryCmd::Tool { .. } => println!("{}", s(&v["text"])),
        MemoryCmd::Watch => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue8_remote_commands_plan_requests() {
        let get = MemoryCmd::Get {
            key: "people/ann lee.md".into(),
            rev: Some("HEAD~1".into()),
        };
        assert_eq!(
            plan("notes", &get, None).unwrap(),
            Planned {
                method: "GET",
                path: "/v1/memory/notes/memories/people/ann%20lee.md?rev=HEAD%7E1".into(),
                body: None
            }
        );
        let search = MemoryCmd::Search {
            query: "churn".into(),
            limit: 5,
            tags: vec!["crm".into()],
            kind: None,
            folder: Some("accounts".into()),
            at: None,
            all_time: true,
            mode: ModeArg::Bm25,
            expand: true,
        };
        let p = plan("notes", &search, None).unwrap();
        assert_eq!(
            (p.method, p.path.as_str()),
            ("POST", "/v1/memory/notes/search")
        );
        assert_eq!(
            p.body.unwrap(),
            json!({"text": "churn", "limit": 5, "valid": "any", "mode": "bm25", "expand": true,
                   "tags": ["crm"], "folder": "accounts"})
        );
        let revert = MemoryCmd::Revert {
            key: None,
            commit: None,
            to: None,
        };
        assert!(plan("notes", &revert, None).is_err());
        assert!(plan("notes", &MemoryCmd::Watch, None).is_err());
        let tool = MemoryCmd::Tool { input: "-".into() };
        let p = plan(
            "n",
            &tool,
            Some(r#"{"command": "view", "path": "/memories"}"#.into()),
        )
        .unwrap();
        assert_eq!(p.path, "/v1/memory/n/tool");
        assert!(plan("n", &tool, Some("not json".into())).is_err());
    }
}
