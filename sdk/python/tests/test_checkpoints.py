"""Checkpoints and forks end to end, sync and async, on the suite's backend
(``SANDLOT_TEST_ISOLATION``): forks continue from the checkpoint's files (and on
gVisor its processes' memory) and go apart; a restore brings back the earlier
files; another tenant sees none of it."""

from __future__ import annotations

import os

import pytest

import sandlot
from sandlot import AsyncSandbox, Sandbox

GVISOR = os.environ.get("SANDLOT_TEST_ISOLATION", "namespace") == "gvisor"

# Counts in its memory into a file it keeps open, one number a tenth of a second.
COUNTER = "i=0; exec 3>>/root/count; while :; do i=$((i+1)); echo $i >&3; sleep 0.1; done"


def counted(sb: Sandbox) -> list[int]:
    return [int(n) for n in sb.files.read_text("/root/count").split()]


def test_forks_continue_from_the_checkpoint_and_go_apart(acme):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme) as sb:
        sb.files.write("/root/note", "before\n")
        sb.exec("sh", "-c", COUNTER, background=True)
        sb.run("sh -c 'while [ ! -s /root/count ]; do sleep 0.05; done'")
        cp = sb.checkpoint("start", leave_running=False)
        assert cp.name == "start" and cp.parent is None and cp.sandbox_state == "paused"
        assert cp.memory == GVISOR and cp.kind == ("memory" if GVISOR else "filesystem")
        assert [c.id for c in sb.checkpoints()] == [cp.id]
        forks = sb.fork(2, checkpoint=cp)
        try:
            assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks)
            assert len({f.id for f in forks} | {sb.id}) == 3
            for f in forks:
                assert f.files.read_text("/root/note") == "before\n"
                n = counted(f)
                f.run("sleep 0.5")
                m = counted(f)
                if GVISOR:
                    # The same counter goes on from where it was, never from 1 again.
                    assert len(m) > len(n) and m == list(range(1, len(m) + 1)), m[-5:]
                else:
                    # Files only: no process counts on.
                    assert m == n and n == list(range(1, len(n) + 1))
            forks[0].files.write("/root/who", "first")
            with pytest.raises(sandlot.NotFoundError):
                forks[1].files.read_text("/root/who")
            sb.delete_checkpoint(cp)
            assert sb.checkpoints() == []
        finally:
            for f in forks:
                f.terminate()


def test_restore_brings_back_the_earlier_files(acme):  # type: ignore[no-untyped-def]
    if GVISOR:
        pytest.skip("the gVisor restore in place is covered by crates/sandlot/tests/api_checkpoints.rs")
    with Sandbox.create(client=acme) as sb:
        sb.files.write("/root/f", "one")
        cp = sb.checkpoint()
        sb.files.write("/root/f", "two")
        later = sb.checkpoint()
        assert later.parent == cp.id
        diff = sb.diff_checkpoints(cp, later)
        assert diff["changed"] == ["/root/f"] and diff["added"] == [] and diff["removed"] == [], diff
        info = sb.restore(cp)
        assert info.state == "running"
        assert sb.files.read_text("/root/f") == "one"


def test_another_tenants_checkpoints_are_not_found(acme, other):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme) as sb:
        cp = sb.checkpoint()
        theirs = Sandbox(sb.info, other)
        with pytest.raises(sandlot.NotFoundError):
            theirs.checkpoints()
        with pytest.raises(sandlot.NotFoundError):
            theirs.fork(1, checkpoint=cp)
        with pytest.raises(sandlot.NotFoundError):
            theirs.delete_checkpoint(cp)


async def test_async_checkpoint_fork_and_delete(aacme):  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme) as sb:
        await sb.files.write("/root/a", "1")
        cp = await sb.checkpoint("a")
        assert [c.id for c in await sb.checkpoints()] == [cp.id]
        forks = await sb.fork(1, checkpoint=cp.id)
        try:
            assert isinstance(forks[0], AsyncSandbox)
            assert (await forks[0].files.read_text("/root/a")) == "1"
        finally:
            await forks[0].terminate()
        await sb.delete_checkpoint(cp.id)
        assert await sb.checkpoints() == []
