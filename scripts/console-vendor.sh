#!/usr/bin/env bash
# The web console's JavaScript from npm (xterm.js and its fit addon) is committed
# under crates/sandlot-server/console/vendor/, the files the binary embeds. This
# script reproduces them from console/package-lock.json with `npm ci` in a scratch
# directory: without arguments it writes them; with --check it fails unless the
# committed files are byte for byte what the lockfile gives (scripts/test.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
console="$root/crates/sandlot-server/console"
check=0
[ "${1:-}" = "--check" ] && check=1

# node_modules path -> vendor file
files=(
    "@xterm/xterm/lib/xterm.js:xterm.js"
    "@xterm/xterm/css/xterm.css:xterm.css"
    "@xterm/addon-fit/lib/addon-fit.js:addon-fit.js"
    "@xterm/xterm/LICENSE:LICENSE-xterm.txt"
    "@xterm/addon-fit/LICENSE:LICENSE-addon-fit.txt"
)

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cp "$console/package.json" "$console/package-lock.json" "$console/.npmrc" "$scratch/"
(cd "$scratch" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)

status=0
mkdir -p "$console/vendor"
for f in "${files[@]}"; do
    from="$scratch/node_modules/${f%%:*}"
    to="$console/vendor/${f##*:}"
    if [ "$check" = 1 ]; then
        if ! cmp -s "$from" "$to"; then
            echo "console-vendor: vendor/${f##*:} differs from ${f%%:*} of the lockfile (run scripts/console-vendor.sh)" >&2
            status=1
        fi
    else
        cp "$from" "$to"
    fi
done
[ "$check" = 1 ] && [ "$status" = 0 ] && echo "console-vendor: vendor/ matches package-lock.json"
exit "$status"
