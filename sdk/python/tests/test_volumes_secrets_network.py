"""Volumes, secrets and a sandbox's network policy and egress log through the SDK,
sync and async, end to end. No traffic leaves the host: the only name looked up
is one the policy denies, which the daemon's resolver answers itself."""

from __future__ import annotations

from pathlib import Path

import pytest

import sandlot
from sandlot import AsyncSandbox, AsyncSecret, AsyncVolume, Sandbox, Secret, Volume

LOOKUP = "import socket\ntry:\n    socket.getaddrinfo('blocked.test', 80)\nexcept OSError:\n    print('refused')"


def test_a_volume_keeps_files_between_sandboxes_and_is_removed_when_free(acme, other) -> None:  # type: ignore[no-untyped-def]
    v = Volume.create("sdk-data", size_limit="16M", client=acme)
    try:
        info = v.info()
        assert (info.name, info.tenant, info.size_limit) == ("sdk-data", "acme", 16 << 20)
        assert info.created_at is not None
        assert "sdk-data" in [x.name for x in Volume.list(client=acme)]
        assert "sdk-data" not in [x.name for x in Volume.list(client=other)]
        with pytest.raises(sandlot.ConflictError):
            Volume.create("sdk-data", client=acme)
        with Sandbox.create(client=acme, volumes=[v.mount("/data")]) as sb:
            assert sb.run("echo kept > /data/f").exit_code == 0
            # Mounted: the volume cannot go.
            with pytest.raises(sandlot.ConflictError):
                v.delete()
        with Sandbox.create(client=acme, volumes=[v.mount("/data", read_only=True)]) as sb:
            assert sb.run("cat /data/f").stdout == "kept\n"
            assert sb.run("touch /data/g").exit_code != 0
    finally:
        Volume("sdk-data", client=acme).delete()
    with pytest.raises(sandlot.NotFoundError):
        v.info()


def test_a_secret_reaches_a_sandbox_as_a_variable_and_a_file_and_is_never_returned(acme, other) -> None:  # type: ignore[no-untyped-def]
    s = Secret.create("sdk-key", "hunter2", client=acme)
    try:
        listed = [x for x in Secret.list(client=acme) if x.name == "sdk-key"]
        assert len(listed) == 1 and listed[0].tenant == "acme"
        assert "hunter2" not in repr(listed[0].raw)
        assert "sdk-key" not in [x.name for x in Secret.list(client=other)]
        with Sandbox.create(client=acme, secrets=[s.env("API_KEY"), s.file("/run/secrets/key", mode=0o440)]) as sb:
            assert sb.run("printf %s \"$API_KEY\"").stdout == "hunter2"
            # Not coreutils' stat, which Debian 12's runsc fails (docs/api.md, "Isolation").
            mode = "python3 -c 'import os; print(oct(os.stat(\"/run/secrets/key\").st_mode & 0o777)[2:])'"
            assert sb.run(f"cat /run/secrets/key; {mode}").stdout == "hunter2440\n"
    finally:
        s.delete()
    with pytest.raises(sandlot.NotFoundError):
        s.delete()


def test_network_policy_changes_take_effect_and_the_log_shows_denials(acme) -> None:  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme, network={"mode": "allow", "allow": [{"domain": "allowed.test"}]}) as sb:
        p = sb.network.get()
        assert (p.mode, p.allow) == ("allow", [{"domain": "allowed.test"}])
        sb.files.write("/tmp/lookup.py", LOOKUP)
        assert sb.run("python3 /tmp/lookup.py").stdout == "refused\n"
        log = sb.network.log()
        denied = [e for e in log if e.kind == "dns" and e.name == "blocked.test"]
        assert denied and all(e.decision == "denied" for e in denied), log
        # Paging: nothing after the last entry seen.
        assert sb.network.log(after=log[-1].seq) == []
        assert len(sb.network.log(limit=1)) == 1
        p = sb.network.set(allow=["*.example.test:443", "203.0.113.0/24"])
        assert p.mode == "allow"
        assert sb.network.get().allow == [
            {"domain": "*.example.test", "ports": [443]},
            {"cidr": "203.0.113.0/24"},
        ]
        with pytest.raises(sandlot.BadRequestError):
            sb.network.set(allow=["bad domain"])
        assert sb.network.set("none").mode == "none"
    # The log outlives the sandbox.
    assert [e.seq for e in sb.network.log()] == [e.seq for e in log]


def test_a_sandbox_created_without_network_cannot_get_one_later(acme) -> None:  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme, network="none") as sb:
        assert sb.network.get().mode == "none"
        with pytest.raises(sandlot.ConflictError):
            sb.network.set("open")


async def test_async_volumes_secrets_and_network(aacme) -> None:  # type: ignore[no-untyped-def]
    v = await AsyncVolume.create("sdk-async", client=aacme)
    s = await AsyncSecret.create("sdk-async", b"async-value", client=aacme)
    try:
        assert (await v.info()).size_limit is None
        assert "sdk-async" in [x.name for x in await AsyncVolume.list(client=aacme)]
        assert "sdk-async" in [x.name for x in await AsyncSecret.list(client=aacme)]
        async with await AsyncSandbox.create(
            client=aacme,
            volumes=[v.mount("/v")],
            secrets=[s.env("V")],
            network={"mode": "allow"},
        ) as sb:
            assert (await sb.run("echo $V > /v/x && cat /v/x")).stdout == "async-value\n"
            await sb.files.write("/tmp/lookup.py", LOOKUP)
            assert (await sb.run("python3 /tmp/lookup.py")).stdout == "refused\n"
            assert any(e.name == "blocked.test" and e.decision == "denied" for e in await sb.network.log())
            p = await sb.network.set(allow=[{"domain": "x.test", "ports": [80]}])
            assert (await sb.network.get()).allow == p.allow == [{"domain": "x.test", "ports": [80]}]
    finally:
        await v.delete()
        await s.delete()
    with pytest.raises(sandlot.NotFoundError):
        await v.info()


def test_allow_rules_read_as_the_cli_reads_them() -> None:
    assert sandlot.allow_rule("API.example.com:443,80") == {"domain": "api.example.com", "ports": [443, 80]}
    assert sandlot.allow_rule("2001:db8::/32") == {"cidr": "2001:db8::/32"}
    assert sandlot.allow_rule("10.0.0.1") == {"cidr": "10.0.0.1"}
    with pytest.raises(ValueError, match="not a port"):
        sandlot.allow_rule("a.test:0")
    with pytest.raises(ValueError):
        sandlot.allow_rule(":443")


def test_the_docs_volume_and_secret_example_runs_as_written(daemon, tokens, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    text = (Path(__file__).resolve().parents[3] / "docs" / "sdk-python.md").read_text()
    body = text.split("\n## Volumes and secrets\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in body.split("```python\n")[1:]]
    assert len(blocks) == 1 and "Volume.create(" in blocks[0], blocks
    monkeypatch.setenv("SANDLOT_URL", f"127.0.0.1:{daemon.port}")
    monkeypatch.setenv("SANDLOT_TOKEN", tokens["acme"])
    sandlot.configure()
    try:
        ns: "dict[str, object]" = {}
        exec(compile(blocks[0], "docs/sdk-python.md", "exec"), ns)
        with Sandbox.create(volumes=[Volume("data").mount("/data")]) as sb:
            assert sb.run("test -s /data/last-run").exit_code == 0
    finally:
        Volume("data").delete()
        Secret("api-key").delete()
        sandlot.configure()
