#!/usr/bin/env python3
"""A collection mounted into a sandbox (FUSE) against the same files on a plain bind
mount, in the same sandbox.

One corpus on disk is ingested as a collection and mounted twice into one sandbox:
at /coll as a collection mount (the daemon's `sandlot __vfs-serve` helper serving the
view over FUSE) and at /plain as a read-only bind of the directory. Each command line
runs alternately in both (`cd /coll && LINE`, `cd /plain && LINE`); the time is taken
inside the sandbox around the command (process start included, API round trip not),
so the figures compare the filesystems, not the API. Outputs are compared byte for
byte first. Both sides run warm (each line is run once, untimed, before timing):
the kernel's page and dentry caches serve repeated reads on both.

    # a private daemon this script starts and stops (root):
    .venv/bin/python sdk/python/bench_vfs_mount.py --spawn target/release/sandlot
    .venv/bin/python sdk/python/bench_vfs_mount.py --spawn target/debug/sandlot --docs 2000 --mb 10 -n 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import List

import sandlot

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vfs import bench_daemon, corpus, emit, pct  # noqa: E402


def timed_in_sandbox(sb: "sandlot.Sandbox", where: str, line: str) -> float:
    """Milliseconds `line` takes in `where`, measured in the sandbox."""
    script = (
        f"cd {where} || exit 99; s=$(date +%s%N); ( {line} ) >/dev/null 2>&1; "
        "e=$(date +%s%N); echo $(( (e - s) / 1000 ))"
    )
    r = sb.run(["/bin/sh", "-c", script])
    if r.exit_code != 0:
        sys.exit(f"{line!r} in {where}: exit {r.exit_code}: {r.stderr}")
    return int(r.stdout.strip()) / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=20, help="iterations per command line (default 20)")
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--spawn", metavar="SANDLOT_BIN", required=True, help="start a private daemon with this binary")
    ap.add_argument("--creates", type=int, default=10, help="sandbox creates timed per kind (default 10)")
    ap.add_argument("--out", help="append the Markdown table to this file")
    a = ap.parse_args()

    with bench_daemon(a.spawn, "sandlot-vfs-mount-corpus-") as (work, client):
        root = work / "docs"
        nbytes, doc = corpus(root, a.docs, a.mb)
        t0 = time.perf_counter()
        col = sandlot.Collection.create("bench", from_dir=root, client=client)
        ingest_s = time.perf_counter() - t0
        mounts = [
            col.mount("/coll", all_access=True),
            {"type": "bind", "source": str(root), "target": "/plain", "readonly": True},
        ]
        # Create time, alternating: with the collection mount (and the bind) against
        # with the bind alone; each sandbox is terminated before the next create.
        cms: List[float] = []
        pms: List[float] = []
        for _ in range(a.creates):
            for kind, ms in ((mounts, cms), (mounts[1:], pms)):
                t0 = time.perf_counter()
                s = sandlot.Sandbox.create(mounts=kind, client=client, timeout="5m")
                ms.append((time.perf_counter() - t0) * 1000.0)
                s.terminate()
        sb = sandlot.Sandbox.create(mounts=mounts, client=client, timeout="60m", memory="1G")
        lines = [
            "find . -type f | wc -l",
            "find . -name '*.md' -size +4k | wc -l",
            "ls -R . | wc -l",
            "grep -rn 'rate limit' . | wc -l",
            "grep -rl 'burst sizes' . | wc -l",
            "grep -rc zzqqxx . | wc -l",
            f"cat {doc} | wc -c",
            "python3 -c 'import os; print(sum(len(f) for _, _, f in os.walk(\".\")))'",
            "git grep --no-index -c 'rate limit' | wc -l",
        ]
        has_rg = sb.run("command -v rg").exit_code == 0
        if has_rg:
            lines.append("rg -c 'rate limit' . | wc -l")
        else:
            print("ripgrep is not installed on this host: no rg row", file=sys.stderr)
        rows = []
        try:
            for line in lines:
                c = sb.run(f"cd /coll && {line}")
                p = sb.run(f"cd /plain && {line}")
                if (c.stdout, c.exit_code) != (p.stdout, p.exit_code):
                    sys.exit(f"outputs differ for {line!r}:\nfuse: {c.stdout[:300]!r}\nplain: {p.stdout[:300]!r}")
            for line in lines:
                fs: List[float] = []
                ps: List[float] = []
                for _ in range(a.n):
                    fs.append(timed_in_sandbox(sb, "/coll", line))
                    ps.append(timed_in_sandbox(sb, "/plain", line))
                rows.append((f"`{line}`".replace("|", "\\|"), fs, ps))
        finally:
            sb.terminate()
            col.delete()
        out = [
            f"Corpus: {a.docs} documents, {nbytes / 1e6:.1f} MB in 500 directories; ingest {ingest_s:.2f} s; "
            f"create of a sandbox with the collection mount p50 {statistics.median(cms):.1f} ms "
            f"(p95 {pct(cms, 0.95):.1f}), with the bind mount alone p50 {statistics.median(pms):.1f} ms "
            f"(p95 {pct(pms, 0.95):.1f}), ratio {statistics.median(cms) / statistics.median(pms):.2f}x "
            f"over {a.creates} creates each; {a.n} iterations each, alternating, warm; "
            f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}.",
            "",
            "| command line (in the mount) | FUSE p50 ms | FUSE p95 ms | bind p50 ms | bind p95 ms | ratio (FUSE p50 / bind p50) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, fs, ps in rows:
            out.append(
                f"| {name} | {statistics.median(fs):.2f} | {pct(fs, 0.95):.2f} | {statistics.median(ps):.2f} | "
                f"{pct(ps, 0.95):.2f} | {statistics.median(fs) / statistics.median(ps):.2f}x |"
            )
        emit(out, a.out)


if __name__ == "__main__":
    main()
