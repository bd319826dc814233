#!/usr/bin/env bash
# Set-up for code contexts: the Jupyter kernel they run (ipykernel with
# jupyter_client) and the libraries their tests use (matplotlib, pandas), from
# Debian, so that the `host` image's python3 has them; and node, which runs
# javascript contexts (the machine's own if it has one: a nodejs package that
# bundles npm conflicts with Debian's npm). Idempotent.
set -euo pipefail

pkgs=(python3-ipykernel python3-jupyter-client python3-matplotlib python3-pandas)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v node >/dev/null || missing+=(nodejs)
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi
/usr/bin/python3 -c 'import ipykernel, jupyter_client, matplotlib, pandas'
echo "code set-up: ${pkgs[*]} and node $(node --version) present"
