#!/usr/bin/env bash
# The whole test suite: unit, privileged integration and end-to-end tests.
# Runs as root (CI does). Leaves nothing behind; fails if anything leaked.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export RUST_BACKTRACE=1
cargo build --workspace --all-targets
cargo nextest run --workspace --no-fail-fast "$@"
SANDLOT_BIN="${CARGO_TARGET_DIR:-target}/debug/sandlot" .venv/bin/python -m pytest -q -p no:cacheprovider sdk/python/tests
bash tests/e2b/run.sh
bash scripts/check-leaks.sh
