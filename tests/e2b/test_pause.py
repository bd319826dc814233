"""E2B's pause, resume and connect, its lifecycle options (auto-pause on timeout,
auto-resume), and listing paused sandboxes, through the official SDK."""

import datetime
import time

import httpx
from e2b import Sandbox, SandboxQuery, SandboxState


def wait_state(sb: Sandbox, state: SandboxState, secs: float = 60) -> None:
    deadline = time.monotonic() + secs
    while Sandbox.get_info(sb.sandbox_id).state != state:
        assert time.monotonic() < deadline, f"{sb.sandbox_id} never became {state}"
        time.sleep(0.2)


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
        wait_state(sb, SandboxState.PAUSED)
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
        wait_state(sb, SandboxState.PAUSED)
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
