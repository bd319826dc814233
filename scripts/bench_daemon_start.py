#!/usr/bin/env python3
"""How long `sandlot serve` takes to its first answer: from the spawn to a
`GET /v1/health` answered 200 on its Unix socket, in a fresh data directory, then
SIGTERM. Two binaries are started in alternation (an old build against a new one,
or one binary against itself for the noise); prints medians and their ratio.

Usage (root): python3 scripts/bench_daemon_start.py BINARY_A BINARY_B [-n 20]
"""

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HEALTH = b"GET /v1/health HTTP/1.1\r\nHost: sandlot\r\nConnection: close\r\n\r\n"


def answered(sock: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(sock)
            s.sendall(HEALTH)
            return s.recv(16).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def start_once(binary: str, run: int) -> float:
    d = tempfile.mkdtemp(prefix="sandlot-start-")
    sock = os.path.join(d, "api.sock")
    try:
        with open(os.path.join(d, "log"), "w") as log:
            t0 = time.monotonic()
            p = subprocess.Popen(
                [binary, "serve", "--data-dir", os.path.join(d, "data"), "--socket", sock,
                 "--id-prefix", f"bst{os.getpid()}x{run}-"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            )
            try:
                while not answered(sock):
                    if p.poll() is not None or time.monotonic() - t0 > 60:
                        sys.exit(f"{binary} did not start; log:\n{open(log.name).read()}")
                    time.sleep(0.001)
                took = (time.monotonic() - t0) * 1000
            finally:
                p.send_signal(signal.SIGTERM)
                p.wait()
        return took
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("-n", type=int, default=20)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_daemon_start: run as root (the daemon makes namespaces and cgroups)")
    binaries = [("A", args.a), ("B", args.b)]
    times = {"A": [], "B": []}
    for i in range(args.n):
        for side, b in binaries:
            times[side].append(start_once(b, i))
    for side, b in binaries:
        t = times[side]
        print(f"{side} {b}: median {statistics.median(t):.1f} ms, min {min(t):.1f} ms (n = {len(t)})")
    ratio = statistics.median(times["B"]) / statistics.median(times["A"])
    print(f"ratio B/A of the medians: {ratio:.3f}")


if __name__ == "__main__":
    main()
