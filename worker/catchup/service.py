"""Catch up a GitHub source from its hook's delivery log.

GitHub never redelivers a delivery that failed. A run lists the hook's log
since the source's cursor, groups the attempts by ``guid`` (constant across
redeliveries), and for every create delivery the inbox does not hold fetches
what GitHub sent and stores it through the ingress's own reading
(``ingest.adapters.incoming_delivery``) under its guid, marked ``catch-up``:
a later real redelivery of it is then a duplicate (``models.inbox``
``stored_duplicate``), and the task is created once, by the worker, as for
any delivery. Each recovered delivery commits on
its own, so a run cut off halfway loses nothing it stored, and the next run
finds those in the inbox and does not store them twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

import httpx
from sqlalchemy.orm import Session, sessionmaker

from ingest.adapters import Refusal, incoming_delivery
from ingest.webhooks import KEPT_HEADERS
from models.catchup import LogSettings, known_delivery_ids, log_settings, window_start
from models.db import session_scope
from models.errors import InvalidSource
from models.inbox import DeliveryStatus, record_delivery
from models.providers import PROVIDERS
from models.sources import VerifyingSource, verifying_source
from models.tables import CatchUpRun, utcnow
from worker.catchup.github_log import (
    AppJwt,
    AttemptNotFound,
    DeliveryLog,
    LoggedAttempt,
    missed_creates,
)

log = logging.getLogger(__name__)

ORIGIN = "catch-up"  # deliveries.origin of a recovered delivery
GITHUB = PROVIDERS["github"]

Send = Callable[[int], None]
LogFactory = Callable[[LogSettings], DeliveryLog]


@dataclass
class CatchUpReport:
    """What one run read and did."""

    run_id: int
    source: str
    since: datetime
    dry_run: bool
    attempts_listed: int = 0
    deliveries_listed: int = 0
    #: Guids of create deliveries the inbox did not hold.
    missed: list[str] = field(default_factory=list)
    #: Inbox rows stored for them (or, with ``redeliver``, attempts GitHub was
    #: asked to redeliver).
    recovered: list[int] = field(default_factory=list)
    #: Guids the ingress's reading refused, with why (a body it cannot store).
    refused: dict[str, str] = field(default_factory=dict)
    covered_until: datetime | None = None


def open_log(settings: LogSettings) -> DeliveryLog:
    if settings.token is not None:
        return DeliveryLog(
            api_base_url=settings.api_base_url, hook_path=settings.hook_path, token=settings.token
        )
    app = AppJwt(app_id=settings.app_id, private_key=settings.private_key)
    return DeliveryLog(
        api_base_url=settings.api_base_url, hook_path=settings.hook_path, authorization=app
    )


def catch_up_github(
    *,
    sessions: sessionmaker[Session],
    slug: str,
    send: Send,
    since: datetime | None = None,
    dry_run: bool = False,
    redeliver: bool = False,
    open_log: LogFactory = open_log,
) -> CatchUpReport:
    """One catch-up of GitHub source ``slug``; see the module docstring.

    ``send`` hands a stored delivery's key to the worker (after its commit);
    ``redeliver`` asks GitHub to send each missed delivery again instead of
    fetching it. Raises the domain's errors for a source that cannot be
    caught up, and ``worker.catchup.github_log.CatchUpError`` when GitHub's
    API refuses or is down -- recorded on the run first.
    """
    started = utcnow()
    with session_scope(sessions) as session:
        settings = log_settings(session=session, slug=slug)
        source = verifying_source(session=session, provider=GITHUB.name, slug=slug)
        if source is None:
            raise InvalidSource(f"source {slug!r} is disabled; enable it to catch it up")
        since = since or window_start(session=session, source_id=source.id, now=started)
        run = CatchUpRun(source_id=source.id, since=since, dry_run=dry_run, started_at=started)
        session.add(run)
        session.flush()
        report = CatchUpReport(run_id=run.id, source=slug, since=since, dry_run=dry_run)

    try:
        with open_log(settings) as delivery_log:
            _read_and_recover(sessions, delivery_log, source, report, send, redeliver)
    except Exception as error:
        _record(sessions, report, error=f"{type(error).__name__}: {error}")
        raise
    # The log is read up to when this run began listing it: the next run's cursor.
    report.covered_until = None if dry_run else started
    _record(sessions, report)
    return report


def _read_and_recover(
    sessions: sessionmaker[Session],
    delivery_log: DeliveryLog,
    source: VerifyingSource,
    report: CatchUpReport,
    send: Send,
    redeliver: bool,
) -> None:
    attempts = list(delivery_log.attempts(since=report.since))
    report.attempts_listed = len(attempts)
    report.deliveries_listed = len({attempt.guid for attempt in attempts})

    def known(guids: list[str]) -> set[str]:
        with session_scope(sessions) as session:
            return known_delivery_ids(session=session, source_id=source.id, delivery_ids=guids)

    missed = missed_creates(attempts, known_guids=known, create_events=source.create_events)
    report.missed = [attempt.guid for attempt in missed]
    if report.dry_run:
        return
    for attempt in missed:
        if redeliver:
            delivery_log.redeliver(attempt.id)
            report.recovered.append(attempt.id)
            continue
        pk = _recover(sessions, delivery_log, source, attempt, report)
        if pk is not None:
            report.recovered.append(pk)
            send(pk)  # committed first: the message never names a row that might not exist


def _recover(
    sessions: sessionmaker[Session],
    delivery_log: DeliveryLog,
    source: VerifyingSource,
    attempt: LoggedAttempt,
    report: CatchUpReport,
) -> int | None:
    """Store what GitHub sent for ``attempt``; the new row's key when it is
    queued for the worker, None when it is not (refused, or stored meanwhile)."""
    try:
        sent = delivery_log.request_of(attempt.id)
    except AttemptNotFound as error:  # gone from GitHub's log since it was listed
        report.refused[attempt.guid] = str(error)
        return None
    headers = httpx.Headers(sent.headers)
    # GitHub's log keeps the payload as JSON, not the bytes it signed: the
    # body is rebuilt from it, as JSON whatever the hook's content type. It
    # was read from GitHub's API with the source's own credential, which
    # stands in for the signature.
    body = json.dumps(sent.payload, ensure_ascii=False, separators=(",", ":")).encode()
    headers["content-type"] = "application/json"
    kept = {
        name: headers[name] for name in (*KEPT_HEADERS, *GITHUB.kept_headers) if name in headers
    }
    try:
        incoming, _known = incoming_delivery(
            GITHUB,
            source,
            delivery_id=attempt.guid,
            headers=headers,
            body=body,
            body_sha256=hashlib.sha256(body).hexdigest(),
            kept_headers=kept,
            max_age_seconds=0,  # GitHub's bodies do not say when they were sent
        )
    except Refusal as refusal:
        report.refused[attempt.guid] = refusal.reason
        return None
    with session_scope(sessions) as session:
        recorded = record_delivery(session=session, incoming=replace(incoming, origin=ORIGIN))
    log.info("catch-up %s: delivery %s stored as %s", report.source, attempt.guid, recorded.pk)
    if not recorded.is_new or recorded.status is not DeliveryStatus.QUEUED:
        return None
    return recorded.pk


def _record(
    sessions: sessionmaker[Session], report: CatchUpReport, *, error: str | None = None
) -> None:
    with session_scope(sessions) as session:
        run = session.get(CatchUpRun, report.run_id)
        run.finished_at = utcnow()
        run.covered_until = report.covered_until
        run.attempts_listed = report.attempts_listed
        run.deliveries_listed = report.deliveries_listed
        run.missed = len(report.missed)
        run.recovered = len(report.recovered)
        run.error = error
