"""Named volumes and secrets of the caller's tenant (``/v1/volumes``, ``/v1/secrets``),
and what ``Sandbox.create(volumes=..., secrets=...)`` takes to use them.

    from sandlot import Sandbox, Secret, Volume

    data = Volume.create("data", size_limit="1G")
    key = Secret.create("api-key", "s3cr3t")
    with Sandbox.create(volumes=[data.mount("/data")], secrets=[key.env("API_KEY")]) as sb:
        sb.run("echo $API_KEY > /data/copy")

A volume outlives the sandboxes that mount it; a secret's value is never returned.
The asyncio twins are ``AsyncVolume`` and ``AsyncSecret`` (same methods, awaited).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union
from urllib.parse import quote

from . import _spec
from .client import AsyncClient, Client, default_async_client, default_client
from .models import SecretInfo, VolumeInfo


def _volume_body(name: str, size_limit: Optional[_spec.Size]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"name": name}
    if size_limit is not None:
        body["size_limit"] = size_limit
    return body


def _secret_body(name: str, value: Union[str, bytes]) -> Dict[str, Any]:
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"secret {name}: the value must be UTF-8 text") from e
    if not isinstance(value, str):
        raise TypeError(f"secret {name}: the value is str or UTF-8 bytes, not {type(value).__name__}")
    return {"name": name, "value": value}


class _VolumeBase:
    def __init__(self, name: str) -> None:
        self.name = name
        self._path = f"/v1/volumes/{quote(name, safe='')}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def mount(self, target: str, *, read_only: bool = False) -> Dict[str, Any]:
        """A ``volumes`` entry of ``Sandbox.create``: this volume at ``target``."""
        return _spec.volume_mount(self.name, target, read_only=read_only)


class Volume(_VolumeBase):
    """A named volume of the caller's tenant (synchronous)."""

    def __init__(self, name: str, *, client: Optional[Client] = None) -> None:
        super().__init__(name)
        self.client = client or default_client()

    @classmethod
    def create(
        cls, name: str, *, size_limit: Optional[_spec.Size] = None, client: Optional[Client] = None
    ) -> "Volume":
        """Creates volume ``name`` (``ConflictError`` if it exists). With ``size_limit``
        (``"1G"`` or bytes, at least 8M) it is a filesystem of that size; without, it
        is bounded only by the daemon's disk."""
        c = client or default_client()
        c.json("POST", "/v1/volumes", json=_volume_body(name, size_limit))
        return cls(name, client=c)

    @staticmethod
    def list(*, client: Optional[Client] = None) -> List[VolumeInfo]:
        """The tenant's volumes (the operator's socket: every tenant's)."""
        d = (client or default_client()).json("GET", "/v1/volumes")
        return [VolumeInfo.from_json(v) for v in d.get("volumes", [])]

    def info(self) -> VolumeInfo:
        """The volume as the daemon has it (``NotFoundError`` if it does not exist)."""
        return VolumeInfo.from_json(self.client.json("GET", self._path))

    def delete(self) -> None:
        """Removes the volume and its files (``ConflictError`` while a live sandbox
        mounts it)."""
        self.client.request("DELETE", self._path)


class AsyncVolume(_VolumeBase):
    """A named volume of the caller's tenant (asyncio)."""

    def __init__(self, name: str, *, client: Optional[AsyncClient] = None) -> None:
        super().__init__(name)
        self.client = client or default_async_client()

    @classmethod
    async def create(
        cls, name: str, *, size_limit: Optional[_spec.Size] = None, client: Optional[AsyncClient] = None
    ) -> "AsyncVolume":
        """See :meth:`Volume.create`."""
        c = client or default_async_client()
        await c.json("POST", "/v1/volumes", json=_volume_body(name, size_limit))
        return cls(name, client=c)

    @staticmethod
    async def list(*, client: Optional[AsyncClient] = None) -> List[VolumeInfo]:
        d = await (client or default_async_client()).json("GET", "/v1/volumes")
        return [VolumeInfo.from_json(v) for v in d.get("volumes", [])]

    async def info(self) -> VolumeInfo:
        return VolumeInfo.from_json(await self.client.json("GET", self._path))

    async def delete(self) -> None:
        await self.client.request("DELETE", self._path)


class _SecretBase:
    def __init__(self, name: str) -> None:
        self.name = name
        self._path = f"/v1/secrets/{quote(name, safe='')}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def env(self, var: str) -> Dict[str, Any]:
        """A ``secrets`` entry of ``Sandbox.create``: the value as variable ``var``."""
        return _spec.secret_env(self.name, var)

    def file(
        self,
        path: str,
        *,
        mode: Union[int, str, None] = None,
        uid: Optional[int] = None,
        gid: Optional[int] = None,
    ) -> Dict[str, Any]:
        """A ``secrets`` entry of ``Sandbox.create``: the value as the file ``path``
        (``/run/secrets/NAME``; see :func:`sandlot.secret_file`)."""
        return _spec.secret_file(self.name, path, mode=mode, uid=uid, gid=gid)


class Secret(_SecretBase):
    """A secret of the caller's tenant (synchronous)."""

    def __init__(self, name: str, *, client: Optional[Client] = None) -> None:
        super().__init__(name)
        self.client = client or default_client()

    @classmethod
    def create(cls, name: str, value: Union[str, bytes], *, client: Optional[Client] = None) -> "Secret":
        """Stores secret ``name`` (UTF-8, at most 64K; ``ConflictError`` if it exists:
        delete it first to change it)."""
        c = client or default_client()
        c.json("POST", "/v1/secrets", json=_secret_body(name, value))
        return cls(name, client=c)

    @staticmethod
    def list(*, client: Optional[Client] = None) -> List[SecretInfo]:
        """The tenant's secrets, names only."""
        d = (client or default_client()).json("GET", "/v1/secrets")
        return [SecretInfo.from_json(s) for s in d.get("secrets", [])]

    def delete(self) -> None:
        """Removes the secret (``NotFoundError`` if there is none); sandboxes that
        have it keep their copy."""
        self.client.request("DELETE", self._path)


class AsyncSecret(_SecretBase):
    """A secret of the caller's tenant (asyncio)."""

    def __init__(self, name: str, *, client: Optional[AsyncClient] = None) -> None:
        super().__init__(name)
        self.client = client or default_async_client()

    @classmethod
    async def create(
        cls, name: str, value: Union[str, bytes], *, client: Optional[AsyncClient] = None
    ) -> "AsyncSecret":
        """See :meth:`Secret.create`."""
        c = client or default_async_client()
        await c.json("POST", "/v1/secrets", json=_secret_body(name, value))
        return cls(name, client=c)

    @staticmethod
    async def list(*, client: Optional[AsyncClient] = None) -> List[SecretInfo]:
        d = await (client or default_async_client()).json("GET", "/v1/secrets")
        return [SecretInfo.from_json(s) for s in d.get("secrets", [])]

    async def delete(self) -> None:
        await self.client.request("DELETE", self._path)
