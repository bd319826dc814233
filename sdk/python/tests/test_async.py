"""The asyncio API end to end."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

import sandlot
from sandlot import AsyncSandbox


async def test_async_context_manager_run_and_cleanup(daemon, aacme):  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme, memory="256M", timeout=60, tags={"a": "1"}) as sb:
        assert sb.state == "running" and sb.id.startswith(daemon.prefix)
        r = await sb.run("python3 -c 'print(6*7)'")
        assert (r.stdout, r.exit_code) == ("42\n", 0)
        assert sb.id in [s.id for s in await AsyncSandbox.list(client=aacme, tags={"a": "1"})]
        sid = sb.id
    assert (await AsyncSandbox.connect(sid, client=aacme)).state == "stopped"
    assert daemon.run_dir_gone(sid)


async def test_async_upload_and_download_of_a_file_keep_its_bytes_and_mode(aacme, tmp_path):  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme) as sb:
        local = tmp_path / "tool.bin"
        local.write_bytes(os.urandom(3 * 1024 * 1024 + 5))
        local.chmod(0o750)
        assert await sb.files.upload(local, "/tmp/tool.bin") == local.stat().st_size
        st = await sb.files.stat("/tmp/tool.bin")
        assert (st.size, st.mode & 0o777) == (local.stat().st_size, 0o750)
        back = tmp_path / "back.bin"
        assert await sb.files.download("/tmp/tool.bin", back) == local.stat().st_size
        assert back.read_bytes() == local.read_bytes()
        with pytest.raises(sandlot.NotFoundError):
            await sb.files.download("/tmp/none", tmp_path / "none")
        assert not (tmp_path / "none").exists() and not (tmp_path / "none.sandlot-partial").exists()
        with pytest.raises(FileNotFoundError):
            await sb.files.upload(tmp_path / "missing", "/tmp/missing")


async def test_async_streaming_stdin_and_exit(aacme):  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme) as sb:
        p = await sb.exec("sh", "-c", "echo first; read x; echo second:$x; echo e >&2; exit 4", stdin=True)
        lines = p.stdout.__aiter__()
        assert await lines.__anext__() == "first\n"
        assert p.returncode is None
        await p.stdin.write(b"go\n")
        await p.stdin.close()
        assert await lines.__anext__() == "second:go\n"
        assert await p.wait() == 4
        assert await p.stderr.read() == "e\n"
        # Binary and large, both ways.
        blob = os.urandom(2 * 1024 * 1024)
        q = await sb.exec("sha256sum", stdin=blob)
        assert (await q.stdout.read()).split()[0] == hashlib.sha256(blob).hexdigest()
        assert await q.wait() == 0
        r = await sb.exec("python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256))*4096)")
        assert await r.stdout.read_bytes() == bytes(range(256)) * 4096
        # Signals, timeouts, check.
        s = await sb.exec("sleep", "60")
        with pytest.raises(sandlot.ProcessTimeoutError):
            await s.wait(timeout=0.2)
        await s.kill()
        assert await s.wait(timeout=10) == -9
        t = await sb.run("sleep 30", timeout=0.5)
        assert t.exit.timed_out
        with pytest.raises(sandlot.CommandError) as e:
            await sb.run("echo no >&2; exit 9", check=True)
        assert e.value.exit_code == 9 and e.value.stderr == "no\n"


async def test_async_callbacks_merged_output_and_background(aacme):  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme) as sb:
        got = []

        async def on_out(text: str) -> None:
            got.append(text)

        p = await sb.exec("sh", "-c", "echo a; echo b", on_stdout=on_out)
        await p.result()
        assert "".join(got) == "a\nb\n"
        q = await sb.exec("sh", "-c", "echo a; sleep 0.1; echo b >&2; sleep 0.1; echo c")
        chunks = [(c.stream, c.data) async for c in q.iter_output()]
        assert chunks == [("stdout", b"a\n"), ("stderr", b"b\n"), ("stdout", b"c\n")]
        # result() after iter_output(): the exit, and what was not yielded.
        r = await q.result()
        assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")
        part = await sb.exec("sh", "-c", "echo one; sleep 0.2; echo two >&2; exit 3")
        async for c in part.iter_output():
            assert c.data == b"one\n"
            break
        r = await part.result()
        assert (r.exit_code, r.stdout, r.stderr) == (3, "", "two\n")
        bg = await sb.exec("sh", "-c", "echo start; sleep 1; echo end", background=True)
        again = await sb.process(bg.id, stdout_from=len("start\n"))
        assert await again.wait(timeout=20) == 0
        assert await again.stdout.read() == "end\n"


async def test_async_concurrent_runs(aacme):  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme) as sb:
        outs = await asyncio.gather(*(sb.run(f"seq 1 {500 + i}") for i in range(16)))
        for i, r in enumerate(outs):
            assert r.stdout == "".join(f"{n}\n" for n in range(1, 501 + i))


async def test_async_errors_and_isolation(daemon, aacme, tokens):  # type: ignore[no-untyped-def]
    with pytest.raises(sandlot.InvalidSpecError) as e:
        await AsyncSandbox.create(client=aacme, memory="1K")
    assert e.value.field == "resources.memory" and e.value.request_id
    with pytest.raises(sandlot.NotFoundError):
        await AsyncSandbox.connect("nope", client=aacme)
    async with sandlot.AsyncClient(daemon.tcp_url, "sl_wrong") as bad:
        with pytest.raises(sandlot.AuthError):
            await AsyncSandbox.list(client=bad)
    async with await AsyncSandbox.create(client=aacme) as sb:
        with pytest.raises(sandlot.SpawnError):
            await sb.exec("/nonexistent")
        async with sandlot.AsyncClient(daemon.tcp_url, tokens["other"]) as other:
            with pytest.raises(sandlot.NotFoundError):
                await AsyncSandbox.connect(sb.id, client=other)
            with pytest.raises(sandlot.NotFoundError):
                await AsyncSandbox(sb.info, other).files.read("/etc/hostname")


async def test_async_files(aacme, tmp_path):  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme) as sb:
        f = sb.files
        assert await f.write("/tmp/x/a.txt", "héllo") == len("héllo".encode())
        assert await f.read_text("/tmp/x/a.txt") == "héllo"
        assert await f.read("/tmp/x/a.txt", offset=0, length=1) == b"h"
        assert await f.exists("/tmp/x/a.txt") and not await f.exists("/tmp/x/b.txt")
        await f.mkdir("/tmp/y")
        await f.rename("/tmp/x/a.txt", "/tmp/y/b.txt")
        assert [e.name for e in await f.list("/tmp/y")] == ["b.txt"]
        st = await f.stat("/tmp/y/b.txt")
        assert st.is_file and st.size == 6

        async def gen():  # type: ignore[no-untyped-def]
            for i in range(5):
                yield bytes([65 + i]) * 100_000

        await f.write("/tmp/gen.bin", gen())
        assert (await f.stat("/tmp/gen.bin")).size == 500_000
        src = tmp_path / "d"
        (src / "s").mkdir(parents=True)
        (src / "s" / "f.txt").write_text("content")
        r = await f.upload_dir(src, "/srv/d")
        assert r.files == 1
        names = await f.download_dir("/srv/d", tmp_path / "back")
        assert any(n.endswith("s/f.txt") for n in names)
        assert (tmp_path / "back" / "s" / "f.txt").read_text() == "content"
        await f.remove("/tmp/y", recursive=True)
        with pytest.raises(sandlot.NotFoundError):
            await f.stat("/tmp/y")
        async with await f.watch("/tmp", recursive=True) as w:
            await f.write("/tmp/watched.txt", b"1")
            ev = await asyncio.wait_for(_first_matching(w, "/tmp/watched.txt"), 15)
            assert ev.kind in ("create", "modify", "rename")
        info = await sb.set_timeout("5m")
        assert info.state == "running"
        assert (await sb.usage()).file_bytes_in > 0
        now = await sb.metrics()  # at least the sample taken now
        assert now and now[-1].memory_bytes > 0 and now[-1].cpu_seconds > 0


async def _first_matching(w, path):  # type: ignore[no-untyped-def]
    async for ev in w:
        if ev.path == path:
            return ev
    raise AssertionError("watch ended")


async def test_async_default_client_from_env(daemon, tokens, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SANDLOT_URL", daemon.tcp_url)
    monkeypatch.setenv("SANDLOT_TOKEN", tokens["acme"])
    sandlot.configure()
    try:
        async with await AsyncSandbox.create() as sb:
            assert sb.info.tenant == "acme"
            assert (await sb.run("echo ok")).stdout == "ok\n"
    finally:
        await sandlot.default_async_client().aclose()
        sandlot.configure()


async def test_async_snapshot_starts_new_sandboxes_as_returned(aacme):  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme) as sb:
        await sb.run("echo kept > /home/user/f", check=True)
        snap = await sb.snapshot_filesystem()
    async with await AsyncSandbox.create(image=snap, client=aacme) as restored:
        assert (await restored.run("cat /home/user/f")).stdout == "kept\n"
