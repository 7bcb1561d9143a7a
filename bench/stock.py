"""The stock stack ``bench latency`` measures taskhook against, in the same run.

What the tutorials build: a FastAPI route that checks the HMAC and calls
``create_task.delay(body)``, and a plain Celery task that parses the body and
does create-if-absent with the SQLAlchemy ORM -- SELECT by external id, INSERT
if absent, commit. It has no inbox: what the broker loses is lost.

For its latency to be measured as taskhook's is, the receiver passes the
time it received the delivery in the message (``time.time()``, the same
host's clock as taskhook's ``received_at``) and the task stamps
``created_at`` when its commit is about to happen, both on the row of
``stock_tasks`` (a table of its own in the benchmark's database).

- receiver: ``uvicorn --factory bench.stock:stock_app`` (the same uvicorn
  options as taskhook's ingress);
- worker: ``celery -A bench.stock worker``, with taskhook's worker pool and
  concurrency (``Settings`` defaults), so the two stacks' workers have the
  same threads; every other Celery setting is Celery's default, as a tutorial
  leaves it.

Configured from ``BENCH_SECRET``, ``BENCH_BROKER_URL`` and
``BENCH_DATABASE_URL`` (a SQLAlchemy URL).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from datetime import UTC, datetime

from celery import Celery
from fastapi import FastAPI, HTTPException, Request
from sqlalchemy import DateTime, String, create_engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from bench.baselines import SIGNATURE_HEADERS
from models.settings import DEFAULT_WORKER_CONCURRENCY, Settings

CREATE_TASK = "bench.stock.create_task"


class StockBase(DeclarativeBase):
    pass


class StockTask(StockBase):
    """One task per external id, as the tutorial's model has it."""

    __tablename__ = "stock_tasks"

    id: Mapped[int] = mapped_column(primary_key=True)
    external_id: Mapped[str] = mapped_column(String(300), unique=True)
    title: Mapped[str] = mapped_column(String(500))
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def create_table(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        StockBase.metadata.create_all(engine)
    finally:
        engine.dispose()


def _worker_shape() -> dict[str, object]:
    fields = Settings.model_fields
    return {
        "worker_pool": fields["worker_pool"].default,
        "worker_concurrency": DEFAULT_WORKER_CONCURRENCY,  # on PostgreSQL
    }


celery = Celery("bench-stock", broker=os.environ.get("BENCH_BROKER_URL", "memory://"))
celery.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    # Its own queue name, so it can never take taskhook's messages.
    task_default_queue="stock",
    **_worker_shape(),
)

_engine = None


def _sessions_engine():
    """One engine per worker process, made on the first task (the receiver never needs it)."""
    global _engine
    if _engine is None:
        concurrency = int(_worker_shape()["worker_concurrency"])
        _engine = create_engine(os.environ["BENCH_DATABASE_URL"], pool_size=concurrency)
    return _engine


def external_id_and_title(payload: dict) -> tuple[str, str]:
    """What a tutorial reads from the three kinds of bodies the benchmarks post."""
    if "pull_request" in payload:
        repository = payload["repository"]["full_name"]
        return f"gh-pr/{repository}#{payload['number']}", payload["pull_request"]["title"]
    if "repository" in payload:
        repository = payload["repository"]["full_name"]
        issue = payload["issue"]
        return f"gh-issue/{repository}#{issue['number']}", issue["title"]
    issue = payload["issue"]
    return f"jira:{issue['key']}", issue["fields"]["summary"]


@celery.task(name=CREATE_TASK)
def create_task(body: str, received: float) -> bool:
    """Create-if-absent: True when this call inserted the task."""
    external_id, title = external_id_and_title(json.loads(body))
    with Session(_sessions_engine()) as session:
        existing = session.scalar(select(StockTask).where(StockTask.external_id == external_id))
        if existing is not None:
            return False
        session.add(
            StockTask(
                external_id=external_id,
                title=title[:500],
                received_at=datetime.fromtimestamp(received, UTC),
                created_at=datetime.now(UTC),
            )
        )
        try:
            session.commit()
        except IntegrityError:  # another worker created it between our SELECT and INSERT
            session.rollback()
            return False
    return True


def stock_app() -> FastAPI:
    """The tutorial receiver: HMAC check, ``.delay``, 202."""
    secret = os.environ["BENCH_SECRET"].encode()
    app = FastAPI()

    @app.post("/webhooks/{provider}/{source}", status_code=202)
    async def receive(provider: str, source: str, request: Request) -> dict[str, str]:
        body = await request.body()
        if provider not in SIGNATURE_HEADERS:
            raise HTTPException(status_code=404, detail="unknown provider")
        expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, request.headers.get(SIGNATURE_HEADERS[provider], "")):
            raise HTTPException(status_code=401, detail="bad signature")
        # Stamped where taskhook stamps received_at: the body read and verified.
        create_task.delay(body.decode(), time.time())
        return {"status": "queued"}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
