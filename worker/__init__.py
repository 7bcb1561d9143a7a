"""The worker: the Celery app and tasks, the sweeper, operator tasks, and the CLI.

``celery -A worker worker`` finds :data:`app` here. It is imported on first
access, so importing ``worker.processing`` or the CLI builds no Celery app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery

    app: Celery

__all__ = ["app"]


def __getattr__(name: str) -> Any:
    if name == "app":
        from worker.celery_app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
