#!/usr/bin/env bash
# Set-up for the Python SDK (sdk/python): a virtual environment in .venv at the
# repository root (git-ignored) with the SDK installed editable, pytest /
# pytest-asyncio for its end-to-end suite, and ruff and mypy for its lint (.ci/run).
# Idempotent: does nothing when the venv already has all of it for this checkout.
# Override the interpreter with PYTHON.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"

ready() {
    [ -x "$venv/bin/ruff" ] && [ -x "$venv/bin/mypy" ] \
        && [ -x "$venv/bin/python" ] && "$venv/bin/python" - "$root" <<'PY' >/dev/null 2>&1
import os, sys
import httpx, pytest, pytest_asyncio, sandlot
want = os.path.join(sys.argv[1], "sdk", "python", "src", "sandlot")
sys.exit(0 if os.path.dirname(os.path.abspath(sandlot.__file__)) == want else 1)
PY
}

if ready; then
    echo "50-python-sdk: $venv ready (sandlot SDK editable, pytest, pytest-asyncio, ruff, mypy)"
    exit 0
fi
command -v "$py" >/dev/null || { echo "50-python-sdk: $py is required" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv" || {
        echo "50-python-sdk: '$py -m venv' failed (on Debian: apt-get install python3-venv)" >&2
        exit 1
    }
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root/sdk/python" "pytest>=7" "pytest-asyncio>=0.23" \
    "ruff==0.17.*" "mypy==2.4.*"
# The editable build leaves its metadata in the source tree; it is not needed there.
rm -rf "$root/sdk/python/src/sandlot.egg-info"
ready || { echo "50-python-sdk: the venv does not have the SDK, pytest, ruff and mypy after installing" >&2; exit 1; }
echo "50-python-sdk: $venv ready"
