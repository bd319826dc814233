#!/usr/bin/env bash
# The platform benchmark: builds a release binary and runs
# `sandlot bench platform` through a private daemon, with bubblewrap and crun in the
# same run. Results: bench-out/results.json and bench-out/latency.png.
# Extra arguments go to `sandlot bench platform` (e.g. --n 50 --density 200).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-matplotlib >/dev/null
fi
# The embedding model (default feature `memory`) plays no part in these paths.
cargo build --release -p sandlot --no-default-features
exec target/release/sandlot bench platform --out bench-out "$@"
