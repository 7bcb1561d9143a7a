"""CATCH_UP, which beat sends every ``catchup_interval_seconds``."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from models.broker.lanes import Sender, keys_per_message, lane_of
from models.broker.messages import CATCH_UP, message_groups, task_for
from models.broker.versions import notice_unknown
from models.catchup import sources_to_catch_up
from models.db import session_scope
from models.errors import TaskStoreError
from worker import runtime
from worker.catchup.api import CatchUpError
from worker.catchup.service import catch_up_github, catch_up_gitlab, catch_up_jira

log = logging.getLogger(__name__)


@shared_task(name=CATCH_UP, bind=True)
def catch_up(self, **unknown: Any) -> dict[str, Any]:
    """Catch up every source with access to its provider, one after the
    other: a GitHub source from its delivery log, a Jira source by a search
    of its site, a GitLab source from its hook's events and a scan. A source
    that fails (bad credentials, a rate limit, the API down) is recorded on
    its run and logged; the others go on, and the next beat tries it again:
    never a crash loop."""
    notice_unknown(CATCH_UP, unknown, self.request.headers)
    lane = lane_of(Sender.CATCH_UP)
    per_message = keys_per_message(runtime.settings(), lane)

    def send(pks: list[int]) -> None:
        for keys in message_groups(pks, per_message):
            name, args = task_for(keys)
            self.app.send_task(name, args=args, queue=lane)

    with session_scope(runtime.sessions()) as session:
        sources = sources_to_catch_up(session=session)
    done: dict[str, Any] = {}
    for slug, provider in sources:
        run = _RUNS.get(provider, catch_up_github)
        try:
            report = run(sessions=runtime.sessions(), slug=slug, send=send)
        except (CatchUpError, TaskStoreError) as error:
            log.warning("catch-up of %s stopped: %s", slug, error)
            done[slug] = {"error": str(error)}
            continue
        except Exception as error:
            # Whatever one source's run raised (recorded on its run, as every
            # read's failure is), the sources after it are still caught up.
            log.exception("catch-up of %s failed", slug)
            done[slug] = {"error": f"{type(error).__name__}: {error}"}
            continue
        done[slug] = {"missed": len(report.missed), "recovered": len(report.recovered)}
    return done


#: Which catch-up reads each provider's sources.
_RUNS = {"jira": catch_up_jira, "gitlab": catch_up_gitlab}
