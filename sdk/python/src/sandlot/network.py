"""A sandbox's egress policy and audit log: ``sb.network``.

    sb.network.get()                                  # NetworkPolicy(mode='allow', ...)
    sb.network.set(allow=["api.example.com:443"])     # effective at once
    for e in sb.network.log():                        # DNS queries and connections
        print(e.kind, e.name, e.decision, e.reason)

A policy change cuts the open connections the new policy no longer allows. A
sandbox created with mode ``none`` has no network slot: ``set`` is then a
``ConflictError`` (create it with ``network={"mode": "allow"}`` to change it later).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, List, Mapping, Optional, Tuple, Union

from . import _spec
from .models import NetworkLogEntry, NetworkPolicy

if TYPE_CHECKING:
    from .client import AsyncClient, Client

Rule = Union[str, Mapping[str, Any]]


def _log_params(after: int, limit: Optional[int]) -> List[Tuple[str, str]]:
    q = [("after", str(after))]
    if limit is not None:
        q.append(("limit", str(limit)))
    return q


class Network:
    """The network policy and egress log of one sandbox (synchronous)."""

    def __init__(self, client: "Client", sandbox_id: str) -> None:
        self._client = client
        self._base = f"/v1/sandboxes/{sandbox_id}/network"

    def get(self) -> NetworkPolicy:
        """The policy in force."""
        return NetworkPolicy.from_json(self._client.json("GET", self._base))

    def set(
        self,
        mode: Optional[str] = None,
        *,
        allow: Optional[Iterable[Rule]] = None,
        deny: Optional[Iterable[Rule]] = None,
    ) -> NetworkPolicy:
        """Replaces the policy while the sandbox runs. ``allow`` rules alone mean mode
        ``allow``; ``deny`` rules mean mode ``open`` with those destinations refused
        (``allow`` rules then win over them); a rule is a string as the CLI's
        ``--allow`` takes it (``api.example.com:443``, ``*.example.com``,
        ``203.0.113.0/24:22,80``) or the API's dict. Above the operator's ceiling is
        a ``BadRequestError``."""
        body = _spec.network_policy(mode, allow, deny)
        return NetworkPolicy.from_json(self._client.json("PUT", self._base, json=body))

    def log(self, *, after: int = 0, limit: Optional[int] = None) -> List[NetworkLogEntry]:
        """Egress decisions, oldest first: those with a ``seq`` above ``after`` (pass
        the last one seen to page), at most ``limit`` (daemon default 1000). Kept
        after the sandbox stops."""
        d = self._client.json("GET", self._base + "/log", params=_log_params(after, limit))
        return [NetworkLogEntry.from_json(e) for e in d.get("entries", [])]


class AsyncNetwork:
    """The network policy and egress log of one sandbox (asyncio)."""

    def __init__(self, client: "AsyncClient", sandbox_id: str) -> None:
        self._client = client
        self._base = f"/v1/sandboxes/{sandbox_id}/network"

    async def get(self) -> NetworkPolicy:
        return NetworkPolicy.from_json(await self._client.json("GET", self._base))

    async def set(
        self,
        mode: Optional[str] = None,
        *,
        allow: Optional[Iterable[Rule]] = None,
        deny: Optional[Iterable[Rule]] = None,
    ) -> NetworkPolicy:
        """See :meth:`Network.set`."""
        body = _spec.network_policy(mode, allow, deny)
        return NetworkPolicy.from_json(await self._client.json("PUT", self._base, json=body))

    async def log(self, *, after: int = 0, limit: Optional[int] = None) -> List[NetworkLogEntry]:
        """See :meth:`Network.log`."""
        d = await self._client.json("GET", self._base + "/log", params=_log_params(after, limit))
        return [NetworkLogEntry.from_json(e) for e in d.get("entries", [])]
