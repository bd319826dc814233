"""Memory stores: agent memory as Markdown files in git, with hybrid (BM25 + vector) search,
kept by the daemon (``/v1/memory/{store}/...``; see docs/memory.md).

    from sandlot import MemoryStore

    store = MemoryStore.create("notes", agent="planner")
    store.add("Office move", "The team moved to the riverside building.", folder="facts")
    for hit in store.search("where does the team work now"):
        print(hit["path"], hit["snippet"])
    store.memory_tool({"command": "view", "path": "/memories"})   # Anthropic memory tool

Writes are git commits authored by the tenant, or by ``agent`` when given. The asyncio twin is
``AsyncMemoryStore`` (same methods, awaited).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union
from urllib.parse import quote

from .client import AsyncClient, Client, default_async_client, default_client

Json = Dict[str, Any]

_AGENT_HEADER = "X-Sandlot-Agent"


def _key(key: str) -> str:
    return quote(key.lstrip("/"), safe="/")


def _new_memory(
    title: str,
    body: str,
    folder: Optional[str],
    path: Optional[str],
    id: Optional[str],
    type: Optional[str],
    tags: Optional[List[str]],
    links: Optional[List[str]],
    valid_from: Optional[str],
    valid_to: Optional[str],
    supersedes: Optional[str],
) -> Json:
    b: Json = {"title": title, "body": body}
    for k, v in (
        ("folder", folder),
        ("path", path),
        ("id", id),
        ("type", type),
        ("tags", tags),
        ("links", links),
        ("valid_from", valid_from),
        ("valid_to", valid_to),
        ("supersedes", supersedes),
    ):
        if v is not None:
            b[k] = v
    return b


def _search_body(
    text: str,
    limit: int,
    tags: Optional[List[str]],
    type: Optional[str],
    folder: Optional[str],
    at: Optional[int],
    all_time: bool,
    mode: str,
    expand: bool,
) -> Json:
    valid: Union[str, Json] = {"at": at} if at is not None else ("any" if all_time else "now")
    b: Json = {"text": text, "limit": limit, "valid": valid, "mode": mode, "expand": expand}
    if tags:
        b["tags"] = tags
    if type is not None:
        b["type"] = type
    if folder is not None:
        b["folder"] = folder
    return b


def _revert_body(commit: Optional[str], key: Optional[str], to: Optional[str]) -> Json:
    if commit is not None and key is None and to is None:
        return {"commit": commit}
    if commit is None and key is not None and to is not None:
        return {"key": key, "to": to}
    raise ValueError("revert: give commit=, or key= and to=")


class _Hybrid:
    """``get`` on the class opens a store; on an instance it reads a memory."""

    def __init__(self, cls_fn: Callable[..., Any], inst_fn: Callable[..., Any]) -> None:
        self.cls_fn = cls_fn
        self.inst_fn = inst_fn

    def __get__(self, obj: Any, cls: Any) -> Callable[..., Any]:
        if obj is None:
            return lambda *a, **kw: self.cls_fn(cls, *a, **kw)
        return lambda *a, **kw: self.inst_fn(obj, *a, **kw)


class MemoryStore:
    """A memory store of the caller's tenant in the daemon (synchronous)."""

    def __init__(self, name: str, *, client: Optional[Client] = None, agent: Optional[str] = None) -> None:
        self.name = name
        self.client = client or default_client()
        self.agent = agent
        self._base = f"/v1/memory/{quote(name, safe='')}"

    def __repr__(self) -> str:
        return f"MemoryStore({self.name!r})"

    def _call(self, method: str, path: str = "", **kw: Any) -> Any:
        headers = {_AGENT_HEADER: self.agent} if self.agent else None
        return self.client.json(method, self._base + path, headers=headers, **kw)

    # ---- stores ----

    @classmethod
    def create(cls, name: str, *, client: Optional[Client] = None, agent: Optional[str] = None) -> "MemoryStore":
        """Creates store ``name`` (409 ``ConflictError`` if it exists)."""
        c = client or default_client()
        c.json("POST", "/v1/memory", json={"name": name})
        return cls(name, client=c, agent=agent)

    @classmethod
    def _open(cls, name: str, *, client: Optional[Client] = None, agent: Optional[str] = None) -> "MemoryStore":
        s = cls(name, client=client, agent=agent)
        s.info()
        return s

    @staticmethod
    def list(*, client: Optional[Client] = None) -> List[str]:
        """Names of the tenant's stores."""
        v = (client or default_client()).json("GET", "/v1/memory")
        return [str(s["name"]) for s in v["stores"]]

    def info(self) -> Json:
        """``{name, tenant, files, chunks, vectors, model}``."""
        return dict(self._call("GET"))

    def delete(self) -> None:
        """Deletes the store and its history (409 while a sandbox mounts it)."""
        self._call("DELETE")

    # ---- memories ----

    def add(
        self,
        title: str,
        body: str = "",
        *,
        folder: Optional[str] = None,
        path: Optional[str] = None,
        id: Optional[str] = None,
        type: Optional[str] = None,
        tags: Optional[List[str]] = None,
        links: Optional[List[str]] = None,
        valid_from: Optional[str] = None,
        valid_to: Optional[str] = None,
        supersedes: Optional[str] = None,
    ) -> Json:
        """Adds a memory (one commit); ``{path, id, commit}``. ``supersedes`` names a memory
        this one replaces (it gets ``valid_to`` and a link to the new one)."""
        b = _new_memory(title, body, folder, path, id, type, tags, links, valid_from, valid_to, supersedes)
        return dict(self._call("POST", "/memories", json=b))

    def _get_memory(self, key: str, rev: Optional[str] = None) -> Json:
        params = {"rev": rev} if rev else None
        return dict(self._call("GET", f"/memories/{_key(key)}", params=params))

    get = _Hybrid(_open.__func__, _get_memory)  # type: ignore[attr-defined]
    """``MemoryStore.get(name)`` opens an existing store (``NotFoundError`` otherwise);
    ``store.get(key, rev=None)`` reads a memory by path or id (at revision ``rev``:
    ``{path, rev, text}``)."""

    def edit(self, key: str, **changes: Any) -> Json:
        """Changes fields: ``title``, ``body``, ``type``, ``tags``, ``add_tags``,
        ``remove_tags``, ``links``, ``add_links``, ``valid_from``, ``valid_to``."""
        return dict(self._call("PATCH", f"/memories/{_key(key)}", json=changes))

    def move(self, src: str, dst: str) -> Json:
        """Renames a memory (nothing is re-embedded)."""
        return dict(self._call("POST", "/move", json={"from": src, "to": dst}))

    def remove(self, key: str) -> Json:
        return dict(self._call("DELETE", f"/memories/{_key(key)}"))

    def search(
        self,
        text: str,
        *,
        limit: int = 10,
        tags: Optional[List[str]] = None,
        type: Optional[str] = None,
        folder: Optional[str] = None,
        at: Optional[int] = None,
        all_time: bool = False,
        mode: str = "hybrid",
        expand: bool = False,
    ) -> List[Json]:
        """Hybrid search; hits ``{path, id, title, line, chunk_lines, score, snippet,
        bm25_rank, vector_rank, similarity, related}``, best first."""
        b = _search_body(text, limit, tags, type, folder, at, all_time, mode, expand)
        return list(self._call("POST", "/search", json=b)["hits"])

    # ---- history ----

    def log(self, key: Optional[str] = None, *, limit: int = 20) -> List[Json]:
        params: Dict[str, Any] = {"limit": limit}
        if key is not None:
            params["key"] = key
        return list(self._call("GET", "/log", params=params)["commits"])

    def diff(self, key: Optional[str] = None, *, rev_from: Optional[str] = None, rev_to: Optional[str] = None) -> str:
        params = {k: v for k, v in (("key", key), ("from", rev_from), ("to", rev_to)) if v is not None}
        return str(self._call("GET", "/diff", params=params)["diff"])

    def revert(self, *, commit: Optional[str] = None, key: Optional[str] = None, to: Optional[str] = None) -> Json:
        """Undoes a store commit (``commit=``) or restores one memory (``key=``, ``to=``)."""
        return dict(self._call("POST", "/revert", json=_revert_body(commit, key, to)))

    def status(self, *, all: bool = False) -> Json:
        return dict(self._call("GET", "/status", params={"all": "true" if all else "false"}))

    def reindex(self, *, fresh: bool = False) -> Json:
        return dict(self._call("POST", "/reindex", json={"fresh": fresh}))

    def memory_tool(self, command: Json) -> Json:
        """Runs one Anthropic memory tool call (its ``input`` verbatim); ``{text, is_error}``."""
        return dict(self._call("POST", "/tool", json=command))


class AsyncMemoryStore:
    """The asyncio twin of ``MemoryStore``."""

    def __init__(self, name: str, *, client: Optional[AsyncClient] = None, agent: Optional[str] = None) -> None:
        self.name = name
        self.client = client or default_async_client()
        self.agent = agent
        self._base = f"/v1/memory/{quote(name, safe='')}"

    def __repr__(self) -> str:
        return f"AsyncMemoryStore({self.name!r})"

    async def _call(self, method: str, path: str = "", **kw: Any) -> Any:
        headers = {_AGENT_HEADER: self.agent} if self.agent else None
        return await self.client.json(method, self._base + path, headers=headers, **kw)

    @classmethod
    async def create(
        cls, name: str, *, client: Optional[AsyncClient] = None, agent: Optional[str] = None
    ) -> "AsyncMemoryStore":
        c = client or default_async_client()
        await c.json("POST", "/v1/memory", json={"name": name})
        return cls(name, client=c, agent=agent)

    @classmethod
    async def _open(
        cls, name: str, *, client: Optional[AsyncClient] = None, agent: Optional[str] = None
    ) -> "AsyncMemoryStore":
        s = cls(name, client=client, agent=agent)
        await s.info()
        return s

    @staticmethod
    async def list(*, client: Optional[AsyncClient] = None) -> List[str]:
        v = await (client or default_async_client()).json("GET", "/v1/memory")
        return [str(s["name"]) for s in v["stores"]]

    async def info(self) -> Json:
        return dict(await self._call("GET"))

    async def delete(self) -> None:
        await self._call("DELETE")

    async def add(
        self,
        title: str,
        body: str = "",
        *,
        folder: Optional[str] = None,
        path: Optional[str] = None,
        id: Optional[str] = None,
        type: Optional[str] = None,
        tags: Optional[List[str]] = None,
        links: Optional[List[str]] = None,
        valid_from: Optional[str] = None,
        valid_to: Optional[str] = None,
        supersedes: Optional[str] = None,
    ) -> Json:
        b = _new_memory(title, body, folder, path, id, type, tags, links, valid_from, valid_to, supersedes)
        return dict(await self._call("POST", "/memories", json=b))

    async def _get_memory(self, key: str, rev: Optional[str] = None) -> Json:
        params = {"rev": rev} if rev else None
        return dict(await self._call("GET", f"/memories/{_key(key)}", params=params))

    get = _Hybrid(_open.__func__, _get_memory)  # type: ignore[attr-defined]
    """``await AsyncMemoryStore.get(name)`` opens a store; ``await store.get(key)`` reads a memory."""

    async def edit(self, key: str, **changes: Any) -> Json:
        return dict(await self._call("PATCH", f"/memories/{_key(key)}", json=changes))

    async def move(self, src: str, dst: str) -> Json:
        return dict(await self._call("POST", "/move", json={"from": src, "to": dst}))

    async def remove(self, key: str) -> Json:
        return dict(await self._call("DELETE", f"/memories/{_key(key)}"))

    async def search(
        self,
        text: str,
        *,
        limit: int = 10,
        tags: Optional[List[str]] = None,
        type: Optional[str] = None,
        folder: Optional[str] = None,
        at: Optional[int] = None,
        all_time: bool = False,
        mode: str = "hybrid",
        expand: bool = False,
    ) -> List[Json]:
        b = _search_body(text, limit, tags, type, folder, at, all_time, mode, expand)
        return list((await self._call("POST", "/search", json=b))["hits"])

    async def log(self, key: Optional[str] = None, *, limit: int = 20) -> List[Json]:
        params: Dict[str, Any] = {"limit": limit}
        if key is not None:
            params["key"] = key
        return list((await self._call("GET", "/log", params=params))["commits"])

    async def diff(
        self, key: Optional[str] = None, *, rev_from: Optional[str] = None, rev_to: Optional[str] = None
    ) -> str:
        params = {k: v for k, v in (("key", key), ("from", rev_from), ("to", rev_to)) if v is not None}
        return str((await self._call("GET", "/diff", params=params))["diff"])

    async def revert(
        self, *, commit: Optional[str] = None, key: Optional[str] = None, to: Optional[str] = None
    ) -> Json:
        return dict(await self._call("POST", "/revert", json=_revert_body(commit, key, to)))

    async def status(self, *, all: bool = False) -> Json:
        return dict(await self._call("GET", "/status", params={"all": "true" if all else "false"}))

    async def reindex(self, *, fresh: bool = False) -> Json:
        return dict(await self._call("POST", "/reindex", json={"fresh": fresh}))

    async def memory_tool(self, command: Json) -> Json:
        return dict(await self._call("POST", "/tool", json=command))

