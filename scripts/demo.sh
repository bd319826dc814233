#!/usr/bin/env bash
# The main job: build Sandlot, create a sandbox and run code in it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
cargo build --release -p sandlot
bin=target/release/sandlot
echo "+ sandlot run -- python3 -c 'print(6*7)'"
"$bin" run --memory 256M --timeout 30s -- python3 -c 'import os, socket; print(6*7, "from", socket.gethostname(), "as uid", os.getuid())'
echo "+ sandlot run -- sh -c 'id; ls /; cat /etc/hostname'"
"$bin" run -- sh -c 'id; ls /; cat /etc/hostname'
