"""The stored credentials as a whole: which key seals how many, and sealing
them all under the first key (``taskhook secrets rotate``).

Every credential column is a :class:`~models.sealing.SealedText`
(:data:`COLUMNS`). Here they are read as stored -- ``type_coerce`` to plain
text, so nothing is opened -- because what matters is which key sealed each
value, not the value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Text, select, type_coerce, update
from sqlalchemy.orm import InstrumentedAttribute, Session

from models.sealing import PREFIX, Keyring, SealingError, sealed_by
from models.tables import CatchUpSource, SourceSecret

#: Every column that holds a credential, with its table's key.
COLUMNS: tuple[tuple[InstrumentedAttribute, InstrumentedAttribute], ...] = (
    (SourceSecret.secret, SourceSecret.id),
    (CatchUpSource.token, CatchUpSource.source_id),
    (CatchUpSource.private_key, CatchUpSource.source_id),
)
#: How :func:`credential_counts` names values stored as plain text.
PLAIN = "plain"


def credential_counts(session: Session) -> Counter[str]:
    """How many stored credentials each key id seals; :data:`PLAIN` for
    those stored before sealing."""
    counts: Counter[str] = Counter()
    for column, _ in COLUMNS:
        raw = type_coerce(column, Text)
        for (value,) in session.execute(select(raw).where(column.is_not(None))):
            counts[sealed_by(value) or PLAIN] += 1
    return counts


def check_keys_cover(session: Session, keyring: Keyring) -> None:
    """:class:`UnknownKey` for the first key id a stored value names and
    ``keyring`` lacks: a key removed while it still seals something."""
    for which, count in sorted(credential_counts(session).items()):
        if which != PLAIN and which not in keyring.key_ids:
            raise KeyStillSeals(which, count)


class KeyStillSeals(SealingError):
    """A key the settings no longer hold still seals stored credentials."""

    def __init__(self, key_id: str, count: int) -> None:
        values = "1 stored credential is" if count == 1 else f"{count} stored credentials are"
        super().__init__(
            f"{values} sealed by key {key_id}, which the encryption keys no longer hold: "
            "put it back (after the first key), run `taskhook secrets rotate`, then remove it"
        )
        self.key_id = key_id
        self.count = count


@dataclass
class Rotated:
    """What one :func:`reseal_batch` did."""

    resealed: int = 0
    #: Changed by someone else between the read and the write: left for the next batch.
    raced: int = 0


def reseal_batch(session: Session, keyring: Keyring, batch_size: int) -> Rotated:
    """Seal up to ``batch_size`` values not sealed by the first key under it.

    Each value is written only if it is still what was read (compare and
    set on the stored text): a credential an operator changes meanwhile is
    not overwritten with its old value. The caller commits; a stopped
    rotation leaves every value readable, and the next run goes on."""
    done = Rotated()
    wanted = f"{PREFIX}{keyring.primary_id}:%"
    for column, key in COLUMNS:
        room = batch_size - done.resealed - done.raced
        if room <= 0:
            break
        raw = type_coerce(column, Text)
        rows = session.execute(
            select(key, raw)
            .where(column.is_not(None), raw.not_like(wanted))
            .order_by(key)
            .limit(room)
        ).all()
        for row_key, stored in rows:
            fresh = keyring.reseal(stored)
            if fresh is None:
                continue
            changed = session.execute(
                update(column.class_)
                .where(key == row_key, raw == stored)
                .values({column.key: fresh})
                .execution_options(synchronize_session=False)
            ).rowcount
            if changed:
                done.resealed += 1
            else:
                done.raced += 1
    return done


def rotate(
    sessions: Callable[[], Session],
    keyring: Keyring,
    *,
    batch_size: int = 500,
    max_batches: int | None = None,
    on_batch: Callable[[Rotated], None] = lambda done: None,
) -> int:
    """Re-seal every credential under the first key, a committed batch at a
    time, until none is left (or ``max_batches``). Returns how many it sealed."""
    total = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        with sessions() as session, session.begin():
            done = reseal_batch(session, keyring, batch_size)
        batches += 1
        total += done.resealed
        on_batch(done)
        if done.resealed + done.raced == 0:
            break
    return total
