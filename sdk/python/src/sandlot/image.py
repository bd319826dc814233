"""Declarative images: ``Image.debian().apt_install("git").pip_install("numpy")``.

An ``Image`` is an immutable description (each method returns a new one). It is
built through the daemon's ``POST /v1/images/build`` (a Sandlot TOML build spec)
the first time it is used, e.g. by ``Sandbox.create(image=img)``; the daemon
caches every step by hash(parent, step), so building it again is all cache hits,
and this process also remembers the result per client. ``Image.from_registry``
pulls through ``POST /v1/images/pull`` first.

``apt_install`` and ``pip_install`` download packages: calling them is the
explicit choice to give the build's ``run`` steps the network (other builds have
none). Pulling and importing change the daemon's shared image set and are the
operator's (the Unix socket); a tenant's build (over TCP) makes images of its own,
tagged in its own namespace, on the operator's build limits.
"""

from __future__ import annotations

import io
import json
import tarfile
import threading
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from . import errors
from .client import AsyncClient, Client, default_async_client, default_client

__all__ = ["Image", "BuildError"]


class BuildError(errors.SandlotError):
    """A build or pull failed; ``code`` is the daemon's error code (for example
    ``build_failed`` for a step whose command failed, ``bad_request`` for a bad
    spec, ``digest_mismatch`` for a pull)."""

    def __init__(self, message: str, code: str = "build_failed") -> None:
        super().__init__(message)
        self.code = code


def _toml_str(s: str) -> str:
    # A TOML basic string is a JSON string minus a few escapes JSON never emits.
    return json.dumps(s, ensure_ascii=False)


_Step = Tuple[str, Any]

_memo: Dict[Tuple[str, str], str] = {}
_memo_lock = threading.Lock()


class Image:
    """An image description. Start with ``Image.debian()``, ``Image.from_registry()``
    or ``Image.from_name()``; add steps with ``run``, ``env``, ``workdir``, ``user``,
    ``apt_install`` and ``pip_install``."""

    __slots__ = ("_base", "_steps", "_network", "_pull")

    def __init__(
        self,
        base: str,
        steps: Tuple[_Step, ...] = (),
        network: bool = False,
        pull: Optional[Dict[str, Any]] = None,
    ) -> None:
        if not base:
            raise ValueError("an image needs a base")
        self._base = base
        self._steps = steps
        self._network = network
        self._pull = pull

    # --- bases -------------------------------------------------------------

    @classmethod
    def debian(cls, suite: str = "bookworm") -> "Image":
        """A minimal Debian ``suite``, built once by the daemon with mmdebstrap
        from the host's own apt sources and cached as ``debian:SUITE``."""
        return cls(f"debian:{suite}")

    @classmethod
    def from_name(cls, name: str) -> "Image":
        """An image already in the daemon's store (``NAME[:TAG]`` or an id)."""
        return cls(name)

    @classmethod
    def from_registry(
        cls,
        reference: str,
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
    ) -> "Image":
        """An image pulled from an OCI registry (``HOST[:PORT]/PATH[:TAG]`` or
        ``...@sha256:...``) on first use. Credentials go to the daemon for this
        pull only (default: the daemon's ``images.auth_file``)."""
        pull: Dict[str, Any] = {"reference": reference}
        if username is not None:
            if password is None:
                raise ValueError("username needs a password")
            pull["auth"] = {"username": username, "password": password}
        return cls(reference, pull=pull)

    # --- steps -------------------------------------------------------------

    def _with(self, step: _Step, network: bool = False) -> "Image":
        return Image(self._base, self._steps + (step,), self._network or network, self._pull)

    def run(self, *commands: str) -> "Image":
        """Runs each shell command (``/bin/sh -c``) in a sandbox; each is a layer."""
        img = self
        for c in commands:
            if not isinstance(c, str) or not c.strip():
                raise ValueError(f"run: {c!r} is not a command")
            img = img._with(("run", c))
        return img

    def env(self, vars: Optional[Mapping[str, str]] = None, **kw: str) -> "Image":
        """Sets environment variables of the image."""
        merged: Dict[str, str] = dict(vars or {})
        merged.update(kw)
        if not merged:
            raise ValueError("env: no variables given")
        for k, v in merged.items():
            if not k or "=" in k or not isinstance(v, str):
                raise ValueError(f"env: {k!r}={v!r} is not NAME=string")
        return self._with(("env", merged))

    def workdir(self, path: str) -> "Image":
        if not path.startswith("/"):
            raise ValueError(f"workdir {path!r} must be absolute")
        return self._with(("workdir", path))

    def user(self, user: str) -> "Image":
        if not user:
            raise ValueError("user: empty")
        return self._with(("user", user))

    def apt_install(self, *packages: str) -> "Image":
        """Installs Debian packages (``apt-get install --no-install-recommends``);
        gives the build network access."""
        return self._with(("apt_install", _packages("apt_install", packages)), network=True)

    def pip_install(self, *packages: str) -> "Image":
        """Installs Python packages with pip; gives the build network access."""
        return self._with(("pip_install", _packages("pip_install", packages)), network=True)

    # --- the spec ----------------------------------------------------------

    def to_toml(self, base: Optional[str] = None) -> str:
        """The Sandlot build spec of this image (``base`` overrides the base)."""
        lines = [f"from = {_toml_str(base or self._base)}", f"network = {'true' if self._network else 'false'}"]
        for kind, arg in self._steps:
            lines.append("[[steps]]")
            if kind == "env":
                inner = ", ".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in arg.items())
                lines.append(f"env = {{ {inner} }}")
            elif kind in ("apt_install", "pip_install"):
                lines.append(f"{kind} = [{', '.join(_toml_str(p) for p in arg)}]")
            else:
                lines.append(f"{kind} = {_toml_str(arg)}")
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return f"<Image from {self._base!r} steps={len(self._steps)}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Image) and self.to_toml() == other.to_toml() and self._pull == other._pull

    def __hash__(self) -> int:
        return hash(self.to_toml())

    # --- building ----------------------------------------------------------

    def _context(self, base: str) -> bytes:
        spec = self.to_toml(base).encode()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            info = tarfile.TarInfo(".sandlot-build/image.toml")
            info.size = len(spec)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(spec))
        return buf.getvalue()

    def build(self, *, tag: Optional[str] = None, client: Optional[Client] = None) -> str:
        """Builds (pulls) the image if this process has not yet; returns its id."""
        c = client or default_client()
        key = (c.url, self.to_toml() + json.dumps(self._pull, sort_keys=True) + (tag or ""))
        with _memo_lock:
            if key in _memo:
                return _memo[key]
        base = self._base
        if self._pull is not None:
            with c.stream("POST", "/v1/images/pull", json=self._pull) as resp:
                done = _follow(resp.iter_lines())
            base = str(done["image"]["id"])
        if self._steps or tag:
            params: Dict[str, str] = {"file": ".sandlot-build/image.toml"}
            if tag:
                params["tag"] = tag
            with c.stream(
                "POST",
                "/v1/images/build",
                params=params,
                content=self._context(base),
                headers={"content-type": "application/x-tar"},
            ) as resp:
                done = _follow(resp.iter_lines())
            image_id = str(done["image"]["id"])
        elif self._pull is not None:
            image_id = base
        else:
            image_id = str(c.json("GET", f"/v1/images/{base}")["id"])
        with _memo_lock:
            _memo[key] = image_id
        return image_id

    async def abuild(self, *, tag: Optional[str] = None, client: Optional[AsyncClient] = None) -> str:
        """``build`` for asyncio."""
        c = client or default_async_client()
        key = (c.url, self.to_toml() + json.dumps(self._pull, sort_keys=True) + (tag or ""))
        with _memo_lock:
            if key in _memo:
                return _memo[key]
        base = self._base
        if self._pull is not None:
            async with c.stream("POST", "/v1/images/pull", json=self._pull) as resp:
                done = _follow([line async for line in resp.aiter_lines()])
            base = str(done["image"]["id"])
        if self._steps or tag:
            params: Dict[str, str] = {"file": ".sandlot-build/image.toml"}
            if tag:
                params["tag"] = tag
            async with c.stream(
                "POST",
                "/v1/images/build",
                params=params,
                content=self._context(base),
                headers={"content-type": "application/x-tar"},
            ) as resp:
                done = _follow([line async for line in resp.aiter_lines()])
            image_id = str(done["image"]["id"])
        elif self._pull is not None:
            image_id = base
        else:
            image_id = str((await c.json("GET", f"/v1/images/{base}"))["id"])
        with _memo_lock:
            _memo[key] = image_id
        return image_id


def _packages(what: str, packages: Iterable[str]) -> List[str]:
    out = list(packages)
    if not out:
        raise ValueError(f"{what}: no packages given")
    for p in out:
        if not isinstance(p, str) or not p or p.startswith("-") or any(ch.isspace() for ch in p):
            raise ValueError(f"{what}: {p!r} is not a package name")
    return out


def _follow(lines: Iterable[str]) -> Dict[str, Any]:
    """The ``done`` line of a progress stream; raises ``BuildError`` on ``error``."""
    done: Optional[Dict[str, Any]] = None
    log: List[str] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError as e:
            raise errors.ProtocolError(f"a progress line is not JSON: {line[:200]!r}") from e
        kind = ev.get("type")
        if kind == "log":
            log.append(str(ev.get("line", "")))
        elif kind == "error":
            tail = "\n".join(log[-20:])
            msg = str(ev.get("message", "failed"))
            raise BuildError(msg + (f"\n--- last output ---\n{tail}" if tail else ""), str(ev.get("code", "error")))
        elif kind == "done":
            done = ev
    if done is None:
        raise errors.ProtocolError("the daemon ended the stream without a result")
    return done


ImageLike = Union[str, Image]
