"""End to end: the official Python MCP SDK (`mcp`, installed from PyPI by
scripts/setup.d/65-mcp.sh, never vendored or patched) drives Sandlot's MCP tools
over both transports: `/mcp` on a real `sandlot serve` with a tenant's token, and
`sandlot mcp` on stdio. Needs root (the daemon creates sandboxes).

Run: bash tests/mcp/run.sh   (SANDLOT_BIN picks the binary; default
$CARGO_TARGET_DIR/debug/sandlot, else target/debug/sandlot).
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

ROOT = Path(__file__).resolve().parents[2]


def sandlot_bin() -> str:
    b = os.environ.get("SANDLOT_BIN")
    if b:
        return b
    target = os.environ.get("CARGO_TARGET_DIR") or str(ROOT / "target")
    return str(Path(target) / "debug" / "sandlot")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Daemon:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.socket = tmp / "sandlot.sock"
        self.port = free_port()
        self.prefix = f"mcpt{secrets.token_hex(2)}-"
        self.log = tmp / "serve.log"
        self.proc = subprocess.Popen(
            [
                sandlot_bin(), "serve",
                "--data-dir", str(tmp / "data"),
                "--socket", str(self.socket),
                "--id-prefix", self.prefix,
                "--listen", f"127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "w"),
        )
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandlot serve exited:\n{self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "sandlot serve did not listen in 20 s"
                time.sleep(0.05)

    def operator(self, *args: str) -> str:
        return subprocess.run(
            [sandlot_bin(), *args],
            env={**os.environ, "SANDLOT_URL": f"unix://{self.socket}", "SANDLOT_TOKEN": ""},
            check=True, capture_output=True, text=True,
        ).stdout

    def token(self, tenant: str) -> str:
        return json.loads(self.operator("token", "create", "--tenant", tenant, "--json"))["token"]

    def stop(self):
        # Sandboxes outlive the daemon by design: delete every one first.
        for sid in self.operator("ls", "--quiet").split():
            self.operator("rm", sid)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def daemon():
    if os.geteuid() != 0:
        pytest.fail("the MCP end-to-end test needs root (sandboxes use namespaces and cgroups)")
    if not Path(sandlot_bin()).exists():
        pytest.fail(f"no sandlot binary at {sandlot_bin()}: build it (cargo build -p sandlot) or set SANDLOT_BIN")
    tmp = Path(tempfile.mkdtemp(prefix="sandlot-mcp-test-"))
    d = Daemon(tmp)
    try:
        yield d
    finally:
        d.stop()
        leftovers = [p.name for p in Path("/run/sandlot/sandboxes").glob(d.prefix + "*")]
        shutil.rmtree(tmp, ignore_errors=True)
        assert not leftovers, f"sandboxes left behind: {leftovers}"


def text(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def round_trip(session: ClientSession):
    await session.initialize()
    names = {t.name for t in (await session.list_tools()).tools}
    assert {"create_sandbox", "run_command", "read_file", "write_file", "delete_sandbox"} <= names
    created = await session.call_tool("create_sandbox", {"timeout": "5m"})
    assert not created.is_error, text(created)
    sid = json.loads(text(created))["id"]
    try:
        out = await session.call_tool("run_command", {"sandbox": sid, "command": "echo hi"})
        assert not out.is_error and text(out).startswith("exit_code: 0\n") and "stdout:\nhi\n" in text(out), text(out)
        w = await session.call_tool("write_file", {"sandbox": sid, "path": "/tmp/p.txt", "content": "py\n"})
        assert not w.is_error, text(w)
        r = await session.call_tool("read_file", {"sandbox": sid, "path": "/tmp/p.txt"})
        assert text(r) == "py\n"
        bad = await session.call_tool("run_command", {"command": "ls"})
        assert bad.is_error and text(bad) == "missing argument `sandbox`"
    finally:
        d = await session.call_tool("delete_sandbox", {"sandbox": sid})
        assert not d.is_error, text(d)


def test_the_python_sdk_uses_the_tools_over_http(daemon):
    token = daemon.token("py-http")

    async def go():
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, streamable_http_client(f"http://127.0.0.1:{daemon.port}/mcp", http_client=http) as (r, w):
            async with ClientSession(r, w) as s:
                await round_trip(s)

    anyio.run(go)


def test_the_python_sdk_uses_the_tools_over_stdio(daemon):
    token = daemon.token("py-stdio")
    params = StdioServerParameters(
        command=sandlot_bin(), args=["mcp"],
        env={"SANDLOT_URL": f"127.0.0.1:{daemon.port}", "SANDLOT_TOKEN": token},
    )

    async def go():
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await round_trip(s)

    anyio.run(go)
