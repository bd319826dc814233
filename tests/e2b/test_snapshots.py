"""E2B's snapshots (`sb.create_snapshot()`, `Sandbox.list_snapshots()`,
`Sandbox.delete_snapshot()`, `Sandbox.create(snapshot_id)`) over Sandlot's
snapshots: the tenant's, kept after the sandbox is killed and across a daemon
restart; a sandbox created from one continues its processes on gVisor and
starts afresh on its files on the namespace backend."""

import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxException, SandboxNotFoundException

from conftest import Server

GVISOR = os.environ.get("SANDLOT_TEST_ISOLATION") == "gvisor"


def test_a_snapshot_outlives_its_killed_sandbox_and_seeds_new_ones(server):
    sb = Sandbox.create(timeout=120)
    made = []
    snap = None
    try:
        sb.files.write("/tmp/state.txt", "at snapshot")
        sb.commands.run("sh -c 'n=41; while :; do sleep 1; done; echo $n' >/dev/null 2>&1 &")
        loop = sb.commands.run("pgrep -f 'n=4[1]'").stdout.strip()
        snap = sb.create_snapshot(name="seed")
        assert snap.snapshot_id and snap.names == ["seed"], snap
        sb.files.write("/tmp/state.txt", "after snapshot")
        assert sb.kill() is True
        # Created by id and by name, after the sandbox is gone.
        for template in (snap.snapshot_id, "seed"):
            new = Sandbox.create(template, timeout=60)
            made.append(new)
            assert new.files.read("/tmp/state.txt") == "at snapshot"
            found = new.commands.run("pgrep -f 'n=4[1]' || true").stdout.strip()
            # gVisor continues the processes (same pid); namespace starts afresh.
            assert found == (loop if GVISOR else ""), (loop, found)
        made[0].files.write("/tmp/state.txt", "mine")
        assert made[1].files.read("/tmp/state.txt") == "at snapshot"
        listed = Sandbox.list_snapshots(sandbox_id=sb.sandbox_id).next_items()
        assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
    finally:
        for m in made:
            m.kill()
        if snap is not None:
            Sandbox.delete_snapshot(snap.snapshot_id)
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    with pytest.raises(Exception):
        Sandbox.create(snap.snapshot_id, timeout=30)


def test_another_tenants_snapshot_is_not_found(server):
    sb = Sandbox.create(timeout=60)
    try:
        snap = sb.create_snapshot()
        try:
            assert Sandbox.delete_snapshot(snap.snapshot_id, api_key=server.key_b) is False
            assert Sandbox.list_snapshots(api_key=server.key_b).next_items() == []
            with pytest.raises(Exception):
                Sandbox.create(snap.snapshot_id, api_key=server.key_b, timeout=30)
            with pytest.raises(SandboxNotFoundException):
                Sandbox.create_snapshot(sb.sandbox_id, api_key=server.key_b)
        finally:
            assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    finally:
        sb.kill()


def test_options_a_snapshot_cannot_honour_are_refused_by_name(server):
    sb = Sandbox.create(timeout=60)
    try:
        snap = sb.create_snapshot()
        try:
            with pytest.raises(SandboxException, match="envVars"):
                Sandbox.create(snap.snapshot_id, envs={"A": "1"}, timeout=30)
            # A narrower network than the snapshot's is refused, never dropped.
            with pytest.raises(SandboxException, match="network"):
                Sandbox.create(snap.snapshot_id, allow_internet_access=False, timeout=30)
            assert [s.sandbox_id for s in Sandbox.list().next_items()] == [sb.sandbox_id]
            if GVISOR:
                with pytest.raises(SandboxException, match="memory"):
                    sb.create_snapshot(mode="filesystem")
        finally:
            Sandbox.delete_snapshot(snap.snapshot_id)
    finally:
        sb.kill()


def test_a_snapshot_name_never_shadows_a_template(server):
    """A snapshot named after a template the key built: a create and a delete by
    that name reach the template, the snapshot only by its id."""
    from e2b import Template

    name = f"tpl-{secrets.token_hex(3)}"
    Template.build(Template().from_base_image().run_cmd("echo built > /tmp/from-template"), name)
    sb = Sandbox.create(timeout=60)
    try:
        sb.files.write("/tmp/from-snapshot", "snap")
        snap = sb.create_snapshot(name=name)
        try:
            fresh = Sandbox.create(name, timeout=30)
            try:
                assert fresh.files.read("/tmp/from-template") == "built\n"
                assert not fresh.files.exists("/tmp/from-snapshot")
            finally:
                fresh.kill()
            # The template, not the snapshot.
            assert Sandbox.delete_snapshot(name)
            assert not Template.exists(name)
            assert snap.snapshot_id in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
        finally:
            Sandbox.delete_snapshot(snap.snapshot_id)
    finally:
        sb.kill()


def test_a_snapshot_survives_a_daemon_restart(server):
    tmp = Path(tempfile.mkdtemp(prefix="sandlot-e2b-snap-"))
    srv = Server(tmp)
    srv.start()
    key = srv.token("e2b-s")
    opts = {"api_key": key, "api_url": srv.url, "sandbox_url": srv.url}
    try:
        sb = Sandbox.create(timeout=60, **opts)
        sb.files.write("/tmp/kept.txt", "kept")
        snap = sb.create_snapshot(**opts)
        assert sb.kill() is True
        srv.stop(delete_sandboxes=False)
        srv.start()
        new = Sandbox.create(snap.snapshot_id, timeout=60, **opts)
        assert new.files.read("/tmp/kept.txt") == "kept"
        assert new.kill() is True
        assert Sandbox.delete_snapshot(snap.snapshot_id, **opts) is True
    finally:
        srv.stop()
        leftovers = srv.leftovers()
        shutil.rmtree(tmp, ignore_errors=True)
        assert not leftovers, leftovers
