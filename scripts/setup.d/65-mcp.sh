#!/usr/bin/env bash
# Set-up for the MCP end-to-end test: a venv under tests/mcp/.venv (git-ignored)
# with the official Python MCP SDK (`mcp`) and pytest at pinned versions.
# Idempotent: does nothing when the pinned versions are there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/tests/mcp/.venv"
MCP_VERSION=2.3.0
PYTEST_VERSION=9.2.0

want="mcp==$MCP_VERSION pytest==$PYTEST_VERSION"
have() {
    "$venv/bin/python" - "$MCP_VERSION" "$PYTEST_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
want = dict(zip(["mcp", "pytest"], sys.argv[1:]))
sys.exit(0 if all(version(k) == v for k, v in want.items()) else 1)
PY
}
if [ -x "$venv/bin/python" ] && have; then
    echo "mcp set-up: $want present"
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check $want
have
echo "mcp set-up: installed $want in $venv"
