#!/usr/bin/env bash
# Runs E2B's own Python SDK tests (a checkout of E2B's public repository, given as
# the first argument; its packages/python-sdk/tests) against a private
# `sandlot serve`. The daemon and pytest run in a network namespace of their own
# with loopback only, so nothing a test does (a sandbox dialling a public address,
# a URL on E2B's domain) leaves this machine: tests that need the internet fail.
# As root. Extra arguments go to pytest (default: the synchronous sandbox and API
# suites).
#
# Which SDK the tests drive ($E2B_UPSTREAM_SDK):
#   checkout (default)  the released `e2b` of the checkout's version (its
#                       pyproject.toml), from the package registry, in a venv of
#                       its own (tests/e2b/.venv-upstream-VERSION): the tests and
#                       the SDK they were written for, mocks included;
#   pinned              the SDK pinned for tests/e2b (scripts/setup.d/60-e2b.sh).
# pytest runs under `python -P`: the checkout's own `e2b` sources, in the working
# directory, are never imported, only the released SDK of the venv.
#
#   bash tests/e2b/upstream.sh /path/to/E2B [pytest args...]
#
# A checkout of E2B's code-interpreter repository (its python/tests) works the
# same way: the released `e2b-code-interpreter` of its version with the `e2b` its
# poetry.lock names (default: the sync, chart and image suites).
#
#   bash tests/e2b/upstream.sh /path/to/code-interpreter [pytest args...]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 E2B_CHECKOUT [pytest args...]" >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -f "$1/python/pyproject.toml" ] && grep -q '^name = "e2b-code-interpreter"' "$1/python/pyproject.toml"; then
    package=e2b-code-interpreter
    sdk="$(cd "$1/python" && pwd)"
    defaults=(tests/sync tests/charts tests/images)
    # Its own pytest.ini runs pytest-xdist; here the tests run in turn.
    extra=(-o "addopts=--import-mode=importlib")
else
    package=e2b
    sdk="$(cd "$1/packages/python-sdk" && pwd)"
    defaults=(tests/sync/sandbox_sync tests/sync/api_sync)
    extra=()
fi
shift
case "${E2B_UPSTREAM_SDK:-checkout}" in
pinned)
    venv="$here/.venv"
    [ -x "$venv/bin/python" ] || bash "$here/../../scripts/setup.d/60-e2b.sh"
    ;;
checkout)
    version="$(sed -n 's/^version = "\([0-9][0-9.]*\)"$/\1/p' "$sdk/pyproject.toml" | head -n 1)"
    [ -n "$version" ] || { echo "no version = \"X.Y.Z\" in $sdk/pyproject.toml" >&2; exit 2; }
    pins=("$package==$version")
    if [ "$package" = e2b-code-interpreter ]; then
        # The `e2b` it was released and tested with.
        e2b_version="$(awk '/^name = "e2b"$/ {getline; gsub(/version = |"/, ""); print; exit}' "$sdk/poetry.lock")"
        [ -n "$e2b_version" ] && pins+=("e2b==$e2b_version")
    fi
    venv="$here/.venv-upstream-$package-$version"
    if ! "$venv/bin/python" -c "from importlib.metadata import version as v; assert v('$package') == '$version'" 2>/dev/null; then
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" \
            pytest==9.2.0 pytest-asyncio==1.5.0 python-dotenv pytest-dotenv
    fi
    ;;
*) echo "E2B_UPSTREAM_SDK: checkout or pinned, not ${E2B_UPSTREAM_SDK}" >&2; exit 2 ;;
esac
"$venv/bin/python" -c 'import pytest_timeout' 2>/dev/null ||
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check pytest-timeout
echo "upstream: e2b $("$venv/bin/python" -c "from importlib.metadata import version; print(version('e2b'))") from $venv" >&2
bin="${SANDLOT_BIN:-${CARGO_TARGET_DIR:-$here/../../target}/debug/sandlot}"
[ $# -gt 0 ] || set -- "${defaults[@]}"

ns="e2bup$$"
tmp="$(mktemp -d /tmp/sandlot-e2b-upstream.XXXXXX)"
pid=""
# nsenter joins only the network namespace (`ip netns exec` would remount /sys,
# hiding the cgroup hierarchies from the daemon).
cleanup() {
    if [ -n "$pid" ]; then
        # Sandboxes outlive the daemon: delete them through the API first.
        for id in $(nsenter --net="/run/netns/$ns" curl -s -H "Authorization: Bearer $key" \
            "http://127.0.0.1:$api/v1/sandboxes" | "$venv/bin/python" -c \
            'import json,sys; print(" ".join(s["id"] for s in json.load(sys.stdin)["sandboxes"]))' 2>/dev/null); do
            nsenter --net="/run/netns/$ns" curl -s -X DELETE -H "Authorization: Bearer $key" \
                "http://127.0.0.1:$api/v1/sandboxes/$id" >/dev/null || true
        done
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up
e2b=49983 api=49984
mkdir -m 700 "$tmp/data"
nsenter --net="/run/netns/$ns" "$bin" serve --data-dir "$tmp/data" --socket "$tmp/sandlot.sock" \
    --id-prefix "e2bup$$-" --listen "127.0.0.1:$api" --e2b-listen "127.0.0.1:$e2b" \
    2>"$tmp/serve.log" &
pid=$!
for _ in $(seq 100); do
    nsenter --net="/run/netns/$ns" curl -s -o /dev/null "http://127.0.0.1:$e2b/health" && break
    sleep 0.2
done
made="$(SANDLOT_URL="unix://$tmp/sandlot.sock" SANDLOT_TOKEN= "$bin" token create --tenant upstream --json)"
# `key` (sl_...) for the native API of the clean-up; its E2B form for the SDK.
key="$(printf '%s' "$made" | "$venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["token"])')"
e2b_key="$(printf '%s' "$made" | "$venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["e2b_api_key"])')"
cd "$sdk"
nsenter --net="/run/netns/$ns" env E2B_API_URL="http://127.0.0.1:$e2b" E2B_SANDBOX_URL="http://127.0.0.1:$e2b" \
    E2B_API_KEY="$e2b_key" E2B_DOMAIN=sandlot.invalid \
    "$venv/bin/python" -P -m pytest -p no:cacheprovider -q -o timeout=60 ${extra[@]+"${extra[@]}"} -rfE "$@" || rc=$?
[ -z "${rc:-}" ] || tail -n 20 "$tmp/serve.log" >&2
exit "${rc:-0}"
