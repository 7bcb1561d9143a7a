"""When the ingress was up, and the windows it was not that no catch-up covered.

Each ingress process records its start and stamps itself alive every
``ingress_heartbeat_seconds`` (``ingest.app``). A stretch of time no process
covered is *downtime*: a provider that does not retry (GitHub) lost every
delivery it sent then. A window is *covered* for a source once a complete
catch-up run of that source read the whole window (``models.catchup``).
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

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


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


def downtime(
    *, session: Session, heartbeat_seconds: float, now: datetime | None = None
) -> list[Window]:
    """The windows within :data:`LOOK_BACK` when no ingress process was up,
    oldest first, from the first process ever recorded on. A process counts
    as up until two heartbeats after its last one (one may be late); the
    last window is still open (ends ``now``) while none is up."""
    now = now or utcnow()
    slack = timedelta(seconds=2 * heartbeat_seconds)
    rows = session.execute(
        select(IngressHeartbeat.started_at, IngressHeartbeat.last_seen_at)
        .where(IngressHeartbeat.last_seen_at >= now - LOOK_BACK - slack)
        .order_by(IngressHeartbeat.started_at)
    ).all()
    windows: list[Window] = []
    covered_until: datetime | None = None
    for started_at, last_seen_at in rows:
        if covered_until is not None and started_at > covered_until:
            windows.append(Window(covered_until, started_at))
        up_until = last_seen_at + slack
        covered_until = up_until if covered_until is None else max(covered_until, up_until)
    if covered_until is not None and covered_until < now:
        windows.append(Window(covered_until, now))
    return [window for window in windows if window.end > now - LOOK_BACK]


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
            if not any(since <= window.start and window.end <= until for since, until in read)
        ]
        if missing:
            gaps[slug] = missing
    return gaps
