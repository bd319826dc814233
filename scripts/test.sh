#!/usr/bin/env bash
# The whole test suite: unit, privileged integration and end-to-end tests.
# Runs as root (CI does). Leaves nothing behind; fails if anything leaked.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Each phase's start, in seconds since the script began, so slow phases show in CI logs.
phase() { echo "== test.sh: $1 (at ${SECONDS}s)" >&2; }
phase "setup"
bash scripts/setup.sh
export RUST_BACKTRACE=1
phase "console vendor check"
bash scripts/console-vendor.sh --check
phase "build"
cargo build --workspace --all-targets
phase "cargo tests"
cargo nextest run --workspace --no-fail-fast "$@"
# The end-to-end suites on each isolation backend.
for isolation in namespace gvisor; do
  phase "Python SDK tests ($isolation)"
  SANDLOT_TEST_ISOLATION=$isolation SANDLOT_BIN="${CARGO_TARGET_DIR:-target}/debug/sandlot" \
    .venv/bin/python -m pytest -q -p no:cacheprovider sdk/python/tests
  phase "E2B SDK tests ($isolation)"
  SANDLOT_TEST_ISOLATION=$isolation bash tests/e2b/run.sh
  phase "web console browser test ($isolation)"
  SANDLOT_TEST_ISOLATION=$isolation bash tests/console/run.sh
done
phase "MCP Python SDK tests"
bash tests/mcp/run.sh
phase "leak check"
bash scripts/check-leaks.sh
phase "done"
