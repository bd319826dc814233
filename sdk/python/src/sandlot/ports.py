"""Inbound traffic to a sandbox: ``sb.ports[8000]`` (the daemon's authenticated
HTTP/WebSocket proxy to port 8000 inside the sandbox, whatever its network mode)
and ``sb.ports.publish(8000)`` (a raw TCP port on the daemon's host)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

import httpx

from . import errors
from .models import PublishedPort

if TYPE_CHECKING:
    from .client import AsyncClient, Client


def _check_port(port: int, field: str = "port") -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{field}: {port!r} is not a TCP port (1 to 65535)")
    return port


def _publish_body(port: int, host_port: Optional[int], bind: Optional[str]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"port": _check_port(port)}
    if host_port is not None:
        body["host_port"] = _check_port(host_port, "host_port")
    if bind is not None:
        body["bind"] = bind
    return body


class _PortBase:
    def __init__(self, client: "Client | AsyncClient", sandbox_id: str, port: int) -> None:
        self._client = client
        self.sandbox_id = sandbox_id
        self.port = _check_port(port)

    @property
    def path(self) -> str:
        """The proxy's API path: ``/v1/sandboxes/{id}/ports/{port}/``."""
        return f"/v1/sandboxes/{self.sandbox_id}/ports/{self.port}/"

    @property
    def url(self) -> str:
        """The URL of the authenticated HTTP/WebSocket proxy to this port. Requests
        need :attr:`headers` (``Authorization: Bearer TOKEN``); the daemon strips
        them before the application sees the request. On the operator's Unix
        socket the URL's host is a placeholder: use :meth:`request` (or any client
        that speaks HTTP over that socket)."""
        return self._client.base_url + self.path

    @property
    def websocket_url(self) -> str:
        """:attr:`url` with the ``ws://`` (or ``wss://``) scheme."""
        u = self.url
        return "ws" + u[4:] if u.startswith("http") else u

    @property
    def headers(self) -> Dict[str, str]:
        """Headers that authenticate a request to :attr:`url`."""
        return self._client.auth_headers()

    def _target(self, path: str) -> str:
        return self.path + path.lstrip("/")

    def __repr__(self) -> str:
        return f"<Port {self.port} of {self.sandbox_id}>"


class Port(_PortBase):
    """Port ``port`` of a sandbox, reached through the daemon's proxy."""

    _client: "Client"

    def request(self, method: str, path: str = "/", **kw: Any) -> httpx.Response:
        """One HTTP request to the application (``path`` and ``params`` are its own).
        The application's answer is returned whatever its status; the daemon's
        own refusals (nothing listening: 502, sandbox stopped: 409, unknown: 404)
        carry a JSON error body and ``x-request-id``. Keyword arguments are those
        of ``httpx.Client.request``."""
        try:
            return self._client._http.request(method, self._target(path), **kw)
        except httpx.TransportError as e:
            raise errors.SandlotError(f"{method} port {self.port}{path}: {type(e).__name__}: {e}") from e

    def get(self, path: str = "/", **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str = "/", **kw: Any) -> httpx.Response:
        return self.request("POST", path, **kw)


class AsyncPort(_PortBase):
    """Port ``port`` of a sandbox, reached through the daemon's proxy (asyncio)."""

    _client: "AsyncClient"

    async def request(self, method: str, path: str = "/", **kw: Any) -> httpx.Response:
        """See :meth:`Port.request`."""
        try:
            return await self._client._http.request(method, self._target(path), **kw)
        except httpx.TransportError as e:
            raise errors.SandlotError(f"{method} port {self.port}{path}: {type(e).__name__}: {e}") from e

    async def get(self, path: str = "/", **kw: Any) -> httpx.Response:
        return await self.request("GET", path, **kw)

    async def post(self, path: str = "/", **kw: Any) -> httpx.Response:
        return await self.request("POST", path, **kw)


class Ports:
    """The ports of a sandbox: ``sb.ports[8000].url``, ``sb.ports.publish(8000)``."""

    def __init__(self, client: "Client", sandbox_id: str) -> None:
        self._client = client
        self._id = sandbox_id
        self._base = f"/v1/sandboxes/{sandbox_id}/ports"

    def __getitem__(self, port: int) -> Port:
        return Port(self._client, self._id, port)

    def publish(self, port: int, *, host_port: Optional[int] = None, bind: Optional[str] = None) -> PublishedPort:
        """Publishes ``port`` as a TCP port on the daemon's host (a free one from the
        operator's range unless ``host_port``; on the operator's default address
        unless ``bind``). It goes away with the sandbox."""
        d = self._client.json("POST", self._base, json=_publish_body(port, host_port, bind))
        return PublishedPort.from_json(d)

    def unpublish(self, port: int) -> None:
        """Closes the host listener of ``port`` (and its open connections)."""
        self._client.request("DELETE", f"{self._base}/{_check_port(port)}")

    def list(self) -> List[PublishedPort]:
        """The published ports, by sandbox port."""
        d = self._client.json("GET", self._base)
        return [PublishedPort.from_json(p) for p in d.get("ports", [])]


class AsyncPorts:
    """The ports of a sandbox (asyncio): ``sb.ports[8000].url``, ``await sb.ports.publish(8000)``."""

    def __init__(self, client: "AsyncClient", sandbox_id: str) -> None:
        self._client = client
        self._id = sandbox_id
        self._base = f"/v1/sandboxes/{sandbox_id}/ports"

    def __getitem__(self, port: int) -> AsyncPort:
        return AsyncPort(self._client, self._id, port)

    async def publish(
        self, port: int, *, host_port: Optional[int] = None, bind: Optional[str] = None
    ) -> PublishedPort:
        """See :meth:`Ports.publish`."""
        d = await self._client.json("POST", self._base, json=_publish_body(port, host_port, bind))
        return PublishedPort.from_json(d)

    async def unpublish(self, port: int) -> None:
        await self._client.request("DELETE", f"{self._base}/{_check_port(port)}")

    async def list(self) -> List[PublishedPort]:
        d = await self._client.json("GET", self._base)
        return [PublishedPort.from_json(p) for p in d.get("ports", [])]
