"""Snapshots end to end, sync and async, on the suite's backend
(``SANDLOT_TEST_ISOLATION``): a snapshot outlives its sandbox, sandboxes start
from it (continuing its processes on gVisor), deleting it is final; another
tenant sees none of it."""

from __future__ import annotations

import os

import pytest

import sandlot
from sandlot import AsyncSandbox, Sandbox

GVISOR = os.environ.get("SANDLOT_TEST_ISOLATION", "namespace") == "gvisor"

LOOP = "sh -c 'n=41; while :; do sleep 1; done; echo $n'"


def test_a_snapshot_outlives_its_sandbox_and_seeds_new_ones(acme):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme) as sb:
        sb.files.write("/root/note", "kept\n")
        sb.exec("sh", "-c", LOOP, background=True)
        snap = sb.create_snapshot("seed")
        assert snap.name == "seed" and snap.memory == GVISOR, snap
    assert [s.id for s in Sandbox.list_snapshots(name="seed", client=acme)] == [snap.id]
    try:
        with Sandbox.from_snapshot(snap, timeout=60, client=acme) as new:
            assert new.files.read_text("/root/note") == "kept\n"
            found = new.run("pgrep -f 'n=4[1]' || true").stdout.strip()
            assert bool(found) == GVISOR, found
    finally:
        Sandbox.delete_snapshot(snap, client=acme)
    with pytest.raises(sandlot.NotFoundError):
        Sandbox.delete_snapshot(snap, client=acme)
    with pytest.raises(sandlot.NotFoundError):
        Sandbox.from_snapshot(snap.id, client=acme)


def test_another_tenants_snapshots_are_not_found(acme, other):  # type: ignore[no-untyped-def]
    with Sandbox.create(client=acme) as sb:
        snap = sb.create_snapshot()
        try:
            assert Sandbox.list_snapshots(client=other) == []
            with pytest.raises(sandlot.NotFoundError):
                Sandbox.from_snapshot(snap, client=other)
            with pytest.raises(sandlot.NotFoundError):
                Sandbox.delete_snapshot(snap, client=other)
            with pytest.raises(sandlot.NotFoundError):
                Sandbox(sb.info, other).create_snapshot()
        finally:
            Sandbox.delete_snapshot(snap, client=acme)


async def test_async_snapshot_start_and_delete(aacme):  # type: ignore[no-untyped-def]
    async with await AsyncSandbox.create(client=aacme) as sb:
        await sb.files.write("/root/note", "async\n")
        snap = await sb.create_snapshot()
    listed = await AsyncSandbox.list_snapshots(sandbox_id=snap.sandbox_id, client=aacme)
    assert [s.id for s in listed] == [snap.id]
    try:
        async with await AsyncSandbox.from_snapshot(snap, client=aacme) as new:
            assert await new.files.read_text("/root/note") == "async\n"
    finally:
        await AsyncSandbox.delete_snapshot(snap, client=aacme)
    assert await AsyncSandbox.list_snapshots(client=aacme) == []
