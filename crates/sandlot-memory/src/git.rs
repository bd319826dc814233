//! The store's history: the `git` binary driven through `std::process`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Serialize;

/// Errors from running git.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("run git {args} in {dir}: {source}")]
    Spawn {
        args: String,
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("git {args} in {dir} failed ({status}): {stderr}")]
    Failed {
        args: String,
        dir: PathBuf,
        status: String,
        stderr: String,
    },
    #[error("git {args} in {dir}: output is not UTF-8")]
    NotUtf8 { args: String, dir: PathBuf },
}

/// Who a change is attributed to: the tenant or agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Author {
    pub name: String,
    pub email: String,
}

impl Author {
    pub fn new(name: impl Into<String>, email: impl Into<String>) -> Author {
        Author {
            name: name.into(),
            email: email.into(),
        }
    }
}

impl Default for Author {
    fn default() -> Author {
        Author::new("sandlot", "sandlot@localhost")
    }
}

/// One commit of the store history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Commit {
    pub rev: String,
    pub author: String,
    pub email: String,
    /// RFC 3339.
    pub time: String,
    pub message: String,
    /// Store-relative paths the commit touched.
    pub paths: Vec<String>,
}

/// A git work tree.
#[derive(Debug, Clone)]
pub(crate) struct Git {
    dir: PathBuf,
}

const FIELD: char = '\u{1f}';
const RECORD: char = '\u{1e}';

impl Git {
    pub(crate) fn new(dir: &Path) -> Git {
        Git {
            dir: dir.to_path_buf(),
        }
    }

    fn command(&self, args: &[&str], author: Option<&Author>) -> Command {
        let mut cmd = Command::new("git");
        cmd.arg("-C").arg(&self.dir);
        // Deterministic, non-interactive, independent of the operator's git config quirks.
        cmd.args(["-c", "core.quotepath=off", "-c", "color.ui=false"]);
        cmd.args(["-c", "commit.gpgsign=false", "-c", "core.autocrlf=false"]);
        // Never run code from the repository: a store may be mounted into untrusted sandboxes,
        // so hooks, an fsmonitor command and external diff/pager programs are switched off
        // whatever `.git/config` says.
        cmd.args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
        ]);
        cmd.args(["-c", "core.pager=cat", "-c", "diff.noprefix=false"]);
        cmd.arg("--no-pager");
        cmd.args(args);
        cmd.env("GIT_TERMINAL_PROMPT", "0");
        cmd.env_remove("GIT_DIR");
        cmd.env_remove("GIT_WORK_TREE");
        cmd.env_remove("GIT_INDEX_FILE");
        if let Some(a) = author {
            cmd.env("GIT_AUTHOR_NAME", &a.name);
            cmd.env("GIT_AUTHOR_EMAIL", &a.email);
            cmd.env("GIT_COMMITTER_NAME", &a.name);
            cmd.env("GIT_COMMITTER_EMAIL", &a.email);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    pub(crate) fn run(&self, args: &[&str], author: Option<&Author>) -> Result<String, GitError> {
        let shown = args.join(" ");
        let out = self
            .command(args, author)
            .output()
            .map_err(|source| GitError::Spawn {
                args: shown.clone(),
                dir: self.dir.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(GitError::Failed {
                args: shown,
                dir: self.dir.clone(),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        String::from_utf8(out.stdout).map_err(|_| GitError::NotUtf8 {
            args: shown,
            dir: self.dir.clone(),
        })
    }

    pub(crate) fn is_repo(&self) -> bool {
        self.dir.join(".git").exists()
    }

    pub(crate) fn init(&self) -> Result<(), GitError> {
        self.run(&["init", "--quiet", "--initial-branch=main"], None)?;
        Ok(())
    }

    /// Stages `paths` (additions, modifications and deletions) and commits them; returns the new
    /// revision, or `None` when nothing changed.
    pub(crate) fn commit_paths(
        &self,
        paths: &[&str],
        message: &str,
        author: &Author,
    ) -> Result<Option<String>, GitError> {
        let mut add = vec!["add", "--all", "--"];
        add.extend_from_slice(paths);
        self.run(&add, None)?;
        let mut diff = vec![
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--cached",
            "--quiet",
            "--",
        ];
        diff.extend_from_slice(paths);
        if self.run(&diff, None).is_ok() {
            return Ok(None);
        }
        let mut commit = vec!["commit", "--quiet", "--no-verify", "-m", message, "--"];
        commit.extend_from_slice(paths);
        self.run(&commit, Some(author))?;
        Ok(Some(self.head()?.unwrap_or_default()))
    }

    pub(crate) fn head(&self) -> Result<Option<String>, GitError> {
        match self.run(&["rev-parse", "--verify", "--quiet", "HEAD"], None) {
            Ok(s) => Ok(Some(s.trim().to_string())),
            Err(GitError::Failed { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// History, newest first, optionally of one path (following renames).
    pub(crate) fn log(&self, path: Option<&str>, limit: usize) -> Result<Vec<Commit>, GitError> {
        if self.head()?.is_none() {
            return Ok(Vec::new());
        }
        let fmt = format!("--format={RECORD}%H{FIELD}%an{FIELD}%ae{FIELD}%aI{FIELD}%B{FIELD}");
        let n = format!("-n{limit}");
        let mut args = vec!["log", &fmt, "--name-only", &n];
        if let Some(p) = path {
            // Follow renames, but only near-identical ones: memories share front matter keys,
            // so git's default 50% similarity would splice unrelated small files together.
            args.extend(["--follow", "-M90%", "--", p]);
        }
        let out = self.run(&args, None)?;
        let mut commits = Vec::new();
        for rec in out.split(RECORD).filter(|r| !r.trim().is_empty()) {
            let f: Vec<&str> = rec.splitn(6, FIELD).collect();
            if f.len() < 6 {
                continue;
            }
            commits.push(Commit {
                rev: f[0].to_string(),
                author: f[1].to_string(),
                email: f[2].to_string(),
                time: f[3].to_string(),
                message: f[4].trim().to_string(),
                paths: f[5]
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect(),
            });
        }
        Ok(commits)
    }

    /// Unified diff between two revisions (or a revision and the work tree when `to` is `None`).
    pub(crate) fn diff(
        &self,
        from: &str,
        to: Option<&str>,
        path: Option<&str>,
    ) -> Result<String, GitError> {
        let mut args = vec!["diff", "--no-ext-diff", "--no-textconv", from];
        if let Some(t) = to {
            args.push(t);
        }
        if let Some(p) = path {
            args.extend(["--", p]);
        }
        self.run(&args, None)
    }

    /// The content of `path` at `rev`.
    pub(crate) fn show(&self, rev: &str, path: &str) -> Result<String, GitError> {
        let spec = format!("{rev}:{path}");
        self.run(&["show", &spec], None)
    }

    /// Whether `ancestor` is `rev` or one of its ancestors.
    pub(crate) fn is_ancestor(&self, ancestor: &str, rev: &str) -> Result<bool, GitError> {
        match self.run(&["merge-base", "--is-ancestor", ancestor, rev], None) {
            Ok(_) => Ok(true),
            Err(GitError::Failed { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether `path` exists at `rev`.
    pub(crate) fn exists_at(&self, rev: &str, path: &str) -> Result<bool, GitError> {
        let spec = format!("{rev}:{path}");
        match self.run(&["cat-file", "-e", &spec], None) {
            Ok(_) => Ok(true),
            Err(GitError::Failed { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Resolves a revision expression to a full commit id.
    pub(crate) fn resolve(&self, rev: &str) -> Result<String, GitError> {
        let spec = format!("{rev}^{{commit}}");
        Ok(self
            .run(&["rev-parse", "--verify", "--quiet", &spec], None)?
            .trim()
            .to_string())
    }

    /// `git revert` of a whole commit, committed as `author`.
    pub(crate) fn revert_commit(&self, rev: &str, author: &Author) -> Result<String, GitError> {
        let res = self.run(&["revert", "--no-edit", rev], Some(author));
        if let Err(e) = res {
            // Leave the work tree as it was: a failed revert must not be half-applied.
            let _ = self.run(&["revert", "--abort"], None);
            return Err(e);
        }
        Ok(self.head()?.unwrap_or_default())
    }

    /// Paths changed between two revisions, with status letters (A, M, D, R...).
    pub(crate) fn changed_paths(&self, rev: &str) -> Result<Vec<String>, GitError> {
        let out = self.run(
            &["show", "--format=", "--name-only", "--no-renames", rev],
            None,
        )?;
        Ok(out
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }
}
