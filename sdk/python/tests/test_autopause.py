"""Auto-pause and resume on demand, sync and async, on the suite's backend
(``SANDLOT_TEST_ISOLATION``): a sandbox created with ``on_idle="pause"`` is
paused when idle instead of ended, and with ``auto_resume`` the next call
resumes it; without, the call raises ``InvalidStateError``."""

from __future__ import annotations

import asyncio
import time

import pytest

import sandlot
from sandlot import AsyncSandbox, Sandbox


def wait_paused(sb: Sandbox) -> None:
    deadline = time.monotonic() + 60
    while sb.refresh().state != "paused":
        assert time.monotonic() < deadline, f"{sb.id} was never auto-paused ({sb.state})"
        time.sleep(0.1)


def test_an_idle_sandbox_is_auto_paused_and_a_call_resumes_it(acme):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme, idle_timeout=1, on_idle="pause", auto_resume=True) as sb:
        assert (sb.info.on_idle, sb.info.on_timeout, sb.info.auto_resume) == ("pause", "kill", True)
        sb.files.write("/root/note", "kept\n")
        wait_paused(sb)
        assert sb.info.end_reason is None
        assert sb.files.read_text("/root/note") == "kept\n"
        assert sb.refresh().state == "running"


def test_without_auto_resume_an_auto_paused_sandbox_raises_invalid_state(acme):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme, idle_timeout=1, on_idle="pause") as sb:
        wait_paused(sb)
        with pytest.raises(sandlot.InvalidStateError, match="paused"):
            sb.run("true")
        back = Sandbox.resume(sb.id, client=acme)
        assert back.run("echo ok").stdout == "ok\n"


def test_a_bad_lifecycle_value_names_the_field(acme):  # type: ignore[no-untyped-def]
    with pytest.raises(sandlot.InvalidSpecError, match="on_timeout"):
        Sandbox.create(client=acme, on_timeout="hibernate")  # type: ignore[arg-type]
    with pytest.raises(sandlot.InvalidSpecError, match="idle_timeout"):
        Sandbox.create(client=acme, on_idle="pause")


async def test_async_auto_pause_on_idle_and_resume_on_call(aacme):  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme, idle_timeout=1, on_idle="pause", auto_resume=True) as sb:
        await sb.files.write("/root/a", "1")
        deadline = time.monotonic() + 60
        while (await sb.refresh()).state != "paused":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert (await sb.files.read_text("/root/a")) == "1"
        assert (await sb.refresh()).state == "running"
