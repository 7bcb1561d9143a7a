"""When the ingress was up, and the windows it was not that no catch-up covered.

Each ingress process records its start and stamps itself alive every
``ingress_heartbeat_seconds`` (``ingest.app``). A stretch of time no process
covered is *downtime*: a provider that does not retry (GitHub) lost every
delivery it sent then. A window is *covered* for a source once a complete
catch-up run of that source read the whole window (``models.catchup``).

A process that is up but cannot store -- its database failing over -- answers
deliveries 503, and GitHub does not send those again: that stretch is a
window too, whatever other processes did. The process ends its row there
and starts a new one (:func:`ingress_refused`); the ended row keeps when it
was seen again in ``last_seen_at``, past ``stopped_at``, which a clean stop
never is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from models.tables import CatchUpRun, IngressHeartbeat, WebhookSource, utcnow

#: How far back downtime is looked for: GitHub Enterprise Server keeps a
#: hook's deliveries 7 days; anything older no catch-up can recover.
LOOK_BACK = timedelta(days=7)


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime
    #: Where a catch-up reads from to cover it: ``start``, unless the
    #: process before it died -- then its last heartbeat, since it may have
    #: died right after it (:func:`downtime`).
    read_from: datetime | None = None
    #: A process was up but answered deliveries 503 (its database was
    #: unavailable), rather than none was up.
    refused: bool = False

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @property
    def since(self) -> datetime:
        return self.read_from or self.start


def ingress_started(*, session: Session, host: str, pid: int) -> int:
    """Record an ingress process's start; its heartbeat row's id."""
    now = utcnow()
    beat = IngressHeartbeat(host=host[:255], pid=pid, started_at=now, last_seen_at=now)
    session.add(beat)
    session.flush()
    return beat.id


def ingress_alive(*, session: Session, heartbeat_id: int) -> None:
    session.execute(
        update(IngressHeartbeat)
        .where(IngressHeartbeat.id == heartbeat_id)
        .values(last_seen_at=utcnow())
        .execution_options(synchronize_session=False)
    )


def ingress_stopped(*, session: Session, heartbeat_id: int) -> None:
    """Record a clean stop: the process's uptime ends now."""
    now = utcnow()
    session.execute(
        update(IngressHeartbeat)
        .where(IngressHeartbeat.id == heartbeat_id)
        .values(last_seen_at=now, stopped_at=now)
        .execution_options(synchronize_session=False)
    )


def ingress_refused(
    *, session: Session, heartbeat_id: int, since: datetime, until: datetime, host: str, pid: int
) -> int:
    """Record that a process answered deliveries 503 from ``since`` until it
    stored one again at ``until``: its row ends at ``since`` (seen again at
    ``until``) and a new one starts at ``until``; the new row's id."""
    session.execute(
        update(IngressHeartbeat)
        .where(IngressHeartbeat.id == heartbeat_id)
        .values(stopped_at=since, last_seen_at=until)
        .execution_options(synchronize_session=False)
    )
    beat = IngressHeartbeat(host=host[:255], pid=pid, started_at=until, last_seen_at=until)
    session.add(beat)
    session.flush()
    return beat.id


def downtime(
    *, session: Session, heartbeat_seconds: float, now: datetime | None = None
) -> list[Window]:
    """The windows within :data:`LOOK_BACK` when no ingress process was up,
    oldest first, from the first process ever recorded on. A process that
    stopped cleanly was up until its stop; one that died counts as up until
    two heartbeats after its last one (one may be late), and a catch-up of
    the window after it reads from that last heartbeat (``read_from``). The
    last window is still open (ends ``now``) while none is up. A stretch a
    process answered deliveries 503 is a window even while others were up
    (:func:`ingress_refused`); windows that overlap are merged."""
    now = now or utcnow()
    slack = timedelta(seconds=2 * heartbeat_seconds)
    rows = session.execute(
        select(
            IngressHeartbeat.started_at,
            IngressHeartbeat.last_seen_at,
            IngressHeartbeat.stopped_at,
        )
        .where(IngressHeartbeat.last_seen_at >= now - LOOK_BACK - slack)
        .order_by(IngressHeartbeat.started_at)
    ).all()
    windows: list[Window] = [
        Window(stopped_at, last_seen_at, refused=True)
        for _, last_seen_at, stopped_at in rows
        if stopped_at is not None and last_seen_at > stopped_at
    ]
    #: Up until then, and from when a catch-up must read if nothing follows.
    covered_until: datetime | None = None
    read_from: datetime | None = None
    for started_at, last_seen_at, stopped_at in rows:
        if covered_until is not None and started_at > covered_until:
            windows.append(Window(covered_until, started_at, read_from))
        if stopped_at is not None:
            up_until, unsure_from = stopped_at, None
        else:
            up_until, unsure_from = last_seen_at + slack, last_seen_at
        if covered_until is None or up_until > covered_until:
            covered_until, read_from = up_until, unsure_from
    if covered_until is not None and covered_until < now:
        windows.append(Window(covered_until, now, read_from))
    return _merged([window for window in windows if window.end > now - LOOK_BACK])


def _merged(windows: list[Window]) -> list[Window]:
    """Oldest first, overlapping windows made one (refused if either was)."""
    merged: list[Window] = []
    for window in sorted(windows, key=lambda window: window.since):
        last = merged[-1] if merged else None
        if last is None or window.since > last.end:
            merged.append(window)
            continue
        start, since = min(last.start, window.start), min(last.since, window.since)
        merged[-1] = Window(
            start,
            max(last.end, window.end),
            since if since != start else None,
            refused=last.refused or window.refused,
        )
    return merged


def uncovered(*, session: Session, windows: list[Window]) -> dict[str, list[Window]]:
    """For each enabled source, the ``windows`` no complete catch-up run of
    it has read whole (a run reads from ``since`` to ``covered_until``)."""
    runs: dict[int, list[tuple[datetime, datetime]]] = {}
    for source_id, since, until in session.execute(
        select(CatchUpRun.source_id, CatchUpRun.since, CatchUpRun.covered_until).where(
            CatchUpRun.covered_until.is_not(None)
        )
    ):
        runs.setdefault(source_id, []).append((since, until))
    sources = session.execute(
        select(WebhookSource.id, WebhookSource.slug)
        .where(WebhookSource.enabled.is_(True))
        .order_by(WebhookSource.slug)
    ).all()
    gaps: dict[str, list[Window]] = {}
    for source_id, slug in sources:
        read = runs.get(source_id, [])
        missing = [
            window
            for window in windows
            if not any(since <= window.since and window.end <= until for since, until in read)
        ]
        if missing:
            gaps[slug] = missing
    return gaps
