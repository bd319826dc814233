"""Connections to the daemon: ``Client`` (sync) and ``AsyncClient``.

The address comes from ``url=``, else ``SANDLOT_URL``, else the operator's Unix
socket ``unix:///run/sandlot/sandlot.sock``. Forms: ``unix:///path/to.sock``,
``http://127.0.0.1:7070``, ``127.0.0.1:7070``. The token comes from ``token=``,
else ``SANDLOT_TOKEN`` (needed over TCP; optional on the socket). ``tenant=``
acts as that tenant on the operator socket (header ``X-Sandlot-Tenant``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import weakref
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Tuple

import httpx

from . import errors
from .models import SandboxInfo, TenantInfo

DEFAULT_URL = "unix:///run/sandlot/sandlot.sock"
__version__ = "0.1.0"


def resolve_url(url: Optional[str]) -> Tuple[str, Optional[str]]:
    """(base_url, unix socket path or None) for an address."""
    u = url or os.environ.get("SANDLOT_URL") or DEFAULT_URL
    if u.startswith("unix://"):
        path = u[len("unix://") :]
        if not path.startswith("/"):
            raise ValueError(f"SANDLOT_URL {u!r}: a Unix socket URL is unix:///absolute/path.sock")
        return "http://sandlot", path
    if u.startswith("/"):
        return "http://sandlot", u
    if "://" not in u:
        u = "http://" + u
    if not (u.startswith("http://") or u.startswith("https://")):
        raise ValueError(f"SANDLOT_URL {u!r}: expected unix:///path, http://host:port or host:port")
    return u.rstrip("/"), None


def _headers(token: Optional[str], tenant: Optional[str]) -> Dict[str, str]:
    h = {"user-agent": f"sandlot-python/{__version__}"}
    if token:
        h["authorization"] = f"Bearer {token}"
    if tenant:
        h["x-sandlot-tenant"] = tenant
    return h


def _raise_for(resp: httpx.Response, body: bytes) -> None:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    text = body.decode("utf-8", errors="replace").strip()[:500]
    fallback = f"HTTP {resp.status_code} from {resp.request.method} {resp.request.url.path}" + (
        f": {text}" if text else ""
    )
    raise errors.from_body(resp.status_code, parsed, resp.headers.get("x-request-id"), fallback)


# Errors of a request sent on a pooled connection the server closed meanwhile.
_STALE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def _replayable(method: str, content: Any, headers: Optional[Dict[str, str]] = None) -> bool:
    """Safe to send again: idempotent (or carrying an ``Idempotency-Key``), and
    the body (if any) is in memory."""
    keyed = headers is not None and "Idempotency-Key" in headers
    return (method in ("GET", "HEAD", "DELETE", "PUT") or keyed) and (
        content is None or isinstance(content, bytes)
    )


def _connect_error(where: str, e: Exception) -> errors.ConnectError:
    return errors.ConnectError(
        f"cannot reach the Sandlot daemon at {where}: {e} "
        "(is `sandlot serve` running? set SANDLOT_URL / SANDLOT_TOKEN)"
    )


class _Base:
    url: str
    token: Optional[str]
    tenant: Optional[str]
    #: The HTTP base of requests (``http://sandlot`` on a Unix socket).
    base_url: str
    #: The Unix socket, or None over TCP.
    uds: Optional[str]

    def _setup(self, url: Optional[str], token: Optional[str], tenant: Optional[str]) -> Tuple[str, Optional[str]]:
        base, uds = resolve_url(url)
        self.url = f"unix://{uds}" if uds else base
        self.token = token if token is not None else (os.environ.get("SANDLOT_TOKEN") or None)
        self.tenant = tenant
        self.base_url = base
        self.uds = uds
        return base, uds

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, tenant={self.tenant!r})"

    def auth_headers(self) -> Dict[str, str]:
        """The headers that authenticate a request to the daemon (for other HTTP clients)."""
        h = _headers(self.token, self.tenant)
        h.pop("user-agent", None)
        return h


class Client(_Base):
    """A synchronous connection to the daemon (thread-safe; pools connections)."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        tenant: Optional[str] = None,
        timeout: float = 120.0,
    ) -> None:
        base, uds = self._setup(url, token, tenant)
        transport = httpx.HTTPTransport(uds=uds) if uds else httpx.HTTPTransport()
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=base,
            transport=transport,
            headers=_headers(self.token, tenant),
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        json: Any = None,
        content: Any = None,
        headers: Optional[Dict[str, str]] = None,
        timeout: Any = httpx.USE_CLIENT_DEFAULT,
    ) -> httpx.Response:
        """One request; raises the typed error for a non-2xx answer."""
        try:
            try:
                resp = self._http.request(
                    method, path, params=params, json=json, content=content, headers=headers, timeout=timeout
                )
            except _STALE as e:
                if not _replayable(method, content, headers):
                    raise
                # A pooled keep-alive connection the daemon had just closed: once more.
                del e
                resp = self._http.request(
                    method, path, params=params, json=json, content=content, headers=headers, timeout=timeout
                )
        except httpx.TransportError as e:
            if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
                raise _connect_error(self.url, e) from e
            raise errors.SandlotError(f"{method} {path}: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            _raise_for(resp, resp.content)
        return resp

    def json(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.request(method, path, **kw)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError as e:
            raise errors.ProtocolError(f"{method} {path}: the answer is not JSON") from e

    @contextlib.contextmanager
    def stream(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        json: Any = None,
        content: Any = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> Iterator[httpx.Response]:
        """A streamed response (no read timeout); raises the typed error first."""
        try:
            with self._http.stream(
                method,
                path,
                params=params,
                json=json,
                content=content,
                headers=headers,
                timeout=httpx.Timeout(self.timeout, connect=10.0, read=None),
            ) as resp:
                if resp.status_code >= 400:
                    _raise_for(resp, resp.read())
                yield resp
        except httpx.TransportError as e:
            if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
                raise _connect_error(self.url, e) from e
            raise errors.SandlotError(f"{method} {path}: {type(e).__name__}: {e}") from e

    def health(self) -> Dict[str, Any]:
        """``GET /v1/health``: ``{"status", "version", "tenant"}``."""
        return dict(self.json("GET", "/v1/health"))

    def tenants(self) -> List[TenantInfo]:
        """``GET /v1/tenants``: every tenant with its quota and usage. The
        operator's (the Unix socket or an operator token); a tenant's token
        raises :class:`sandlot.errors.ForbiddenError`."""
        return [TenantInfo.from_json(t) for t in self.json("GET", "/v1/tenants")["tenants"]]

    def get_sandbox(self, id_or_name: str) -> SandboxInfo:
        return SandboxInfo.from_json(self.json("GET", f"/v1/sandboxes/{id_or_name}"))


class AsyncClient(_Base):
    """An asyncio connection to the daemon. Use it from one event loop."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        tenant: Optional[str] = None,
        timeout: float = 120.0,
    ) -> None:
        base, uds = self._setup(url, token, tenant)
        transport = httpx.AsyncHTTPTransport(uds=uds) if uds else httpx.AsyncHTTPTransport()
        self.timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=base,
            transport=transport,
            headers=_headers(self.token, tenant),
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        json: Any = None,
        content: Any = None,
        headers: Optional[Dict[str, str]] = None,
        timeout: Any = httpx.USE_CLIENT_DEFAULT,
    ) -> httpx.Response:
        try:
            try:
                resp = await self._http.request(
                    method, path, params=params, json=json, content=content, headers=headers, timeout=timeout
                )
            except _STALE as e:
                if not _replayable(method, content, headers):
                    raise
                del e
                resp = await self._http.request(
                    method, path, params=params, json=json, content=content, headers=headers, timeout=timeout
                )
        except httpx.TransportError as e:
            if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
                raise _connect_error(self.url, e) from e
            raise errors.SandlotError(f"{method} {path}: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            _raise_for(resp, resp.content)
        return resp

    async def json(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self.request(method, path, **kw)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError as e:
            raise errors.ProtocolError(f"{method} {path}: the answer is not JSON") from e

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        json: Any = None,
        content: Any = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> AsyncIterator[httpx.Response]:
        try:
            async with self._http.stream(
                method,
                path,
                params=params,
                json=json,
                content=content,
                headers=headers,
                timeout=httpx.Timeout(self.timeout, connect=10.0, read=None),
            ) as resp:
                if resp.status_code >= 400:
                    _raise_for(resp, await resp.aread())
                yield resp
        except httpx.TransportError as e:
            if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
                raise _connect_error(self.url, e) from e
            raise errors.SandlotError(f"{method} {path}: {type(e).__name__}: {e}") from e

    async def health(self) -> Dict[str, Any]:
        return dict(await self.json("GET", "/v1/health"))

    async def tenants(self) -> List[TenantInfo]:
        """``GET /v1/tenants``: see :meth:`Client.tenants`."""
        return [TenantInfo.from_json(t) for t in (await self.json("GET", "/v1/tenants"))["tenants"]]

    async def get_sandbox(self, id_or_name: str) -> SandboxInfo:
        return SandboxInfo.from_json(await self.json("GET", f"/v1/sandboxes/{id_or_name}"))


_default_lock = threading.Lock()
_default_config: Dict[str, Optional[str]] = {"url": None, "token": None, "tenant": None}
_default_sync: Optional[Client] = None
_default_async: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient]" = weakref.WeakKeyDictionary()


def default_client() -> Client:
    """The shared client configured from the environment (created on first use)."""
    global _default_sync
    with _default_lock:
        if _default_sync is None:
            _default_sync = Client(_default_config["url"], _default_config["token"], tenant=_default_config["tenant"])
        return _default_sync


def default_async_client() -> AsyncClient:
    """The shared async client of the running event loop, configured from the environment."""
    loop = asyncio.get_running_loop()
    with _default_lock:
        c = _default_async.get(loop)
        if c is None:
            c = AsyncClient(_default_config["url"], _default_config["token"], tenant=_default_config["tenant"])
            _default_async[loop] = c
        return c


def configure(url: Optional[str] = None, token: Optional[str] = None, *, tenant: Optional[str] = None) -> None:
    """Points the shared clients (sync and async) at a daemon, overriding
    ``SANDLOT_URL``/``SANDLOT_TOKEN`` for calls that pass no ``client=``."""
    global _default_sync
    with _default_lock:
        _default_config.update(url=url, token=token, tenant=tenant)
        old, _default_sync = _default_sync, None
        _default_async.clear()
    if old is not None:
        old.close()
