"""Pure parts of the SDK (no daemon): error mapping, request bodies, addresses."""

from __future__ import annotations

import io
import tarfile
from datetime import timedelta

import pytest

import sandlot
from sandlot import _spec, errors
from sandlot._tarsafe import extract_tar
from sandlot.client import resolve_url


@pytest.mark.parametrize(
    "status,code,field,cls",
    [
        (400, "bad_request", "resources.memory", sandlot.InvalidSpecError),
        (400, "bad_request", None, sandlot.BadRequestError),
        (400, "spawn_failed", None, sandlot.SpawnError),
        (400, "invalid_user", None, sandlot.InvalidUserError),
        (401, "unauthorized", None, sandlot.AuthError),
        (403, "permission_denied", None, sandlot.PermissionDeniedError),
        (404, "not_found", None, sandlot.NotFoundError),
        (405, "method_not_allowed", None, sandlot.MethodNotAllowedError),
        (409, "conflict", None, sandlot.ConflictError),
        (409, "already_exists", None, sandlot.AlreadyExistsError),
        (409, "not_a_directory", None, sandlot.NotADirectoryError_),
        (409, "is_a_directory", None, sandlot.IsADirectoryError_),
        (409, "directory_not_empty", None, sandlot.DirectoryNotEmptyError),
        (409, "process_exited", None, sandlot.ProcessExitedError),
        (410, "gone", None, sandlot.GoneError),
        (413, "payload_too_large", None, sandlot.PayloadTooLargeError),
        (429, "quota_exceeded", None, sandlot.QuotaExceededError),
        (500, "internal", None, sandlot.InternalError),
        (503, "unavailable", None, sandlot.UnavailableError),
        (503, "host_exhausted", None, sandlot.HostExhaustedError),
        (507, "no_space", None, sandlot.NoSpaceError),
        (403, "forbidden", None, sandlot.ForbiddenError),
        (409, "lifetime_exceeded", None, sandlot.LifetimeExceededError),
        (415, "unsupported_media_type", None, sandlot.UnsupportedMediaTypeError),
        (422, "build_failed", None, sandlot.BuildFailedError),
        (502, "bad_gateway", None, sandlot.BadGatewayError),
        (504, "timeout", None, sandlot.GatewayTimeoutError),
        (409, "some_new_code", None, sandlot.ConflictError),
        (502, "some_new_code", None, sandlot.InternalError),
        (418, "teapot", None, sandlot.APIError),
    ],
)
def test_error_mapping(status, code, field, cls):  # type: ignore[no-untyped-def]
    body = {"error": {"code": code, "message": "m", "request_id": "req_1", "field": field}}
    e = errors.from_body(status, body, None, "fallback")
    assert type(e) is cls
    assert (e.status, e.code, e.request_id, e.field, e.message) == (status, code, "req_1", field, "m")
    assert "req_1" in str(e) and code in str(e)


def test_secret_references():
    assert sandlot.secret_env("token", "API_TOKEN") == {"name": "token", "env": "API_TOKEN"}
    assert sandlot.secret_file("key", "/run/secrets/key") == {"name": "key", "path": "/run/secrets/key"}
    assert sandlot.secret_file("key", "/run/secrets/key", mode=0o440, uid=0, gid=2000) == {
        "name": "key",
        "path": "/run/secrets/key",
        "mode": "0440",
        "uid": 0,
        "gid": 2000,
    }
    assert sandlot.secret_file("key", "/run/secrets/key", mode="0400")["mode"] == "0400"


def test_error_without_json_body():
    e = errors.from_body(502, None, "req_9", "HTTP 502 from GET /x: bad gateway")
    assert isinstance(e, sandlot.InternalError) and e.request_id == "req_9" and "bad gateway" in e.message


def test_create_body_merges_spec_and_arguments():
    b = _spec.create_body(
        spec={"resources": {"pids": 64, "memory": "1G"}, "network": {"mode": "none"}, "future_field": {"x": 1}},
        memory="512M",
        cpus=1.5,
        timeout=timedelta(minutes=5),
        idle_timeout="30s",
        env={"A": "1"},
        tags={"t": "v"},
        volumes=[{"name": "data", "target": "/data"}],
        secrets={"API_KEY": "k"},
        isolation="gvisor",
    )
    assert b == {
        "resources": {"pids": 64, "memory": "512M", "cpus": 1.5},
        "network": {"mode": "none"},
        "future_field": {"x": 1},
        "timeout": 300.0,
        "idle_timeout": "30s",
        "env": {"A": "1"},
        "tags": {"t": "v"},
        "volumes": [{"name": "data", "target": "/data"}],
        "secrets": {"API_KEY": "k"},
        "isolation": "gvisor",
    }
    assert _spec.create_body() == {}
    with pytest.raises(TypeError):
        _spec.create_body(timeout=[1])  # type: ignore[arg-type]


def test_exec_and_list_bodies():
    assert _spec.argv_of(("ls", "-l")) == ["ls", "-l"] == _spec.argv_of((["ls", "-l"],))
    with pytest.raises(ValueError):
        _spec.argv_of(())
    with pytest.raises(TypeError):
        _spec.argv_of(("ls", 3))
    assert _spec.shell_argv("echo hi") == ["/bin/sh", "-c", "echo hi"]
    assert _spec.shell_argv(["echo", "hi"]) == ["echo", "hi"]
    assert _spec.exec_body(["x"], pty=True, stdin=True, timeout="5s", background=True) == {
        "argv": ["x"],
        "pty": {"rows": 24, "cols": 80},
        "timeout": "5s",
        "stdin": True,
        "background": True,
    }
    assert _spec.list_params({"a": "1", "b": None}, ["running", "stopped"], "n", 5) == [
        ("state", "running,stopped"),
        ("tag", "a=1"),
        ("tag", "b"),
        ("name", "n"),
        ("limit", "5"),
    ]
    assert _spec.mode_str(0o644) == "0644" and _spec.mode_str(0o4755) == "4755"


def test_addresses(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("SANDLOT_URL", raising=False)
    assert resolve_url(None) == ("http://sandlot", "/run/sandlot/sandlot.sock")
    assert resolve_url("unix:///tmp/s.sock") == ("http://sandlot", "/tmp/s.sock")
    assert resolve_url("127.0.0.1:7070") == ("http://127.0.0.1:7070", None)
    assert resolve_url("http://h:1/") == ("http://h:1", None)
    monkeypatch.setenv("SANDLOT_URL", "http://10.0.0.1:7070")
    assert resolve_url(None) == ("http://10.0.0.1:7070", None)
    with pytest.raises(ValueError):
        resolve_url("unix://relative.sock")


def test_tar_extraction_refuses_escapes(tmp_path):  # type: ignore[no-untyped-def]
    def tar_of(*members: "tuple[str, bytes]") -> io.BytesIO:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        buf.seek(0)
        return buf

    assert extract_tar(tar_of(("a/b.txt", b"ok")), str(tmp_path / "ok")) == ["a/b.txt"]
    assert (tmp_path / "ok" / "a" / "b.txt").read_bytes() == b"ok"
    for evil in ("../escape", "/abs/path", "a/../../escape"):
        with pytest.raises(ValueError, match="outside"):
            extract_tar(tar_of((evil, b"x")), str(tmp_path / "t"))
    assert not (tmp_path / "escape").exists()


def test_deny_rules_mean_open_mode_and_public_ports_are_a_spec_field():
    assert _spec.network_policy(deny=["203.0.113.0/24", "*.example.test:443"]) == {
        "mode": "open",
        "deny": [{"cidr": "203.0.113.0/24"}, {"domain": "*.example.test", "ports": [443]}],
    }
    assert _spec.network_policy(deny=["denied.test"], allow=["ok.denied.test"]) == {
        "mode": "open",
        "allow": [{"domain": "ok.denied.test"}],
        "deny": [{"domain": "denied.test"}],
    }
    assert _spec.network_policy(allow=["a.test"]) == {"mode": "allow", "allow": [{"domain": "a.test"}]}
    with pytest.raises(TypeError):
        _spec.network_policy(deny="a.test")
    assert _spec.create_body(public_ports=True) == {"ports": {"public": True}}
    p = sandlot.NetworkPolicy.from_json({"mode": "open", "deny": [{"cidr": "203.0.113.0/24"}]})
    assert (p.mode, p.allow, p.deny) == ("open", [], [{"cidr": "203.0.113.0/24"}])
