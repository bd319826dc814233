"""E2B sandboxes, access tokens and processes survive a daemon restart."""

import os
import shutil
import tempfile
from pathlib import Path

from conftest import Server


def test_restart_keeps_sandboxes_tokens_and_processes(server):
    from e2b import Sandbox

    tmp = Path(tempfile.mkdtemp(prefix="sandlot-e2b-restart-"))
    srv = Server(tmp)
    srv.start()
    key = srv.token("e2b-r")
    opts = {"api_key": key, "api_url": srv.url, "sandbox_url": srv.url}
    try:
        sb = Sandbox.create(timeout=60, **opts)
        bg = sb.commands.run("sleep 20", background=True)
        sb.files.write("/tmp/kept.txt", "still here")
        srv.stop(delete_sandboxes=False)  # sandboxes outlive the daemon
        srv.start()
        # The handle from before the restart still works: same access token.
        assert sb.files.read("/tmp/kept.txt") == "still here"
        assert bg.pid in {p.pid for p in sb.commands.list()}
        again = Sandbox.connect(sb.sandbox_id, **opts)
        assert again.commands.run("echo after").stdout == "after\n"
        assert again.commands.kill(bg.pid) is True
        assert sb.kill() is True
    finally:
        srv.stop()
        leftovers = srv.leftovers()
        shutil.rmtree(tmp, ignore_errors=True)
        assert not leftovers, leftovers
    assert os.environ["E2B_API_URL"] == server.url
