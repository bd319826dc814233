//! `sandlot memory --remote NAME ...`: the same commands against store NAME of a daemon
//! (`/v1/memory/NAME/...`). Each command is first planned as a request (method, path, body),
//! then sent; the answer is printed as JSON (`--json`) or as text by the local mode's
//! [`crate::memory_output::render`].

use anyhow::{bail, Context};
use sandlot_client::encode_path as seg;
use serde_json::{json, Value};

use crate::memory_cmd::{patch_is_empty, MemoryCmd, Request};
use crate::memory_output::{Origin, Printer};

/// One API request.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub method: &'static str,
    pub path: String,
    pub body: Option<Value>,
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

/// The JSON of `v` without null fields and empty lists: the fields the command sets.
fn set_fields(v: &impl serde::Serialize) -> anyhow::Result<Value> {
    let mut v = serde_json::to_value(v)?;
    if let Some(o) = v.as_object_mut() {
        o.retain(|_, f| !(f.is_null() || f.as_array().is_some_and(Vec::is_empty)));
    }
    Ok(v)
}

/// The request for `cmd` on store `store`, given its text input (the body of `add` and
/// `edit`, the call of `tool`).
pub fn plan(store: &str, cmd: &MemoryCmd, input: Option<String>) -> anyhow::Result<Planned> {
    let base = format!("/v1/memory/{}", seg(store));
    let p = |method, path: String, body| Planned { method, path, body };
    Ok(match cmd.request(input)? {
        Request::Init => p("POST", "/v1/memory".into(), Some(json!({ "name": store }))),
        Request::Stores => p("GET", "/v1/memory".into(), None),
        Request::DeleteStore => p("DELETE", base, None),
        Request::Add { new, supersedes } => {
            let mut b = set_fields(&new)?;
            if let Some(old) = supersedes {
                b["supersedes"] = json!(old);
            }
            p("POST", format!("{base}/memories"), Some(b))
        }
        Request::Get { key, rev } => p(
            "GET",
            format!("{base}/memories/{}{}", seg(&key), query(&[("rev", rev)])),
            None,
        ),
        Request::Edit { key, patch } => {
            if patch_is_empty(&patch) {
                bail!("with --remote, `edit` needs at least one change flag (no editor session)");
            }
            p(
                "PATCH",
                format!("{base}/memories/{}", seg(&key)),
                Some(set_fields(&patch)?),
            )
        }
        Request::Mv { from, to } => p(
            "POST",
            format!("{base}/move"),
            Some(json!({ "from": from, "to": to })),
        ),
        Request::Rm { key } => p("DELETE", format!("{base}/memories/{}", seg(&key)), None),
        Request::Search(q) => p("POST", format!("{base}/search"), Some(set_fields(&q)?)),
        Request::Log { key, limit } => p(
            "GET",
            format!(
                "{base}/log{}",
                query(&[("key", key), ("limit", Some(limit.to_string()))])
            ),
            None,
        ),
        Request::Diff { key, from, to } => p(
            "GET",
            format!(
                "{base}/diff{}",
                query(&[("key", key), ("from", Some(from)), ("to", to)])
            ),
            None,
        ),
        Request::RevertCommit { commit } => p(
            "POST",
            format!("{base}/revert"),
            Some(json!({ "commit": commit })),
        ),
        Request::RevertMemory { key, to } => p(
            "POST",
            format!("{base}/revert"),
            Some(json!({ "key": key, "to": to })),
        ),
        Request::Status { all } => p(
            "GET",
            format!("{base}/status{}", query(&[("all", Some(all.to_string()))])),
            None,
        ),
        Request::Reindex { fresh } => p(
            "POST",
            format!("{base}/reindex"),
            Some(json!({ "fresh": fresh })),
        ),
        Request::Tool(v) => p("POST", format!("{base}/tool"), Some(v)),
        Request::Watch => {
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
    input: Option<String>,
    json_out: bool,
) -> anyhow::Result<i32> {
    let planned = plan(store, cmd, input)?;
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
    let out = Printer {
        cmd,
        json: json_out,
        origin: Origin::Remote(store),
    };
    out.print(&v, || Ok(v.clone()))?;
    Ok(match cmd {
        MemoryCmd::Tool { .. } if v["is_error"] == json!(true) => 1,
        _ => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_cmd::ModeArg;

    #[test]
    fn remote_commands_plan_requests() {
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

    #[test]
    fn writes_send_only_the_fields_given() {
        let add = MemoryCmd::Add {
            title: "Ann".into(),
            body: None,
            body_file: None,
            folder: Some("people".into()),
            path: None,
            id: None,
            kind: Some("person".into()),
            tags: vec!["crm".into()],
            links: vec![],
            valid_from: None,
            valid_to: Some(String::new()),
            supersedes: Some("people/ann-old".into()),
        };
        let p = plan("n", &add, Some("likes tea".into())).unwrap();
        assert_eq!(
            (p.method, p.path.as_str()),
            ("POST", "/v1/memory/n/memories")
        );
        assert_eq!(
            p.body.unwrap(),
            json!({"title": "Ann", "body": "likes tea", "folder": "people", "type": "person",
                   "tags": ["crm"], "valid_to": "", "supersedes": "people/ann-old"})
        );
        let p = plan("n", &add, None).unwrap();
        assert_eq!(p.body.unwrap()["body"], "");
        let edit = |add_tags: Vec<String>| MemoryCmd::Edit {
            key: "people/ann.md".into(),
            title: None,
            body: None,
            body_file: None,
            kind: None,
            add_tags,
            remove_tags: vec![],
            links: vec!["acme".into()],
            valid_from: None,
            valid_to: None,
        };
        let p = plan("n", &edit(vec!["q3".into()]), Some("new body".into())).unwrap();
        assert_eq!(
            (p.method, p.path.as_str()),
            ("PATCH", "/v1/memory/n/memories/people/ann.md")
        );
        assert_eq!(
            p.body.unwrap(),
            json!({"body": "new body", "add_tags": ["q3"], "add_links": ["acme"]})
        );
        let bare = MemoryCmd::Edit {
            key: "k".into(),
            title: None,
            body: None,
            body_file: None,
            kind: None,
            add_tags: vec![],
            remove_tags: vec![],
            links: vec![],
            valid_from: None,
            valid_to: None,
        };
        let e = plan("n", &bare, None).unwrap_err();
        assert!(e.to_string().contains("at least one change flag"), "{e}");
        let revert = MemoryCmd::Revert {
            key: Some("k".into()),
            commit: None,
            to: Some("HEAD~2".into()),
        };
        assert_eq!(
            plan("n", &revert, None).unwrap().body.unwrap(),
            json!({"key": "k", "to": "HEAD~2"})
        );
    }
}
