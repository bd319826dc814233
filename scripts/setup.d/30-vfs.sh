#!/usr/bin/env bash
# Set-up for sandlot-vfs: tools the virtual shell is compared against
# in the differential tests, FUSE user-space tools, and moto's S3 server for the
# S3 ingest test. Idempotent.
set -euo pipefail

need_apt=()
command -v tree >/dev/null 2>&1 || need_apt+=(tree)
command -v rg >/dev/null 2>&1 || need_apt+=(ripgrep)
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
command -v unshare >/dev/null 2>&1 || need_apt+=(util-linux)
command -v git >/dev/null 2>&1 || need_apt+=(git)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
if ((${#need_apt[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

if ! command -v moto_server >/dev/null 2>&1 || ! python3 -c 'import boto3, moto' >/dev/null 2>&1; then
    python3 -m pip install --quiet 'moto[server]' || python3 -m pip install --quiet --break-system-packages 'moto[server]'
    if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
fi

command -v moto_server >/dev/null
echo "vfs set-up: tree, ripgrep, fuse3, moto_server present"
