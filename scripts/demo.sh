#!/usr/bin/env bash
# The main job: build Sandlot, start the daemon, create a sandbox and run code in it
# (from the CLI and from the Python SDK), then stop everything.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
cargo build --release -p sandlot
bin=$PWD/target/release/sandlot

dir=$(mktemp -d /tmp/sandlot-demo.XXXXXX)
sock=$dir/sandlot.sock
echo "+ sandlot serve --pool-size 2   (data and socket under $dir)"
"$bin" serve --data-dir "$dir/data" --socket "$sock" --pool-size 2 \
    --id-prefix "demo$$-" >"$dir/daemon.log" 2>&1 &
daemon=$!
stop() {
    kill -TERM "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    rm -rf "$dir"
}
trap stop EXIT
for _ in $(seq 200); do
    [ -S "$sock" ] && break
    kill -0 "$daemon" 2>/dev/null || { cat "$dir/daemon.log"; exit 1; }
    sleep 0.05
done
export SANDLOT_URL=unix://$sock

echo "+ sandlot create --memory 256M --timeout 2m"
id=$("$bin" create --memory 256M --timeout 2m)
echo "$id"
echo "+ sandlot exec $id -- python3 -c 'print(6*7)'"
"$bin" exec "$id" -- python3 -c 'import os, socket; print(6*7, "from", socket.gethostname(), "as uid", os.getuid())'
echo "+ sandlot exec $id -- sh -c 'id; ls /; cat /etc/hostname'"
"$bin" exec "$id" -- sh -c 'id; ls /; cat /etc/hostname'
echo "+ sandlot rm $id"
"$bin" rm "$id" >/dev/null

echo "+ python: Sandbox.create() ... sb.run(...)"
.venv/bin/python - <<'EOF'
from sandlot import Sandbox

with Sandbox.create(timeout="1m") as sb:
    r = sb.run(["python3", "-c", "print(sum(range(10)))"])
    print(sb.id, "->", r.stdout.strip())
EOF

echo "+ sandlot run -- echo (one-shot, no daemon)"
"$bin" run --memory 128M -- echo "hello from a one-shot sandbox"
