#!/usr/bin/env bash
# Runs the E2B compatibility suite: the official e2b SDK (pinned, from the venv
# scripts/setup.d/60-e2b.sh makes) against a real `sandlot serve`. As root.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
[ -x "$venv/bin/python" ] || bash "$here/../../scripts/setup.d/60-e2b.sh"
cd "$here"
exec "$venv/bin/python" -m pytest -q "$@"
