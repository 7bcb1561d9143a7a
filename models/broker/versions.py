"""Which version of taskhook's messages a message is, and what a task does
with arguments it does not know.

During an upgrade the old release's processes and the new one's share the
broker: either may send a message the other takes (docs/deploy.md,
"Upgrades"). The rule is one release back, both ways: a release reads every
message the release before it sends, and sends only messages that release
reads. A new argument therefore comes as an optional one in release N, and is
sent only from release N+1, when every worker that may take it knows it.

Release 0.1.0 sent no version: its messages are version 1. From 0.2.0 on every
message carries :data:`MESSAGE_VERSION` in the header :data:`HEADER` -- a
header, not an argument, because a 0.1.0 task takes positional arguments only
and fails on a keyword it does not know, while a Celery worker of any version
passes over a header it does not know.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from celery.signals import before_task_publish

log = logging.getLogger(__name__)

#: The message header that says which version of the messages this is.
HEADER = "taskhook_message_version"
#: The version this release sends: 2 since 0.2.0 (0.1.0's, without the header, are 1).
MESSAGE_VERSION = 2
#: A message without :data:`HEADER`: what 0.1.0 sent.
UNVERSIONED = 1


def version_of(headers: Mapping[str, Any] | None) -> int:
    """The version a received message says it is (its custom headers)."""
    value = (headers or {}).get(HEADER)
    try:
        return int(value) if value is not None else UNVERSIONED
    except (TypeError, ValueError):
        return UNVERSIONED


def _stamp(headers: dict[str, Any] | None = None, **_: object) -> None:
    if headers is not None:
        headers.setdefault(HEADER, MESSAGE_VERSION)


def stamp_every_message() -> None:
    """Every message this process publishes through Celery (``send_task``, a
    retry, beat) carries the version header from now on. Safe to call again.
    The relay's prebuilt messages add it themselves (``ingest.relay``)."""
    before_task_publish.connect(_stamp, weak=False, dispatch_uid="taskhook-message-version")


_noticed: set[tuple[str, frozenset[str], int]] = set()
_noticed_lock = threading.Lock()


def notice_unknown(task_name: str, unknown: Mapping[str, Any], headers: Mapping | None) -> None:
    """A task's message held keyword arguments this release does not know, or
    came from a newer release: say so once per process and kind, and go on.

    The task runs with the arguments it knows: by the rule above, what a
    newer release adds is optional. Logged once, not per message: during a
    rollback every message of the newer release would say it again.
    """
    version = version_of(headers)
    if not unknown and version <= MESSAGE_VERSION:
        return
    kind = (task_name, frozenset(unknown), version)
    with _noticed_lock:
        if kind in _noticed:
            return
        _noticed.add(kind)
    if unknown:
        log.warning(
            "%s: ignored arguments this release does not know (%s), from a message of version %d",
            task_name,
            ", ".join(sorted(unknown)),
            version,
        )
    else:
        log.info(
            "%s: a message of version %d, newer than this release's %d: "
            "a newer release runs beside this one",
            task_name,
            version,
            MESSAGE_VERSION,
        )
