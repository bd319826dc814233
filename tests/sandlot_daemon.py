"""A real `sandlot serve` for the Python end-to-end suites (E2B, MCP, console):
its own data directory, operator socket, TCP ports and sandbox id prefix, so a
run never touches the machine's daemon. Standard library only: every suite's
venv can import it (`sys.path` gets `tests/`).
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Where both backends keep their per-sandbox state: what a test run must not leave.
SANDBOX_DIRS = ("/run/sandlot/sandboxes", "/run/sandlot/gvisor")


def sandlot_bin() -> str:
    b = os.environ.get("SANDLOT_BIN")
    if b:
        return b
    target = os.environ.get("CARGO_TARGET_DIR") or str(ROOT / "target")
    return str(Path(target) / "debug" / "sandlot")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def require_root_and_binary(what: str) -> str | None:
    """Why `what` cannot run here, or None: callers fail the test with it (never skip)."""
    if os.geteuid() != 0:
        return f"{what} needs root (sandboxes use namespaces and cgroups): run as root"
    if not Path(sandlot_bin()).exists():
        return f"no sandlot binary at {sandlot_bin()}: build it (cargo build -p sandlot) or set SANDLOT_BIN"
    return None


class Daemon:
    """A `sandlot serve` with the native API on TCP (`api_url`) and, with `e2b`,
    the E2B front door (`url`). `config` is the operator's TOML."""

    def __init__(self, tmp: Path, prefix: str, config: str = "", e2b: bool = False):
        self.tmp = tmp
        self.data_dir = tmp / "data"
        self.socket = tmp / "sandlot.sock"
        self.prefix = f"{prefix}{secrets.token_hex(2)}-"
        self.api_port = free_port()
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.e2b_port = free_port() if e2b else None
        self.url = f"http://127.0.0.1:{self.e2b_port}" if e2b else self.api_url
        self.config = config
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "serve.log"
        self.data_dir.mkdir(mode=0o700, exist_ok=True)

    def operator(self, *args: str) -> str:
        """A CLI command on the operator socket; its standard output."""
        return subprocess.run(
            [sandlot_bin(), *args],
            env={**os.environ, "SANDLOT_URL": f"unix://{self.socket}", "SANDLOT_TOKEN": ""},
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def token(self, tenant: str) -> str:
        return json.loads(self.operator("token", "create", "--tenant", tenant, "--json"))["token"]

    def native(self, method: str, path: str, token: str, body=None):
        """A call to Sandlot's own API over TCP (bearer token); the JSON answer."""
        req = urllib.request.Request(
            self.api_url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"null")

    def start(self):
        config = self.tmp / "sandlot.toml"
        config.write_text(self.config)
        cmd = [
            sandlot_bin(), "serve",
            "--config", str(config),
            "--data-dir", str(self.data_dir),
            "--socket", str(self.socket),
            "--id-prefix", self.prefix,
            "--listen", f"127.0.0.1:{self.api_port}",
        ]
        if self.e2b_port is not None:
            cmd += ["--e2b-listen", f"127.0.0.1:{self.e2b_port}"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
        wait_port = self.e2b_port if self.e2b_port is not None else self.api_port
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandlot serve exited {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", wait_port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sandlot serve did not listen in 20 s:\n{self.log.read_text()}")

    def delete_sandboxes(self):
        """Deletes every tenant's sandboxes (the operator socket sees them all):
        sandboxes outlive the daemon by design."""
        for sid in self.operator("ls", "--quiet").split():
            self.operator("rm", sid)

    def stop(self, delete_sandboxes: bool = True):
        """Stops the daemon; first deletes every sandbox unless told to keep them
        (a restart test keeps them for the next daemon)."""
        if delete_sandboxes and self.proc and self.proc.poll() is None:
            try:
                self.delete_sandboxes()
            except subprocess.CalledProcessError as e:  # reported by `leftovers`
                print(f"deleting sandboxes on the operator socket failed: {e.stderr}")
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def leftovers(self) -> list[str]:
        """Sandboxes of this daemon still on the machine."""
        return [p.name for d in SANDBOX_DIRS for p in Path(d).glob(self.prefix + "*")]


def daemon_fixture(make, suite: str):
    """Generator body for a pytest fixture: the daemon `make(tmp)` builds, started,
    then stopped and checked for leftovers."""
    tmp = Path(tempfile.mkdtemp(prefix=f"sandlot-{suite}-test-"))
    d = make(tmp)
    try:
        d.start()
        yield d
    finally:
        d.stop()
        left = d.leftovers()
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"sandboxes left behind: {left}"
