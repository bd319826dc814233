//! Anthropic's memory tool (`memory_20250818`) over a store: the commands `view`, `create`,
//! `str_replace`, `insert`, `delete` and `rename` on paths under `/memories`, with the result
//! strings the tool's documentation specifies, so agents trained on it work unchanged. Every
//! change is a git commit by the calling agent and is indexed before the call returns.

use serde::Deserialize;

use crate::git::Author;
use crate::store::{validate_rel_path, Store, StoreError};
use crate::tree::{join, Kind, WorkTree};

/// The virtual root the agent sees.
pub const ROOT: &str = "/memories";
/// Most lines `view` shows for one file.
pub const MAX_LINES: usize = 999_999;

/// One memory tool call, as the model sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    View {
        path: String,
        #[serde(default)]
        view_range: Option<(i64, i64)>,
    },
    Create {
        path: String,
        file_text: String,
    },
    StrReplace {
        path: String,
        old_str: String,
        #[serde(default)]
        new_str: String,
    },
    Insert {
        path: String,
        insert_line: i64,
        insert_text: String,
    },
    Delete {
        path: String,
    },
    Rename {
        old_path: String,
        new_path: String,
    },
}

/// The text returned to the model, and whether it reports an error (`is_error` of the tool result).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ToolOutput {
    pub text: String,
    pub is_error: bool,
}

fn ok(text: impl Into<String>) -> ToolOutput {
    ToolOutput {
        text: text.into(),
        is_error: false,
    }
}

fn err(text: impl Into<String>) -> ToolOutput {
    ToolOutput {
        text: text.into(),
        is_error: true,
    }
}

/// Runs one tool call given as the tool's JSON input (`{"command": "view", "path": "/memories"}`).
pub fn execute_json(store: &Store, input: &serde_json::Value, author: &Author) -> ToolOutput {
    match Command::deserialize(input) {
        Ok(cmd) => execute(store, &cmd, author),
        Err(e) => err(format!("Error: invalid memory tool input: {e}")),
    }
}

/// Where a `/memories/...` path points inside the store: `None` for the root itself.
enum Target {
    Root,
    Rel(String),
}

fn target(path: &str) -> Result<Target, ToolOutput> {
    let denied = || {
        err(format!(
            "Error: The path {path} is not allowed: paths must stay inside {ROOT}"
        ))
    };
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2e") || lower.contains("%2f") || lower.contains("%5c") {
        return Err(denied());
    }
    let rest = match path.strip_prefix(ROOT) {
        Some(r) if r.is_empty() || r == "/" => return Ok(Target::Root),
        Some(r) if r.starts_with('/') => r.trim_start_matches('/').trim_end_matches('/'),
        _ => return Err(denied()),
    };
    match validate_rel_path(rest) {
        Ok(p) => Ok(Target::Rel(p)),
        Err(_) => Err(denied()),
    }
}

fn failure(e: StoreError) -> ToolOutput {
    err(format!("Error: {e}"))
}

/// Runs one tool call.
pub fn execute(store: &Store, cmd: &Command, author: &Author) -> ToolOutput {
    match cmd {
        Command::View { path, view_range } => view(store, path, *view_range),
        Command::Create { path, file_text } => {
            let rel = match target(path) {
                Ok(Target::Rel(r)) => r,
                Ok(Target::Root) => return err(format!("Error: File {path} already exists")),
                Err(e) => return e,
            };
            if store.tree().kind(&rel).is_some() {
                return err(format!("Error: File {path} already exists"));
            }
            match store.write_file(&rel, file_text, &format!("memory: create {path}"), author) {
                Ok(_) => ok(format!("File created successfully at: {path}")),
                Err(e) => failure(e),
            }
        }
        Command::StrReplace {
            path,
            old_str,
            new_str,
        } => {
            let missing = || {
                err(format!(
                    "Error: The path {path} does not exist. Please provide a valid path."
                ))
            };
            let rel = match target(path) {
                Ok(Target::Rel(r)) => r,
                Ok(Target::Root) => return missing(),
                Err(e) => return e,
            };
            if store.tree().kind(&rel) != Some(Kind::File) {
                return missing();
            }
            let text = match store.read_file(&rel) {
                Ok(t) => t,
                Err(e) => return failure(e),
            };
            let hits: Vec<usize> = text
                .match_indices(old_str.as_str())
                .map(|(i, _)| i)
                .collect();
            if old_str.is_empty() || hits.is_empty() {
                return err(format!(
                    "No replacement was performed, old_str `{old_str}` did not appear verbatim in {path}."
                ));
            }
            if hits.len() > 1 {
                let lines: Vec<String> = hits
                    .iter()
                    .map(|&i| (text[..i].matches('\n').count() + 1).to_string())
                    .collect();
                return err(format!(
                    "No replacement was performed. Multiple occurrences of old_str `{old_str}` in lines: {}. Please ensure it is unique",
                    lines.join(", ")
                ));
            }
            let at = hits[0];
            let new_text = format!("{}{}{}", &text[..at], new_str, &text[at + old_str.len()..]);
            if let Err(e) =
                store.write_file(&rel, &new_text, &format!("memory: edit {path}"), author)
            {
                return failure(e);
            }
            let first = text[..at].matches('\n').count() + 1;
            let last = first + new_str.matches('\n').count();
            ok(format!(
                "The memory file has been edited.\n{}",
                numbered(&new_text, first.saturating_sub(4).max(1), last + 4)
            ))
        }
        Command::Insert {
            path,
            insert_line,
            insert_text,
        } => {
            let missing = || err(format!("Error: The path {path} does not exist"));
            let rel = match target(path) {
                Ok(Target::Rel(r)) => r,
                Ok(Target::Root) => return missing(),
                Err(e) => return e,
            };
            if store.tree().kind(&rel) != Some(Kind::File) {
                return missing();
            }
            let text = match store.read_file(&rel) {
                Ok(t) => t,
                Err(e) => return failure(e),
            };
            let lines: Vec<&str> = text.lines().collect();
            let n = lines.len();
            if *insert_line < 0 || *insert_line as usize > n {
                return err(format!(
                    "Error: Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines of the file: [0, {n}]"
                ));
            }
            let at = *insert_line as usize;
            let mut out = String::with_capacity(text.len() + insert_text.len() + 2);
            for l in &lines[..at] {
                out.push_str(l);
                out.push('\n');
            }
            out.push_str(insert_text);
            if !insert_text.ends_with('\n') {
                out.push('\n');
            }
            for l in &lines[at..] {
                out.push_str(l);
                out.push('\n');
            }
            if !text.ends_with('\n') && at < n {
                out.pop();
            }
            match store.write_file(&rel, &out, &format!("memory: insert into {path}"), author) {
                Ok(_) => ok(format!("The file {path} has been edited.")),
                Err(e) => failure(e),
            }
        }
        Command::Delete { path } => {
            let rel = match target(path) {
                Ok(Target::Rel(r)) => r,
                Ok(Target::Root) => {
                    return err(format!(
                        "Error: The path {path} cannot be deleted: it is the memory root"
                    ))
                }
                Err(e) => return e,
            };
            if store.tree().kind(&rel).is_none() {
                return err(format!("Error: The path {path} does not exist"));
            }
            match store.remove(&rel, author) {
                Ok(_) => ok(format!("Successfully deleted {path}")),
                Err(e) => failure(e),
            }
        }
        Command::Rename { old_path, new_path } => {
            let from = match target(old_path) {
                Ok(Target::Rel(r)) => r,
                Ok(Target::Root) => {
                    return err(format!(
                        "Error: The path {old_path} cannot be renamed: it is the memory root"
                    ))
                }
                Err(e) => return e,
            };
            let to = match target(new_path) {
                Ok(Target::Rel(r)) => r,
                Ok(Target::Root) => {
                    return err(format!("Error: The destination {new_path} already exists"))
                }
                Err(e) => return e,
            };
            if store.tree().kind(&from).is_none() {
                return err(format!("Error: The path {old_path} does not exist"));
            }
            if store.tree().kind(&to).is_some() {
                return err(format!("Error: The destination {new_path} already exists"));
            }
            match store.rename(&from, &to, author) {
                Ok(_) => ok(format!("Successfully renamed {old_path} to {new_path}")),
                Err(e) => failure(e),
            }
        }
    }
}

/// `cat -n` style lines `from..=to` (1-based, clamped) of `text`.
fn numbered(text: &str, from: usize, to: usize) -> String {
    let mut out = String::new();
    for (i, l) in text.lines().enumerate() {
        let n = i + 1;
        if n < from || n > to {
            continue;
        }
        out.push_str(&format!("{n:>6}\t{l}\n"));
    }
    if out.ends_with('\n') {
        out.pop();
    }
    out
}

fn view(store: &Store, path: &str, range: Option<(i64, i64)>) -> ToolOutput {
    let missing = || {
        err(format!(
            "The path {path} does not exist. Please provide a valid path."
        ))
    };
    let t = match target(path) {
        Ok(t) => t,
        Err(e) => return e,
    };
    if let Target::Rel(r) = &t {
        // Never through a symbolic link (one planted by a sandbox could lead out of the store).
        if store.guard(r).is_err() {
            return missing();
        }
    }
    let rel = match &t {
        Target::Root => String::new(),
        Target::Rel(r) => r.clone(),
    };
    let tree = store.tree();
    match tree.kind(&rel) {
        Some(Kind::Dir) => {
            let shown = path.trim_end_matches('/');
            let mut lines = vec![format!("{}\t{shown}", human_size(dir_size(tree, &rel)))];
            list_dir(tree, &rel, shown, 1, &mut lines);
            return ok(format!(
                "Here're the files and directories up to 2 levels deep in {shown}, excluding hidden items and node_modules:\n{}",
                lines.join("\n")
            ));
        }
        Some(Kind::File) if !rel.is_empty() => {}
        _ => return missing(),
    }
    let text = match store.read_file(&rel) {
        Ok(t) => t,
        Err(e) => return failure(e),
    };
    let n = text.lines().count();
    if n > MAX_LINES {
        return err(format!(
            "File {path} exceeds maximum line limit of 999,999 lines."
        ));
    }
    let (from, to) = match range {
        None => (1, n.max(1)),
        Some((a, b)) => {
            let end = if b == -1 { n as i64 } else { b };
            if a < 1 || a as usize > n.max(1) || end < a || end as usize > n {
                return err(format!(
                    "Error: Invalid `view_range` parameter: [{a}, {b}]. It should be within the range of lines of the file: [1, {n}]"
                ));
            }
            (a as usize, end as usize)
        }
    };
    ok(format!(
        "Here's the content of {path} with line numbers:\n{}",
        numbered(&text, from, to)
    ))
}

fn visible(name: &str) -> bool {
    !name.starts_with('.') && name != "node_modules"
}

/// Lists folder `rel` of the work tree (through its descriptors: a folder swapped for a
/// link lists nothing).
fn list_dir(tree: &WorkTree, rel: &str, shown: &str, depth: usize, out: &mut Vec<String>) {
    let Ok((entries, _)) = tree.list(rel) else {
        return;
    };
    for (name, e) in entries.into_iter().filter(|(n, _)| visible(n)) {
        let child = format!("{shown}/{name}");
        let child_rel = join(rel, &name);
        let is_dir = e.kind == Kind::Dir;
        let size = if is_dir {
            dir_size(tree, &child_rel)
        } else {
            e.size
        };
        out.push(format!("{}\t{child}", human_size(size)));
        if is_dir && depth < 2 {
            list_dir(tree, &child_rel, &child, depth + 1, out);
        }
    }
}

fn dir_size(tree: &WorkTree, rel: &str) -> u64 {
    let Ok((entries, _)) = tree.list(rel) else {
        return 0;
    };
    entries
        .into_iter()
        .filter(|(n, _)| visible(n))
        .map(|(name, e)| match e.kind {
            Kind::Dir => dir_size(tree, &join(rel, &name)),
            _ => e.size,
        })
        .sum()
}

/// `du -h` style: `512`, `5.5K`, `1.2M`.
fn human_size(n: u64) -> String {
    const UNITS: [&str; 4] = ["K", "M", "G", "T"];
    if n < 1024 {
        return n.to_string();
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1}{}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_stay_under_the_root() {
        assert!(matches!(target("/memories"), Ok(Target::Root)));
        assert!(matches!(target("/memories/"), Ok(Target::Root)));
        assert!(matches!(target("/memories/a/b.md"), Ok(Target::Rel(p)) if p == "a/b.md"));
        for bad in [
            "/etc/passwd",
            "/memories/../etc",
            "/memoriesX/a",
            "/memories/%2e%2e/x",
            "/memories/.git/config",
            "memories/a",
        ] {
            assert!(target(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn sizes_and_numbering() {
        assert_eq!(human_size(512), "512");
        assert_eq!(human_size(5632), "5.5K");
        assert_eq!(human_size(1_300_000), "1.2M");
        assert_eq!(numbered("a\nb\nc\n", 2, 9), "     2\tb\n     3\tc");
    }

    #[test]
    fn commands_parse_from_tool_json() {
        let c: Command = serde_json::from_value(serde_json::json!(
            {"command": "view", "path": "/memories", "view_range": [1, 10]}
        ))
        .unwrap();
        assert!(matches!(
            c,
            Command::View {
                view_range: Some((1, 10)),
                ..
            }
        ));
        let bad = serde_json::from_value::<Command>(serde_json::json!({"command": "explode"}));
        assert!(bad.is_err());
    }
}
