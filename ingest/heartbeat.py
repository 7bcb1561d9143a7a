"""The ingress's heartbeat: when this process was up, for ``models.uptime``.

A window no ingress process covered is one in which deliveries may have been
missed; so is one in which this process answered them 503 (``ingest.refusals``),
recorded as soon as it stores again. ``taskhook stats`` shows those no
catch-up has covered yet.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from ingest.runtime import IngressRuntime
from models.db import session_scope
from models.uptime import ingress_alive, ingress_refused, ingress_started, ingress_stopped

log = logging.getLogger(__name__)


@asynccontextmanager
async def beating(runtime: IngressRuntime) -> AsyncIterator[None]:
    """Record this process's start, stamp it alive every
    ``ingress_heartbeat_seconds`` while the block runs, and its clean stop at
    the end. A database that cannot take the stamp (down, not yet migrated) is
    logged and the ingress serves on: the heartbeat is a record, not a gate."""
    task = asyncio.create_task(_beat(runtime))
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


async def _beat(runtime: IngressRuntime) -> None:
    beat_id = None
    try:
        while True:
            try:
                if beat_id is None:
                    beat_id = await runtime.in_store_thread(_started, runtime)
                elif refused := runtime.refusals.pending():
                    beat_id = await runtime.in_store_thread(_refused, runtime, beat_id, refused)
                    runtime.refusals.recorded(len(refused))
                else:
                    await runtime.in_store_thread(_alive, runtime, beat_id)
            except Exception as error:  # never a reason to stop serving
                log.warning("ingress heartbeat not recorded: %s", type(error).__name__)
            # Woken early when a stretch of refusals ends: stats shows it at once.
            with suppress(TimeoutError):
                await asyncio.wait_for(
                    runtime.refusals.changed.wait(), runtime.settings.ingress_heartbeat_seconds
                )
    except asyncio.CancelledError:
        if beat_id is not None:  # a clean stop: the uptime ends here
            with suppress(Exception):
                await asyncio.shield(runtime.in_store_thread(_stopped, runtime, beat_id))
        raise


def _started(runtime: IngressRuntime) -> int:
    with session_scope(runtime.sessions) as session:
        return ingress_started(session=session, host=socket.gethostname(), pid=os.getpid())


def _alive(runtime: IngressRuntime, beat_id: int) -> None:
    with session_scope(runtime.sessions) as session:
        ingress_alive(session=session, heartbeat_id=beat_id)


def _refused(runtime: IngressRuntime, beat_id: int, refused: list) -> int:
    with session_scope(runtime.sessions) as session:
        for since, until in refused:
            beat_id = ingress_refused(
                session=session,
                heartbeat_id=beat_id,
                since=since,
                until=until,
                host=socket.gethostname(),
                pid=os.getpid(),
            )
        return beat_id


def _stopped(runtime: IngressRuntime, beat_id: int) -> None:
    with session_scope(runtime.sessions) as session:
        ingress_stopped(session=session, heartbeat_id=beat_id)
