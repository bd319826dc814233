"""Pause and resume end to end, sync and async, on the suite's backend
(``SANDLOT_TEST_ISOLATION``): on gVisor a pause keeps memory (a counter held by
a running process goes on where it was); on the namespace backend it keeps files
only (the file stays, the process ends)."""

from __future__ import annotations

import os

import pytest

import sandlot
from sandlot import AsyncSandbox, Sandbox

GVISOR = os.environ.get("SANDLOT_TEST_ISOLATION", "namespace") == "gvisor"

# Counts in its memory, one number a tenth of a second, into a file it keeps open.
COUNTER = "i=0; exec 3>>/root/count; while :; do i=$((i+1)); echo $i >&3; sleep 0.1; done"


def counted(sb: Sandbox) -> list[int]:
    return [int(n) for n in sb.files.read_text("/root/count").split()]


def test_pause_keeps_what_the_backend_keeps_and_resume_brings_it_back(acme):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme) as sb:
        sb.files.write("/root/note", "kept\n")
        sb.exec("sh", "-c", COUNTER, background=True)
        sb.run("sh -c 'while [ ! -s /root/count ]; do sleep 0.05; done'")
        info = sb.pause()
        assert info.paused and sb.state == "paused"
        with pytest.raises(sandlot.InvalidStateError, match="paused"):
            sb.run("true")
        with pytest.raises(sandlot.InvalidStateError, match="paused"):
            sb.pause()
        back = Sandbox.resume(sb.id, client=acme)
        assert back.state == "running" and back.info.pause is None
        assert back.files.read_text("/root/note") == "kept\n"
        if GVISOR:
            # The memory was kept: the same process counts on from where it was,
            # never from 1 again.
            assert info.pause == "memory" and info.memory_kept
            n = counted(back)
            back.run("sleep 0.5")
            m = counted(back)
            assert len(m) > len(n) and m == list(range(1, len(m) + 1)), m[-5:]
        else:
            # Files only: the counter's process ended at the pause.
            assert info.pause == "filesystem" and not info.memory_kept
            n = counted(back)
            assert n == list(range(1, len(n) + 1))
            back.run("sleep 0.3")
            assert counted(back) == n
        with pytest.raises(sandlot.InvalidStateError, match="running"):
            Sandbox.resume(sb.id, client=acme)


def test_pause_of_a_terminated_sandbox_is_refused_naming_its_state(acme):  # type: ignore[no-untyped-def]
    sb = Sandbox.create(client=acme)
    sb.terminate()
    with pytest.raises(sandlot.InvalidStateError, match="stopped"):
        sb.pause()
    with pytest.raises(sandlot.ConflictError):
        Sandbox.resume(sb.id, client=acme)


def test_a_paused_sandbox_is_listed_and_can_be_terminated(acme):  # type: ignore[no-untyped-def]
    sb = Sandbox.create(client=acme, tags={"pause-list": "1"})
    sb.pause()
    listed = Sandbox.list(client=acme, tags={"pause-list": "1"})
    assert [(s.id, s.state) for s in listed] == [(sb.id, "paused")]
    assert [s.id for s in Sandbox.list(client=acme, state="paused", tags={"pause-list": "1"})] == [sb.id]
    gone = sb.terminate()
    assert (gone.state, gone.end_reason) == ("stopped", "deleted")


async def test_async_pause_and_resume(aacme):  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme) as sb:
        await sb.files.write("/root/a", "1")
        info = await sb.pause()
        assert info.state == "paused"
        assert info.pause == ("memory" if GVISOR else "filesystem")
        back = await AsyncSandbox.resume(sb.id, client=aacme)
        assert back.state == "running"
        assert (await back.files.read_text("/root/a")) == "1"
        with pytest.raises(sandlot.InvalidStateError):
            await AsyncSandbox.resume(sb.id, client=aacme)
