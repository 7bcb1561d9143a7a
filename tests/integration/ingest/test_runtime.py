"""The ingress runtime's source cache: one load per source at a time."""

from __future__ import annotations

import asyncio
import threading

from ingest.metrics import IngressMetrics
from ingest.relay import Relay
from ingest.runtime import Runtime
from models.db import session_scope
from models.settings import Settings
from models.sources import add_source
from tests.conftest import Store


def _runtime(store: Store, **settings: object) -> Runtime:
    relay = Relay(lambda keys: None)
    return Runtime(
        Settings(database_url=store.url, **settings), store.sessions, relay, IngressMetrics()
    )


def test_requests_for_an_expired_source_share_one_load(store: Store, monkeypatch):
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug="acme-github",
            secret="s",
            create_events=["issues.opened"],
        )
    runtime = _runtime(store, source_cache_seconds=60)
    loads: list[str] = []
    load = runtime._load_source
    gate = threading.Event()

    def slow_load(provider: str, slug: str):
        loads.append(slug)
        gate.wait(5)  # every request arrives while the first load runs
        return load(provider, slug)

    monkeypatch.setattr(runtime, "_load_source", slow_load)

    async def many_requests():
        waiting = [
            asyncio.create_task(runtime.verifying_source("github", "acme-github"))
            for _ in range(20)
        ]
        await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(*waiting)

    sources = asyncio.run(many_requests())

    assert loads == ["acme-github"]
    assert {source.slug for source in sources} == {"acme-github"}
    assert asyncio.run(runtime.verifying_source("github", "acme-github")).slug == "acme-github"
    assert loads == ["acme-github"]  # cached now


def test_an_unknown_source_is_not_cached_and_a_failed_load_is_not_kept(store: Store):
    runtime = _runtime(store, source_cache_seconds=60)

    async def twice():
        first = await runtime.verifying_source("github", "nobody")
        second = await runtime.verifying_source("github", "nobody")
        return first, second

    assert asyncio.run(twice()) == (None, None)
    assert runtime._loading_sources == {}
