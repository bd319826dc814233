"""The image builder (``sandlot.Image``) against the real daemon: a base imported
from a small root filesystem (host programs and their libraries), a builder
chain built through ``POST /v1/images/build`` on first use by
``Sandbox.create(image=...)``, cached afterwards (same id, all steps cache hits
on the daemon), sync and async; a failing step raises ``BuildError``. No step
needs the network."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

import sandlot
import sandlot.image
from conftest import Daemon
from sandlot import AsyncClient, AsyncSandbox, BuildError, Image, Sandbox

PROGRAMS = ["sh", "cat", "echo", "pwd", "id", "true", "ls"]


def _mini_rootfs(root: Path) -> None:
    (root / "usr/bin").mkdir(parents=True)
    for link, target in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/bin")]:
        os.symlink(target, root / link)
    for d in ["etc", "tmp", "root", "proc", "sys", "dev", "srv"]:
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/tmp:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\nuser:x:1000:\n")
    libs = set()
    for p in PROGRAMS:
        src = shutil.which(p, path="/usr/bin:/bin")
        assert src, p
        shutil.copy2(src, root / "usr/bin" / p)
        out = subprocess.run(["ldd", src], capture_output=True, text=True).stdout
        for line in out.splitlines():
            path = line.split("=>")[-1].split()[0] if line.strip() else ""
            if path.startswith("/"):
                # Keep the name the binary asks for, under its real directory.
                libs.add(os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path)))
    for lib in libs:
        dst = root / lib.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dst)


@pytest.fixture(scope="module")
def base(daemon: Daemon, operator: sandlot.Client) -> Iterator[str]:
    d = daemon
    tmp = Path(tempfile.mkdtemp(prefix="sandlot-sdk-image-"))
    try:
        _mini_rootfs(tmp / "rootfs")
        r = subprocess.run(
            [d.bin, "image", "import", str(tmp / "rootfs"), "--tag", "pytest/base:1"],
            env={**os.environ, "SANDLOT_URL": d.unix_url, "SANDLOT_TOKEN": ""},
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        yield "pytest/base:1"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_builder_is_immutable_and_renders_toml() -> None:
    a = Image.debian("bookworm")
    b = a.env(A="1").workdir("/w").run("echo hi", "echo 'q\"'").user("1000")
    assert a.to_toml() == 'from = "debian:bookworm"\nnetwork = false\n'
    t = b.to_toml()
    assert 'env = { "A" = "1" }' in t and 'run = "echo \'q\\"\'"' in t and 'user = "1000"' in t
    # Installing packages is the explicit choice of network for the build.
    n = a.apt_install("git").pip_install("numpy")
    assert "network = true" in n.to_toml()
    assert 'apt_install = ["git"]' in n.to_toml()
    with pytest.raises(ValueError):
        a.apt_install()
    with pytest.raises(ValueError):
        a.apt_install("-o=evil")
    with pytest.raises(ValueError):
        a.workdir("relative")
    with pytest.raises(ValueError):
        Image.from_registry("127.0.0.1:1/x", username="u")


def test_sandbox_create_builds_on_first_use_and_caches(base: str, operator: sandlot.Client) -> None:
    img = Image.from_name(base).env(GREETING="hi there").workdir("/srv").run("echo built > /srv/out")
    sandlot.image._memo.clear()
    with Sandbox.create(image=img, client=operator, timeout=120) as sb:
        r = sb.run("cat out; pwd; echo $GREETING")
        assert r.stdout == "built\n/srv\nhi there\n", r
    first = img.build(client=operator)
    # Forget this process's memo: the daemon's step cache gives the same image.
    sandlot.image._memo.clear()
    assert img.build(client=operator) == first
    info = operator.json("GET", f"/v1/images/{first}")
    assert info["source"] == "build" and info["workdir"] == "/srv"
    # A tag names the result.
    assert img.build(client=operator, tag="pytest/built:1") == first
    assert "pytest/built:1" in operator.json("GET", "/v1/images/pytest/built:1")["tags"]


def test_failing_step_raises_build_error(base: str, operator: sandlot.Client) -> None:
    bad = Image.from_name(base).run("echo about to fail; exit 7")
    with pytest.raises(BuildError) as e:
        bad.build(client=operator)
    assert "exit code 7" in str(e.value) and "about to fail" in str(e.value)
    assert e.value.code == "build_failed", e.value.code
    with pytest.raises(BuildError) as e:
        Image.from_name("pytest/no-such:1").run("true").build(client=operator)
    assert "no image pytest/no-such:1" in str(e.value)


async def test_async_build_and_create(base: str, daemon: Daemon) -> None:
    async with AsyncClient(daemon.unix_url, token="") as c:
        img = Image.from_name(base).run("echo async > /srv/a")
        sandlot.image._memo.clear()
        async with await AsyncSandbox.create(image=img, client=c, timeout=120) as sb:
            r = await sb.run("cat /srv/a")
            assert r.stdout == "async\n"
        built = await img.abuild(client=c)
        sandlot.image._memo.clear()
        with sandlot.Client(daemon.unix_url, token="") as sync:
            assert img.build(client=sync) == built


def test_a_tenant_builds_over_tcp_and_the_image_is_its_own(base: str, acme: sandlot.Client, other: sandlot.Client) -> None:
    img = Image.from_name(base).env(WHO="acme").run("echo $WHO > /srv/who")
    sandlot.image._memo.clear()
    with Sandbox.create(image=img, client=acme, timeout=120) as sb:
        assert sb.run("cat /srv/who").stdout == "acme\n"
    built = img.build(client=acme, tag="pytest/tenant-built:1")
    info = acme.json("GET", "/v1/images/pytest/tenant-built:1")
    assert (info["id"], info["owner"]) == (built, "acme"), info
    with pytest.raises(sandlot.NotFoundError):
        other.json("GET", f"/v1/images/{built}")
