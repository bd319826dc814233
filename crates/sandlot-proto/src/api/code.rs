//! Code contexts: long-lived interpreters (Jupyter kernels) inside a sandbox that
//! keep their state between runs: `/v1/sandboxes/{id}/contexts`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ApiErrorBody;

/// The languages a context may speak.
pub const LANGUAGES: &[&str] = &["python", "bash", "javascript"];

/// The context every sandbox has without asking: Python, created on first use.
pub const DEFAULT_CONTEXT: &str = "default";

/// `POST /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateContextBody {
    /// `python` (default), `bash` or `javascript` (needs a Jupyter kernel for it in
    /// the image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Working directory of the interpreter (absolute; default: the sandbox's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Variables set over the sandbox's environment for the interpreter.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// A code context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContextView {
    pub id: String,
    pub language: String,
    /// Its working directory as asked (absent: the sandbox's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// `idle`, `busy` (running a cell), or `stopped` (its interpreter ended; the next
    /// run starts a new one, with `restarted` set).
    pub state: String,
    /// How many times its interpreter was started again (restart, crash, timeout).
    pub restarts: u64,
    /// RFC 3339.
    pub created_at: String,
}

/// `GET /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContextList {
    pub contexts: Vec<ContextView>,
}

/// `POST .../contexts/{ctx}/run`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RunCodeBody {
    pub code: String,
    /// Interrupt the cell after this long (seconds or `"30s"`; default 300s). A cell
    /// that does not stop within 2s of the interrupt loses the context's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "30s"))]
    pub timeout: Option<serde_json::Value>,
    /// Variables set for this run only (Python, bash and javascript contexts).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// One rich result: a MIME bundle (`text/plain`, `text/html`, `text/markdown`,
/// `image/png` as base64, `image/svg+xml`, `application/json`, `text/latex`, ...).
/// A pandas DataFrame carries `text/html` and, as `application/json`, its data
/// (`columns`, `index`, `data`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CodeResult {
    /// The value of the cell's last expression (`false`: `display()` output).
    pub is_main_result: bool,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub data: BTreeMap<String, serde_json::Value>,
}

/// An exception a cell raised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CodeError {
    /// `ZeroDivisionError`, `KeyboardInterrupt`; `KernelDied` when the interpreter
    /// ended, `TimeoutError` when the run's timeout expired.
    pub name: String,
    pub value: String,
    pub traceback: String,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Ok,
    /// The cell raised (including `KeyboardInterrupt` after an interrupt).
    Error,
    /// The timeout expired.
    TimedOut,
    /// The interpreter died (crash, `os._exit`, out of memory): its state is lost.
    Crashed,
}

/// The outcome of a run (the answer without `?stream=ndjson`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Execution {
    pub results: Vec<CodeResult>,
    /// Chunks of stdout and stderr text, in order.
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CodeError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_count: Option<u64>,
    pub status: RunStatus,
    /// The interpreter was started again before this run: earlier state is lost.
    pub restarted: bool,
    /// Output past the per-run cap was left out (a marker says where).
    pub truncated: bool,
}

/// One line of `POST .../run?stream=ndjson` (and one text frame of the run
/// WebSocket): `started`, then output as it happens, then `end`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeEvent {
    Started {
        context: ContextView,
        restarted: bool,
    },
    Stdout {
        text: String,
    },
    Stderr {
        text: String,
    },
    Result {
        result: CodeResult,
    },
    /// The cell raised.
    Exception {
        error: CodeError,
    },
    /// The run is over (nothing follows).
    End {
        status: RunStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        execution_count: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<CodeError>,
        restarted: bool,
        truncated: bool,
    },
    /// The stream failed; nothing follows.
    Error {
        error: ApiErrorBody,
    },
}
