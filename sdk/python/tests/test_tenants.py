"""The operator's list of tenants through the SDK, sync and async: every tenant
with its quota and usage for the operator; a tenant's token is refused."""

from __future__ import annotations

import pytest

import sandlot


def test_the_operator_lists_tenants_with_usage_and_a_tenant_is_refused(operator, acme, other) -> None:  # type: ignore[no-untyped-def]
    with sandlot.Sandbox.create(client=acme, memory="128M", timeout=120) as _sb:
        by_name = {t.name: t for t in operator.tenants()}
        assert {"acme", "other"} <= set(by_name)
        a = by_name["acme"]
        assert isinstance(a, sandlot.TenantInfo)
        assert a.sandboxes_live >= 1
        assert a.memory_limit_bytes >= 128 << 20
        assert a.max_sandboxes > 0
        assert a.active_tokens >= 1
    with pytest.raises(sandlot.errors.ForbiddenError):
        other.tenants()


async def test_async_tenants_are_the_operators(daemon, aacme) -> None:  # type: ignore[no-untyped-def]
    async with sandlot.AsyncClient(daemon.unix_url, token="") as op:
        names = [t.name for t in await op.tenants()]
    assert "acme" in names
    with pytest.raises(sandlot.errors.ForbiddenError):
        await aacme.tenants()
