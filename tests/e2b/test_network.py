"""Network options through the official SDK: a deny list with the rest open, and
public sandbox ports (`allow_public_traffic`). Nothing here sends traffic past the
host: the denied destinations are private addresses the daemon refuses anyway, so
the egress log's reason shows which rule refused them. Reaching allowed destinations
and names is proven in the simulated internet of `crates/sandlot/tests/net_e2b.rs`."""

import time

import httpx
from e2b import Sandbox


def _log(server, sandbox_id):
    r = httpx.get(
        f"{server.api_url}/v1/sandboxes/{sandbox_id}/network/log",
        headers={"Authorization": f"Bearer {server.key}"},
    )
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def test_deny_out_with_the_rest_open_refuses_by_its_rule(server):
    sbx = Sandbox.create(
        network={"deny_out": ["10.0.0.0/8", "denied.test"], "allow_out": ["ok.denied.test"]},
        timeout=60,
    )
    try:
        info = sbx.get_info()
        assert info.allow_internet_access is True
        net = info.network or {}
        deny = net.get("deny_out") if isinstance(net, dict) else getattr(net, "deny_out", None)
        assert deny == ["10.0.0.0/8", "denied.test"], net
        r = sbx.commands.run("curl -sS -m 5 http://10.1.2.3/ || true")
        assert "reset" in (r.stdout + r.stderr).lower(), r
        reasons = [e["reason"] for e in _log(server, sbx.sandbox_id) if e["decision"] == "denied"]
        assert any("a deny rule names 10.1.2.3:80" in x for x in reasons), reasons
    finally:
        sbx.kill()


def test_allow_public_traffic_true_serves_a_port_without_a_credential(server):
    sbx = Sandbox.create(network={"allow_public_traffic": True, "deny_out": ["10.0.0.0/8"]}, timeout=60)
    try:
        sbx.commands.run("mkdir -p /tmp/www && echo public > /tmp/www/index.html")
        sbx.commands.run("cd /tmp/www && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
        url = server.url + "/index.html"
        host = sbx.get_host(8000)
        deadline = time.monotonic() + 10
        while True:
            r = httpx.get(url, headers={"Host": host})
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200 and r.text == "public\n", r.text
        # envd never becomes public: without its access token it is a 401.
        envd = httpx.get(server.url + "/health", headers={"Host": sbx.get_host(49983)})
        assert envd.status_code == 401, envd.text
    finally:
        sbx.kill()


def test_allow_public_traffic_false_keeps_the_token(server):
    sbx = Sandbox.create(network={"allow_public_traffic": False}, timeout=60)
    try:
        sbx.commands.run("mkdir -p /tmp/www && echo private > /tmp/www/index.html")
        sbx.commands.run("cd /tmp/www && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
        url = server.url + "/index.html"
        host = sbx.get_host(8000)
        token = {"Host": host, "e2b-traffic-access-token": sbx.traffic_access_token}
        deadline = time.monotonic() + 10
        while True:
            r = httpx.get(url, headers=token)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200 and r.text == "private\n", r.text
        assert httpx.get(url, headers={"Host": host}).status_code == 401
    finally:
        sbx.kill()
