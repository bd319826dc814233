"""Benchmark of the E2B front door against Sandlot's own API, same daemon, same run.

    tests/e2b/.venv/bin/python tests/e2b/bench.py [-n 30]     (as root)

Starts a private `sandlot serve` (like the test suite) and measures, N times each:
  * create: E2B `Sandbox.create()` vs native `POST /v1/sandboxes`;
  * exec: E2B `commands.run("echo hi")` (Connect stream) vs native
    `POST .../exec?stream=ndjson` of the same `/bin/bash -l -c 'echo hi'`;
  * file: E2B `files.write` + `files.read` of 64 KiB vs native `PUT`/`GET .../files`.
Prints medians (ms) and the E2B/native ratio.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import Server  # noqa: E402


def median_ms(xs):
    return statistics.median(xs) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=30)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sandlot-e2b-bench-"))
    srv = Server(tmp)
    srv.start()
    key = srv.token("bench")
    os.environ.update(E2B_API_URL=srv.url, E2B_SANDBOX_URL=srv.url, E2B_API_KEY=key)
    from e2b import Sandbox

    native = httpx.Client(base_url=srv.api_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    payload = os.urandom(64 * 1024)
    res = {k: [] for k in ["create_e2b", "create_native", "exec_e2b", "exec_native", "file_e2b", "file_native"]}
    try:
        for _ in range(a.n):
            t = time.perf_counter()
            sb = Sandbox.create(timeout=60)
            res["create_e2b"].append(time.perf_counter() - t)
            t = time.perf_counter()
            nid = native.post("/v1/sandboxes", json={"user": "user", "timeout": 60}).raise_for_status().json()["id"]
            res["create_native"].append(time.perf_counter() - t)

            t = time.perf_counter()
            assert sb.commands.run("echo hi").stdout == "hi\n"
            res["exec_e2b"].append(time.perf_counter() - t)
            t = time.perf_counter()
            body = {"argv": ["/bin/bash", "-l", "-c", "echo hi"]}
            r = native.post(f"/v1/sandboxes/{nid}/exec", params={"stream": "ndjson"}, json=body).raise_for_status()
            assert '"exit"' in r.text
            res["exec_native"].append(time.perf_counter() - t)

            t = time.perf_counter()
            sb.files.write("/tmp/f.bin", payload)
            assert bytes(sb.files.read("/tmp/f.bin", format="bytes")) == payload
            res["file_e2b"].append(time.perf_counter() - t)
            t = time.perf_counter()
            native.put(f"/v1/sandboxes/{nid}/files", params={"path": "/tmp/f.bin"}, content=payload).raise_for_status()
            assert native.get(f"/v1/sandboxes/{nid}/files", params={"path": "/tmp/f.bin"}).content == payload
            res["file_native"].append(time.perf_counter() - t)

            sb.kill()
            native.delete(f"/v1/sandboxes/{nid}").raise_for_status()
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'operation':<10} {'e2b ms':>9} {'native ms':>10} {'ratio':>6}   (median of {a.n})")
    for op in ["create", "exec", "file"]:
        e, n = median_ms(res[f"{op}_e2b"]), median_ms(res[f"{op}_native"])
        print(f"{op:<10} {e:>9.2f} {n:>10.2f} {e / n:>6.2f}")


if __name__ == "__main__":
    main()
