#!/usr/bin/env bash
# Fails if anything a sandbox or a test creates is still on the machine.
set -u
bad=0
report() { echo "leak: $1" >&2; bad=1; }
procs=$(ps -eo pid=,args= | grep -E 'sandlot (__init|__zygote|__gvisor|__vfs-serve|run|serve)' | grep -v grep || true)
[ -n "$procs" ] && report "processes: $procs"
# gVisor sandboxes: runsc's sandbox and gofer processes, and their directories.
gp=$(ps -eo pid=,args= | grep -E '^ *[0-9]+ runsc-(sandbox|gofer) --root=/run/sandlot/gvisor/' || true)
[ -n "$gp" ] && report "gVisor processes: $gp"
if [ -d /run/sandlot/gvisor ]; then
  gd=$(ls -A /run/sandlot/gvisor)
  [ -n "$gd" ] && report "gVisor sandbox dirs: $gd"
fi
# The runtime's own tmpfs under the run directory (sandlot_runtime::run_dir) is
# meant to stay, like /run itself; its contents are checked below.
m=$(grep -E 'sandlot' /proc/mounts | grep -vE '^sandlot-run /run/sandlot/sandboxes tmpfs ' || true)
[ -n "$m" ] && report "mounts: $m"
cg=$(find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d -path '*sandlot*' ! -name sandlot 2>/dev/null || true)
[ -n "$cg" ] && report "cgroups: $cg"
# The shared parent goes with the last sandbox (and a daemon's cgroup stock).
cgp=$(find /sys/fs/cgroup -mindepth 2 -maxdepth 2 -type d -name sandlot 2>/dev/null || true)
[ -n "$cgp" ] && report "parent cgroups: $cgp"
# A sandbox cgroup nested below another one (runsc takes a relative cgroups path
# below its own cgroup in each hierarchy).
cgn=$(find /sys/fs/cgroup -mindepth 3 -type d -name sandlot 2>/dev/null || true)
[ -n "$cgn" ] && report "nested sandbox cgroups: $cgn"
if [ -d /run/sandlot/sandboxes ]; then
  sb=$(ls -A /run/sandlot/sandboxes)
  [ -n "$sb" ] && report "sandbox run dirs: $sb"
fi
ns=$(ip netns list 2>/dev/null || true)
[ -n "$ns" ] && report "network namespaces: $ns"
v=$(ip -o link show type veth 2>/dev/null || true)
[ -n "$v" ] && report "veth devices: $v"
# Network slots (sandlot-net): namespaces and host veths are named sn<6 hex><6 hex>,
# nftables tables sandlot_sn<6 hex>; the world of the net tests uses tw<pid>x<n>-*.
sn=$(ls -A /run/netns 2>/dev/null | grep -E '^(sn[0-9a-f]{12}|tw[0-9]+x[0-9]+-)' || true)
[ -n "$sn" ] && report "sandlot network slots: $sn"
sl=$(ls -A /sys/class/net 2>/dev/null | grep -E '^sn[0-9a-f]{12}$' || true)
[ -n "$sl" ] && report "sandlot slot links: $sl"
if command -v nft >/dev/null 2>&1; then
  nt=$(nft list tables 2>/dev/null | grep -E 'sandlot_sn[0-9a-f]{6}' || true)
  [ -n "$nt" ] && report "sandlot nftables tables: $nt"
fi
if [ $bad = 0 ]; then echo "check-leaks: nothing left behind"; fi
exit $bad
