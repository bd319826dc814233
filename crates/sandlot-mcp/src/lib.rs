//! Sandlot's Model Context Protocol server: the tools an agent uses to create
//! sandboxes, run commands and code in them, read and write their files, browse
//! document collections and keep memories.
//!
//! Every tool is a call of the typed client of the HTTP API ([`sandlot_client::Client`]),
//! so each of the API's checks (the caller's tenant, quotas, limits, audit) applies
//! to it unchanged. The same tools serve two transports:
//!
//! * stdio ([`serve_stdio`]): `sandlot mcp`, with a client from `SANDLOT_URL` and
//!   `SANDLOT_TOKEN`;
//! * streamable HTTP ([`http_service`]): the daemon's `/mcp`, whose client for each
//!   request is made from that request (its bearer token) by the daemon.
//!
//! The tools live in this crate, not in the binary's, because the daemon
//! (`sandlot-server`) mounts them and cannot depend on the binary; and not in
//! `sandlot-client`, which stays free of the protocol's dependencies.

#![forbid(unsafe_code)]

mod args;
mod output;
mod resources;
mod tools;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourceTemplatesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use sandlot_client::Client;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use output::CappedOutput;

/// The client a request of a streamable HTTP session acts with, made from that
/// request's head (its `Authorization` header); `None` refuses the request.
pub type ClientForRequest = dyn Fn(&http::request::Parts) -> Option<Client> + Send + Sync;

/// Whose identity the tools act with.
#[derive(Clone)]
enum Caller {
    /// One client for the whole session (stdio).
    Fixed(Client),
    /// A client per request, from its HTTP head (the daemon's `/mcp`).
    PerRequest(Arc<ClientForRequest>),
}

/// Tool calls a session may have in flight at once; one more is a tool error
/// naming this limit.
pub const MAX_CALLS_PER_SESSION: usize = 8;

/// The tool calls a tenant may have in flight at once over all its sessions: a
/// request of the daemon's `/mcp` carries it in its extensions.
#[derive(Clone)]
pub struct TenantCalls {
    pub permits: Arc<Semaphore>,
    pub max: usize,
}

/// Cancelled when the HTTP response of a request is dropped (its stream ended, or
/// the client went away): a request of the daemon's `/mcp` carries it in its
/// extensions, and a tool call still running then is cancelled.
#[derive(Clone)]
pub struct ResponseGone(pub CancellationToken);

/// The MCP server: its tools over a client of the API.
#[derive(Clone)]
pub struct SandlotMcp {
    caller: Caller,
    /// This session's calls in flight.
    calls: Arc<Semaphore>,
    /// The `vfs_shell` sessions this MCP session opened: the only ones its
    /// `session` argument may name.
    vfs_sessions: Arc<Mutex<HashSet<String>>>,
}

const INSTRUCTIONS: &str = "Sandlot runs isolated Linux sandboxes. Create one with \
create_sandbox, then run commands (run_command), Python code (run_code) and read or write \
its files (read_file, write_file, list_files); delete it with delete_sandbox when done \
(it also ends by itself when its timeout expires). Sandboxes are referred to by the id \
(or the name) create_sandbox returns. vfs_shell browses document collections with a \
read-only shell; the memory_* tools search and keep Markdown memories.";

impl SandlotMcp {
    /// Tools acting with `client` (stdio: the CLI's client).
    pub fn new(client: Client) -> SandlotMcp {
        SandlotMcp::with_caller(Caller::Fixed(client))
    }

    /// Tools acting, for each request, with the client `client_for` makes from it.
    pub fn per_request(client_for: Arc<ClientForRequest>) -> SandlotMcp {
        SandlotMcp::with_caller(Caller::PerRequest(client_for))
    }

    fn with_caller(caller: Caller) -> SandlotMcp {
        SandlotMcp {
            caller,
            calls: Arc::new(Semaphore::new(MAX_CALLS_PER_SESSION)),
            vfs_sessions: Arc::default(),
        }
    }

    /// The same tools for a new session: its own limits and `vfs_shell` sessions.
    fn for_session(&self) -> SandlotMcp {
        SandlotMcp::with_caller(self.caller.clone())
    }

    fn client(&self, ctx: &RequestContext<RoleServer>) -> Result<Client, ErrorData> {
        match &self.caller {
            Caller::Fixed(c) => Ok(c.clone()),
            Caller::PerRequest(f) => ctx
                .extensions
                .get::<http::request::Parts>()
                .and_then(|p| f(p))
                .ok_or_else(|| {
                    ErrorData::invalid_request("the request carries no valid token", None)
                }),
        }
    }
}

impl ServerHandler for SandlotMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("sandlot", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::list()))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(
            resources::templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let client = self.client(&context)?;
        let contents = resources::read(&client, &request.uri).await?;
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools::list().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let client = self.client(&context)?;
        let busy = |what: String| -> Result<CallToolResponse, ErrorData> {
            Ok(CallToolResult::error(vec![ContentBlock::text(what)]).into())
        };
        let Ok(_mine) = self.calls.clone().try_acquire_owned() else {
            return busy(format!(
                "too many tool calls in flight in this session (the most is {MAX_CALLS_PER_SESSION}): wait for one to finish"
            ));
        };
        let parts = context.extensions.get::<http::request::Parts>();
        let tenant_calls = parts
            .and_then(|p| p.extensions.get::<TenantCalls>())
            .cloned();
        let gone = parts
            .and_then(|p| p.extensions.get::<ResponseGone>())
            .cloned();
        let _tenants = match tenant_calls {
            Some(t) => match t.permits.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    return busy(format!(
                        "too many tool calls in flight for this tenant (the most is {}): wait for one to finish",
                        t.max
                    ))
                }
            },
            None => None,
        };
        let mut context = context;
        if let Some(gone) = gone {
            // In a session rmcp does not cancel a call whose POST went away: a call
            // ends with either (notifications/cancelled, or the response dropped).
            let (either, a, b) = (CancellationToken::new(), context.ct.clone(), gone.0.clone());
            let e = either.clone();
            let link = tokio::spawn(async move {
                tokio::select! {
                    () = a.cancelled() => {}
                    () = b.cancelled() => {}
                }
                e.cancel();
            });
            context.ct = either;
            let r = self.run_tool(&client, request, &context).await;
            link.abort();
            return r;
        }
        self.run_tool(&client, request, &context).await
    }
}

impl SandlotMcp {
    async fn run_tool(
        &self,
        client: &Client,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let result =
            match tools::call(client, &request.name, args, context, &self.vfs_sessions).await {
                Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
                Err(tools::ToolError::UnknownTool) => {
                    return Err(ErrorData::invalid_params(
                        format!("no tool named {:?}", request.name),
                        None,
                    ))
                }
                Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
            };
        Ok(result.into())
    }
}

/// Serves the tools on standard input and output until the client closes them.
pub async fn serve_stdio(client: Client) -> Result<(), std::io::Error> {
    let running = SandlotMcp::new(client)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(std::io::Error::other)?;
    running.waiting().await.map_err(std::io::Error::other)?;
    Ok(())
}

/// The streamable HTTP service of the tools (sessions kept in memory), and its
/// session manager (to ask whether a session still exists). Any `Host` is
/// accepted: the caller's bearer token, checked before a request gets here, is
/// what admits it.
pub fn http_service(
    client_for: Arc<ClientForRequest>,
    max_request_body: usize,
) -> (
    StreamableHttpService<SandlotMcp, LocalSessionManager>,
    Arc<LocalSessionManager>,
) {
    let sessions = Arc::new(LocalSessionManager::default());
    let server = SandlotMcp::per_request(client_for);
    let svc = StreamableHttpService::new(
        move || Ok(server.for_session()),
        sessions.clone(),
        StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_max_request_body_bytes(max_request_body),
    );
    (svc, sessions)
}
