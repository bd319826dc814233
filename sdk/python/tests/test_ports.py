"""Inbound traffic end to end: ``sb.ports[8000]`` through the daemon's
authenticated proxy, and ``sb.ports.publish`` (raw TCP on the host's loopback).
Every byte stays on loopback."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

import sandlot
from sandlot import AsyncSandbox, Sandbox

# An HTTP app for the sandbox: echoes the path and whether a token reached it.
APP = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        code = 404 if self.path.startswith("/missing") else 200
        b = json.dumps({"path": self.path, "auth": self.headers.get("Authorization"),
                        "prefix": self.headers.get("X-Forwarded-Prefix")}).encode()
        self.send_response(code); self.send_header("Content-Length", str(len(b))); self.end_headers()
        self.wfile.write(b)
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        b = self.rfile.read(n)[::-1]
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers()
        self.wfile.write(b)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

WAIT = "import socket,sys,time\nfor i in range(200):\n    try: socket.create_connection(('127.0.0.1',int(sys.argv[1])),1).close(); break\n    except OSError: time.sleep(0.05)\nelse: sys.exit(1)"


def start_app(sb: Sandbox, port: int) -> None:
    sb.files.write("/tmp/app.py", APP)
    sb.files.write("/tmp/wait.py", WAIT)
    sb.exec("python3", "/tmp/app.py", str(port), background=True)
    assert sb.run(f"python3 /tmp/wait.py {port}").exit_code == 0


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), 2).close()
        return False
    except ConnectionRefusedError:
        return True


def test_port_urls_proxy_requests_for_the_owner_only(daemon, acme, other, tokens) -> None:  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme) as sb:
        start_app(sb, 8000)
        p = sb.ports[8000]
        assert p.url == f"{daemon.tcp_url}/v1/sandboxes/{sb.id}/ports/8000/"
        assert p.websocket_url.startswith("ws://127.0.0.1:")
        # Any HTTP client, with the token in a header; the app never sees it.
        r = httpx.get(p.url + "a/b?x=1", headers=p.headers)
        assert r.status_code == 200, r.text
        j = r.json()
        assert j == {"path": "/a/b?x=1", "auth": None, "prefix": f"/v1/sandboxes/{sb.id}/ports/8000"}
        # Or through the SDK's own connection.
        assert p.post("/rev", content=b"abc").content == b"cba"
        # The app's 404 is the app's.
        assert p.get("/missing").status_code == 404
        # Nothing on 8001: 502 naming the port.
        r = sb.ports[8001].get("/")
        assert r.status_code == 502 and "port 8001" in r.json()["error"]["message"]
        # No token: 401; another tenant: 404.
        assert httpx.get(p.url).status_code == 401
        assert httpx.get(p.url, headers=other.auth_headers()).status_code == 404
        with pytest.raises(ValueError, match="port"):
            sb.ports[0]
        with pytest.raises(ValueError, match="port"):
            sb.ports[70000]


def test_ports_publish_list_and_unpublish(acme, other) -> None:  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme) as sb:
        start_app(sb, 8000)
        pub = sb.ports.publish(8000)
        assert (pub.port, pub.host) == (8000, "127.0.0.1")
        assert pub.address == f"127.0.0.1:{pub.host_port}"
        r = httpx.get(f"http://{pub.address}/direct")
        assert r.json()["path"] == "/direct"
        assert sb.ports.list() == [pub]
        with pytest.raises(sandlot.ConflictError, match="already published"):
            sb.ports.publish(8000)
        with pytest.raises(sandlot.BadRequestError, match="bind"):
            sb.ports.publish(8001, bind="0.0.0.0")
        with pytest.raises(sandlot.NotFoundError):
            Sandbox.connect(sb.id, client=other)
        sb.ports.unpublish(8000)
        assert refused("127.0.0.1", pub.host_port)
        assert sb.ports.list() == []
        with pytest.raises(sandlot.NotFoundError, match="not published"):
            sb.ports.unpublish(8000)
        again = sb.ports.publish(8000)
    # Gone with the sandbox.
    assert refused("127.0.0.1", again.host_port)


async def test_async_ports(aacme) -> None:  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme) as sb:
        await sb.files.write("/tmp/app.py", APP)
        await sb.files.write("/tmp/wait.py", WAIT)
        await sb.exec("python3", "/tmp/app.py", "8000", background=True)
        assert (await sb.run("python3 /tmp/wait.py 8000")).exit_code == 0
        p = sb.ports[8000]
        assert p.url.endswith(f"/v1/sandboxes/{sb.id}/ports/8000/")
        r = await p.get("/async")
        assert r.json()["path"] == "/async"
        pub = await sb.ports.publish(8000)
        assert await sb.ports.list() == [pub]
        async with httpx.AsyncClient() as h:
            assert (await h.get(f"http://{pub.address}/x")).json()["path"] == "/x"
        await sb.ports.unpublish(8000)
        assert refused("127.0.0.1", pub.host_port)
        start = time.monotonic()
        assert (await sb.ports[8002].get("/")).status_code == 502
        assert time.monotonic() - start < 10
