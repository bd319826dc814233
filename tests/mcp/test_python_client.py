"""End to end: the official Python MCP SDK (`mcp`, installed from PyPI by
scripts/setup.d/65-mcp.sh, never vendored or patched) drives Sandlot's MCP tools
over both transports: `/mcp` on a real `sandlot serve` with a tenant's token, and
`sandlot mcp` on stdio. Needs root (the daemon creates sandboxes).

Run: bash tests/mcp/run.sh   (SANDLOT_BIN picks the binary; default
$CARGO_TARGET_DIR/debug/sandlot, else target/debug/sandlot).
"""

import json
import sys
import tempfile
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sandlot_daemon import Daemon, daemon_fixture, require_root_and_binary, sandlot_bin  # noqa: E402


@pytest.fixture(scope="module")
def daemon():
    why = require_root_and_binary("the MCP end-to-end test")
    if why:
        pytest.fail(why)
    yield from daemon_fixture(lambda tmp: Daemon(tmp, "mcpt"), "mcp")


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
        async with http, streamable_http_client(f"http://127.0.0.1:{daemon.api_port}/mcp", http_client=http) as (r, w):
            async with ClientSession(r, w) as s:
                await round_trip(s)

    anyio.run(go)


def test_the_python_sdk_uses_the_tools_over_stdio(daemon):
    token = daemon.token("py-stdio")
    params = StdioServerParameters(
        command=sandlot_bin(), args=["mcp"],
        env={"SANDLOT_URL": f"127.0.0.1:{daemon.api_port}", "SANDLOT_TOKEN": token},
    )

    async def go():
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await round_trip(s)

    anyio.run(go)


def test_the_python_sdk_calls_every_tool_and_reads_every_kind_of_resource(daemon):
    """Every tool the server lists is called once with arguments a model would
    send, and each answer is checked: the success paths of the memory tools and
    of snapshot_sandbox included."""
    tenant = "py-all"
    token = daemon.token(tenant)
    # A collection and a memory store of the tenant, made outside MCP.
    with tempfile.TemporaryDirectory() as docs:
        (Path(docs) / "guide.md").write_text("# Guide\nThe rate limit is 40 requests a minute.\n")
        daemon.operator("vfs", "create", "kb", "--from", docs, "--tenant", tenant)
    daemon.native("POST", "/v1/memory", token, {"name": "notes"})
    called: set[str] = set()

    async def call(s: ClientSession, tool: str, args: dict) -> str:
        called.add(tool)
        r = await s.call_tool(tool, args)
        assert not r.is_error, f"{tool}: {text(r)}"
        return text(r)

    async def go():
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, streamable_http_client(f"http://127.0.0.1:{daemon.api_port}/mcp", http_client=http) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                listed = {t.name for t in (await s.list_tools()).tools}
                sid = json.loads(await call(s, "create_sandbox", {"timeout": "5m", "memory": "256M"}))["id"]
                fork = None
                try:
                    ids = [x["id"] for x in json.loads(await call(s, "list_sandboxes", {}))]
                    assert sid in ids
                    await call(s, "write_file", {"sandbox": sid, "path": "/tmp/work/a.txt", "content": "kept\n"})
                    listing = await call(s, "list_files", {"sandbox": sid, "path": "/tmp/work"})
                    assert "/tmp/work/a.txt" in listing, listing
                    assert await call(s, "read_file", {"sandbox": sid, "path": "/tmp/work/a.txt"}) == "kept\n"
                    res = await s.read_resource(f"sandlot://sandboxes/{sid}/files/tmp/work/a.txt")
                    assert [c.text for c in res.contents] == ["kept\n"]
                    out = await call(s, "run_command", {"sandbox": sid, "argv": ["cat", "/tmp/work/a.txt"]})
                    assert "stdout:\nkept\n" in out, out
                    await call(s, "run_code", {"sandbox": sid, "code": "x = 41"})
                    assert "42" in await call(s, "run_code", {"sandbox": sid, "code": "x + 1"})

                    snap = json.loads(await call(s, "snapshot_sandbox", {"sandbox": sid, "tag": "work:1"}))
                    assert snap.get("id"), snap
                    fork = json.loads(await call(s, "create_sandbox", {"image": "work:1", "timeout": "5m"}))["id"]
                    assert await call(s, "read_file", {"sandbox": fork, "path": "/tmp/work/a.txt"}) == "kept\n"

                    sh = await call(s, "vfs_shell", {"collection": "kb", "command": "grep -r 'rate limit' /"})
                    assert "guide.md" in sh and "40 requests" in sh, sh
                    doc = await s.read_resource("sandlot://collections/kb/guide.md")
                    assert [c.text for c in doc.contents] == [
                        "# Guide\nThe rate limit is 40 requests a minute.\n"
                    ], doc

                    made = json.loads(await call(s, "memory_create", {
                        "store": "notes", "title": "Deploy window", "body": "Deploys happen on Tuesdays.",
                        "tags": ["ops"],
                    }))
                    view = await call(s, "memory_view", {"store": "notes", "key": made["path"]})
                    assert "Deploys happen on Tuesdays." in view, view
                    edit = {"store": "notes", "key": made["path"], "body": "Deploys happen on Thursdays."}
                    await call(s, "memory_edit", edit)
                    view = await call(s, "memory_view", {"store": "notes", "key": made["path"]})
                    assert "Thursdays" in view and "Tuesdays" not in view, view
                    query = {"store": "notes", "text": "when do deploys happen"}
                    hits = json.loads(await call(s, "memory_search", query))
                    assert [h["path"] for h in hits["hits"]][:1] == [made["path"]], hits
                    mem = await s.read_resource(f"sandlot://memory/notes/{made['path']}")
                    assert "Deploys happen on Thursdays." in mem.contents[0].text, mem
                    assert mem.contents[0].mime_type == "text/markdown", mem
                    templates = {t.uri_template for t in (await s.list_resource_templates()).resource_templates}
                    assert templates == {
                        "sandlot://sandboxes/{sandbox}/files/{+path}",
                        "sandlot://memory/{store}/{+key}",
                        "sandlot://collections/{collection}/{+path}",
                    }, templates
                finally:
                    for x in (fork, sid):
                        if x:
                            await call(s, "delete_sandbox", {"sandbox": x})
                assert called == listed, f"tools not called: {listed - called}; unknown: {called - listed}"

    anyio.run(go)
