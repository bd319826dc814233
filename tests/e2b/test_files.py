"""files.* through envd's filesystem service and /files."""

import os
import time

import pytest
from e2b import FileNotFoundException, FileType, FilesystemEventType, SandboxException
from e2b.sandbox.filesystem.filesystem import WriteEntry


def test_write_read_text_bytes_stream(sbx):
    info = sbx.files.write("notes/hello.txt", "hello world")
    assert info.path == "/home/user/notes/hello.txt" and info.name == "hello.txt"
    assert sbx.files.read("/home/user/notes/hello.txt") == "hello world"
    data = os.urandom(3 * 1024 * 1024 + 17)
    sbx.files.write("/tmp/blob.bin", data)
    assert bytes(sbx.files.read("/tmp/blob.bin", format="bytes")) == data
    with sbx.files.read("/tmp/blob.bin", format="stream") as s:
        assert b"".join(s) == data
    # Written as the default user, in its home.
    assert sbx.files.get_info("notes/hello.txt").owner == "user"
    assert sbx.commands.run("cat ~/notes/hello.txt").stdout == "hello world"


def test_write_many_creates_parents(sbx):
    written = sbx.files.write_files(
        [
            WriteEntry(path="/tmp/many/a/one.txt", data="1"),
            WriteEntry(path="/tmp/many/b/c/two.txt", data=b"22"),
            WriteEntry(path="/tmp/many/three.txt", data="333"),
        ]
    )
    assert sorted(w.path for w in written) == ["/tmp/many/a/one.txt", "/tmp/many/b/c/two.txt", "/tmp/many/three.txt"]
    assert sbx.files.read("/tmp/many/b/c/two.txt") == "22"
    top = {e.name: e for e in sbx.files.list("/tmp/many")}
    assert set(top) == {"a", "b", "three.txt"}
    assert top["a"].type == FileType.DIR and top["three.txt"].type == FileType.FILE
    assert top["three.txt"].size == 3
    deep = {e.path for e in sbx.files.list("/tmp/many", depth=3)}
    assert {"/tmp/many/a/one.txt", "/tmp/many/b/c", "/tmp/many/b/c/two.txt"} <= deep


def test_exists_info_rename_remove_make_dir(sbx):
    assert not sbx.files.exists("/tmp/x")
    assert sbx.files.make_dir("/tmp/x/y") is True
    assert sbx.files.make_dir("/tmp/x/y") is False
    assert sbx.files.exists("/tmp/x/y")
    sbx.files.write("/tmp/x/f.txt", "abc")
    i = sbx.files.get_info("/tmp/x/f.txt")
    assert (i.type, i.size, i.name, i.path) == (FileType.FILE, 3, "f.txt", "/tmp/x/f.txt")
    assert i.permissions.startswith("-rw")
    d = sbx.files.get_info("/tmp/x/y")
    assert d.type == FileType.DIR and d.permissions.startswith("d")
    moved = sbx.files.rename("/tmp/x/f.txt", "/tmp/x/y/g.txt")
    assert moved.path == "/tmp/x/y/g.txt"
    assert not sbx.files.exists("/tmp/x/f.txt")
    assert sbx.files.read("/tmp/x/y/g.txt") == "abc"
    # Like envd: a rename creates the destination's parents.
    sbx.files.rename("/tmp/x/y/g.txt", "/tmp/x/new/deeper/g.txt")
    assert sbx.files.read("/tmp/x/new/deeper/g.txt") == "abc"
    sbx.files.remove("/tmp/x")
    assert not sbx.files.exists("/tmp/x")
    # ...and removing what is not there succeeds, as with envd.
    sbx.files.remove("/tmp/x")
    with pytest.raises(FileNotFoundException):
        sbx.files.rename("/tmp/x", "/tmp/elsewhere")


def test_missing_files_and_users(sbx):
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/tmp/missing")
    with pytest.raises(FileNotFoundException):
        sbx.files.get_info("/tmp/missing")
    with pytest.raises(FileNotFoundException):
        sbx.files.list("/tmp/missing")
    with pytest.raises(SandboxException):
        sbx.files.write("/root/secret.txt", "no")
    sbx.files.write("/root/ok.txt", "yes", user="root")
    assert sbx.files.read("/root/ok.txt", user="root") == "yes"
    assert sbx.files.get_info("/root/ok.txt", user="root").owner == "root"


def test_watch_dir_polled(sbx):
    sbx.files.make_dir("/tmp/w")
    h = sbx.files.watch_dir("/tmp/w")
    sbx.files.write("/tmp/w/new.txt", "x")
    sbx.commands.run("echo more >> /tmp/w/new.txt; mv /tmp/w/new.txt /tmp/w/moved.txt; rm /tmp/w/moved.txt")
    seen = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        seen += [(e.name, e.type) for e in h.get_new_events()]
        if ("moved.txt", FilesystemEventType.REMOVE) in seen:
            break
        time.sleep(0.1)
    h.stop()
    assert ("new.txt", FilesystemEventType.CREATE) in seen, seen
    assert ("new.txt", FilesystemEventType.WRITE) in seen, seen
    assert ("new.txt", FilesystemEventType.RENAME) in seen, seen
    assert ("moved.txt", FilesystemEventType.REMOVE) in seen, seen


def test_streamed_upload_of_a_file_object(sbx):
    import io

    data = os.urandom(2 * 1024 * 1024)
    info = sbx.files.write("/tmp/streamed.bin", io.BytesIO(data))
    assert info.path == "/tmp/streamed.bin"
    assert bytes(sbx.files.read("/tmp/streamed.bin", format="bytes")) == data
    # `wc -c`, not `stat`: coreutils' statx flags are EINVAL to gVisor's older kernels.
    assert sbx.commands.run("wc -c < /tmp/streamed.bin").stdout.strip() == str(len(data))


def test_gzip_uploads_are_refused_with_a_typed_error(sbx):
    from e2b import InvalidArgumentException

    with pytest.raises(InvalidArgumentException, match="gzip"):
        sbx.files.write("/tmp/z.txt", "zipped?", gzip=True)
    assert not sbx.files.exists("/tmp/z.txt")
