#!/usr/bin/env bash
# Set-up for image registry tests and Debian base builds: the Debian
# package docker-registry (the OCI Distribution server the pull/push tests start on
# loopback with a temporary storage directory; its own service is NOT started
# here), openssl (test token-server keys) and mmdebstrap (debian:* bases, built
# from the host's own apt sources). Idempotent.
set -euo pipefail
pkgs=(docker-registry openssl mmdebstrap)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "70-images: installing ${missing[*]}"
    apt-get update -qq
    # policy-rc.d-less hosts would start the packaged registry on :5000; the tests
    # never use it, so keep it from starting.
    DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if command -v systemctl >/dev/null && systemctl is-active --quiet docker-registry 2>/dev/null; then
    echo "70-images: note: the packaged docker-registry service is running on :5000 (tests do not need it)"
fi
echo "70-images: docker-registry $(dpkg-query -W -f='${Version}' docker-registry), mmdebstrap ready"
