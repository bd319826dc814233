//! `sandlot run-code SB CODE|-`: runs code in a sandbox's code context (the default
//! Python one unless `--context`), streaming its output; rich results are shown by
//! their text (images and other formats by name and size).

use std::io::{Read, Write};

use sandlot_client::code::{CodeEvent, CodeResult, RunCodeBody, RunStatus, DEFAULT_CONTEXT};

use super::client_cmds::{num_or_str, Conn};

#[derive(Debug, clap::Args)]
pub struct RunCodeArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The code context (default: the sandbox's Python context).
    #[arg(short, long, default_value = DEFAULT_CONTEXT)]
    pub context: String,
    /// Interrupt the cell after this long, e.g. 30s (default 300s).
    #[arg(long)]
    pub timeout: Option<String>,
    /// Print the run's events as JSON lines.
    #[arg(long)]
    pub json: bool,
    /// Sandbox id or name.
    pub sandbox: String,
    /// The code, or `-` to read it from stdin.
    pub code: String,
}

/// Exit code of a run: 0 ok, 1 when the cell raised or the interpreter died, 124
/// when its timeout expired.
fn exit_code(s: RunStatus) -> i32 {
    match s {
        RunStatus::Ok => 0,
        RunStatus::Error | RunStatus::Crashed => 1,
        RunStatus::TimedOut => 124,
    }
}

/// A result as one line of text: its `text/plain`, else its formats.
fn result_text(r: &CodeResult) -> String {
    if let Some(t) = r.data.get("text/plain").and_then(|v| v.as_str()) {
        let rest: Vec<_> = r
            .data
            .iter()
            .filter(|(k, _)| k.as_str() != "text/plain")
            .map(|(k, v)| {
                format!(
                    "{k} ({} bytes)",
                    v.as_str().map_or(v.to_string().len(), str::len)
                )
            })
            .collect();
        if rest.is_empty() || r.is_main_result {
            return t.to_string();
        }
        return format!("{t} [{}]", rest.join(", "));
    }
    r.data.keys().cloned().collect::<Vec<_>>().join(", ")
}

pub async fn run(a: RunCodeArgs) -> anyhow::Result<i32> {
    let code = if a.code == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        a.code.clone()
    };
    let body = RunCodeBody {
        code,
        timeout: a.timeout.as_deref().map(num_or_str),
        ..Default::default()
    };
    let c = a.conn.client()?;
    let mut s = c.run_code_stream(&a.sandbox, &a.context, &body).await?;
    let mut status = None;
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    while let Some(ev) = s.next_event().await? {
        if a.json {
            writeln!(out, "{}", serde_json::to_string(&ev)?)?;
            if let CodeEvent::End { status: st, .. } = ev {
                status = Some(st);
            }
            continue;
        }
        match ev {
            CodeEvent::Started {
                restarted: true, ..
            } => writeln!(
                err,
                "sandlot: the interpreter was started again: earlier state is lost"
            )?,
            CodeEvent::Started { .. } | CodeEvent::Error { .. } => {}
            CodeEvent::Stdout { text } => {
                out.write_all(text.as_bytes())?;
                out.flush()?;
            }
            CodeEvent::Stderr { text } => err.write_all(text.as_bytes())?,
            CodeEvent::Result { result } => writeln!(out, "{}", result_text(&result))?,
            CodeEvent::Exception { error } => {
                if error.traceback.is_empty() {
                    writeln!(err, "{}: {}", error.name, error.value)?
                } else {
                    writeln!(err, "{}", error.traceback)?
                }
            }
            CodeEvent::End {
                status: st,
                error,
                truncated,
                ..
            } => {
                if let (RunStatus::TimedOut | RunStatus::Crashed, Some(e)) = (st, error) {
                    writeln!(err, "{}: {}", e.name, e.value)?;
                }
                if truncated {
                    writeln!(err, "sandlot: output past the daemon's cap was left out")?;
                }
                status = Some(st);
            }
        }
    }
    let st = status.ok_or_else(|| anyhow::anyhow!("the run's stream ended before its end"))?;
    Ok(exit_code(st))
}
