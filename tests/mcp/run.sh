#!/usr/bin/env bash
# Runs the MCP end-to-end test: the official Python MCP SDK (pinned, from the
# venv scripts/setup.d/65-mcp.sh makes) against a real `sandlot serve` (`/mcp`) and
# `sandlot mcp` (stdio). As root.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
[ -x "$venv/bin/python" ] || bash "$here/../../scripts/setup.d/65-mcp.sh"
cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
