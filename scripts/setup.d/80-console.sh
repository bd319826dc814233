#!/usr/bin/env bash
# Set-up for the web console: Debian's node and npm (which reproduce the console's
# vendored JavaScript from console/package-lock.json), Debian's chromium and
# chromium-driver, and a venv under tests/console/.venv (git-ignored) with Selenium
# and pytest at pinned versions for the browser test. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/tests/console/.venv"
SELENIUM_VERSION=4.27.1
PYTEST_VERSION=9.2.0

missing=()
for p in chromium chromium-driver; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm from wherever the machine has them (a nodejs package that bundles
# npm conflicts with Debian's npm package); Debian's otherwise.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
    echo "console set-up: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

want="selenium==$SELENIUM_VERSION pytest==$PYTEST_VERSION"
have() {
    "$venv/bin/python" - "$SELENIUM_VERSION" "$PYTEST_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
want = dict(zip(["selenium", "pytest"], sys.argv[1:]))
sys.exit(0 if all(version(k) == v for k, v in want.items()) else 1)
PY
}
if [ -x "$venv/bin/python" ] && have; then
    echo "console set-up: $want present"
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check $want
have
echo "console set-up: installed $want in $venv"
