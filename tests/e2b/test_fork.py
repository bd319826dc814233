"""E2B's fork (`sb.fork(count)`, `Sandbox.fork(id)`) over Sandlot's fork: new
sandboxes of the caller's tenant that continue from the sandbox's files (and, on
gVisor, its processes and memory), each with its own files from then on."""

import datetime
import os

import pytest
from e2b import Sandbox, SandboxNotFoundException

GVISOR = os.environ.get("SANDLOT_TEST_ISOLATION") == "gvisor"


def test_forks_continue_from_the_sandbox_and_then_go_apart(server):
    sb = Sandbox.create(timeout=120)
    forks = []
    try:
        sb.files.write("/tmp/state.txt", "before")
        # A process whose memory holds a value that is not on disk.
        sb.commands.run("sh -c 'n=41; while :; do sleep 1; done; echo $n' >/dev/null 2>&1 &")
        forks = sb.fork(count=2, timeout=60)
        assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
        ids = {f.sandbox_id for f in forks}
        assert len(ids) == 2 and sb.sandbox_id not in ids
        for f in forks:
            assert f.files.read("/tmp/state.txt") == "before"
            # Its lifetime is the fork's timeout.
            info = Sandbox.get_info(f.sandbox_id)
            lifetime = (info.end_at - datetime.datetime.now(tz=info.end_at.tzinfo)).total_seconds()
            assert 20 < lifetime <= 61, lifetime
        # Writes in one are seen neither by its sibling nor by the parent.
        forks[0].files.write("/tmp/state.txt", "fork 0")
        assert forks[1].files.read("/tmp/state.txt") == "before"
        assert sb.files.read("/tmp/state.txt") == "before"
        loops = [f.commands.run("pgrep -f 'n=4[1]' || true").stdout.strip() for f in forks]
        if GVISOR:
            # The loop came along, at the same process id, in each fork.
            parent = sb.commands.run("pgrep -f 'n=4[1]'").stdout.strip()
            assert loops == [parent, parent], (parent, loops)
        else:
            # The namespace backend forks files only: processes start afresh.
            assert loops == ["", ""], loops
    finally:
        for f in forks:
            if isinstance(f, Sandbox):
                f.kill()
        sb.kill()


def test_another_tenants_or_a_killed_sandbox_is_not_found_and_bad_counts_are_refused(server):
    sb = Sandbox.create(timeout=60)
    try:
        with pytest.raises(SandboxNotFoundException):
            Sandbox.fork(sb.sandbox_id, api_key=server.key_b)
        with pytest.raises(Exception, match="count"):
            sb.fork(count=0)
        with pytest.raises(Exception, match="timeout"):
            sb.fork(timeout=10 ** 9)
    finally:
        sb.kill()
    # A killed sandbox is not found either.
    with pytest.raises(SandboxNotFoundException):
        sb.fork()
