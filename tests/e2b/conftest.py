"""End-to-end tests of Sandlot's E2B compatibility: the official `e2b` package
(installed from PyPI by scripts/setup.d/60-e2b.sh, never vendored or patched)
against a real `sandlot serve` started here with its own data directory,
socket, ports and id prefix. Needs root (sandboxes need namespaces and cgroups).

Run: bash tests/e2b/run.sh   (SANDLOT_BIN picks the binary; default
$CARGO_TARGET_DIR/debug/sandlot, else target/debug/sandlot).
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

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


class Server:
    """A running `sandlot serve` and what the tests need to reach it."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.data_dir = tmp / "data"
        self.socket = tmp / "sandlot.sock"
        self.prefix = f"e2bt{secrets.token_hex(2)}-"
        self.e2b_port = free_port()
        self.api_port = free_port()
        self.url = f"http://127.0.0.1:{self.e2b_port}"
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.proc = None
        self.log = tmp / "serve.log"

    def token(self, tenant: str) -> str:
        out = subprocess.run(
            [sandlot_bin(), "token", "create", "--tenant", tenant, "--json"],
            env={**os.environ, "SANDLOT_URL": f"unix://{self.socket}", "SANDLOT_TOKEN": ""},
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return json.loads(out)["token"]

    def native(self, method: str, path: str, token: str, body=None):
        """A call to Sandlot's own API over TCP (bearer token)."""
        req = urllib.request.Request(
            self.api_url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"null")

    def start(self):
        # Operator configuration: a tenant with a quota of one sandbox, and a second
        # E2B template next to the built-in `base`.
        config = self.tmp / "sandlot.toml"
        config.write_text(
            "[tenants.e2b-q]\nmax_sandboxes = 1\n"
            "[e2b]\ndomain = \"sandlot.test\"\n"
            "[e2b.templates.rooty]\nimage = \"host\"\nuser = \"root\"\nenv = { FROM_TEMPLATE = \"yes\" }\n"
            # Template builds: a small limit for the upload attacks to reach, and
            # small step sandboxes.
            "[images]\nmax_expanded_size = \"64M\"\nbuild_memory = \"512M\"\n"
            # The same tests on either backend: $SANDLOT_TEST_ISOLATION is
            # namespace (the default) or gvisor.
            f"[isolation]\ndefault = \"{os.environ.get('SANDLOT_TEST_ISOLATION', 'namespace')}\"\n"
        )
        self.proc = subprocess.Popen(
            [
                sandlot_bin(), "serve",
                "--config", str(config),
                "--data-dir", str(self.data_dir),
                "--socket", str(self.socket),
                "--id-prefix", self.prefix,
                "--listen", f"127.0.0.1:{self.api_port}",
                "--e2b-listen", f"127.0.0.1:{self.e2b_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "w"),
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandlot serve exited {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.e2b_port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sandlot serve did not listen in 20s:\n{self.log.read_text()}")

    def stop(self, tokens):
        # Sandboxes outlive the daemon by design: delete every one first.
        for t in tokens:
            try:
                for sb in self.native("GET", "/v1/sandboxes", t)["sandboxes"]:
                    self.native("DELETE", f"/v1/sandboxes/{sb['id']}", t)
            except Exception as e:  # the daemon is gone: reported below
                print(f"cleanup through the API failed: {e}")
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def server():
    if os.geteuid() != 0:
        pytest.fail("the E2B compatibility tests need root (sandboxes use namespaces and cgroups): run as root")
    if not Path(sandlot_bin()).exists():
        pytest.fail(f"no sandlot binary at {sandlot_bin()}: build it (cargo build -p sandlot) or set SANDLOT_BIN")
    tmp = Path(tempfile.mkdtemp(prefix="sandlot-e2b-test-"))
    srv = Server(tmp)
    srv.data_dir.mkdir(mode=0o700)
    srv.start()
    srv.key = srv.token("e2b-a")
    srv.key_b = srv.token("e2b-b")
    srv.key_q = srv.token("e2b-q")
    os.environ["E2B_API_URL"] = srv.url
    os.environ["E2B_SANDBOX_URL"] = srv.url
    os.environ["E2B_API_KEY"] = srv.key
    os.environ.pop("E2B_DEBUG", None)
    try:
        yield srv
    finally:
        srv.stop([srv.key, srv.key_b, srv.key_q])
        leftovers = [
            p.name
            for d in ("/run/sandlot/sandboxes", "/run/sandlot/gvisor")
            for p in Path(d).glob(srv.prefix + "*")
        ]
        shutil.rmtree(tmp, ignore_errors=True)
        assert not leftovers, f"sandboxes left behind: {leftovers}"


@pytest.fixture
def sbx(server):
    from e2b import Sandbox

    sb = Sandbox.create(timeout=120)
    try:
        yield sb
    finally:
        sb.kill()
