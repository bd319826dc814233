#!/usr/bin/env python3
"""The virtual shell against a Sandlot sandbox holding the same files.

One corpus on disk is both ingested as a collection and bind-mounted read-only
into sandboxes at /docs. The same command lines then run, alternating, in a vfs
session (cwd /) and in a sandbox (`cd /docs && LINE` through /bin/sh), both
through the SDK over the daemon's API, so each figure is a full API round trip.
Outputs are compared byte for byte before timing.

"start" is what a conversation pays before its first answer: vfs = open a session
and run `ls`; sandbox = create a sandbox with the corpus mounted and run `ls`
(then deleted, untimed). The sandbox is the best case for it: the files are bound
in, not copied.

    # a private daemon this script starts and stops (root):
    .venv/bin/python sdk/python/bench_vfs.py --spawn target/release/sandlot
    # fewer documents / iterations for a quick look:
    .venv/bin/python sdk/python/bench_vfs.py --spawn target/debug/sandlot --docs 2000 --mb 10 -n 10
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import sandlot

WORDS = (
    "api request limit token quota burst window retry header client server error status "
    "timeout backoff cache region cluster node policy access group role audit event "
    "stream batch queue worker schedule deploy release version config secret key"
).split()


def corpus(root: Path, docs: int, mb: int, seed: int = 7) -> Tuple[int, str]:
    """`docs` Markdown files in 500 directories, about `mb` MB; returns (bytes, a doc path)."""
    rnd = random.Random(seed)
    per = max(200, mb * 1_000_000 // docs)
    total = 0
    sample = ""
    for i in range(docs):
        d = root / f"section{i % 50}" / f"topic{(i // 50) % 10}"
        d.mkdir(parents=True, exist_ok=True)
        lines = [f"# Document {i}\n"]
        size = len(lines[0])
        while size < per:
            words = rnd.choices(WORDS, k=12)
            if rnd.random() < 0.01:
                words.insert(3, "rate limit")
            if rnd.random() < 0.002:
                words.insert(5, "burst sizes")
            line = " ".join(words) + ".\n"
            lines.append(line)
            size += len(line)
        p = d / f"doc{i}.md"
        p.write_text("".join(lines))
        total += size
        if i == docs // 2:
            sample = str(p.relative_to(root))
    return total, sample


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def spawn(bin_: str, allowed: Path) -> Tuple["subprocess.Popen[bytes]", str, str]:
    d = tempfile.mkdtemp(prefix="sandlot-vfs-bench-")
    sock = os.path.join(d, "api.sock")
    cfg = os.path.join(d, "sandlot.toml")
    with open(cfg, "w") as f:
        f.write(f'[mounts]\nallowed_host_paths = ["{allowed}"]\n[vfs]\nmax_output = "64M"\n')
    log = open(os.path.join(d, "daemon.log"), "ab")
    proc = subprocess.Popen(
        [bin_, "serve", "--data-dir", os.path.join(d, "data"), "--socket", sock, "--config", cfg,
         "--id-prefix", f"vb{os.getpid()}-"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock)
            return proc, f"unix://{sock}", d
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the daemon did not start; see {d}/daemon.log")
            time.sleep(0.02)


@contextlib.contextmanager
def bench_daemon(bin_: str, prefix: str) -> Iterator[Tuple[Path, "sandlot.Client"]]:
    """A work directory that sandboxes may read and bind (it is the daemon's
    `allowed_host_paths`) and a client of a private daemon started from `bin_`.
    If the benchmark fails, the daemon log's last lines go to stderr; the daemon and
    both directories are gone afterwards."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    work.chmod(0o755)  # sandboxes read the bind-mounted corpus as an unprivileged user
    proc: Optional["subprocess.Popen[bytes]"] = None
    tmp: Optional[str] = None
    try:
        proc, url, tmp = spawn(bin_, work)
        yield work, sandlot.Client(url, "", timeout=3600.0)  # a large ingest is one request
    except BaseException:
        if tmp:
            log = Path(tmp) / "daemon.log"
            if log.exists():
                print("daemon log (last lines):\n" + "\n".join(log.read_text().splitlines()[-30:]), file=sys.stderr)
        raise
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def emit(lines: List[str], out: Optional[str]) -> None:
    """Prints the report and appends it to `out` if given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(text)


def timed(f: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    f()
    return (time.perf_counter() - t0) * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=20, help="iterations per operation (default 20)")
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--spawn", metavar="SANDLOT_BIN", required=True, help="start a private daemon with this binary")
    ap.add_argument("--out", help="append the Markdown table to this file")
    a = ap.parse_args()

    with bench_daemon(a.spawn, "sandlot-vfs-corpus-") as (work, client):
        root = work / "docs"
        nbytes, doc = corpus(root, a.docs, a.mb)
        t0 = time.perf_counter()
        col = sandlot.Collection.create("bench", from_dir=root, client=client)
        ingest_s = time.perf_counter() - t0
        mounts = [{"type": "bind", "source": str(root), "target": "/docs", "readonly": True}]
        lines = [
            f"cat {doc}",
            "grep -rn 'rate limit' . | wc -l",
            "grep -rni 'Rate Limit' . | sort | tail -3",
            "grep -rl 'burst sizes' . | wc -l",
            "grep -rc zzqqxx . | wc -l",
            "find . -name '*.md' | wc -l",
            f"ls {os.path.dirname(doc)} | head",
            f"head -20 {doc} | wc -w",
        ]
        sh = col.session("bench")
        sb = sandlot.Sandbox.create(mounts=mounts, client=client, timeout="30m")
        try:
            # Same output first.
            for line in lines:
                v = sh.run(line)
                s = sb.run(f"cd /docs && {line}")
                if (v.stdout, v.exit_code) != (s.stdout, s.exit_code):
                    sys.exit(f"outputs differ for {line!r}:\nvfs: {v.stdout[:300]!r}\nsandbox: {s.stdout[:300]!r}")
            rows = []

            def start_vfs() -> None:
                with col.session("bench") as s2:
                    s2.run("ls")

            def start_sandbox() -> Tuple[float, "sandlot.Sandbox"]:
                t = time.perf_counter()
                b = sandlot.Sandbox.create(mounts=mounts, client=client)
                b.run("cd /docs && ls")
                return (time.perf_counter() - t) * 1000.0, b

            vs, ss = [], []
            for _ in range(a.n):
                vs.append(timed(start_vfs))
                ms, b = start_sandbox()
                ss.append(ms)
                b.terminate()
            rows.append(("start (session or sandbox) + `ls`", vs, ss))
            for line in lines:
                vs, ss = [], []
                for _ in range(a.n):
                    vs.append(timed(lambda: sh.run(line)))
                    ss.append(timed(lambda: sb.run(f"cd /docs && {line}")))
                rows.append((f"`{line}`".replace("|", "\\|"), vs, ss))
        finally:
            sh.close()
            sb.terminate()
            col.delete()
        out = [
            f"Corpus: {a.docs} documents, {nbytes / 1e6:.1f} MB; ingest through the API (tar upload) {ingest_s:.2f} s; "
            f"{a.n} iterations each, alternating; {os.cpu_count()} CPUs.",
            "",
            "| operation | vfs p50 ms | vfs p95 ms | sandbox p50 ms | sandbox p95 ms | ratio (sandbox p50 / vfs p50) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, vs, ss in rows:
            out.append(
                f"| {name} | {statistics.median(vs):.2f} | {pct(vs, 0.95):.2f} | {statistics.median(ss):.2f} | "
                f"{pct(ss, 0.95):.2f} | {statistics.median(ss) / statistics.median(vs):.1f}x |"
            )
        emit(out, a.out)


if __name__ == "__main__":
    main()
