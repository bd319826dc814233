"""commands.* and pty.* through envd's process service."""

import time

import pytest
from e2b import CommandExitException, PtySize, TimeoutException


def test_run_output_exit_code_and_callbacks(sbx):
    out, err = [], []
    r = sbx.commands.run("echo out; echo err >&2; printf 'a\\nb\\n'", on_stdout=out.append, on_stderr=err.append)
    assert r.exit_code == 0
    assert r.stdout == "out\na\nb\n"
    assert r.stderr == "err\n"
    assert "".join(out) == r.stdout and "".join(err) == r.stderr
    assert r.error is None


def test_nonzero_exit_raises_command_exit_exception(sbx):
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run("echo partial; echo bad >&2; exit 7")
    assert e.value.exit_code == 7
    assert e.value.stdout == "partial\n"
    assert e.value.stderr == "bad\n"
    assert "exit status 7" in e.value.error


def test_envs_cwd_and_users(sbx):
    assert sbx.commands.run("id -un; pwd; echo $HOME").stdout == "user\n/home/user\n/home/user\n"
    assert sbx.commands.run("id -un", user="root").stdout == "root\n"
    assert sbx.commands.run("echo $A-$B", envs={"A": "1", "B": "two"}).stdout == "1-two\n"
    sbx.files.make_dir("/tmp/work")
    assert sbx.commands.run("pwd", cwd="/tmp/work").stdout == "/tmp/work\n"
    # The default user may write its home but not root's.
    with pytest.raises(CommandExitException):
        sbx.commands.run("touch /root/nope")
    sbx.commands.run("touch /root/yes", user="root")


def test_background_list_and_wait(sbx):
    h = sbx.commands.run("sleep 0.5; echo done", background=True)
    assert h.pid > 0
    listed = sbx.commands.list()
    mine = [p for p in listed if p.pid == h.pid]
    assert len(mine) == 1
    assert mine[0].cmd == "/bin/bash" and mine[0].args[-1] == "sleep 0.5; echo done"
    r = h.wait()
    assert r.stdout == "done\n" and r.exit_code == 0
    deadline = time.monotonic() + 5
    while any(p.pid == h.pid for p in sbx.commands.list()):
        assert time.monotonic() < deadline, "a finished command is still listed"
        time.sleep(0.1)


def test_stdin(sbx):
    h = sbx.commands.run("cat; echo eof", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hello ")
    h.send_stdin(b"world\n")
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "hello world\neof\n"


def test_kill_and_connect(sbx):
    h = sbx.commands.run("sleep 30", background=True)
    assert sbx.commands.kill(h.pid) is True
    # kill answers once the process is gone (reaped): nothing is left to signal.
    with pytest.raises(CommandExitException):
        sbx.commands.run(f"kill -0 {h.pid}")
    with pytest.raises(CommandExitException) as e:
        h.wait()
    assert e.value.exit_code == -1
    assert "killed" in e.value.error
    assert sbx.commands.kill(h.pid) is False
    assert sbx.commands.kill(999999) is False

    h = sbx.commands.run("for i in 1 2 3; do echo tick $i; sleep 0.3; done", background=True)
    h.disconnect()
    again = sbx.commands.connect(h.pid)
    r = again.wait()
    assert "tick 3" in r.stdout


def test_command_timeout(sbx):
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 10", timeout=1)


def test_pty_create_input_resize(sbx):
    chunks = []
    h = sbx.pty.create(PtySize(rows=24, cols=80), envs={"PS1": "$ "})
    sbx.pty.send_stdin(h.pid, b"echo $((6*7))\n")
    sbx.pty.resize(h.pid, PtySize(rows=33, cols=101))
    sbx.pty.send_stdin(h.pid, b"stty size; exit 3\n")
    with pytest.raises(CommandExitException) as e:
        h.wait(on_pty=chunks.append)
    assert e.value.exit_code == 3
    out = b"".join(chunks).decode(errors="replace")
    assert "42" in out
    assert "33 101" in out


def test_stream_input(sbx):
    h = sbx.commands.run("wc -c", background=True, stdin=True)
    sbx.commands.stream_input(h.pid, (chunk for chunk in [b"abc", "def", b"\n" * 4]))
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout.strip() == "10"


def test_killed_sandbox_is_not_running(server):
    from e2b import Sandbox, SandboxNotRunningException

    sb = Sandbox.create(timeout=30)
    sb.kill()
    with pytest.raises(SandboxNotRunningException):
        sb.commands.run("true")
    with pytest.raises(SandboxNotRunningException):
        sb.files.read("/etc/hostname")


def test_a_command_of_a_killed_sandbox_ends_saying_so(server):
    from e2b import Sandbox, SandboxNotRunningException

    sb = Sandbox.create(timeout=30)
    cmd = sb.commands.run("sleep 60", background=True)
    sb.kill()
    with pytest.raises(SandboxNotRunningException, match="killed or reached its end of life"):
        cmd.wait()


def test_bad_cwd_and_unknown_user_are_errors_not_hangs(sbx):
    from e2b import InvalidArgumentException

    with pytest.raises(InvalidArgumentException):
        sbx.commands.run("pwd", cwd="/no/such/dir", timeout=10)
    with pytest.raises(InvalidArgumentException):
        sbx.commands.run("id", user="no-such-user", timeout=10)
    with pytest.raises(InvalidArgumentException):
        sbx.files.read("/etc/hostname", user="no-such-user")
