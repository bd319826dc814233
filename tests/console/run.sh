#!/usr/bin/env bash
# Runs the web console's browser test: Debian's chromium, headless, driven by
# Selenium (pinned, from the venv scripts/setup.d/80-console.sh makes) against a
# real `sandlot serve`. As root. Screenshots go to tests/console/screenshots/
# (or $SANDLOT_CONSOLE_SCREENSHOTS).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
[ -x "$venv/bin/python" ] || bash "$here/../../scripts/setup.d/80-console.sh"
cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
