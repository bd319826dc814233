//! Code contexts of a sandbox (`/v1/sandboxes/{id}/contexts`): stateful
//! interpreters, and runs of code in them.

use http::Method;
pub use sandlot_proto::api::code::{
    CodeError, CodeEvent, CodeResult, ContextList, ContextView, CreateContextBody, Execution,
    RunCodeBody, RunStatus, DEFAULT_CONTEXT,
};

use crate::stream::{ws_connect, Lines, WsSession};
use crate::{conn, enc, Client, Error};

/// The NDJSON events of a run (`started` first, `end` last).
pub struct CodeStream {
    lines: Lines,
}

impl CodeStream {
    /// The next event; `None` after the last. An `error` line becomes `Err`.
    pub async fn next_event(&mut self) -> Result<Option<CodeEvent>, Error> {
        let Some(l) = self.lines.next_line().await? else {
            return Ok(None);
        };
        let ev: CodeEvent =
            serde_json::from_slice(&l).map_err(|e| Error::Decode(format!("run line: {e}")))?;
        if let CodeEvent::Error { error } = ev {
            return Err(Error::Api {
                status: http::StatusCode::INTERNAL_SERVER_ERROR,
                body: error,
            });
        }
        Ok(Some(ev))
    }
}

/// A run over a WebSocket: its events as text frames, interrupts sent in band.
pub struct CodeWs {
    ws: WsSession,
}

impl CodeWs {
    /// The next event; `None` after the last. An `error` event becomes `Err`.
    pub async fn next_event(&mut self) -> Result<Option<CodeEvent>, Error> {
        let Some(t) = self.ws.next_text().await? else {
            return Ok(None);
        };
        let ev: CodeEvent =
            serde_json::from_str(&t).map_err(|e| Error::Decode(format!("run frame: {e}")))?;
        if let CodeEvent::Error { error } = ev {
            return Err(Error::Api {
                status: http::StatusCode::INTERNAL_SERVER_ERROR,
                body: error,
            });
        }
        Ok(Some(ev))
    }

    /// Interrupts the cell.
    pub async fn interrupt(&mut self) -> Result<(), Error> {
        self.ws
            .send_json(&serde_json::json!({"type": "interrupt"}))
            .await
    }
}

impl Client {
    /// Runs code over a WebSocket (events as they happen, interrupt in band).
    pub async fn run_code_ws(
        &self,
        id: &str,
        ctx: &str,
        req: &RunCodeBody,
    ) -> Result<CodeWs, Error> {
        let mut ws = ws_connect(
            self.target(),
            &format!("/v1/sandboxes/{}/contexts/{}/run/ws", enc(id), enc(ctx)),
            &self.headers(),
        )
        .await?;
        ws.send_json(req).await?;
        Ok(CodeWs { ws })
    }

    /// Creates a code context and starts its interpreter.
    pub async fn create_context(
        &self,
        id: &str,
        req: &CreateContextBody,
    ) -> Result<ContextView, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/contexts", enc(id)),
            Some(req),
        )
        .await
    }

    pub async fn list_contexts(&self, id: &str) -> Result<Vec<ContextView>, Error> {
        let l: ContextList = self
            .json(
                Method::GET,
                &format!("/v1/sandboxes/{}/contexts", enc(id)),
                None::<&()>,
            )
            .await?;
        Ok(l.contexts)
    }

    pub async fn delete_context(&self, id: &str, ctx: &str) -> Result<(), Error> {
        self.no_content(
            Method::DELETE,
            &format!("/v1/sandboxes/{}/contexts/{}", enc(id), enc(ctx)),
            None::<&()>,
        )
        .await
    }

    /// Starts the context's interpreter again (its state is lost).
    pub async fn restart_context(&self, id: &str, ctx: &str) -> Result<ContextView, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/contexts/{}/restart", enc(id), enc(ctx)),
            None::<&()>,
        )
        .await
    }

    /// Interrupts the cell the context runs now.
    pub async fn interrupt_context(&self, id: &str, ctx: &str) -> Result<(), Error> {
        self.no_content(
            Method::POST,
            &format!("/v1/sandboxes/{}/contexts/{}/interrupt", enc(id), enc(ctx)),
            None::<&()>,
        )
        .await
    }

    /// Runs code in a context (`default`: the sandbox's Python context) to its end.
    pub async fn run_code(
        &self,
        id: &str,
        ctx: &str,
        req: &RunCodeBody,
    ) -> Result<Execution, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/contexts/{}/run", enc(id), enc(ctx)),
            Some(req),
        )
        .await
    }

    /// Runs code and streams its events as they happen.
    pub async fn run_code_stream(
        &self,
        id: &str,
        ctx: &str,
        req: &RunCodeBody,
    ) -> Result<CodeStream, Error> {
        let body = conn::full(serde_json::to_vec(req).map_err(|e| Error::Decode(e.to_string()))?);
        let resp = self
            .send(
                Method::POST,
                &format!(
                    "/v1/sandboxes/{}/contexts/{}/run?stream=ndjson",
                    enc(id),
                    enc(ctx)
                ),
                Some("application/json"),
                body,
            )
            .await?;
        Ok(CodeStream {
            lines: Lines::new(resp),
        })
    }
}
