"""The async client: AsyncSandbox over the same endpoints (streams, watch)."""

import asyncio

import pytest
from e2b import AsyncSandbox, CommandExitException, FilesystemEventType


@pytest.mark.asyncio
async def test_async_sandbox_commands_and_files(server):
    sb = await AsyncSandbox.create(metadata={"client": "async"}, envs={"X": "y"}, timeout=60)
    try:
        r = await sb.commands.run("echo $X; id -un")
        assert r.stdout == "y\nuser\n"
        with pytest.raises(CommandExitException):
            await sb.commands.run("exit 2")
        out = []
        h = await sb.commands.run("cat", background=True, stdin=True, on_stdout=out.append)
        await sb.commands.send_stdin(h.pid, "async in\n")
        await sb.commands.close_stdin(h.pid)
        r = await h.wait()
        assert r.stdout == "async in\n" and "".join(out) == "async in\n"
        await sb.files.write("/tmp/a/b.txt", "async file")
        assert await sb.files.read("/tmp/a/b.txt") == "async file"
        assert [e.name for e in await sb.files.list("/tmp/a")] == ["b.txt"]
        infos = await (AsyncSandbox.list()).next_items()
        assert sb.sandbox_id in {i.sandbox_id for i in infos}
        await sb.set_timeout(100)
        assert (await sb.get_info()).metadata == {"client": "async"}
    finally:
        assert await sb.kill() is True
    assert not await sb.is_running()


@pytest.mark.asyncio
async def test_async_watch_dir_streams_events(server):
    sb = await AsyncSandbox.create(timeout=60)
    try:
        await sb.files.make_dir("/tmp/aw")
        events = []
        got = asyncio.Event()

        def on_event(e):
            events.append((e.name, e.type))
            if e.name == "f.txt" and e.type == FilesystemEventType.WRITE:
                got.set()

        h = await sb.files.watch_dir("/tmp/aw", on_event=on_event, recursive=True)
        await sb.files.write("/tmp/aw/f.txt", "1")
        try:
            await asyncio.wait_for(got.wait(), 5)
        except asyncio.TimeoutError:
            raise AssertionError(f"no WRITE event of f.txt within 5s; events: {events}")
        await h.stop()
        assert ("f.txt", FilesystemEventType.CREATE) in events
        # The upload's temporary file never shows.
        assert all(name == "f.txt" for name, _ in events), events
    finally:
        await sb.kill()


@pytest.mark.asyncio
async def test_async_pty(server):
    sb = await AsyncSandbox.create(timeout=60)
    try:
        from e2b import PtySize

        chunks = []
        h = await sb.pty.create(PtySize(rows=20, cols=60), on_data=chunks.append)
        await sb.pty.resize(h.pid, PtySize(rows=21, cols=61))
        await sb.pty.send_stdin(h.pid, b"stty size; exit\n")
        await h.wait()
        assert "21 61" in b"".join(chunks).decode(errors="replace")
    finally:
        await sb.kill()
