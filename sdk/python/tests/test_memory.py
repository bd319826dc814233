"""Memory stores end to end through the SDK, against the session's real daemon and its real
all-MiniLM-L6-v2 embedder (the model must be installed: scripts/setup.d/40-memory.sh)."""

from __future__ import annotations

import uuid

import pytest

import sandlot
from sandlot import AsyncMemoryStore, MemoryStore


def _name() -> str:
    return "m" + uuid.uuid4().hex[:10]


def test_memory_store_writes_searches_history_and_stays_with_its_tenant(acme: sandlot.Client, other: sandlot.Client) -> None:
    name = _name()
    store = MemoryStore.create(name, client=acme, agent="sdk-agent")
    try:
        assert name in MemoryStore.list(client=acme)
        assert MemoryStore.get(name, client=acme).info()["model"] == "all-MiniLM-L6-v2"
        w = store.add(
            "Ann Lee",
            "Ann runs customer success and tracks churn of enterprise accounts.",
            folder="people",
            tags=["crm"],
        )
        assert w["path"] == "people/ann-lee.md" and w["commit"]
        store.add("Lunch", "The canteen serves noodles on Fridays.", folder="facts")
        # Semantic: no keyword in common with the memory.
        hits = store.search("which colleague looks after clients leaving us", limit=1)
        assert [h["path"] for h in hits] == ["people/ann-lee.md"]
        # The tag filter keeps the noodles memory (folder facts, no tag) out; hybrid
        # search still returns semantic neighbours that carry the tag.
        assert store.search("noodles")[0]["path"].startswith("facts/")
        assert all(h["path"].startswith("people/") for h in store.search("noodles", tags=["crm"]))
        m = store.get("people/ann-lee")
        assert m["title"] == "Ann Lee" and "crm" in m["tags"]
        store.edit("people/ann-lee.md", add_tags=["vip"])
        store.move("people/ann-lee.md", "people/ann.md")
        log = store.log("people/ann.md")
        assert [c["author"] for c in log] == ["sdk-agent"] * 3
        first = log[-1]["rev"]
        assert "vip" not in store.get("people/ann-lee.md", rev=first)["text"]
        assert "+  - vip" in store.diff(rev_from=first) or "vip" in store.diff(rev_from=first)
        store.revert(key="people/ann.md", to=first)
        assert "vip" not in store.get("people/ann.md")["text"]
        with pytest.raises(ValueError):
            store.revert(key="people/ann.md")
        assert store.status()["indexed_files"] == 2
        assert store.reindex()["texts_embedded"] == 0
        # The Anthropic memory tool, verbatim inputs.
        out = store.memory_tool({"command": "create", "path": "/memories/todo.md", "file_text": "call the zyxel vendor\n"})
        assert out == {"text": "File created successfully at: /memories/todo.md", "is_error": False}
        assert [h["path"] for h in store.search("zyxel", mode="bm25")] == ["todo.md"]
        out = store.memory_tool({"command": "str_replace", "path": "/memories/todo.md", "old_str": "nope", "new_str": "x"})
        assert out["is_error"] is True
        store.remove("todo.md")
        assert store.search("zyxel", mode="bm25") == []
        # Errors are typed.
        with pytest.raises(sandlot.NotFoundError):
            store.get("nope")
        with pytest.raises(sandlot.ConflictError):
            MemoryStore.create(name, client=acme)
        with pytest.raises(sandlot.APIError) as e:
            store.search("x", mode="fuzzy")
        assert e.value.status == 400
        # Another tenant sees nothing.
        with pytest.raises(sandlot.NotFoundError):
            MemoryStore.get(name, client=other)
        with pytest.raises(sandlot.NotFoundError):
            MemoryStore(name, client=other).search("churn")
        assert name not in MemoryStore.list(client=other)
    finally:
        store.delete()
    with pytest.raises(sandlot.NotFoundError):
        MemoryStore.get(name, client=acme)


async def test_async_memory_store_writes_and_searches(aacme: sandlot.AsyncClient) -> None:
    name = _name()
    store = await AsyncMemoryStore.create(name, client=aacme)
    try:
        await store.add("Flags", "The vexillology club meets on Thursdays.")
        hits = await store.search("a society that studies flags", mode="vector", limit=1)
        assert [h["path"] for h in hits] == ["flags.md"]
        assert (await store.get("flags"))["title"] == "Flags"
        assert (await AsyncMemoryStore.get(name, client=aacme)).name == name
        out = await store.memory_tool({"command": "view", "path": "/memories"})
        assert "flags.md" in out["text"] and out["is_error"] is False
        log = await store.log()
        assert log[0]["author"] == "acme"
    finally:
        await store.delete()
