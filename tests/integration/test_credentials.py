"""Stored credentials are sealed at rest, and rotate to a new key in batches.

A database dump must not be enough to forge a webhook or act as the App:
every signing secret, catch-up token and App private key is stored sealed
(``models.sealing``), on SQLite and PostgreSQL, and ``taskhook secrets
rotate``'s batches (``models.credentials``) move them to a new key, each
batch committed, resumable, without overwriting a credential changed
meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import text

from models import sealing
from models.catchup import log_settings, set_app_access, set_log_access
from models.credentials import (
    PLAIN,
    KeyStillSeals,
    check_keys_cover,
    credential_counts,
    reseal_batch,
    rotate,
)
from models.db import session_scope
from models.sources import add_secret, verifying_source
from tests.support.feeds import make_feed
from tests.support.stores import Store

OLD, NEW = sealing.new_key(), sealing.new_key()
SECRET, TOKEN = "gh-secret", "ghp_canaryTOKEN0123456789"


@pytest.fixture
def keys() -> Iterator[None]:
    """The process's keyring for one test: OLD seals; put back after."""
    before = sealing.installed()
    sealing.install(sealing.Keyring([OLD]))
    yield
    sealing.install(before)


def raw(store: Store, sql: str) -> list[str]:
    """Values as the database holds them: what a dump would show."""
    with store.engine.connect() as connection:
        return [row[0] for row in connection.execute(text(sql))]


def private_key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()


def test_every_credential_is_stored_sealed_and_reads_as_it_was_given(store: Store, keys):
    make_feed(store.sessions)
    pem = private_key_pem()
    with session_scope(store.sessions) as session:
        set_log_access(
            session=session, slug="acme-github", target="repos/acme/app", token=TOKEN, hook_id="1"
        )
        set_app_access(session=session, slug="acme-github", app_id="123", private_key=pem)
        set_log_access(
            session=session, slug="acme-github", target="repos/acme/app", token=TOKEN, hook_id="1"
        )
    stored = raw(store, "SELECT secret FROM source_secrets") + raw(
        store, "SELECT token FROM catchup_sources"
    )
    assert stored and all(
        value.startswith(f"enc:fernet:{sealing.key_id(OLD)}:") for value in stored
    )
    dump = " ".join(stored)
    assert SECRET not in dump and "jira-secret" not in dump and TOKEN not in dump
    with session_scope(store.sessions) as session:
        source = verifying_source(session=session, provider="github", slug="acme-github")
        assert source is not None and source.secrets == (SECRET,)
        assert log_settings(session=session, slug="acme-github").token == TOKEN
    with session_scope(store.sessions) as session:
        set_app_access(session=session, slug="acme-github", app_id="123", private_key=pem)
    (sealed_key,) = raw(store, "SELECT private_key FROM catchup_sources")
    assert sealed_key.startswith("enc:fernet:") and "PRIVATE KEY" not in sealed_key
    with session_scope(store.sessions) as session:
        assert log_settings(session=session, slug="acme-github").private_key.strip() == pem.strip()


def test_plain_values_stored_before_sealing_still_read_and_are_counted(store: Store, keys):
    make_feed(store.sessions)
    with store.engine.begin() as connection:
        connection.execute(text("UPDATE source_secrets SET secret = 'plain-old-secret'"))
    with session_scope(store.sessions) as session:
        source = verifying_source(session=session, provider="github", slug="acme-github")
        assert source is not None and source.secrets == ("plain-old-secret",)
        assert credential_counts(session) == {PLAIN: 2}


def test_rotate_seals_everything_under_the_first_key_a_batch_at_a_time(store: Store, keys):
    make_feed(store.sessions)
    with session_scope(store.sessions) as session:
        for n in range(3):
            add_secret(session=session, slug="acme-github", new_secret=f"next-{n}")
        set_log_access(
            session=session, slug="acme-github", target="repos/acme/app", token=TOKEN, hook_id="1"
        )
    with store.engine.begin() as connection:  # one left from before sealing
        connection.execute(text("UPDATE source_secrets SET secret = 'plain-old' WHERE id = 1"))
    with session_scope(store.sessions) as session:
        assert credential_counts(session) == {sealing.key_id(OLD): 5, PLAIN: 1}

    new = sealing.install(sealing.Keyring([NEW, OLD]))
    # Stopped after two batches of two: four moved, each batch committed.
    assert rotate(store.sessions, new, batch_size=2, max_batches=2) == 4
    with session_scope(store.sessions) as session:
        counts = credential_counts(session)
    assert counts[sealing.key_id(NEW)] == 4 and sum(counts.values()) == 6
    # Run again: it goes on from what is left, and ends.
    assert rotate(store.sessions, new, batch_size=2) == 2
    with session_scope(store.sessions) as session:
        assert credential_counts(session) == {sealing.key_id(NEW): 6}
        check_keys_cover(session, sealing.Keyring([NEW]))  # OLD seals nothing now
        source = verifying_source(session=session, provider="github", slug="acme-github")
        assert source is not None
        assert set(source.secrets) == {"plain-old", "next-0", "next-1", "next-2"}
        assert log_settings(session=session, slug="acme-github").token == TOKEN
    # NEW alone opens everything.
    sealing.install(sealing.Keyring([NEW]))
    with session_scope(store.sessions) as session:
        assert log_settings(session=session, slug="acme-github").token == TOKEN


def test_a_key_removed_while_it_still_seals_is_refused_with_a_count(store: Store, keys):
    make_feed(store.sessions)
    with session_scope(store.sessions) as session, pytest.raises(KeyStillSeals) as refused:
        check_keys_cover(session, sealing.Keyring([NEW]))
    assert refused.value.count == 2 and refused.value.key_id == sealing.key_id(OLD)
    assert "taskhook secrets rotate" in str(refused.value)


def test_rotate_never_overwrites_a_credential_changed_meanwhile(postgres_store: Store, keys):
    """The write is a compare and set on the stored text: a secret an operator
    replaces between the batch's read and its write keeps the new value, and
    is sealed by the next batch. (PostgreSQL: SQLite takes one writer at a
    time, so nothing changes between a batch's read and its write there.)"""
    store = postgres_store
    make_feed(store.sessions)
    meddled: list[str] = []

    class Meddling(sealing.Keyring):
        def reseal(self, stored: str) -> str | None:
            fresh = super().reseal(stored)
            if not meddled:  # once, while the batch is between its read and its write
                with store.engine.begin() as connection:
                    connection.execute(
                        text("UPDATE source_secrets SET secret = 'changed-meanwhile' WHERE id = 1")
                    )
                meddled.append(stored)
            return fresh

    new = Meddling([NEW, OLD])
    with session_scope(store.sessions) as session:
        done = reseal_batch(session, new, batch_size=10)
    assert (done.resealed, done.raced) == (1, 1)
    assert raw(store, "SELECT secret FROM source_secrets WHERE id = 1") == ["changed-meanwhile"]
    with session_scope(store.sessions) as session:
        assert reseal_batch(session, new, batch_size=10).resealed == 1
    sealing.install(new)
    with session_scope(store.sessions) as session:
        source = verifying_source(session=session, provider="github", slug="acme-github")
        assert source is not None and source.secrets == ("changed-meanwhile",)
        assert credential_counts(session) == {sealing.key_id(NEW): 2}
