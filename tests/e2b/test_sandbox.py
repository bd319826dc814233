"""Sandbox lifecycle through E2B's REST API, and that it is Sandlot's sandbox."""

import datetime
import json
import time

import httpx
import pytest
from e2b import (
    AuthenticationException,
    RateLimitException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
)


def test_create_with_metadata_envs_and_timeout(server):
    sb = Sandbox.create(metadata={"owner": "alice", "run": "1"}, envs={"GREETING": "hello"}, timeout=90)
    try:
        info = sb.get_info()
        assert info.sandbox_id == sb.sandbox_id
        assert info.template_id == "base"
        assert info.metadata == {"owner": "alice", "run": "1"}
        lifetime = (info.end_at - info.started_at).total_seconds()
        assert 85 <= lifetime <= 95, lifetime
        assert info.memory_mb > 0 and info.cpu_count >= 1
        assert sb.commands.run("echo $GREETING").stdout == "hello\n"
        assert sb.is_running()
    finally:
        assert sb.kill() is True


def test_is_the_same_sandbox_in_the_native_api(server, sbx):
    listed = server.native("GET", "/v1/sandboxes", server.key)["sandboxes"]
    mine = [s for s in listed if s["id"] == sbx.sandbox_id]
    assert len(mine) == 1, listed
    assert mine[0]["tenant"] == "e2b-a"
    assert mine[0]["tags"]["e2b.template"] == "base"
    assert mine[0]["spec"]["user"] == "user"
    # A process started through E2B is a process of the native API too.
    h = sbx.commands.run("sleep 30", background=True)
    procs = server.native("GET", f"/v1/sandboxes/{sbx.sandbox_id}/processes", server.key)["processes"]
    assert any(p["pid"] == h.pid and p["state"] == "running" for p in procs), procs
    assert h.kill()
    # ...and one the native API creates is reachable through E2B.
    native = server.native("POST", "/v1/sandboxes", server.key, {"user": "user", "timeout": 60})
    try:
        other = Sandbox.connect(native["id"])
        assert other.commands.run("id -un").stdout == "user\n"
    finally:
        server.native("DELETE", f"/v1/sandboxes/{native['id']}", server.key)


def test_list_get_info_connect_set_timeout_kill(server):
    a = Sandbox.create(metadata={"suite": "list", "n": "a"}, timeout=60)
    b = Sandbox.create(metadata={"suite": "list", "n": "b"}, timeout=60)
    try:
        ids = {s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"suite": "list"})).next_items()}
        assert ids == {a.sandbox_id, b.sandbox_id}
        only_a = Sandbox.list(query=SandboxQuery(metadata={"n": "a"})).next_items()
        assert [s.sandbox_id for s in only_a] == [a.sandbox_id]
        before = a.get_info().end_at
        a.set_timeout(300)
        after = Sandbox.get_info(a.sandbox_id).end_at
        assert after - before > datetime.timedelta(seconds=200)
        again = Sandbox.connect(a.sandbox_id)
        assert again.commands.run("echo connected").stdout == "connected\n"
        assert Sandbox.kill(b.sandbox_id) is True
        assert Sandbox.kill(b.sandbox_id) is False
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(b.sandbox_id)
        assert not b.is_running()
        ids = {s.sandbox_id for s in Sandbox.list().next_items()}
        assert a.sandbox_id in ids and b.sandbox_id not in ids
    finally:
        a.kill()
        b.kill()


def test_zero_timeout_ends_the_sandbox(server):
    sb = Sandbox.create(timeout=60)
    sb.set_timeout(0)
    assert not sb.is_running()
    with pytest.raises(SandboxNotFoundException):
        sb.get_info()


def test_metrics(server, sbx):
    sbx.commands.run("head -c 1000000 /dev/zero | md5sum")
    m = sbx.get_metrics()
    assert len(m) == 1
    assert m[0].mem_total > 0 and m[0].mem_used > 0
    assert 0 <= m[0].cpu_used_pct <= 100


def test_metrics_over_a_time_range(server, sbx):
    now = datetime.datetime.now(datetime.timezone.utc)
    assert len(sbx.get_metrics(start=now - datetime.timedelta(seconds=30), end=now)) == 1
    past = now - datetime.timedelta(hours=1)
    assert sbx.get_metrics(start=past, end=past + datetime.timedelta(minutes=1)) == []


def test_list_pages_and_started_after(server):
    tag = {"suite": "pages"}
    a = Sandbox.create(metadata=tag, timeout=60)
    b = Sandbox.create(metadata=tag, timeout=60)
    try:
        pages = Sandbox.list(query=SandboxQuery(metadata=tag), limit=1)
        first = pages.next_items()
        assert [s.sandbox_id for s in first] == [b.sandbox_id] and pages.has_next
        second = pages.next_items()
        assert [s.sandbox_id for s in second] == [a.sandbox_id] and not pages.has_next
        started = b.get_info().started_at
        later = Sandbox.list(query=SandboxQuery(metadata=tag, started_after=started)).next_items()
        assert b.sandbox_id in {s.sandbox_id for s in later}
        after = started + datetime.timedelta(seconds=1)
        assert Sandbox.list(query=SandboxQuery(metadata=tag, started_after=after)).next_items() == []
        r = httpx.get(server.url + "/v2/sandboxes?nextToken=nope", headers={"X-API-Key": server.key})
        assert r.status_code == 400 and "nextToken" in r.json()["message"]
    finally:
        a.kill()
        b.kill()


def test_get_host_routes_to_a_sandbox_port_with_its_traffic_token(server, sbx):
    sbx.commands.run("mkdir -p /tmp/www && echo served > /tmp/www/index.html")
    sbx.commands.run("cd /tmp/www && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
    host = sbx.get_host(8000)
    assert host == f"8000-{sbx.sandbox_id}.sandlot.test"
    token = sbx.traffic_access_token
    assert token
    url = server.url + "/index.html"
    deadline = time.monotonic() + 10
    while True:
        r = httpx.get(url, headers={"Host": host, "e2b-traffic-access-token": token})
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200 and r.text == "served\n", r.text
    # The tenant's API key works too; nothing, a wrong token or another tenant's key does not.
    assert httpx.get(url, headers={"Host": host, "X-API-Key": server.key}).text == "served\n"
    assert httpx.get(url, headers={"Host": host}).status_code == 401
    assert httpx.get(url, headers={"Host": host, "e2b-traffic-access-token": "0" * 64}).status_code == 401
    assert httpx.get(url, headers={"Host": host, "X-API-Key": server.key_b}).status_code == 502
    # Port 49983 by host name is envd: the SDK needs no E2B_SANDBOX_URL.
    h = {"Host": f"49983-{sbx.sandbox_id}.sandlot.test", "X-Access-Token": sbx._envd_access_token}
    assert httpx.get(server.url + "/health", headers=h).status_code == 204


def test_bad_api_key_is_an_authentication_error(server):
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="sl_" + "0" * 48)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="not-a-token").next_items()


def test_the_e2b_shaped_form_of_a_token_is_the_same_key(server, sbx):
    """`e2b_<hex>` with a token's own digits is that token (E2B SDK releases that
    check a key's shape send nothing else); other `e2b_` keys are refused, and a
    revoked token's E2B form is refused with it."""
    key = "e2b_" + server.key.removeprefix("sl_")
    assert sbx.sandbox_id in {s.sandbox_id for s in Sandbox.list(api_key=key).next_items()}
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="e2b_" + "0" * 48).next_items()
    with pytest.raises(AuthenticationException):  # only lowercase hex maps to a token
        Sandbox.list(api_key="e2b_" + server.key.removeprefix("sl_").upper()).next_items()
    made = json.loads(server.operator("token", "create", "--tenant", "e2b-a", "--json"))
    assert made["e2b_api_key"] == "e2b_" + made["token"].removeprefix("sl_")
    assert sbx.sandbox_id in {s.sandbox_id for s in Sandbox.list(api_key=made["e2b_api_key"]).next_items()}
    server.operator("token", "revoke", made["id"])
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key=made["e2b_api_key"]).next_items()


def test_tenants_do_not_see_each_other(server, sbx):
    assert sbx.sandbox_id not in {s.sandbox_id for s in Sandbox.list(api_key=server.key_b).next_items()}
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id, api_key=server.key_b)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id, api_key=server.key_b)
    assert Sandbox.kill(sbx.sandbox_id, api_key=server.key_b) is False
    assert sbx.is_running()


def test_envd_needs_the_sandboxs_access_token(server, sbx):
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
    r = httpx.get(server.url + "/health", headers=headers)
    assert r.status_code == 401
    r = httpx.get(server.url + "/health", headers={**headers, "X-Access-Token": "0" * 64})
    assert r.status_code == 401
    r = httpx.post(
        server.url + "/process.Process/List",
        headers={**headers, "Content-Type": "application/json"},
        content=b"{}",
    )
    assert r.status_code == 401


def test_unsupported_calls_fail_with_typed_errors_not_hangs(server, sbx):
    with pytest.raises(SandboxException, match="not found"):
        Sandbox.create(template="no-such-template")
    with pytest.raises(SandboxException, match=r"network\.denyOut\[1\]"):
        Sandbox.create(network={"deny_out": ["192.0.2.1", "192.0.2.1/8"]})
    assert sbx.is_running()


def test_operator_templates(server):
    sb = Sandbox.create(template="rooty", envs={"EXTRA": "1"}, timeout=30)
    try:
        assert sb.get_info().template_id == "rooty"
        r = sb.commands.run("id -un; pwd; echo $FROM_TEMPLATE$EXTRA")
        assert r.stdout == "root\n/root\nyes1\n"
        assert sb.commands.run("id -un", user="user").stdout == "user\n"
    finally:
        sb.kill()


def test_quota_is_a_rate_limit_error(server):
    first = Sandbox.create(api_key=server.key_q, timeout=30)
    try:
        with pytest.raises(RateLimitException):
            Sandbox.create(api_key=server.key_q, timeout=30)
    finally:
        first.kill()
    # The slot is free again once the first one is gone.
    Sandbox.create(api_key=server.key_q, timeout=30).kill()


def test_rest_logs_and_v1_routes(server):
    h = {"X-API-Key": server.key}
    r = httpx.post(server.url + "/sandboxes", headers=h, json={"templateID": "base", "timeout": 30})
    assert r.status_code == 201, r.text
    sid = r.json()["sandboxID"]
    assert r.json()["envdVersion"] and r.json()["envdAccessToken"]
    try:
        listed = httpx.get(server.url + "/sandboxes", headers=h).json()
        assert sid in {s["sandboxID"] for s in listed}
        logs = httpx.get(server.url + f"/sandboxes/{sid}/logs", headers=h).json()
        assert any("created" in line["line"] for line in logs["logs"]), logs
        v2 = httpx.get(server.url + f"/v2/sandboxes/{sid}/logs", headers=h).json()
        assert v2["logs"] and v2["logs"][0]["level"] == "info"
        r = httpx.post(server.url + f"/sandboxes/{sid}/refreshes", headers=h, json={"duration": 120})
        assert r.status_code == 204
        r = httpx.post(server.url + f"/sandboxes/{sid}/snapshots", headers=h, json={})
        assert r.status_code == 201, r.text
        snap = r.json()["snapshotID"]
        assert httpx.delete(server.url + f"/templates/{snap}", headers=h).status_code == 204
        r = httpx.post(server.url + f"/sandboxes/{sid}/no-such-call", headers=h, json={})
        assert r.status_code in (404, 501), r.text
    finally:
        assert httpx.delete(server.url + f"/sandboxes/{sid}", headers=h).status_code == 204
    assert httpx.delete(server.url + f"/sandboxes/{sid}", headers=h).status_code == 404
