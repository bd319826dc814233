"""Files through the sync API end to end."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

import sandlot


def test_write_read_bytes_text_and_modes(sb):  # type: ignore[no-untyped-def]
    f = sb.files
    assert f.write("/home/user/a.txt", b"data") == 4
    assert f.read("/home/user/a.txt") == b"data"
    f.write("/tmp/deep/new/dirs/t.txt", "héllo\n")  # parents created, str is UTF-8
    assert f.read_text("/tmp/deep/new/dirs/t.txt") == "héllo\n"
    f.write("/tmp/deep/new/dirs/t.txt", " more", append=True)
    assert f.read_text("/tmp/deep/new/dirs/t.txt") == "héllo\n more"
    assert f.read("/tmp/deep/new/dirs/t.txt", offset=1, length=4) == "héllo".encode()[1:5]
    f.write("/tmp/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    st = f.stat("/tmp/run.sh")
    assert (st.kind, st.mode, st.size, st.is_file) == ("file", 0o755, 19, True)
    assert sb.run("/tmp/run.sh").stdout == "ran\n"
    f.write("/tmp/m.txt", b"x", mode="0600")
    assert f.stat("/tmp/m.txt").mode == 0o600
    # Binary exactness both ways, with a file written inside the sandbox.
    blob = bytes(range(256)) * 4096
    f.write("/tmp/blob.bin", blob)
    assert sb.run("sha256sum /tmp/blob.bin").stdout.split()[0] == hashlib.sha256(blob).hexdigest()
    sb.run("head -c 100000 /dev/urandom > /tmp/rand.bin", check=True)
    assert len(f.read("/tmp/rand.bin")) == 100000
    # Streaming sources: a generator of chunks and a file object.
    f.write("/tmp/gen.bin", (bytes([i]) * 70000 for i in range(10)))
    assert f.stat("/tmp/gen.bin").size == 700000
    assert b"".join(f.iter_read("/tmp/gen.bin", chunk_size=4096)) == b"".join(bytes([i]) * 70000 for i in range(10))


def test_stat_exists_list_mkdir_remove_rename(sb):  # type: ignore[no-untyped-def]
    f = sb.files
    assert not f.exists("/work/x")
    with pytest.raises(sandlot.NotFoundError) as e:
        f.stat("/work/x")
    assert e.value.status == 404 and "/work/x" in e.value.message
    with pytest.raises(sandlot.NotFoundError):
        f.read("/work/x")
    with pytest.raises(sandlot.NotFoundError):
        f.mkdir("/work/x/y")  # parents=False
    f.mkdir("/work/x/y", parents=True, mode=0o700)
    assert f.exists("/work/x/y") and f.stat("/work/x/y").is_dir
    assert f.stat("/work/x/y").mode == 0o700
    with pytest.raises(sandlot.AlreadyExistsError):
        f.mkdir("/work/x/y")
    f.write("/work/x/a.txt", b"a")
    f.write("/work/x/y/b.txt", b"b")
    sb.run("ln -s a.txt /work/x/link", check=True)
    top = f.list("/work/x")
    assert [(e.name, e.kind, e.depth) for e in top] == [
        ("a.txt", "file", 1),
        ("link", "symlink", 1),
        ("y", "dir", 1),
    ]
    assert top[1].symlink_target == "a.txt"
    assert f.stat("/work/x/link", follow=True).is_file
    deep = [e.path for e in f.list("/work/x", depth=2)]
    assert "/work/x/y/b.txt" in deep
    with pytest.raises(sandlot.NotADirectoryError_):
        f.list("/work/x/a.txt")
    # Rename across directories (the guest used to fail with EXDEV), and overwrite rules.
    f.rename("/work/x/y/b.txt", "/work/x/b2.txt")
    assert f.read("/work/x/b2.txt") == b"b" and not f.exists("/work/x/y/b.txt")
    f.mkdir("/srv/other", parents=True)
    f.rename("/work/x/y", "/srv/other/y")
    assert f.exists("/srv/other/y") and not f.exists("/work/x/y")
    with pytest.raises(sandlot.AlreadyExistsError):
        f.rename("/work/x/a.txt", "/work/x/b2.txt", overwrite=False)
    f.rename("/work/x/a.txt", "/work/x/b2.txt")
    assert f.read("/work/x/b2.txt") == b"a"
    with pytest.raises(sandlot.DirectoryNotEmptyError):
        f.remove("/work/x")
    f.remove("/work/x/b2.txt")
    f.remove("/work/x", recursive=True)
    assert not f.exists("/work/x")
    with pytest.raises(sandlot.InvalidSpecError) as e:
        f.read("relative/path")
    assert e.value.field == "path"


def test_permission_denied_as_user(acme):  # type: ignore[no-untyped-def]
    with sandlot.Sandbox.create(client=acme, user="user") as sb:
        sb.files.write("/home/user/mine.txt", b"ok")
        assert sb.files.stat("/home/user/mine.txt").uid == 1000
        with pytest.raises(sandlot.PermissionDeniedError) as e:
            sb.files.write("/etc/owned-by-root", b"x")
        assert e.value.status == 403


def test_upload_download_files_and_dirs(sb, tmp_path):  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("X = 1\n")
    (src / "pkg" / "sub" / "data.bin").write_bytes(os.urandom(300_000))
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o750)
    r = sb.files.upload_dir(src, "/work/project")
    assert (r.files, r.dirs >= 2, r.skipped) == (3, True, [])
    assert sb.run("cd /work/project && python3 -c 'import pkg; print(pkg.X)'").stdout == "1\n"
    assert sb.files.stat("/work/project/run.sh").mode & 0o777 == 0o750
    sb.run("mkdir -p /work/project/out && echo result > /work/project/out/r.txt", check=True)
    dst = tmp_path / "dst"
    names = sb.files.download_dir("/work/project", dst)
    assert any(n.endswith("out/r.txt") for n in names)
    assert (dst / "out" / "r.txt").read_text() == "result\n"
    assert (dst / "pkg" / "sub" / "data.bin").read_bytes() == (src / "pkg" / "sub" / "data.bin").read_bytes()
    # Single files, streamed.
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(5 * 1024 * 1024 + 3))
    assert sb.files.upload(big, "/tmp/big.bin") == big.stat().st_size
    back = tmp_path / "back.bin"
    assert sb.files.download("/tmp/big.bin", back) == big.stat().st_size
    assert back.read_bytes() == big.read_bytes()
    with pytest.raises(sandlot.NotFoundError):
        sb.files.download("/tmp/none", tmp_path / "none")
    assert not (tmp_path / "none").exists() and not (tmp_path / "none.sandlot-partial").exists()


def test_watch(sb):  # type: ignore[no-untyped-def]
    sb.files.mkdir("/tmp/w")
    seen = []
    with sb.files.watch("/tmp/w", recursive=True) as w:
        done = threading.Event()

        def collect() -> None:
            for ev in w:
                seen.append(ev)
                if ev.path and ev.path.endswith("second.txt"):
                    done.set()
                    return

        t = threading.Thread(target=collect, daemon=True)
        t.start()
        sb.files.write("/tmp/w/first.txt", b"1")
        sb.run("mkdir -p /tmp/w/d && echo 2 > /tmp/w/d/second.txt", check=True)
        assert done.wait(15), seen
    paths = [e.path for e in seen]
    assert "/tmp/w/first.txt" in paths and "/tmp/w/d/second.txt" in paths, seen
    assert {e.kind for e in seen} <= {"create", "modify", "rename", "delete", "overflow"}
