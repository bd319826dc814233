"""E2B's pause, resume and connect, its lifecycle options (auto-pause on timeout,
auto-resume), and listing paused sandboxes, through the official SDK."""

import datetime
import threading
import time
import urllib.error

import httpx
import pytest
from e2b import Sandbox, SandboxException, SandboxQuery, SandboxState


def wait_paused(server, sb: Sandbox, secs: float = 60) -> None:
    """Waits until `sb` is paused, not merely being paused (which E2B's state
    shows as paused already)."""
    deadline = time.monotonic() + secs
    while server.native("GET", f"/v1/sandboxes/{sb.sandbox_id}", server.key)["state"] != "paused":
        assert time.monotonic() < deadline, f"{sb.sandbox_id} never paused"
        time.sleep(0.2)
    assert Sandbox.get_info(sb.sandbox_id).state == SandboxState.PAUSED


def test_pause_then_connect_resumes_the_sandbox_with_its_files(server):
    sb = Sandbox.create(timeout=120)
    try:
        sb.files.write("/tmp/kept.txt", "still here")
        assert sb.pause() is True
        assert Sandbox.get_info(sb.sandbox_id).state == SandboxState.PAUSED
        assert not sb.is_running()
        # A second pause finds it paused (E2B's 409, which the SDK answers False).
        assert sb.pause() is False
        resumed = Sandbox.connect(sb.sandbox_id, timeout=60)
        assert resumed.is_running()
        assert resumed.files.read("/tmp/kept.txt") == "still here"
        info = Sandbox.get_info(sb.sandbox_id)
        assert info.state == SandboxState.RUNNING
        # connect set its timeout: it ends about 60 s from now.
        lifetime = (info.end_at - datetime.datetime.now(tz=info.end_at.tzinfo)).total_seconds()
        assert 30 < lifetime <= 61, lifetime
    finally:
        sb.kill()


def test_resume_answers_created_and_conflict_when_running(server):
    h = {"X-API-Key": server.key}
    sb = Sandbox.create(timeout=120)
    try:
        url = server.url + f"/sandboxes/{sb.sandbox_id}"
        r = httpx.post(url + "/resume", headers=h, json={"timeout": 30})
        assert r.status_code == 409, r.text
        assert httpx.post(url + "/pause", headers=h).status_code == 204
        assert httpx.post(url + "/pause", headers=h).status_code == 409
        r = httpx.post(url + "/resume", headers=h, json={"timeout": 30})
        assert r.status_code == 201, r.text
        assert r.json()["sandboxID"] == sb.sandbox_id and r.json()["envdAccessToken"]
        assert sb.commands.run("echo back").stdout == "back\n"
        other = httpx.post(server.url + "/sandboxes/nope/pause", headers=h)
        assert other.status_code == 404
        # Another tenant's real sandbox is not found either.
        b = {"X-API-Key": server.key_b}
        for action in ("pause", "resume", "connect"):
            r = httpx.post(url + "/" + action, headers=b, json={"timeout": 30})
            assert r.status_code == 404, (action, r.text)
        assert httpx.delete(url, headers=b).status_code == 404
        assert sb.commands.run("echo still").stdout == "still\n"
    finally:
        sb.kill()


def test_list_filters_paused_sandboxes_and_kill_deletes_one(server):
    running = Sandbox.create(metadata={"suite": "paused-list"}, timeout=120)
    paused = Sandbox.create(metadata={"suite": "paused-list"}, timeout=120)
    try:
        paused.pause()

        def listed(*states):
            q = SandboxQuery(metadata={"suite": "paused-list"}, state=list(states))
            return {s.sandbox_id: s.state for s in Sandbox.list(query=q).next_items()}

        assert listed(SandboxState.PAUSED) == {paused.sandbox_id: SandboxState.PAUSED}
        assert listed(SandboxState.RUNNING) == {running.sandbox_id: SandboxState.RUNNING}
        assert len(listed(SandboxState.RUNNING, SandboxState.PAUSED)) == 2
        assert Sandbox.kill(paused.sandbox_id) is True
        assert listed(SandboxState.PAUSED) == {}
    finally:
        running.kill()
        paused.kill()


def test_auto_pause_on_timeout_keeps_the_sandbox_for_connect(server):
    sb = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause"})
    try:
        sb.files.write("/tmp/kept.txt", "across the auto-pause")
        info = Sandbox.get_info(sb.sandbox_id)
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": False}
        wait_paused(server, sb)
        # Without auto-resume an envd call does not wake it.
        assert not sb.is_running()
        assert Sandbox.get_info(sb.sandbox_id).state == SandboxState.PAUSED
        sb.connect(timeout=60)
        assert Sandbox.get_info(sb.sandbox_id).state == SandboxState.RUNNING
        assert sb.files.read("/tmp/kept.txt") == "across the auto-pause"
    finally:
        sb.kill()


def test_auto_resume_wakes_a_paused_sandbox_on_an_envd_call(server):
    sb = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sb.files.write("/tmp/kept.txt", "woken")
        # E2B's zero timeout is the timeout now: the sandbox auto-pauses.
        sb.set_timeout(0)
        wait_paused(server, sb)
        assert sb.commands.run("cat /tmp/kept.txt").stdout == "woken"
        assert Sandbox.get_info(sb.sandbox_id).state == SandboxState.RUNNING
    finally:
        sb.kill()


def test_bad_lifecycle_options_are_refused(server):
    h = {"X-API-Key": server.key}
    r = httpx.post(
        server.url + "/sandboxes",
        headers=h,
        json={"templateID": "base", "lifecycle": {"onTimeout": "hibernate"}},
    )
    assert r.status_code == 400 and "lifecycle.onTimeout" in r.json()["message"], r.text
    r = httpx.post(server.url + "/sandboxes", headers=h, json={"templateID": "base", "autoPause": "yes"})
    assert r.status_code == 400 and "autoPause" in r.json()["message"], r.text


def test_a_resume_timeout_past_the_maximum_lifetime_is_refused_before_resuming(server):
    h = {"X-API-Key": server.key}
    sb = Sandbox.create(timeout=120)
    try:
        url = server.url + f"/sandboxes/{sb.sandbox_id}"
        assert sb.pause() is True
        for action in ("resume", "connect"):
            # Far past the operator's maximum lifetime (24 h by default).
            r = httpx.post(url + "/" + action, headers=h, json={"timeout": 10**7})
            assert r.status_code == 400 and "timeout" in r.json()["message"], r.text
            assert Sandbox.get_info(sb.sandbox_id).state == SandboxState.PAUSED
    finally:
        sb.kill()


def test_kill_during_a_resume_deletes_the_sandbox(server):
    sb = Sandbox.create(timeout=120)
    try:
        sb.pause()
        resumed = {}

        def connect():
            try:
                Sandbox.connect(sb.sandbox_id, timeout=60)
                resumed["ok"] = True
            except Exception as e:  # the kill may come first
                resumed["error"] = e

        t = threading.Thread(target=connect)
        t.start()
        # Killed as soon as its resume shows (resuming, or running already).
        deadline = time.monotonic() + 60
        while server.native("GET", f"/v1/sandboxes/{sb.sandbox_id}", server.key)["state"] == "paused":
            assert time.monotonic() < deadline, "no resume"
            time.sleep(0.01)
        assert Sandbox.kill(sb.sandbox_id) is True
        t.join()
        rec = server.native("GET", f"/v1/sandboxes/{sb.sandbox_id}", server.key)
        assert (rec["state"], rec["end_reason"]) == ("stopped", "deleted"), rec
        q = SandboxQuery(state=[SandboxState.RUNNING, SandboxState.PAUSED])
        assert sb.sandbox_id not in {s.sandbox_id for s in Sandbox.list(query=q).next_items()}
    finally:
        sb.kill()


def test_a_refused_pause_is_raised_not_taken_for_already_paused(server):
    # A gVisor sandbox with a tmpfs mount, whose files a pause would not keep:
    # the pause is refused and the sandbox runs on.
    try:
        rec = server.native(
            "POST",
            "/v1/sandboxes",
            server.key,
            {"isolation": "gvisor", "mounts": [{"type": "tmpfs", "target": "/scratch"}]},
        )
    except urllib.error.HTTPError as e:
        pytest.skip(f"no gVisor sandbox on this host ({e.code})")
    try:
        with pytest.raises(SandboxException) as e:
            Sandbox.pause(rec["id"])
        assert "400" in str(e.value) and "/scratch" in str(e.value), e.value
        assert Sandbox.get_info(rec["id"]).state == SandboxState.RUNNING
    finally:
        Sandbox.kill(rec["id"])
