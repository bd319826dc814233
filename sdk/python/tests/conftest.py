"""End-to-end fixtures: one real ``sandlot serve`` per test session, on its own
temporary data directory, Unix socket, loopback TCP port and sandbox id prefix
(so it never touches anyone else's sandboxes), with tokens made by
``sandlot token create`` through the daemon. At the end every sandbox is deleted, the daemon is
stopped, and the session fails if any run directory or cgroup of its prefix is
left on the host.

The binary: ``$SANDLOT_BIN``, else ``target/debug/sandlot`` of the repository."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List

import pytest

import sandlot

REPO = Path(__file__).resolve().parents[3]


def pytest_configure(config: pytest.Config) -> None:
    # A SIGTERM (a CI timeout, `timeout pytest`) runs the teardown like ^C does, so
    # the daemon's sandboxes are deleted instead of outliving the run.
    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)


def sandlot_bin() -> str:
    b = os.environ.get("SANDLOT_BIN") or str(REPO / "target" / "debug" / "sandlot")
    if not os.access(b, os.X_OK):
        pytest.exit(
            f"sandlot binary {b} not found: run `cargo build -p sandlot` or set SANDLOT_BIN", returncode=2
        )
    return b


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIG = """
[limits]
default_timeout = "2m"
max_timeout = "1h"
[tenants.tiny]
max_sandboxes = 1
max_memory = "1G"
"""


def isolation_config() -> str:
    """``[isolation] default`` from ``$SANDLOT_TEST_ISOLATION`` (``namespace``, the
    default, or ``gvisor``): the same tests on either backend."""
    iso = os.environ.get("SANDLOT_TEST_ISOLATION", "namespace")
    if iso not in ("namespace", "gvisor"):
        pytest.exit(f"SANDLOT_TEST_ISOLATION={iso!r}: use namespace or gvisor", returncode=2)
    return f'[isolation]\ndefault = "{iso}"\n'


@dataclass
class Daemon:
    bin: str
    dir: Path
    socket: Path
    port: int
    prefix: str
    proc: "subprocess.Popen[bytes]"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def tcp_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    def log(self) -> str:
        try:
            return (self.dir / "daemon.log").read_text(errors="replace")
        except OSError:
            return ""

    def token(self, tenant: str) -> str:
        o = subprocess.run(
            [self.bin, "token", "create", "--tenant", tenant],
            env={**os.environ, "SANDLOT_URL": self.unix_url, "SANDLOT_TOKEN": ""},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert o.returncode == 0, o.stderr
        return o.stdout.strip()

    def leftovers(self) -> List[str]:
        """Run directories (gVisor's too) and cgroups of this daemon's sandboxes
        still on the host."""
        pats = [
            f"/run/sandlot/sandboxes/{self.prefix}*",
            f"/sys/fs/cgroup/sandlot/{self.prefix}*",
            f"/sys/fs/cgroup/*/sandlot/{self.prefix}*",
            f"/run/sandlot/gvisor/{self.prefix}*",
        ]
        return sorted(p for pat in pats for p in glob.glob(pat))

    def run_dir_exists(self, sandbox_id: str) -> bool:
        return any(os.path.exists(f"/run/sandlot/{d}/{sandbox_id}") for d in ("sandboxes", "gvisor"))

    def run_dir_gone(self, sandbox_id: str, timeout: float = 10.0) -> bool:
        """Whether the sandbox's run directory is gone within `timeout`: the host
        clean-up runs right after the sandbox is recorded stopped, off the request."""
        deadline = time.monotonic() + timeout
        while self.run_dir_exists(sandbox_id) and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self.run_dir_exists(sandbox_id)


def _start() -> Daemon:
    if os.geteuid() != 0:
        pytest.exit(
            "the SDK's end-to-end tests start a real daemon, which creates namespaces, cgroups and mounts: run as root (CI does)",
            returncode=2,
        )
    b = sandlot_bin()
    d = Path(tempfile.mkdtemp(prefix="sandlot-sdk-test-"))
    (d / "sandlot.toml").write_text(CONFIG + isolation_config())
    prefix = f"py{os.getpid()}-"
    port = free_port()
    sock = d / "api.sock"
    log = open(d / "daemon.log", "ab")
    proc = subprocess.Popen(
        [
            b,
            "serve",
            "--data-dir",
            str(d / "data"),
            "--socket",
            str(sock),
            "--listen",
            f"127.0.0.1:{port}",
            "--id-prefix",
            prefix,
            "--config",
            str(d / "sandlot.toml"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "SANDLOT_LOG": "info"},
        # Its own session: a signal to the test's process group (^C, `timeout`)
        # must not stop it before the teardown has deleted its sandboxes.
        start_new_session=True,
    )
    log.close()
    daemon = Daemon(bin=b, dir=d, socket=sock, port=port, prefix=prefix, proc=proc)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            pytest.exit(f"sandlot serve exited with {proc.returncode}; log:\n{daemon.log()}", returncode=3)
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(sock))
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
            return daemon
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.exit(f"the daemon did not start; log:\n{daemon.log()}", returncode=3)
            time.sleep(0.02)


def _stop(d: Daemon) -> List[str]:
    if d.proc.poll() is None:
        with sandlot.Client(d.unix_url) as op:
            for sb in sandlot.Sandbox.list(client=op, state="live"):
                try:
                    sb.terminate()
                except sandlot.SandlotError:
                    pass
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
    deadline = time.monotonic() + 10
    while d.leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    return d.leftovers()


# Tests that failed in this session: the daemon's log is printed at its end then,
# so that a failure (a 500 names only its request id) can be read in CI's output.
_FAILED: "list[str]" = []
# The daemon's log after a failing session, kept on disk and printed last.
_DAEMON_LOG: "list[str]" = []


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    for text in _DAEMON_LOG:
        terminalreporter.write_sep("-", "daemon log")
        terminalreporter.write_line(text)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _FAILED.append(report.nodeid)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    d = _start()
    failed = False
    try:
        yield d
    except BaseException:
        failed = True
        raise
    finally:
        left = _stop(d)
        if left or failed or _FAILED:
            # Shown in the terminal summary: a session fixture's teardown output
            # is captured (and dropped) by pytest.
            _DAEMON_LOG.append(f"{d.dir / 'daemon.log'} (failed: {_FAILED})\n{d.log()[-30000:]}")
        else:
            shutil.rmtree(d.dir, ignore_errors=True)
        assert not left, f"leftovers of this test session's sandboxes on the host: {left}"


@pytest.fixture(scope="session")
def tokens(daemon: Daemon) -> "dict[str, str]":
    return {t: daemon.token(t) for t in ("acme", "other", "tiny")}


@pytest.fixture(scope="session")
def operator(daemon: Daemon) -> Iterator[sandlot.Client]:
    """The operator: the Unix socket, no token."""
    with sandlot.Client(daemon.unix_url, token="") as c:
        yield c


@pytest.fixture(scope="session")
def acme(daemon: Daemon, tokens: "dict[str, str]") -> Iterator[sandlot.Client]:
    """Tenant acme over TCP with its bearer token."""
    with sandlot.Client(daemon.tcp_url, tokens["acme"]) as c:
        yield c


@pytest.fixture(scope="session")
def other(daemon: Daemon, tokens: "dict[str, str]") -> Iterator[sandlot.Client]:
    """Another tenant over TCP."""
    with sandlot.Client(daemon.tcp_url, tokens["other"]) as c:
        yield c


@pytest.fixture
def sb(acme: sandlot.Client) -> Iterator[sandlot.Sandbox]:
    """A fresh sandbox of tenant acme, terminated after the test."""
    with sandlot.Sandbox.create(client=acme, memory="256M", timeout=120, tags={"suite": "sdk"}) as s:
        yield s


@pytest.fixture
async def aacme(daemon: Daemon, tokens: "dict[str, str]"):  # type: ignore[no-untyped-def]
    """Tenant acme, async (one client per test: each test has its own event loop)."""
    async with sandlot.AsyncClient(daemon.tcp_url, tokens["acme"]) as c:
        yield c
