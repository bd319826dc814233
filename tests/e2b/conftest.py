"""End-to-end tests of Sandlot's E2B compatibility: the official `e2b` package
(installed from PyPI by scripts/setup.d/60-e2b.sh, never vendored or patched)
against a real `sandlot serve` started here with its own data directory,
socket, ports and id prefix. Needs root (sandboxes need namespaces and cgroups).

Run: bash tests/e2b/run.sh   (SANDLOT_BIN picks the binary; default
$CARGO_TARGET_DIR/debug/sandlot, else target/debug/sandlot).
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sandlot_daemon import Daemon, daemon_fixture, require_root_and_binary  # noqa: E402

# Operator configuration: a tenant with a quota of one sandbox, and a second E2B
# template next to the built-in `base`.
CONFIG = (
    "[tenants.e2b-q]\nmax_sandboxes = 1\n"
    "[e2b]\ndomain = \"sandlot.test\"\n"
    "[e2b.templates.rooty]\nimage = \"host\"\nuser = \"root\"\nenv = { FROM_TEMPLATE = \"yes\" }\n"
    # Template builds: a small limit for the upload attacks to reach, and small
    # step sandboxes.
    "[images]\nmax_expanded_size = \"64M\"\nbuild_memory = \"512M\"\n"
    # The same tests on either backend: $SANDLOT_TEST_ISOLATION is namespace (the
    # default) or gvisor.
    f"[isolation]\ndefault = \"{os.environ.get('SANDLOT_TEST_ISOLATION', 'namespace')}\"\n"
)


class Server(Daemon):
    """A `sandlot serve` with the E2B front door and this suite's configuration."""

    def __init__(self, tmp: Path):
        super().__init__(tmp, "e2bt", config=CONFIG, e2b=True)


@pytest.fixture(scope="session")
def server():
    why = require_root_and_binary("the E2B compatibility tests")
    if why:
        pytest.fail(why)
    for srv in daemon_fixture(Server, "e2b"):
        srv.key = srv.token("e2b-a")
        srv.key_b = srv.token("e2b-b")
        srv.key_q = srv.token("e2b-q")
        os.environ["E2B_API_URL"] = srv.url
        os.environ["E2B_SANDBOX_URL"] = srv.url
        os.environ["E2B_API_KEY"] = srv.key
        os.environ.pop("E2B_DEBUG", None)
        yield srv


@pytest.fixture
def sbx(server):
    from e2b import Sandbox

    sb = Sandbox.create(timeout=120)
    try:
        yield sb
    finally:
        sb.kill()
