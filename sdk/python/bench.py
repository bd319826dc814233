#!/usr/bin/env python3
"""Create → first output, through the SDK and through the raw HTTP API (httpx), in
one run, alternating, so the two are measured under the same conditions.

Each iteration: create a sandbox, start `echo hi`, stop the clock at the first
stdout bytes, then delete the sandbox (not timed).

    # against a private daemon this script starts and stops (root):
    .venv/bin/python sdk/python/bench.py --spawn target/release/sandlot -n 50
    # against a running daemon:
    SANDLOT_URL=unix:///run/sandlot/sandlot.sock .venv/bin/python sdk/python/bench.py -n 50
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Optional, Tuple

import httpx

import sandlot
from sandlot.client import resolve_url


def via_sdk(client: sandlot.Client) -> float:
    t0 = time.perf_counter()
    sb = sandlot.Sandbox.create(client=client)
    try:
        p = sb.exec("echo", "hi")
        first = next(p.stdout.iter_bytes())
        dt = time.perf_counter() - t0
        assert first == b"hi\n", first
        p.wait()
        return dt
    finally:
        sb.terminate()


def via_raw(http: httpx.Client) -> float:
    t0 = time.perf_counter()
    r = http.post("/v1/sandboxes", json={})
    r.raise_for_status()
    sid = r.json()["id"]
    try:
        with http.stream("POST", f"/v1/sandboxes/{sid}/exec", params={"stream": "ndjson"}, json={"argv": ["echo", "hi"]}) as s:
            s.raise_for_status()
            dt = None
            for line in s.iter_lines():
                ev = json.loads(line)
                if ev["type"] == "stdout" and dt is None:
                    dt = time.perf_counter() - t0
                    assert base64.b64decode(ev["data"]) == b"hi\n"
            assert dt is not None
            return dt
    finally:
        http.delete(f"/v1/sandboxes/{sid}").raise_for_status()


def exec_sdk(sb: sandlot.Sandbox) -> float:
    t0 = time.perf_counter()
    p = sb.exec("echo", "hi")
    first = next(p.stdout.iter_bytes())
    dt = time.perf_counter() - t0
    assert first == b"hi\n", first
    p.wait()
    return dt


def exec_raw(http: httpx.Client, sid: str) -> float:
    t0 = time.perf_counter()
    with http.stream("POST", f"/v1/sandboxes/{sid}/exec", params={"stream": "ndjson"}, json={"argv": ["echo", "hi"]}) as s:
        s.raise_for_status()
        dt = None
        for line in s.iter_lines():
            ev = json.loads(line)
            if ev["type"] == "stdout" and dt is None:
                dt = time.perf_counter() - t0
        assert dt is not None
        return dt


def table(title: str, res: "dict[str, List[float]]") -> None:
    print(title)
    print(f"{'client':<8}{'p50 ms':>10}{'p95 ms':>10}{'mean ms':>10}{'min ms':>10}")
    for name in ("sdk", "raw"):
        xs = [x * 1000 for x in res[name]]
        print(f"{name:<8}{statistics.median(xs):>10.2f}{pct(xs, 0.95):>10.2f}{statistics.fmean(xs):>10.2f}{min(xs):>10.2f}")
    print(f"sdk/raw p50 ratio: {statistics.median(res['sdk']) / statistics.median(res['raw']):.3f}")


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def spawn(bin_: str) -> Tuple[subprocess.Popen, str, str]:  # type: ignore[type-arg]
    d = tempfile.mkdtemp(prefix="sandlot-sdk-bench-")
    sock = os.path.join(d, "api.sock")
    log = open(os.path.join(d, "daemon.log"), "ab")
    proc = subprocess.Popen(
        [bin_, "serve", "--data-dir", os.path.join(d, "data"), "--socket", sock, "--id-prefix", f"pb{os.getpid()}-"],
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=50, help="iterations per client (default 50)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--url", help="daemon address (default: SANDLOT_URL or the operator socket)")
    ap.add_argument("--token", help="bearer token (default: SANDLOT_TOKEN)")
    ap.add_argument("--spawn", metavar="SANDLOT_BIN", help="start a private daemon with this binary")
    a = ap.parse_args()

    proc: Optional[subprocess.Popen] = None  # type: ignore[type-arg]
    tmp = None
    url = a.url
    if a.spawn:
        proc, url, tmp = spawn(a.spawn)
    try:
        client = sandlot.Client(url, a.token)
        base, uds = resolve_url(url)
        headers = {"authorization": f"Bearer {client.token}"} if client.token else {}
        http = httpx.Client(
            base_url=base,
            transport=httpx.HTTPTransport(uds=uds) if uds else httpx.HTTPTransport(),
            headers=headers,
            timeout=60,
        )
        runs: List[Tuple[str, Callable[[], float]]] = [("sdk", lambda: via_sdk(client)), ("raw", lambda: via_raw(http))]
        for _ in range(a.warmup):
            for _, f in runs:
                f()
        res = {"sdk": [], "raw": []}  # type: ignore[var-annotated]
        for i in range(a.n):
            for name, f in runs if i % 2 == 0 else runs[::-1]:  # each goes first half the time
                res[name].append(f())
        table(f"create -> first output, n={a.n} sequential each, alternating ({client.url})", res)
        # The same without the create: exec -> first output in one running sandbox.
        sb = sandlot.Sandbox.create(client=client)
        try:
            ex = {"sdk": [], "raw": []}  # type: ignore[var-annotated]
            for _ in range(a.warmup):
                exec_sdk(sb), exec_raw(http, sb.id)
            for i in range(a.n):
                if i % 2 == 0:
                    ex["sdk"].append(exec_sdk(sb))
                    ex["raw"].append(exec_raw(http, sb.id))
                else:
                    ex["raw"].append(exec_raw(http, sb.id))
                    ex["sdk"].append(exec_sdk(sb))
        finally:
            sb.terminate()
        table(f"exec -> first output in a running sandbox, n={a.n} each, alternating", ex)
        client.close()
        http.close()
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
