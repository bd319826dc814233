#!/usr/bin/env bash
# Installs everything Sandlot's build, demo and tests need, idempotently.
# Runs every scripts/setup.d/*.sh in order after the base packages.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "setup: run as root (sandboxes need namespaces, cgroups and mounts)" >&2
    exit 1
  fi
}
need_root

# Debian packages: the comparison peers of the benchmark, tools the tests use, and
# gVisor's runsc (the `gvisor` isolation backend; the daemon reads what the
# installed release can do from it).
apt_pkgs=(bubblewrap hyperfine crun iproute2 nftables openssl curl python3 python3-venv ca-certificates runsc)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

command -v cargo >/dev/null || { echo "setup: cargo is required (rustup)" >&2; exit 1; }
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest
# Licenses, duplicate crates and crate sources of the dependency graph (.ci/run, deny.toml).
command -v cargo-deny >/dev/null || cargo install --locked cargo-deny

for s in "$here"/setup.d/*.sh; do
  [ -e "$s" ] || continue
  bash "$s"
done
