"""Document collections browsed with a virtual shell: ``Collection`` (sync) and
``AsyncCollection``, their sessions ``ShellSession`` / ``AsyncShellSession``.

    from sandlot import Collection

    col = Collection.create("docs", from_dir="./site", acl={"internal/**": "group:eng"})
    with col.session("alice", groups=["support"]) as sh:
        print(sh.run("grep -rn 'rate limit' / | head").stdout)

A session answers ``ls``, ``cat``, ``grep``, ``find``... from the collection in the
daemon, without a container; what the principal may not read is pruned from its
tree before the session starts. The working directory is kept across ``run``
calls. Collections belong to the caller's tenant.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any, AsyncIterator, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from ._spec import collection_mount
from .client import AsyncClient, Client, default_async_client, default_client
from .models import AuditRecord, CollectionInfo, IngestReport, ShellResult, ShellSessionInfo

PathLike = Union[str, "os.PathLike[str]"]
_CHUNK = 256 * 1024


def _q(s: str) -> str:
    return quote(s, safe="")


def _acl_params(acl: Optional[Mapping[str, str]], default_acl: Optional[str]) -> List[Tuple[str, str]]:
    params: List[Tuple[str, str]] = []
    if default_acl is not None:
        params.append(("acl_default", default_acl))
    for pattern, a in (acl or {}).items():
        params.append(("acl", f"{pattern}={a}"))
    return params


def _acl_json(acl: Optional[Mapping[str, str]], default_acl: Optional[str]) -> Optional[Dict[str, Any]]:
    if acl is None and default_acl is None:
        return None
    out: Dict[str, Any] = {"rules": [{"pattern": p, "acl": a} for p, a in (acl or {}).items()]}
    if default_acl is not None:
        out["default"] = default_acl
    return out


def _tar_dir(root: Path) -> "io.BufferedRandom":
    """A tar archive of the regular files under ``root`` (``.git`` and symbolic
    links left out), in a temporary file."""
    import tempfile

    if not root.is_dir():
        raise ValueError(f"from_dir={str(root)!r}: not a directory")
    f = tempfile.TemporaryFile()
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != ".git")
            for name in sorted(filenames):
                p = Path(dirpath) / name
                if p.is_symlink() or not p.is_file():
                    continue
                tf.add(str(p), arcname=str(p.relative_to(root)), recursive=False)
    f.seek(0)
    return f


class _Upload:
    """A prepared request body: JSON, or a file streamed with a content type."""

    def __init__(self, json_body: Optional[Dict[str, Any]], file: Optional[Any], content_type: Optional[str]):
        self.json = json_body
        self.file = file
        self.content_type = content_type

    def chunks(self) -> Iterator[bytes]:
        assert self.file is not None
        while True:
            b = self.file.read(_CHUNK)
            if not b:
                return
            yield b

    async def achunks(self) -> AsyncIterator[bytes]:
        for b in self.chunks():
            yield b

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _prepare(
    name: Optional[str],
    from_dir: Optional[PathLike],
    from_jsonl: Optional[PathLike],
    source: Optional[Mapping[str, Any]],
    acl: Optional[Mapping[str, str]],
    default_acl: Optional[str],
) -> Tuple[_Upload, List[Tuple[str, str]]]:
    given = [x for x in (from_dir, from_jsonl, source) if x is not None]
    if len(given) > 1:
        raise ValueError("give one of from_dir=, from_jsonl= or source=")
    if from_dir is not None:
        params = ([("name", name)] if name else []) + _acl_params(acl, default_acl)
        return _Upload(None, _tar_dir(Path(from_dir)), "application/x-tar"), params
    if from_jsonl is not None:
        params = ([("name", name)] if name else []) + _acl_params(acl, default_acl)
        return _Upload(None, open(from_jsonl, "rb"), "application/x-ndjson"), params
    body: Dict[str, Any] = {}
    if name:
        body["name"] = name
    if source is not None:
        body["source"] = dict(source)
    a = _acl_json(acl, default_acl)
    if a is not None:
        body["acl"] = a
    return _Upload(body, None, None), []


def _session_body(
    principal: str,
    groups: Sequence[str],
    version: Optional[int],
    all_access: bool,
    scratch: Union[bool, int] = False,
) -> Dict[str, Any]:
    if isinstance(groups, str):
        raise TypeError("groups= is a list of group names, not a string")
    body: Dict[str, Any] = {"principal": principal, "groups": list(groups)}
    if version is not None:
        body["version"] = version
    if all_access:
        body["all_access"] = True
    if scratch is True:
        body["scratch"] = True
    elif scratch is not False and scratch is not None:
        if not isinstance(scratch, int) or scratch <= 0:
            raise ValueError(f"scratch= is True or a positive size in bytes, got {scratch!r}")
        body["scratch"] = True
        body["scratch_max_bytes"] = scratch
    return body


def _audit_params(principal: Optional[str], last: Optional[int]) -> Dict[str, Any]:
    p: Dict[str, Any] = {}
    if principal is not None:
        p["principal"] = principal
    if last is not None:
        p["last"] = last
    return p


class ShellSession:
    """A virtual shell session on a collection. Closes on ``close()`` or at the end
    of a ``with`` block (the daemon also closes it once idle)."""

    def __init__(self, collection: "Collection", info: ShellSessionInfo) -> None:
        self.collection = collection
        self.id = info.id
        self.info = info
        self.closed = False

    def __repr__(self) -> str:
        return f"ShellSession(id={self.id!r}, collection={self.collection.name!r}, principal={self.info.principal!r})"

    @property
    def _path(self) -> str:
        return f"/v1/vfs/{_q(self.collection.name)}/sessions/{_q(self.id)}"

    def run(self, command: str) -> ShellResult:
        """Runs one command line (pipes, ``&&``, ``||``, globs, ``cd``...). A failing
        command is a result with its ``exit_code``, not an exception."""
        d = self.collection.client.json("POST", f"{self._path}/run", json={"command": command})
        return ShellResult.from_json(d)

    def refresh(self) -> ShellSessionInfo:
        self.info = ShellSessionInfo.from_json(self.collection.client.json("GET", self._path))
        return self.info

    @property
    def cwd(self) -> str:
        return self.refresh().cwd

    def close(self) -> None:
        """Closes the session (idempotent; an already expired session is fine)."""
        if self.closed:
            return
        from .errors import NotFoundError

        try:
            self.collection.client.request("DELETE", self._path)
        except NotFoundError:
            pass
        self.closed = True

    def __enter__(self) -> "ShellSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Collection:
    """A document collection of the caller's tenant."""

    def __init__(self, info: CollectionInfo, client: Client) -> None:
        self.client = client
        self.info = info

    def __repr__(self) -> str:
        return f"Collection(name={self.name!r}, version={self.version}, documents={self.info.documents})"

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def version(self) -> int:
        return self.info.version

    @property
    def _path(self) -> str:
        return f"/v1/vfs/{_q(self.name)}"

    @classmethod
    def create(
        cls,
        name: str,
        *,
        from_dir: Optional[PathLike] = None,
        from_jsonl: Optional[PathLike] = None,
        source: Optional[Mapping[str, Any]] = None,
        acl: Optional[Mapping[str, str]] = None,
        default_acl: Optional[str] = None,
        client: Optional[Client] = None,
    ) -> "Collection":
        """Creates a collection from a local directory (uploaded as a tar archive),
        a local JSONL chunk export, or a daemon-side ``source`` (``{"kind": "dir",
        "path": ...}``, ``git``, ``jsonl`` or ``s3`` with ``bucket``, ``prefix``,
        ``endpoint``; the operator must allow it). ``acl`` maps path globs to ACLs
        (``{"internal/**": "group:eng"}``, the last match wins); ``default_acl`` is
        for the rest (``public`` unless given: ``none``, ``group:NAME,...``).
        The ingest report is in ``col.last_ingest``."""
        c = client or default_client()
        up, params = _prepare(name, from_dir, from_jsonl, source, acl, default_acl)
        if up.json is not None and "source" not in up.json:
            raise ValueError("give one of from_dir=, from_jsonl= or source=")
        try:
            if up.json is not None:
                d = c.json("POST", "/v1/vfs", json=up.json)
            else:
                d = c.json(
                    "POST",
                    "/v1/vfs",
                    params=params,
                    content=up.chunks(),
                    headers={"content-type": up.content_type or ""},
                )
        finally:
            up.close()
        col = cls(CollectionInfo.from_json(d["collection"]), c)
        col.last_ingest = IngestReport.from_json(d["ingest"])
        return col

    last_ingest: Optional[IngestReport] = None

    @classmethod
    def get(cls, name: str, *, client: Optional[Client] = None) -> "Collection":
        c = client or default_client()
        return cls(CollectionInfo.from_json(c.json("GET", f"/v1/vfs/{_q(name)}")), c)

    @classmethod
    def list(cls, *, client: Optional[Client] = None) -> "List[Collection]":
        c = client or default_client()
        d = c.json("GET", "/v1/vfs")
        return [cls(CollectionInfo.from_json(x), c) for x in d.get("collections", [])]

    def refresh(self) -> CollectionInfo:
        self.info = CollectionInfo.from_json(self.client.json("GET", self._path))
        return self.info

    def update(
        self,
        *,
        from_dir: Optional[PathLike] = None,
        from_jsonl: Optional[PathLike] = None,
        source: Optional[Mapping[str, Any]] = None,
        acl: Optional[Mapping[str, str]] = None,
        default_acl: Optional[str] = None,
    ) -> IngestReport:
        """Re-ingests: from the stored source when nothing is given, else from the
        new upload or source. Only what changed is fetched; sessions already open
        keep their version."""
        up, params = _prepare(None, from_dir, from_jsonl, source, acl, default_acl)
        try:
            if up.json is not None:
                d = self.client.json("POST", f"{self._path}/ingest", json=up.json)
            else:
                d = self.client.json(
                    "POST",
                    f"{self._path}/ingest",
                    params=params,
                    content=up.chunks(),
                    headers={"content-type": up.content_type or ""},
                )
        finally:
            up.close()
        self.info = CollectionInfo.from_json(d["collection"])
        self.last_ingest = IngestReport.from_json(d["ingest"])
        return self.last_ingest

    def delete(self) -> None:
        """Removes the collection; its open sessions are closed (409 while a sandbox
        mounts it)."""
        self.client.request("DELETE", self._path)

    def mount(
        self,
        target: str,
        *,
        principal: Optional[str] = None,
        groups: Sequence[str] = (),
        all_access: bool = False,
        version: Optional[int] = None,
    ) -> Dict[str, Any]:
        """A ``mounts`` entry for ``Sandbox.create(mounts=[...])``: this collection,
        read-only at ``target``, as ``principal`` with ``groups`` sees it (default
        ``anonymous``: public documents only). Real tools (``grep -r``, ``rg``,
        ``find``, ``os.walk``) work on it; the version is pinned at create."""
        return collection_mount(
            self.name, target, principal=principal, groups=groups, all_access=all_access, version=version
        )

    def session(
        self,
        principal: str,
        *,
        groups: Sequence[str] = (),
        version: Optional[int] = None,
        all_access: bool = False,
        scratch: Union[bool, int] = False,
    ) -> ShellSession:
        """Opens a shell session for ``principal`` (who sees public documents and
        those of ``groups``). Use it as a context manager to close it.

        ``scratch=True`` (or a size in bytes) gives the session a private,
        in-memory copy-on-write scratch area: ``>``, ``mkdir``, ``rm``, ``cp``,
        ``mv``, ``tee``... then change only this session's view, and it is gone
        when the session closes. Without it writes fail with "Read-only file
        system"."""
        d = self.client.json(
            "POST",
            f"{self._path}/sessions",
            json=_session_body(principal, groups, version, all_access, scratch),
        )
        return ShellSession(self, ShellSessionInfo.from_json(d))

    def audit(self, *, principal: Optional[str] = None, last: Optional[int] = None) -> List[AuditRecord]:
        """The audited command lines of the collection, oldest first."""
        d = self.client.json("GET", f"{self._path}/audit", params=_audit_params(principal, last))
        return [AuditRecord.from_json(x) for x in d.get("records", [])]


class AsyncShellSession:
    """The asyncio twin of :class:`ShellSession`."""

    def __init__(self, collection: "AsyncCollection", info: ShellSessionInfo) -> None:
        self.collection = collection
        self.id = info.id
        self.info = info
        self.closed = False

    def __repr__(self) -> str:
        return (
            f"AsyncShellSession(id={self.id!r}, collection={self.collection.name!r}, "
            f"principal={self.info.principal!r})"
        )

    @property
    def _path(self) -> str:
        return f"/v1/vfs/{_q(self.collection.name)}/sessions/{_q(self.id)}"

    async def run(self, command: str) -> ShellResult:
        d = await self.collection.client.json("POST", f"{self._path}/run", json={"command": command})
        return ShellResult.from_json(d)

    async def refresh(self) -> ShellSessionInfo:
        self.info = ShellSessionInfo.from_json(await self.collection.client.json("GET", self._path))
        return self.info

    async def close(self) -> None:
        if self.closed:
            return
        from .errors import NotFoundError

        try:
            await self.collection.client.request("DELETE", self._path)
        except NotFoundError:
            pass
        self.closed = True

    async def __aenter__(self) -> "AsyncShellSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncCollection:
    """The asyncio twin of :class:`Collection`."""

    last_ingest: Optional[IngestReport] = None

    def __init__(self, info: CollectionInfo, client: AsyncClient) -> None:
        self.client = client
        self.info = info

    def __repr__(self) -> str:
        return f"AsyncCollection(name={self.name!r}, version={self.version}, documents={self.info.documents})"

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def version(self) -> int:
        return self.info.version

    @property
    def _path(self) -> str:
        return f"/v1/vfs/{_q(self.name)}"

    @classmethod
    async def create(
        cls,
        name: str,
        *,
        from_dir: Optional[PathLike] = None,
        from_jsonl: Optional[PathLike] = None,
        source: Optional[Mapping[str, Any]] = None,
        acl: Optional[Mapping[str, str]] = None,
        default_acl: Optional[str] = None,
        client: Optional[AsyncClient] = None,
    ) -> "AsyncCollection":
        c = client or default_async_client()
        up, params = _prepare(name, from_dir, from_jsonl, source, acl, default_acl)
        if up.json is not None and "source" not in up.json:
            raise ValueError("give one of from_dir=, from_jsonl= or source=")
        try:
            if up.json is not None:
                d = await c.json("POST", "/v1/vfs", json=up.json)
            else:
                d = await c.json(
                    "POST",
                    "/v1/vfs",
                    params=params,
                    content=up.achunks(),
                    headers={"content-type": up.content_type or ""},
                )
        finally:
            up.close()
        col = cls(CollectionInfo.from_json(d["collection"]), c)
        col.last_ingest = IngestReport.from_json(d["ingest"])
        return col

    @classmethod
    async def get(cls, name: str, *, client: Optional[AsyncClient] = None) -> "AsyncCollection":
        c = client or default_async_client()
        return cls(CollectionInfo.from_json(await c.json("GET", f"/v1/vfs/{_q(name)}")), c)

    @classmethod
    async def list(cls, *, client: Optional[AsyncClient] = None) -> "List[AsyncCollection]":
        c = client or default_async_client()
        d = await c.json("GET", "/v1/vfs")
        return [cls(CollectionInfo.from_json(x), c) for x in d.get("collections", [])]

    async def refresh(self) -> CollectionInfo:
        self.info = CollectionInfo.from_json(await self.client.json("GET", self._path))
        return self.info

    async def update(
        self,
        *,
        from_dir: Optional[PathLike] = None,
        from_jsonl: Optional[PathLike] = None,
        source: Optional[Mapping[str, Any]] = None,
        acl: Optional[Mapping[str, str]] = None,
        default_acl: Optional[str] = None,
    ) -> IngestReport:
        up, params = _prepare(None, from_dir, from_jsonl, source, acl, default_acl)
        try:
            if up.json is not None:
                d = await self.client.json("POST", f"{self._path}/ingest", json=up.json)
            else:
                d = await self.client.json(
                    "POST",
                    f"{self._path}/ingest",
                    params=params,
                    content=up.achunks(),
                    headers={"content-type": up.content_type or ""},
                )
        finally:
            up.close()
        self.info = CollectionInfo.from_json(d["collection"])
        self.last_ingest = IngestReport.from_json(d["ingest"])
        return self.last_ingest

    async def delete(self) -> None:
        await self.client.request("DELETE", self._path)

    def mount(
        self,
        target: str,
        *,
        principal: Optional[str] = None,
        groups: Sequence[str] = (),
        all_access: bool = False,
        version: Optional[int] = None,
    ) -> Dict[str, Any]:
        """See :meth:`Collection.mount`."""
        return collection_mount(
            self.name, target, principal=principal, groups=groups, all_access=all_access, version=version
        )

    async def session(
        self,
        principal: str,
        *,
        groups: Sequence[str] = (),
        version: Optional[int] = None,
        all_access: bool = False,
        scratch: Union[bool, int] = False,
    ) -> AsyncShellSession:
        d = await self.client.json(
            "POST",
            f"{self._path}/sessions",
            json=_session_body(principal, groups, version, all_access, scratch),
        )
        return AsyncShellSession(self, ShellSessionInfo.from_json(d))

    async def audit(self, *, principal: Optional[str] = None, last: Optional[int] = None) -> List[AuditRecord]:
        d = await self.client.json("GET", f"{self._path}/audit", params=_audit_params(principal, last))
        return [AuditRecord.from_json(x) for x in d.get("records", [])]
