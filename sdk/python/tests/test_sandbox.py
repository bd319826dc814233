"""The sync API end to end: lifecycle, processes, errors, tenants, timeouts."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import sandlot
from sandlot import Sandbox, SandlotError


def wait_until(pred, timeout: float = 15.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# --- lifecycle -----------------------------------------------------------------


def test_context_manager_runs_code_and_terminates(daemon, acme):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme, memory="256M", timeout=60, tags={"user": "u1"}, metadata={"k": "v"}) as sb:
        assert sb.state == "running"
        assert sb.info.tenant == "acme"
        assert sb.tags == {"user": "u1"} and sb.metadata == {"k": "v"}
        assert sb.id.startswith(daemon.prefix)
        assert daemon.run_dir_exists(sb.id)
        r = sb.run("python3 -c 'print(6*7)'")
        assert (r.stdout, r.stderr, r.exit_code) == ("42\n", "", 0)
        sid = sb.id
    # Terminated on exit, every trace gone from the host, the record kept.
    assert daemon.run_dir_gone(sid)
    again = Sandbox.connect(sid, client=acme)
    assert again.state == "stopped" and again.info.end_reason == "deleted"
    assert sid not in [s.id for s in Sandbox.list(client=acme)]
    assert sid in [s.id for s in Sandbox.list(client=acme, state="all")]


def test_context_manager_terminates_on_exception(daemon, acme):  # type: ignore[no-untyped-def]
    with pytest.raises(RuntimeError, match="boom"):
        with Sandbox.create(client=acme, timeout=60) as sb:
            sid = sb.id
            raise RuntimeError("boom")
    assert Sandbox.connect(sid, client=acme).state == "stopped"
    assert daemon.run_dir_gone(sid)


def test_create_with_the_same_idempotency_key_returns_the_same_sandbox(acme):  # type: ignore[no-untyped-def]
    key = "retry-" + os.urandom(6).hex()
    with Sandbox.create(client=acme, timeout=60, tags={"k": key}, idempotency_key=key) as first:
        again = Sandbox.create(client=acme, timeout=60, tags={"k": key}, idempotency_key=key)
        assert again.id == first.id
        assert [s.id for s in Sandbox.list(client=acme, tags={"k": key})] == [first.id]
        with pytest.raises(SandlotError) as ei:
            Sandbox.create(client=acme, timeout=60, tags={"k": "other"}, idempotency_key=key)
        assert ei.value.code == "idempotency_mismatch"
    # Without a key given, each call is a new sandbox (a fresh key per call).
    with Sandbox.create(client=acme, timeout=60) as a, Sandbox.create(client=acme, timeout=60) as b:
        assert a.id != b.id


def test_spec_fields_reach_the_sandbox(acme):  # type: ignore[no-untyped-def]
    with Sandbox.create(
        client=acme,
        env={"GREETING": "hello"},
        workdir="/tmp",
        user="user",
        hostname="box1",
        cpus=0.5,
        memory="300M",
        pids=128,
        disk="64M",
        timeout=timedelta(minutes=2),
        name="spec-check",
        spec={"mounts": [{"type": "tmpfs", "target": "/scratch", "size": "8M"}]},
    ) as sb:
        r = sb.run("echo $GREETING; pwd; id -u; hostname; df -k /scratch | tail -1")
        lines = r.stdout.splitlines()
        assert lines[:4] == ["hello", "/tmp", "1000", "box1"], r
        assert " 8192 " in lines[4], lines[4]
        spec = sb.info.spec
        assert spec["resources"]["memory"] == 300 * 1024 * 1024
        assert spec["resources"]["cpus"] == 0.5 and spec["resources"]["pids"] == 128
        assert sb.name == "spec-check"
        assert Sandbox.connect("spec-check", client=acme).id == sb.id


def test_isolation_chooses_the_kernel_that_answers(acme):  # type: ignore[no-untyped-def]
    """Both backends from one daemon: gVisor's kernel answers for itself, the
    namespace sandbox's is the host's."""
    with open("/proc/sys/kernel/osrelease") as f:
        host = f.read().strip()
    for isolation, same in (("namespace", True), ("gvisor", False)):
        with Sandbox.create(client=acme, isolation=isolation) as sb:
            assert sb.info.spec.get("isolation", "namespace") == isolation
            release = sb.run("uname -r").stdout.strip()
            assert (release == host) is same, (isolation, release, host)


def test_list_filters_by_tag_and_state(acme):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme, tags={"team": "a", "run": "list1"}) as a, Sandbox.create(
        client=acme, tags={"team": "b", "run": "list1"}
    ) as b:
        ids = lambda **kw: {s.id for s in Sandbox.list(client=acme, **kw)}  # noqa: E731
        assert ids(tags={"run": "list1"}) == {a.id, b.id}
        assert ids(tags={"run": "list1", "team": "a"}) == {a.id}
        assert ids(tags={"team": None, "run": "list1"}) == {a.id, b.id}
        assert ids(tags=["run"]) >= {a.id, b.id}
        b.terminate()
        assert ids(tags={"run": "list1"}) == {a.id}
        assert ids(tags={"run": "list1"}, state="stopped") == {b.id}
        assert ids(tags={"run": "list1"}, state=["running", "stopped"]) == {a.id, b.id}
        assert b.terminate().state == "stopped"  # idempotent


def test_refresh_usage_and_events(sb):  # type: ignore[no-untyped-def]
    sb.run("head -c 1000 /dev/zero")
    sb.files.write("/tmp/u", b"12345")
    u = sb.usage()
    assert u.exec_count >= 1
    assert u.stdout_bytes >= 1000
    assert u.file_bytes_in >= 5
    assert u.memory_peak_bytes > 0
    info = sb.refresh()
    assert info.state == "running" and info.started_at is not None
    kinds = [e.kind for e in sb.events()]
    assert kinds[:2] == ["created", "started"], kinds


def test_metrics_keep_cpu_and_memory_over_the_sandboxs_life(sb):  # type: ignore[no-untyped-def]
    start = datetime.now(timezone.utc)
    # Busy for a little over one sampling interval (5 s), then a sample is kept.
    sb.run("timeout 6 sh -c 'while :; do :; done'; true")
    deadline = time.monotonic() + 30
    while len(kept := sb.metrics()[:-1]) < 1:  # the last one is taken now
        assert time.monotonic() < deadline, "no sample kept after 30 s"
        time.sleep(0.5)
    m = sb.metrics()
    assert all(a.at is not None and b.at is not None and a.at < b.at for a, b in zip(m, m[1:])), m
    assert kept[0].cpu_cores > 0.05 and kept[0].cpu_seconds > 0.3, kept
    assert all(x.memory_bytes > 0 for x in m), m
    # A range picks its samples; one before the sandbox existed has none.
    assert sb.metrics(start=start - timedelta(hours=1), end=start - timedelta(minutes=1)) == []
    assert sb.metrics(start=datetime.now(timezone.utc) + timedelta(hours=1)) == []
    with pytest.raises(sandlot.InvalidSpecError) as e:
        sb.metrics(start=start, end=start - timedelta(seconds=1))
    assert e.value.field == "start"


def test_set_timeout_extends_and_lifetime_ends_it(daemon, acme):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme, timeout=60) as sb:
        before = sb.info.expires_at
        info = sb.set_timeout("10m")
        assert info.expires_at is not None and before is not None
        assert (info.expires_at - before).total_seconds() > 500
        with pytest.raises(sandlot.InvalidSpecError) as e:
            sb.set_timeout("2h")  # past the operator's max_timeout (1h)
        assert e.value.field == "timeout"
        assert "maximum lifetime" in e.value.message
    # A short lifetime: the daemon ends it.
    sb = Sandbox.create(client=acme, timeout=1)
    info = wait_until(lambda: (lambda i: i if i.state == "stopped" else None)(sb.refresh()), what="lifetime end")
    assert info.end_reason == "timeout"
    assert daemon.run_dir_gone(sb.id)


def test_idle_timeout(acme):  # type: ignore[no-untyped-def]
    sb = Sandbox.create(client=acme, idle_timeout=1)
    try:
        info = wait_until(lambda: (lambda i: i if i.state == "stopped" else None)(sb.refresh()), what="idle end")
        assert info.end_reason == "idle_timeout"
    finally:
        sb.terminate()


# --- processes -------------------------------------------------------------------


def test_exec_streams_output_before_exit(sb):  # type: ignore[no-untyped-def]
    # The process prints a line, then blocks on stdin: the line must arrive while it runs.
    p = sb.exec("sh", "-c", "echo first; read x; echo second:$x; echo oops >&2; exit 3", stdin=True)
    lines = iter(p.stdout)
    assert next(lines) == "first\n"
    assert p.returncode is None
    p.stdin.write("go\n")
    p.stdin.close()
    assert next(lines) == "second:go\n"
    assert p.wait() == 3 and p.returncode == 3
    assert list(lines) == []
    assert p.stderr.read() == "oops\n"
    assert p.exit is not None and p.exit.code == 3 and not p.exit.timed_out


def test_binary_output_is_exact_and_large(sb):  # type: ignore[no-untyped-def]
    p = sb.exec("python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)) * 8192)")
    data = p.stdout.read_bytes()
    assert p.wait() == 0
    assert data == bytes(range(256)) * 8192  # 2 MiB, every byte


def test_stdin_streams_large_input(sb):  # type: ignore[no-untyped-def]
    blob = os.urandom(3 * 1024 * 1024 + 17)
    p = sb.exec("sha256sum", stdin=True)
    for i in range(0, len(blob), 1 << 20):
        p.stdin.write(blob[i : i + (1 << 20)])
    p.stdin.close()
    assert p.wait() == 0
    assert p.stdout.read().split()[0] == hashlib.sha256(blob).hexdigest()
    with pytest.raises(ValueError):
        p.stdin.write(b"late")


def test_stdin_echoed_back_does_not_deadlock(sb):  # type: ignore[no-untyped-def]
    # cat writes back everything while we are still writing and not reading:
    # its output must keep flowing, or both sides would block.
    blob = os.urandom(6 * 1024 * 1024)
    p = sb.exec("cat", stdin=True)
    p.stdin.write(blob)
    p.stdin.close()
    assert p.stdout.read_bytes() == blob
    assert p.wait(timeout=30) == 0


def test_stdin_data_argument(sb):  # type: ignore[no-untyped-def]
    assert sb.run("tr a-z A-Z", stdin="hello\n").stdout == "HELLO\n"
    assert sb.run(["wc", "-c"], stdin=b"\x00" * 1000).stdout.strip() == "1000"


def test_exit_codes_signals_and_check(sb):  # type: ignore[no-untyped-def]
    assert sb.run("exit 7").exit_code == 7
    assert sb.run("true").ok
    r = sb.run("kill -9 $$")
    assert r.exit_code == -9 and r.exit.signal == 9
    with pytest.raises(sandlot.CommandError) as e:
        sb.run("echo out; echo bad >&2; exit 2", check=True)
    assert e.value.exit_code == 2
    assert e.value.stdout == "out\n" and e.value.stderr == "bad\n"
    assert "exited with code 2" in str(e.value) and "bad" in str(e.value)


def test_exec_timeout(sb):  # type: ignore[no-untyped-def]
    r = sb.run("sleep 30", timeout=0.5)
    assert r.exit.timed_out and r.exit_code != 0
    with pytest.raises(sandlot.CommandTimeoutError) as e:
        sb.run("sleep 30", timeout="500ms", check=True)
    assert isinstance(e.value, TimeoutError) and "timed out" in str(e.value)


def test_wait_timeout_signal_and_kill(sb):  # type: ignore[no-untyped-def]
    p = sb.exec("sleep", "60")
    with pytest.raises(sandlot.ProcessTimeoutError):
        p.wait(timeout=0.2)
    assert p.poll() is None
    p.terminate()
    assert p.wait(timeout=10) == -15
    q = sb.exec("sh", "-c", "trap '' TERM; echo ready; sleep 60")
    # Signalled once the trap is set (before it, SIGTERM ends the shell).
    assert next(iter(q.stdout)) == "ready\n"
    q.signal("SIGTERM")
    with pytest.raises(sandlot.ProcessTimeoutError):
        q.wait(timeout=0.3)
    q.kill()
    assert q.wait(timeout=10) == -9


def test_pty(sb):  # type: ignore[no-untyped-def]
    p = sb.exec("sh", "-c", "tty; stty size", pty=(30, 100))
    out = p.stdout.read()
    assert p.wait() == 0
    assert "/dev/pts/" in out and "30 100" in out, out
    # Resize a running PTY process.
    p = sb.exec("sh", "-c", "read x; stty size", pty=True, stdin=True)
    p.resize(50, 132)
    p.stdin.write("\n")
    out = p.stdout.read()
    assert p.wait() == 0 and "50 132" in out, out


def test_callbacks_and_merged_output(sb):  # type: ignore[no-untyped-def]
    got = {"stdout": [], "stderr": []}
    p = sb.exec(
        "sh",
        "-c",
        "echo a; sleep 0.1; echo b >&2; sleep 0.1; echo c",
        on_stdout=got["stdout"].append,
        on_stderr=got["stderr"].append,
    )
    assert p.wait() == 0
    p.result()  # both streams drained
    assert "".join(got["stdout"]) == "a\nc\n" and "".join(got["stderr"]) == "b\n"
    q = sb.exec("sh", "-c", "echo a; sleep 0.1; echo b >&2; sleep 0.1; echo c")
    chunks = [(c.stream, c.data) for c in q.iter_output()]
    assert chunks == [("stdout", b"a\n"), ("stderr", b"b\n"), ("stdout", b"c\n")]
    assert q.returncode == 0
    r = q.result()
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")


def test_background_process_and_reattach(sb):  # type: ignore[no-untyped-def]
    p = sb.exec("sh", "-c", "echo start; sleep 2; echo end", background=True, tag="job-1")
    assert p.info.background and p.info.tag == "job-1"
    assert p.id in [i.id for i in sb.processes()]
    # A reader that leaves early...
    first = sb.process(p.id)
    assert next(iter(first.stdout)) == "start\n"
    first.close()
    # ...and one that re-attaches from an offset: only what follows it.
    tail = sb.process(p.id, stdout_from=len("start\n"))
    assert tail.wait(timeout=20) == 0
    assert tail.stdout.read() == "end\n"
    assert sb.process(p.id).poll() == 0
    # Once a reader has received the exit, the agent no longer retains the output:
    # a re-attach from an offset is 410, while wait() still gets the exit status.
    gone = sb.process(p.id, stdout_from=1)
    assert gone.wait(timeout=20) == 0
    with pytest.raises(sandlot.GoneError) as e:
        gone.stdout.read()
    assert e.value.status == 410 and e.value.code == "gone"


def test_many_concurrent_processes(sb):  # type: ignore[no-untyped-def]
    results = {}

    def one(i: int) -> None:
        results[i] = sb.run(f"seq 1 {1000 + i}").stdout

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(12):
        assert results[i] == "".join(f"{n}\n" for n in range(1, 1001 + i))


# --- errors ----------------------------------------------------------------------


def test_invalid_spec_names_the_field(acme):  # type: ignore[no-untyped-def]
    with pytest.raises(sandlot.InvalidSpecError) as e:
        Sandbox.create(client=acme, memory="1K")
    assert e.value.field == "resources.memory" and e.value.status == 400
    assert e.value.code == "bad_request" and e.value.request_id.startswith("req_")
    assert "resources.memory" in str(e.value) and e.value.request_id in str(e.value)
    with pytest.raises(sandlot.InvalidSpecError) as e:
        Sandbox.create(client=acme, spec={"bogus": 1})
    assert e.value.field == "bogus"
    with pytest.raises(sandlot.InvalidSpecError) as e:
        Sandbox.create(client=acme, mounts=[{"type": "tmpfs", "target": "relative"}])
    assert e.value.field.startswith("mounts[0]")
    with pytest.raises(sandlot.InvalidSpecError) as e:
        Sandbox.create(client=acme, tags={"bad key!": "x"})
    assert e.value.field.startswith("tags")
    with pytest.raises(sandlot.InvalidSpecError) as e:
        Sandbox.create(client=acme, timeout="2h")
    assert e.value.field == "timeout"
    # Newer spec fields pass through the SDK untouched; the API validates them and
    # names the entry (a volume without a target).
    with pytest.raises(sandlot.InvalidSpecError) as e:
        Sandbox.create(client=acme, volumes=[{"name": "v"}])
    assert e.value.field.startswith("volumes[0]"), e.value.field
    assert isinstance(e.value, sandlot.BadRequestError) and isinstance(e.value, sandlot.APIError)


def test_not_found_and_conflict(acme, sb):  # type: ignore[no-untyped-def]
    with pytest.raises(sandlot.NotFoundError) as e:
        Sandbox.connect("no-such-sandbox", client=acme)
    assert e.value.status == 404 and "no-such-sandbox" in e.value.message and e.value.request_id
    with pytest.raises(sandlot.NotFoundError):
        sb.process(999999)
    with pytest.raises(sandlot.SpawnError) as e:
        sb.exec("/no/such/binary")
    assert e.value.code == "spawn_failed"
    with pytest.raises(sandlot.SpawnError) as e:
        sb.exec("ls -l /tmp")  # a command line given to exec: the error says what to do
    assert "run('ls -l /tmp')" in str(e.value) and "exec('ls', '-l', '/tmp')" in str(e.value)
    with pytest.raises(sandlot.InvalidUserError):
        sb.exec("true", user="nobody-here")
    with Sandbox.create(client=acme, name="taken-name") as a:
        with pytest.raises(sandlot.ConflictError) as e:
            Sandbox.create(client=acme, name="taken-name")
        assert e.value.status == 409
        a.terminate()
        with pytest.raises(sandlot.ConflictError) as e:
            a.run("true")
        assert "stopped" in e.value.message
    p = sb.exec("true")
    p.wait()
    with pytest.raises(sandlot.ConflictError):
        sb._client.request("POST", f"/v1/sandboxes/{sb.id}/processes/{p.id}/stdin", content=b"x")


def test_auth(daemon, tokens):  # type: ignore[no-untyped-def]
    for token in ("", "sl_" + "0" * 48, "not-a-token"):
        with sandlot.Client(daemon.tcp_url, token=token) as c:
            with pytest.raises(sandlot.AuthError) as e:
                Sandbox.list(client=c)
            assert e.value.status == 401 and e.value.code == "unauthorized"
    with sandlot.Client(daemon.tcp_url, token=tokens["acme"]) as c:
        assert c.health()["tenant"] == "acme"


def test_env_configuration(daemon, tokens, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SANDLOT_URL", f"127.0.0.1:{daemon.port}")
    monkeypatch.setenv("SANDLOT_TOKEN", tokens["other"])
    sandlot.configure()
    try:
        assert sandlot.default_client().health()["tenant"] == "other"
        with Sandbox.create() as sb:
            assert sb.info.tenant == "other"
        # Explicit arguments win over the environment.
        sandlot.configure(daemon.unix_url, "")
        assert sandlot.default_client().health()["tenant"] == "*"
    finally:
        sandlot.configure()
    with sandlot.Client(f"unix://{daemon.dir}/missing.sock") as c:
        with pytest.raises(sandlot.ConnectError) as e:
            c.health()
        assert "missing.sock" in str(e.value)
    with pytest.raises(ValueError):
        sandlot.Client("ftp://x")


def test_tenant_isolation(acme, other, operator):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme, name="iso", tags={"iso": "1"}) as mine:
        for ref in (mine.id, "iso"):
            with pytest.raises(sandlot.NotFoundError):
                Sandbox.connect(ref, client=other)
        assert mine.id not in [s.id for s in Sandbox.list(client=other, state="all")]
        foreign = Sandbox(mine.info, other)  # a handle forged with another tenant's client
        with pytest.raises(sandlot.NotFoundError):
            foreign.run("true")
        with pytest.raises(sandlot.NotFoundError):
            foreign.files.read("/etc/hostname")
        with pytest.raises(sandlot.NotFoundError):
            foreign.terminate()
        assert Sandbox.connect(mine.id, client=acme).state == "running"
        # The operator sees every tenant's sandboxes, and can act as one.
        assert mine.id in [s.id for s in Sandbox.list(client=operator, tags={"iso": "1"})]
        with sandlot.Client(operator.url, token="", tenant="other") as as_other:
            assert Sandbox.list(client=as_other, tags={"iso": "1"}) == []


def test_quota_exceeded(daemon, tokens):  # type: ignore[no-untyped-def]
    with sandlot.Client(daemon.tcp_url, tokens["tiny"]) as tiny:
        with Sandbox.create(client=tiny):
            with pytest.raises(sandlot.QuotaExceededError) as e:
                Sandbox.create(client=tiny)
            assert e.value.status == 429 and e.value.code == "quota_exceeded"
        with pytest.raises(sandlot.QuotaExceededError):
            Sandbox.create(client=tiny, memory="2G")


def test_process_of_a_terminated_sandbox_fails_clearly(acme):  # type: ignore[no-untyped-def]
    sb = Sandbox.create(client=acme)
    p = sb.exec("sleep", "60")
    Sandbox.connect(sb.id, client=acme).terminate()
    with pytest.raises(sandlot.SandlotError) as e:
        p.wait(timeout=30)
    assert not isinstance(e.value, sandlot.ProcessTimeoutError)
    with pytest.raises(sandlot.SandlotError):
        p.stdout.read()
    with pytest.raises(sandlot.ConflictError):
        sb.exec("true")


def test_a_host_sandbox_snapshot_starts_new_sandboxes_as_returned(acme):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme) as sb:
        sb.run("mkdir -p /home/user/proj && echo kept > /home/user/proj/f", check=True)
        snap = sb.snapshot_filesystem()
    assert snap["base"] == "host" and snap["parent"] is None, snap
    # What snapshot_filesystem() returns is what create() takes.
    with Sandbox.create(image=snap, client=acme) as restored:
        assert restored.run("cat /home/user/proj/f").stdout == "kept\n"
        again = restored.snapshot_filesystem()
    assert again["parent"] == snap["id"], again
    with pytest.raises(TypeError, match="snapshot_filesystem"):
        Sandbox.create(image={"no": "id"}, client=acme)


def _doc_blocks(section: str) -> "list[str]":
    """The Python code blocks of a section of docs/sdk-python.md."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "sdk-python.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [b.split("```", 1)[0] for b in body.split("```python\n")[1:]]


def test_the_docs_create_examples_run_as_written(daemon, tokens, monkeypatch):  # type: ignore[no-untyped-def]
    blocks = _doc_blocks("Sandboxes")[:2]
    assert "Sandbox.create(" in blocks[0] and "volumes=" in blocks[1], blocks
    monkeypatch.setenv("SANDLOT_URL", f"127.0.0.1:{daemon.port}")
    monkeypatch.setenv("SANDLOT_TOKEN", tokens["acme"])
    sandlot.configure()
    try:
        c = sandlot.default_client()
        # What the second example says to make first.
        c.json("POST", "/v1/volumes", json={"name": "cache"})
        for name in ("token", "key"):
            c.json("POST", "/v1/secrets", json={"name": name, "value": f"{name}-value"})
        ns: "dict[str, object]" = {}  # one session: the second block follows the first
        for code in blocks:
            exec(compile(code, "docs/sdk-python.md", "exec"), ns)
    finally:
        for path in ("/v1/volumes/cache", "/v1/secrets/token", "/v1/secrets/key"):
            with contextlib.suppress(SandlotError):
                sandlot.default_client().request("DELETE", path)
        sandlot.configure()
