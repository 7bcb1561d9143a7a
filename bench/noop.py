"""The end-to-end baseline: a Celery app with taskhook's own settings
(``worker.celery_app.celery_config``: acks late, prefetch one, the same broker
options) and one task that does nothing. ``celery -A bench.noop worker``."""

from __future__ import annotations

from celery import Celery

from models.settings import get_settings
from worker.celery_app import celery_config

NOOP = "bench.noop"

app = Celery("bench-noop", set_as_current=True)
app.add_defaults(lambda: celery_config(get_settings()))


@app.task(name=NOOP)
def noop(delivery_pk: int) -> None:
    """Takes a key, as PROCESS_DELIVERY does, and does nothing with it."""
    del delivery_pk
