//! Inbound traffic to a sandbox: the authenticated HTTP/WebSocket proxy
//! (`/v1/sandboxes/{id}/ports/{port}/...`) and raw TCP ports published on the
//! daemon's host (`/v1/sandboxes/{id}/ports`).

use http::Method;
pub use sandlot_proto::api::ports::{PortList, PublishPort, PublishedPort};

use crate::{Client, Error, Target};

/// The API path of the HTTP/WebSocket proxy to `port` of sandbox `id`.
pub fn proxy_path(id: &str, port: u16) -> String {
    format!("/v1/sandboxes/{id}/ports/{port}/")
}

impl Client {
    /// The URL of the authenticated HTTP proxy to `port` of sandbox `id` (needs a
    /// TCP daemon address; requests carry `Authorization: Bearer TOKEN`). On the
    /// Unix socket there is no URL: `None`.
    pub fn port_url(&self, id: &str, port: u16) -> Option<String> {
        match self.target() {
            Target::Tcp(hp) => Some(format!("http://{hp}{}", proxy_path(id, port))),
            Target::Unix(_) | Target::InProcess => None,
        }
    }

    /// Publishes a TCP port of the sandbox on the host.
    pub async fn publish_port(&self, id: &str, req: &PublishPort) -> Result<PublishedPort, Error> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/ports"),
            Some(req),
        )
        .await
    }

    /// The sandbox's published ports.
    pub async fn list_ports(&self, id: &str) -> Result<Vec<PublishedPort>, Error> {
        let l: PortList = self
            .json(
                Method::GET,
                &format!("/v1/sandboxes/{id}/ports"),
                None::<&()>,
            )
            .await?;
        Ok(l.ports)
    }

    /// Stops publishing a port: the host listener closes and open connections end.
    pub async fn unpublish_port(&self, id: &str, port: u16) -> Result<(), Error> {
        self.no_content(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}/ports/{port}"),
            None::<&()>,
        )
        .await
    }

    /// One request through the HTTP proxy (`path` after the port, with its query
    /// string): status, headers and the whole body. For streaming, use the URL
    /// ([`Client::port_url`]) with any HTTP client.
    pub async fn proxy_request(
        &self,
        id: &str,
        port: u16,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<http::Response<bytes::Bytes>, Error> {
        let m = Method::from_bytes(method.as_bytes())
            .map_err(|e| Error::Transport(format!("method {method}: {e}")))?;
        let p = format!(
            "/v1/sandboxes/{id}/ports/{port}/{}",
            path.trim_start_matches('/')
        );
        let b = if body.is_empty() {
            crate::conn::empty()
        } else {
            crate::conn::full(body)
        };
        let resp = self.conns.request(m, &p, &self.headers(), None, b).await?;
        let (parts, inc) = resp.into_parts();
        let bytes = http_body_util::BodyExt::collect(inc)
            .await
            .map(|c| c.to_bytes())
            .map_err(|e| Error::Transport(e.to_string()))?;
        Ok(http::Response::from_parts(parts, bytes))
    }
}
