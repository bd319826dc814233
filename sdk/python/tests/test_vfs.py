"""Document collections and virtual shell sessions end to end."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

import sandlot
from sandlot import AsyncCollection, Collection


def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    (root / "docs").mkdir(parents=True)
    (root / "internal").mkdir()
    (root / ".git").mkdir()
    (root / "docs" / "guide.md").write_text("# Guide\nThe API has a rate limit of 10 requests.\n")
    (root / "docs" / "faq.md").write_text("Q: what is the rate limit?\n")
    (root / "internal" / "secret.md").write_text("rate limit bypass: hunter2\n")
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "README.md").write_text("hello\n")
    return root


def name() -> str:
    return f"col-{uuid.uuid4().hex[:8]}"


def test_collection_session_acl_cwd_and_audit(acme: sandlot.Client, tmp_path: Path) -> None:
    n = name()
    col = Collection.create(n, from_dir=site(tmp_path), acl={"internal/**": "group:eng"}, client=acme)
    try:
        assert (col.name, col.version, col.info.documents, col.info.source) == (n, 1, 4, "upload:tar")
        assert col.last_ingest is not None and col.last_ingest.added == 4
        assert n in [c.name for c in Collection.list(client=acme)]
        with col.session("alice") as sh:
            r = sh.run("ls /")
            assert (r.stdout, r.exit_code, r.ok) == ("README.md\ndocs\n", 0, True)
            r = sh.run("grep -rn 'rate limit' / | head")
            assert r.stdout == (
                "/docs/faq.md:1:Q: what is the rate limit?\n/docs/guide.md:2:The API has a rate limit of 10 requests.\n"
            )
            r = sh.run("cat /internal/secret.md")
            assert r.exit_code == 1 and "No such file or directory" in r.stderr
            assert sh.run("cd docs").cwd == "/docs"
            assert sh.run("ls").stdout == "faq.md\nguide.md\n"
            r = sh.run("touch x")
            assert r.exit_code == 1 and "Read-only file system" in r.stderr
            info = sh.refresh()
            assert (info.cwd, info.commands_run, info.documents, info.principal) == ("/docs", 6, 3, "alice")
            sid = sh.id
        # The context manager closed it.
        with pytest.raises(sandlot.NotFoundError):
            ShellSessionProbe(col, sid).run("ls")
        with col.session("bob", groups=["eng"]) as sh:
            assert sh.run("grep -rl hunter2 /").stdout == "/internal/secret.md\n"
        recs = col.audit()
        assert [r.principal for r in recs] == ["alice"] * 6 + ["bob"]
        assert recs[0].command == "ls /" and recs[0].session == sid
        assert len(col.audit(principal="bob")) == 1 and len(col.audit(last=2)) == 2
        # Re-ingest: unchanged, then one edit makes v2.
        assert not col.update(from_dir=tmp_path / "site").changed
        (tmp_path / "site" / "README.md").write_text("hello again\n")
        rep = col.update(from_dir=tmp_path / "site")
        assert (rep.changed, rep.version, rep.updated) == (True, 2, 1)
        assert Collection.get(n, client=acme).version == 2
    finally:
        col.delete()
    with pytest.raises(sandlot.NotFoundError):
        Collection.get(n, client=acme)


class ShellSessionProbe:
    """Runs in a session by id (to prove a closed one is gone)."""

    def __init__(self, col: Collection, sid: str) -> None:
        self.col, self.sid = col, sid

    def run(self, command: str) -> object:
        return self.col.client.json("POST", f"/v1/vfs/{self.col.name}/sessions/{self.sid}/run", json={"command": command})


def test_collections_are_per_tenant(acme: sandlot.Client, other: sandlot.Client, tmp_path: Path) -> None:
    n = name()
    col = Collection.create(n, from_dir=site(tmp_path), default_acl="public", client=acme)
    try:
        sh = col.session("alice", groups=["eng"])
        with pytest.raises(sandlot.NotFoundError):
            Collection.get(n, client=other)
        assert n not in [c.name for c in Collection.list(client=other)]
        theirs = Collection(col.info, other)
        with pytest.raises(sandlot.NotFoundError):
            theirs.session("mallory")
        with pytest.raises(sandlot.NotFoundError):
            ShellSessionProbe(theirs, sh.id).run("cat /internal/secret.md")
        with pytest.raises(sandlot.NotFoundError):
            theirs.audit()
        with pytest.raises(sandlot.NotFoundError):
            theirs.delete()
        assert sh.run("cat /internal/secret.md").stdout == "rate limit bypass: hunter2\n"
        sh.close()
        sh.close()  # idempotent
    finally:
        col.delete()


def test_jsonl_upload_and_bad_input(acme: sandlot.Client, tmp_path: Path) -> None:
    rows = [
        {"path": "kb/a.md", "chunk": 1, "text": "second\n"},
        {"path": "kb/a.md", "chunk": 0, "text": "first\n"},
        {"path": "kb/hr.md", "chunk": 0, "text": "salaries\n", "metadata": {"groups": ["hr"]}},
    ]
    f = tmp_path / "export.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    n = name()
    col = Collection.create(n, from_jsonl=f, client=acme)
    try:
        assert col.info.source == "upload:jsonl"
        with col.session("x") as sh:
            assert sh.run("cat kb/a.md; ls kb").stdout == "first\nsecond\na.md\n"
        with col.session("h", groups=["hr"]) as sh:
            assert sh.run("ls kb").stdout == "a.md\nhr.md\n"
        with pytest.raises(sandlot.AlreadyExistsError):
            Collection.create(n, from_jsonl=f, client=acme)
        with pytest.raises(sandlot.InvalidSpecError) as ei:
            col.session("a b")
        assert ei.value.field == "principal"
        with pytest.raises(sandlot.InvalidSpecError) as ei:
            Collection.create(name(), from_jsonl=f, acl={"x/**": "group:a b"}, client=acme)
        assert ei.value.field == "acl.rules[0].acl"
        with pytest.raises(sandlot.PermissionDeniedError):
            Collection.create(name(), source={"kind": "dir", "path": str(tmp_path)}, client=acme)
        with pytest.raises(ValueError):
            Collection.create(name(), client=acme)
        with pytest.raises(TypeError):
            col.session("a", groups="eng")
    finally:
        col.delete()


async def test_async_collection_session_and_acl(aacme: sandlot.AsyncClient, tmp_path: Path) -> None:
    n = name()
    col = await AsyncCollection.create(n, from_dir=site(tmp_path), acl={"internal/**": "group:eng"}, client=aacme)
    try:
        assert col.info.documents == 4
        async with await col.session("alice") as sh:
            r = await sh.run("find / -name '*.md' | sort")
            assert r.stdout == "/README.md\n/docs/faq.md\n/docs/guide.md\n"
            await sh.run("cd /docs")
            assert (await sh.run("pwd")).stdout == "/docs\n"
        assert sh.closed
        assert [c.name for c in await AsyncCollection.list(client=aacme)].count(n) == 1
        assert (await AsyncCollection.get(n, client=aacme)).version == 1
        assert len(await col.audit()) == 3
        rep = await col.update(from_dir=tmp_path / "site")
        assert not rep.changed
    finally:
        await col.delete()


def test_scratch_session_is_private_and_bounded(acme: sandlot.Client, tmp_path: Path) -> None:
    n = name()
    col = Collection.create(n, from_dir=site(tmp_path), acl={"internal/**": "group:eng"}, client=acme)
    try:
        with col.session("alice", scratch=True) as a, col.session("bob") as b:
            assert a.info.scratch is not None and a.info.scratch["used_bytes"] == 0
            assert b.info.scratch is None
            r = a.run("mkdir -p /notes && echo 'rate limit: 5/s' > /notes/todo.md && rm /docs/faq.md && ls /")
            assert (r.stdout, r.stderr, r.exit_code) == ("README.md\ndocs\nnotes\n", "", 0)
            # grep sees the new file and no longer the removed one.
            assert a.run("grep -rl 'rate limit' / | sort").stdout == "/docs/guide.md\n/notes/todo.md\n"
            # A pruned name is just free: writing it creates a scratch file, revealing nothing.
            r = a.run("mkdir /internal && echo mine > /internal/secret.md && cat /internal/secret.md")
            assert (r.stdout, r.exit_code) == ("mine\n", 0)
            assert a.run("grep -r hunter2 /").exit_code == 1
            assert a.refresh().scratch["used_bytes"] == len("rate limit: 5/s\n") + len("mine\n")
            # Another session and the collection are untouched.
            assert b.run("ls /; cat /docs/faq.md").stdout == "README.md\ndocs\nQ: what is the rate limit?\n"
            r = b.run("echo x > /x")
            assert r.exit_code == 1 and r.stderr.endswith("/x: Read-only file system\n")
        with col.session("carol", scratch=64) as c:
            assert c.info.scratch["max_bytes"] == 64
            r = c.run("seq 100 > /big; wc -c < /big")
            assert (r.stdout, r.stderr, r.exit_code) == ("64\n", "seq: write error: No space left on device\n", 0)
            assert c.run("ls /").stdout == "README.md\nbig\ndocs\n"
        # A new session starts from the collection again.
        with col.session("alice", scratch=True) as a2:
            assert a2.run("ls /").stdout == "README.md\ndocs\n"
        with pytest.raises(sandlot.InvalidSpecError) as ei:
            col.session("x", scratch=1 << 40)
        assert ei.value.field == "scratch_max_bytes"
        with pytest.raises(ValueError):
            col.session("x", scratch=0)
    finally:
        col.delete()


def _fuse_mounts_under(d: Path) -> list:
    d = d.resolve()
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            mp = pre.split(" ")[4]
            if post.startswith("fuse") and Path(mp).is_relative_to(d):
                out.append(mp)
    return out


def test_collection_mounted_into_a_sandbox(
    acme: sandlot.Client, other: sandlot.Client, daemon: object, tmp_path: Path
) -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.skip("SKIPPED: /dev/fuse is missing on this machine; collection mounts need the fuse module")
    n = name()
    col = Collection.create(n, from_dir=site(tmp_path), acl={"internal/**": "group:eng"}, client=acme)
    mounts_dir = daemon.data_dir / "vfs-mounts"  # type: ignore[attr-defined]
    try:
        assert col.mount("/docs") == {"type": "collection", "collection": n, "target": "/docs"}
        assert sandlot.collection_mount(n, "/e", principal="bob", groups=["eng"], version=1) == {
            "type": "collection",
            "collection": n,
            "target": "/e",
            "principal": "bob",
            "groups": ["eng"],
            "version": 1,
        }
        with pytest.raises(TypeError):
            col.mount("/docs", groups="eng")
        mounts = [col.mount("/docs"), col.mount("/eng", principal="bob", groups=["eng"])]
        with sandlot.Sandbox.create(client=acme, timeout=120, mounts=mounts) as sb:
            # The version is pinned in the sandbox's spec.
            assert [m["version"] for m in sb.info.spec["mounts"]] == [1, 1]
            # A glob, not `ls`: coreutils' statx flags are EINVAL to Debian 12's gVisor.
            assert sb.run("for f in /docs/*; do echo ${f#/docs/}; done").stdout == "README.md\ndocs\n"
            assert sb.run("grep -rn 'rate limit' /docs | sort").stdout == (
                "/docs/docs/faq.md:1:Q: what is the rate limit?\n"
                "/docs/docs/guide.md:2:The API has a rate limit of 10 requests.\n"
            )
            r = sb.run("cat /docs/internal/secret.md")
            assert r.exit_code != 0 and "No such file or directory" in r.stderr
            assert sb.run("cat /eng/internal/secret.md").stdout == "rate limit bypass: hunter2\n"
            walk = "import os; print(sorted(os.path.join(r, f) for r, _, fs in os.walk('/docs') for f in fs))"
            assert sb.run(["python3", "-c", walk]).stdout == (
                "['/docs/README.md', '/docs/docs/faq.md', '/docs/docs/guide.md']\n"
            )
            r = sb.run("echo x > /docs/README.md")
            assert r.exit_code != 0 and "Read-only file system" in r.stderr
            # A collection a sandbox mounts cannot be removed.
            with pytest.raises(sandlot.ConflictError):
                col.delete()
            assert len(_fuse_mounts_under(mounts_dir / sb.id)) == 2
            sid = sb.id
        # Terminated with the block: its mounts and their directory go right after
        # (the host clean-up runs once the sandbox is recorded as stopped).
        deadline = time.monotonic() + 10
        while (mounts_dir / sid).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _fuse_mounts_under(mounts_dir / sid) == []
        assert not (mounts_dir / sid).exists()
        # Another tenant cannot mount it: for them it does not exist.
        with pytest.raises(sandlot.InvalidSpecError) as ei:
            sandlot.Sandbox.create(client=other, timeout=60, mounts=[col.mount("/docs")])
        assert ei.value.field == "mounts[0].collection"
    finally:
        col.delete()
