#!/usr/bin/env bash
# Set-up for the E2B compatibility tests: a venv under tests/e2b/.venv
# (git-ignored) with the official e2b and e2b-code-interpreter SDKs at pinned
# versions, pytest and pytest-asyncio. Idempotent: does nothing when the pinned versions are there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/tests/e2b/.venv"
E2B_VERSION=2.63.0
E2B_CODE_INTERPRETER_VERSION=2.11.5
PYTEST_VERSION=9.2.0
PYTEST_ASYNCIO_VERSION=1.5.0

want="e2b==$E2B_VERSION e2b-code-interpreter==$E2B_CODE_INTERPRETER_VERSION pytest==$PYTEST_VERSION pytest-asyncio==$PYTEST_ASYNCIO_VERSION"
have() {
    "$venv/bin/python" - "$E2B_VERSION" "$E2B_CODE_INTERPRETER_VERSION" "$PYTEST_VERSION" "$PYTEST_ASYNCIO_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
want = dict(zip(["e2b", "e2b-code-interpreter", "pytest", "pytest-asyncio"], sys.argv[1:]))
sys.exit(0 if all(version(k) == v for k, v in want.items()) else 1)
PY
}
if [ -x "$venv/bin/python" ] && have; then
    echo "e2b set-up: $want present"
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check $want
have
echo "e2b set-up: installed $want in $venv"
