"""Request bodies and query strings, shared by the sync and async API. Pure: no I/O."""

from __future__ import annotations

import copy
import ipaddress
from datetime import timedelta
from typing import Any, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple, Union

Duration = Union[int, float, str, timedelta]
Size = Union[int, str]
#: What a sandbox's idle or lifetime timeout does (``on_idle``, ``on_timeout``):
#: end it, or pause it as :meth:`Sandbox.pause` would.
OnExpiry = Literal["kill", "pause"]

_UNSET: Any = object()


def duration(v: Duration) -> Union[int, float, str]:
    """Seconds (number), a string with a unit (``"10m"``), or a timedelta."""
    if isinstance(v, timedelta):
        return v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise TypeError(f"a duration is seconds, a string like '10m' or a timedelta, not {v!r}")
    return v


def mode_str(mode: Union[int, str]) -> str:
    """A file mode for the API: ``0o644`` → ``"0644"``; strings pass through."""
    if isinstance(mode, bool):
        raise TypeError(f"a file mode is an int like 0o644 or a string like '0644', not {mode!r}")
    if isinstance(mode, int):
        return format(mode, "04o")
    return mode


def image_ref(image: Union[str, Mapping[str, Any]]) -> str:
    """The API's ``image`` field: a name or id as it is, or the ``id`` of an image
    as the API returns it (what ``snapshot_filesystem()`` returns)."""
    if isinstance(image, str):
        return image
    if isinstance(image, Mapping) and isinstance(image.get("id"), str):
        return str(image["id"])
    raise TypeError(
        "image: a name, an id, an Image, or an image as the API returns it "
        f"(a dict with its 'id', e.g. what snapshot_filesystem() returns), not {image!r}"
    )


def create_body(
    *,
    image: Union[str, Mapping[str, Any], None] = None,
    rootfs: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    workdir: Optional[str] = None,
    user: Optional[str] = None,
    hostname: Optional[str] = None,
    isolation: Optional[str] = None,
    resources: Optional[Mapping[str, Any]] = None,
    cpus: Optional[float] = None,
    memory: Optional[Size] = None,
    pids: Optional[int] = None,
    disk: Optional[Size] = None,
    timeout: Optional[Duration] = None,
    idle_timeout: Optional[Duration] = None,
    on_idle: Optional[OnExpiry] = None,
    on_timeout: Optional[OnExpiry] = None,
    auto_resume: Optional[bool] = None,
    mounts: Optional[Sequence[Mapping[str, Any]]] = None,
    network: Any = None,
    public_ports: Optional[bool] = None,
    volumes: Any = None,
    secrets: Any = None,
    name: Optional[str] = None,
    tags: Optional[Mapping[str, str]] = None,
    metadata: Optional[Mapping[str, str]] = None,
    spec: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """The ``POST /v1/sandboxes`` body. ``spec`` is the base (any field the API
    knows, including ones newer than this SDK); explicit arguments override it;
    ``cpus``/``memory``/``pids``/``disk`` are merged into ``resources``. Values are
    passed as the API takes them; the daemon validates and names a bad field."""
    body: Dict[str, Any] = copy.deepcopy(dict(spec)) if spec else {}
    plain = {
        "image": None if image is None else image_ref(image),
        "rootfs": rootfs,
        "workdir": workdir,
        "user": user,
        "hostname": hostname,
        "isolation": isolation,
        "network": {"mode": network} if isinstance(network, str) else network,
        "volumes": volumes,
        "secrets": secrets,
        "name": name,
        "on_idle": on_idle,
        "on_timeout": on_timeout,
        "auto_resume": auto_resume,
    }
    for k, v in plain.items():
        if v is not None:
            body[k] = v
    if public_ports is not None:
        body["ports"] = {"public": bool(public_ports)}
    if env is not None:
        body["env"] = dict(env)
    if tags is not None:
        body["tags"] = dict(tags)
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if mounts is not None:
        body["mounts"] = [dict(m) for m in mounts]
    if timeout is not None:
        body["timeout"] = duration(timeout)
    if idle_timeout is not None:
        body["idle_timeout"] = duration(idle_timeout)
    res: Dict[str, Any] = dict(body.get("resources") or {})
    if resources is not None:
        res.update(resources)
    for k, v in (("cpus", cpus), ("memory", memory), ("pids", pids), ("disk", disk)):
        if v is not None:
            res[k] = v
    if res:
        body["resources"] = res
    return body


def collection_mount(
    collection: str,
    target: str,
    *,
    principal: Optional[str] = None,
    groups: Sequence[str] = (),
    all_access: bool = False,
    version: Optional[int] = None,
) -> Dict[str, Any]:
    """A ``mounts`` entry that mounts a collection of the caller's tenant read-only at
    ``target``: what ``principal`` (default ``anonymous``: public documents only) with
    ``groups`` may read, at ``version`` (default: the head when the sandbox is created;
    it is kept for the sandbox's life)."""
    if isinstance(groups, str):
        raise TypeError("groups= is a list of group names, not a string")
    m: Dict[str, Any] = {"type": "collection", "collection": collection, "target": target}
    if principal is not None:
        m["principal"] = principal
    if groups:
        m["groups"] = list(groups)
    if all_access:
        m["all_access"] = True
    if version is not None:
        m["version"] = version
    return m


def secret_env(name: str, env: str) -> Dict[str, Any]:
    """A ``secrets`` entry: secret ``name`` of the caller's tenant as variable ``env``."""
    return {"name": name, "env": env}


def secret_file(
    name: str,
    path: str,
    *,
    mode: Union[int, str, None] = None,
    uid: Optional[int] = None,
    gid: Optional[int] = None,
) -> Dict[str, Any]:
    """A ``secrets`` entry: secret ``name`` as the file ``path`` (directly under
    ``/run/secrets/``). The file belongs to the sandbox's user (the uid and primary
    group its commands run as: ``user=`` or the image's ``USER``) with mode 0400
    unless ``uid``, ``gid`` (0 to 65534) or ``mode`` (permission bits, at most
    ``0o777``: ``0o440`` or ``"0440"``) say otherwise."""
    s: Dict[str, Any] = {"name": name, "path": path}
    if mode is not None:
        s["mode"] = mode_str(mode)
    if uid is not None:
        s["uid"] = uid
    if gid is not None:
        s["gid"] = gid
    return s


def argv_of(args: Tuple[Any, ...]) -> List[str]:
    """``exec("ls", "-l")`` or ``exec(["ls", "-l"])``."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = tuple(args[0])
    if not args:
        raise ValueError("exec: give the command, e.g. exec('python3', '-c', 'print(1)')")
    out = []
    for a in args:
        if not isinstance(a, str):
            raise TypeError(f"exec: arguments are strings, got {a!r}")
        out.append(a)
    return out


def shell_argv(cmd: Union[str, Sequence[str]]) -> List[str]:
    """``run("echo hi")`` runs through ``/bin/sh -c``; a list is the argv itself."""
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    return argv_of((list(cmd),))


def pty_size(pty: Any) -> Optional[Dict[str, int]]:
    if pty is None or pty is False:
        return None
    if pty is True:
        return {"rows": 24, "cols": 80}
    if isinstance(pty, (tuple, list)) and len(pty) == 2:
        return {"rows": int(pty[0]), "cols": int(pty[1])}
    if isinstance(pty, Mapping):
        return {"rows": int(pty["rows"]), "cols": int(pty["cols"])}
    raise TypeError(f"pty is True, (rows, cols) or {{'rows': R, 'cols': C}}, not {pty!r}")


def exec_body(
    argv: List[str],
    *,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
    pty: Any = None,
    timeout: Optional[Duration] = None,
    stdin: bool = False,
    tag: Optional[str] = None,
    background: bool = False,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"argv": argv}
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        body["user"] = user
    size = pty_size(pty)
    if size is not None:
        body["pty"] = size
    if timeout is not None:
        body["timeout"] = duration(timeout)
    if stdin:
        body["stdin"] = True
    if tag is not None:
        body["tag"] = tag
    if background:
        body["background"] = True
    return body


def list_params(
    tags: Union[Mapping[str, Optional[str]], Iterable[str], None],
    state: Union[str, Iterable[str], None],
    name: Optional[str],
    limit: Optional[int],
) -> List[Tuple[str, str]]:
    """Query of ``GET /v1/sandboxes``: ``tags={"user": "u1", "team": None}`` means
    tag user=u1 and "has the tag team"; a list of keys means "has these tags"."""
    q: List[Tuple[str, str]] = []
    if state is not None:
        q.append(("state", state if isinstance(state, str) else ",".join(state)))
    if tags is not None:
        if isinstance(tags, Mapping):
            for k, v in tags.items():
                q.append(("tag", k if v is None else f"{k}={v}"))
        else:
            for k in tags:
                q.append(("tag", k))
    if name is not None:
        q.append(("name", name))
    if limit is not None:
        q.append(("limit", str(limit)))
    return q


def stdin_bytes(data: Union[bytes, bytearray, memoryview, str]) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"stdin data is bytes or str, not {type(data).__name__}")


def volume_mount(name: str, target: str, *, read_only: bool = False) -> Dict[str, Any]:
    """A ``volumes`` entry: volume ``name`` of the caller's tenant at ``target``."""
    v: Dict[str, Any] = {"name": name, "target": target}
    if read_only:
        v["read_only"] = True
    return v


def allow_rule(rule: Union[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """One destination of an ``allow`` policy. A string reads as the CLI's
    ``--allow``: ``api.example.com``, ``*.example.com:443``, ``203.0.113.0/24:22,80``
    (a CIDR or an address is a ``cidr``, anything else a ``domain``); a mapping is
    the API's rule as it is."""
    if isinstance(rule, Mapping):
        return dict(rule)
    if not isinstance(rule, str):
        raise TypeError(f"an allow rule is a string like 'api.example.com:443' or a dict, not {rule!r}")
    dest, ports = rule, ""
    head, sep, tail = rule.rpartition(":")
    # A bare IPv6 address or prefix has colons of its own.
    if sep and tail and all(c.isdigit() or c == "," for c in tail) and ":" not in head:
        dest, ports = head, tail
    if not dest:
        raise ValueError(f"allow rule {rule!r}: give a domain or a CIDR")
    r: Dict[str, Any]
    try:
        ipaddress.ip_network(dest, strict=False)
        r = {"cidr": dest}
    except ValueError:
        r = {"domain": dest.lower()}
    if ports:
        nums = []
        for p in ports.split(","):
            if not p.isdigit() or not 1 <= int(p) <= 65535:
                raise ValueError(f"allow rule {rule!r}: {p!r} is not a port")
            nums.append(int(p))
        r["ports"] = nums
    return r


def network_policy(
    mode: Optional[str] = None,
    allow: Optional[Iterable[Union[str, Mapping[str, Any]]]] = None,
    deny: Optional[Iterable[Union[str, Mapping[str, Any]]]] = None,
) -> Dict[str, Any]:
    """A ``network`` body: ``allow`` rules alone mean mode ``allow``; ``deny`` rules
    mean mode ``open`` (everything but them, ``allow`` rules winning over them)."""
    for name, rules_in in (("allow", allow), ("deny", deny)):
        if isinstance(rules_in, (str, Mapping)):
            raise TypeError(f"{name}= is a list of rules, e.g. ['api.example.com:443']")
    rules = [allow_rule(r) for r in allow] if allow is not None else []
    denied = [allow_rule(r) for r in deny] if deny is not None else []
    if mode is None:
        if deny is not None:
            mode = "open"
        elif allow is not None:
            mode = "allow"
        else:
            raise ValueError("a network policy needs mode= ('none', 'allow', 'open'), allow= or deny= rules")
    body: Dict[str, Any] = {"mode": mode}
    if rules:
        body["allow"] = rules
    if denied:
        body["deny"] = denied
    return body
