"""What a name no source answers to costs the ingress, on SQLite and
PostgreSQL: the answer that there is no such source is cached as briefly as a
known source's secrets (``TASKHOOK_SOURCE_CACHE_SECONDS``), in a cache of its
own and of bounded size (``ingest.runtime``)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event
from sqlalchemy.engine import Engine

import ingest.runtime
from models.db import session_scope
from models.sources import add_source, set_source_enabled
from tests.support.ingress import GITHUB_SECRET, Ingress, open_ingress, wait_until
from tests.support.stores import Store


class Visits:
    """The transactions and statements the ingress's engine runs, counted
    from when it is made."""

    def __init__(self, engine: Engine) -> None:
        self.transactions = self.statements = 0
        event.listen(engine, "begin", self._begun)
        event.listen(engine, "before_cursor_execute", self._executed)

    def _begun(self, connection) -> None:
        self.transactions += 1

    def _executed(self, connection, cursor, statement, *rest) -> None:
        self.statements += 1

    @property
    def counts(self) -> tuple[int, int]:
        return self.transactions, self.statements


@contextmanager
def cached(store: Store, seconds: float) -> Iterator[tuple[Ingress, Visits]]:
    """The ingress with sources cached for ``seconds``, and what it asks of the
    store from the first heartbeat on (no other beat comes meanwhile)."""
    opened = open_ingress(store, source_cache_seconds=seconds, ingress_heartbeat_seconds=3600)
    ingress = next(opened)
    try:
        wait_until(lambda: store.scalar("SELECT count(*) FROM ingress_heartbeats"))
        yield ingress, Visits(ingress.client.app.state.runtime.sessions.kw["bind"])
    finally:
        opened.close()


def test_a_name_no_source_answers_to_is_looked_up_once_per_cache_time(store: Store):
    with cached(store, seconds=60) as (ingress, visits):
        first = ingress.github("issues__opened", source="nope")
        assert first.status_code == 404
        assert visits.counts == (1, 1)  # one transaction, one SELECT: as before

        again = [ingress.github("issues__opened", source="nope") for _ in range(20)]

        assert [response.status_code for response in again] == [404] * 20
        assert visits.counts == (1, 1)  # was (21, 21): one transaction per POST
        # Each provider's name apart: a GitHub name says nothing of a Jira one.
        assert ingress.jira("jira_issue_created__cloud", source="nope").status_code == 404
        assert visits.counts == (2, 2)
        # Known sources are served as before.
        assert ingress.github("issues__opened").status_code == 202


def test_a_source_added_under_a_cached_name_is_taken_within_the_cache_time(store: Store):
    seconds = 2.0
    with cached(store, seconds=seconds) as (ingress, _):
        asked = time.monotonic()
        assert ingress.github("issues__opened", source="late").status_code == 404
        with session_scope(store.sessions) as session:
            add_source(
                session=session,
                provider="github",
                workspace_id=store.workspace("globex", "GLX").id,
                slug="late",
                secret=GITHUB_SECRET,
                create_events=["issues.opened"],
            )

        # Still the cached answer, within the cache time...
        assert ingress.github("issues__opened", source="late").status_code == 404
        time.sleep(max(0.0, asked + seconds + 0.1 - time.monotonic()))

        # ...and the new source after it.
        assert ingress.github("issues__opened", source="late").status_code == 202


def test_a_source_enabled_again_is_taken_within_the_cache_time(store: Store):
    seconds = 1.0
    with cached(store, seconds=seconds) as (ingress, _):
        with session_scope(store.sessions) as session:
            set_source_enabled(session=session, slug="acme-github", enabled=False)
        assert ingress.github("issues__opened").status_code == 404
        with session_scope(store.sessions) as session:
            set_source_enabled(session=session, slug="acme-github", enabled=True)

        wait_until(lambda: ingress.github("issues__opened").status_code == 202, timeout=seconds + 2)


def test_random_names_keep_the_cache_at_its_size(store: Store, monkeypatch):
    monkeypatch.setattr(ingest.runtime, "_MAX_UNKNOWN_SOURCES", 8)
    with cached(store, seconds=60) as (ingress, visits):
        runtime = ingress.client.app.state.runtime
        hammered = "hammered"
        names = [f"random-{secrets.token_hex(4)}" for _ in range(30)]
        names.append("x" * 20_000)  # as long as the head allows
        for name in names:
            assert ingress.github("issues__opened", source=name).status_code == 404
            # Asked for all along: never the least lately asked for.
            assert ingress.github("issues__opened", source=hammered).status_code == 404

        assert len(runtime._unknown) == 8
        # Each name kept as a digest, however long it was.
        assert {len(digest) for _, digest in runtime._unknown} == {32}
        # One lookup per name, the hammered one's included: it was never pushed out.
        assert visits.transactions == len(names) + 1
        # The latest names are still cached; the first ones were pushed out.
        for name in names[-7:]:
            ingress.github("issues__opened", source=name)
        assert visits.transactions == len(names) + 1
        ingress.github("issues__opened", source=names[0])
        assert visits.transactions == len(names) + 2


def test_no_cache_time_caches_no_name(store: Store):
    with cached(store, seconds=0) as (ingress, visits):
        for _ in range(3):
            assert ingress.github("issues__opened", source="nope").status_code == 404
        assert visits.transactions == 3
        assert not ingress.client.app.state.runtime._unknown
