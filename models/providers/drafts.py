"""What every provider produces, and the pieces the providers share.

A provider (``models.providers.github``, ``.jira``, ``.gitlab``) turns one
webhook delivery into a :class:`TaskDraft`: provider-neutral, I/O-free, and
ready to become a :class:`models.tasks.NewTask`. The helpers here are the
parts every provider does the same way -- header lookup without regard to
case, strict JSON bodies, titles and descriptions the task store keeps -- and
the errors a provider raises for a body it cannot use. Verifying a delivery
is ``models.providers.signing``'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn
from urllib.parse import urlsplit

from pydantic import AfterValidator, ValidationError

from models.errors import InvalidExternalId
from models.external_id import normalize_external_id
from models.tasks import (
    MAX_DESCRIPTION_LENGTH,
    MAX_TITLE_LENGTH,
    UNSTORABLE_TEXT,
    NewTask,
    SourceLink,
)

#: Ends a description cut to what the task store keeps (see draft_description).
TRUNCATION_MARKER = "\n\n… (truncated)"

#: How many pydantic errors an :class:`UnsupportedPayload` message names.
_MAX_REPORTED_ERRORS = 3
#: How much of a caller-supplied event name an error message repeats.
_MAX_SHOWN_EVENT = 100


class UnsupportedPayload(ValueError):
    """The body is not the JSON object this provider expects, or cannot become a task.

    The message names the event or field at fault and never echoes payload
    values, so it is safe to show the caller.
    """


class UnsupportedContentType(ValueError):
    """The delivery's Content-Type is not one the provider sends (the ingress answers 415)."""


@dataclass(frozen=True)
class TaskDraft:
    """A task as the provider describes it, before any workspace or store is involved."""

    provider: str
    title: str
    description: str | None
    url: str
    remote_key: str
    external_id: str
    #: The provider's id of the item that survives its moves, where it has one
    #: (models.names.py); None where it has none.
    stable_key: str | None = None
    #: The external ids the item had before a move this create announces
    #: (a GitHub issue opened by a transfer names the one it came from).
    moved_from: tuple[str, ...] = ()

    def new_task(self) -> NewTask:
        return NewTask(
            title=self.title,
            description=self.description,
            external_id=self.external_id,
            source=SourceLink(provider=self.provider, url=self.url, remote_key=self.remote_key),
            stable_key=self.stable_key,
            moved_from=self.moved_from,
        )


def lookup_header(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header ``name``, whatever the case of the key in ``headers``.

    Starlette's ``Headers`` already match without regard to case; a plain dict
    (tests, replays from a log that lower-cased the names) does not.
    """
    value = headers.get(name)
    if value is not None:
        return value
    wanted = name.lower()
    for key, candidate in headers.items():
        if key.lower() == wanted:
            return candidate
    return None


def header_text(headers: Mapping[str, str], name: str) -> str | None:
    """The header's value without surrounding white space; None when absent or blank."""
    value = lookup_header(headers, name)
    if value is None:
        return None
    return value.strip() or None


def event_header_value(event: str | None, header: str) -> str:
    """What a provider that names its events in ``header`` sends there for
    ``event`` (``issues.opened`` → ``issues``): the action after the dot is the
    body's. For a sample delivery, which must name its event."""
    if event is None:
        raise ValueError(f"a sample delivery needs an event to name in {header}")
    return event.partition(".")[0]


def media_type(content_type: str | None) -> str | None:
    """``application/json`` for ``application/json; charset=UTF-8``; None when absent."""
    if content_type is None:
        return None
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind or None


def parse_json_object(data: bytes | str) -> dict[str, Any]:
    """The JSON object in ``data``; :class:`UnsupportedPayload` for anything else.

    Strict JSON: ``NaN`` and ``Infinity`` are not JSON and are refused, and so
    is nesting too deep to parse.
    """
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
        raise UnsupportedPayload("body is not valid JSON") from error
    if not isinstance(value, dict):
        raise UnsupportedPayload(f"body must be a JSON object, not {_json_kind(value)}")
    return value


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def unsupported_because_invalid(event: str, error: ValidationError) -> UnsupportedPayload:
    """An :class:`UnsupportedPayload` naming the fields that failed, never their values."""
    problems = [
        f"{'.'.join(str(part) for part in detail['loc']) or 'body'}: {detail['msg']}"
        for detail in error.errors(include_input=False, include_url=False)
    ]
    shown = "; ".join(problems[:_MAX_REPORTED_ERRORS])
    more = len(problems) - _MAX_REPORTED_ERRORS
    if more > 0:
        shown += f"; and {more} more"
    return UnsupportedPayload(f"{event} payload does not have the expected shape ({shown})")


def not_handled(event: str) -> UnsupportedPayload:
    """An :class:`UnsupportedPayload` for an event the provider does not turn into tasks."""
    shown = event if len(event) <= _MAX_SHOWN_EVENT else event[:_MAX_SHOWN_EVENT] + "…"
    return UnsupportedPayload(f"{shown!r} deliveries do not become tasks")


def http_url(value: str) -> str:
    """A pydantic after-validator: the value is an absolute http(s) URL.

    Provider links end up clickable in front of people, so nothing else
    (``javascript:``, relative paths) gets through.
    """
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("must be an absolute http(s) URL")
    return value


HttpUrlText = Annotated[str, AfterValidator(http_url)]


def draft_title(raw: str | None, fallback: str) -> str:
    """The provider's title, stripped and cut to what the task store accepts.

    A missing or blank title falls back to ``fallback`` (the remote key): a
    task with a dull title beats a delivery that cannot become a task.
    """
    title = storable_text(raw).strip() if isinstance(raw, str) else ""
    if not title:
        title = fallback.strip()
    if len(title) > MAX_TITLE_LENGTH:
        title = title[: MAX_TITLE_LENGTH - 1].rstrip() + "…"
    return title


def draft_description(raw: str | None) -> str | None:
    """The description, or None when it is missing or only white space.

    Cut to what the task store accepts, ending with :data:`TRUNCATION_MARKER`:
    the item keeps its task, and the marker tells a reader the rest is at the
    source link (docs/contract.md, "Validation and normalization").
    """
    if raw is None or not raw.strip():
        return None
    description = storable_text(raw)
    if len(description) > MAX_DESCRIPTION_LENGTH:
        kept = MAX_DESCRIPTION_LENGTH - len(TRUNCATION_MARKER)
        description = description[:kept].rstrip() + TRUNCATION_MARKER
    return description


def url_host(url: object) -> str | None:
    """The host of an absolute http(s) URL, lower case, with its port unless
    it is the scheme's default; None for anything else.

    Part of a stable key (docs/contract.md §15, "Stable keys"): the same
    site spelled ``https://Jira.Example.com:443/`` or
    ``https://jira.example.com`` must give the same key.
    """
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is not a number, "https://[/..."
        return None
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        return None
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    default = 443 if parts.scheme == "https" else 80
    return host if port in (None, default) else f"{host}:{port}"


def positive_id(value: object) -> int | None:
    """A provider's numeric id: a positive integer, or its decimal digits in a
    string (Jira's ``issue.id`` is ``"10002"``); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


def bounded_key(key: str) -> str | None:
    """``key`` when it can name an item as an external id can: no control
    characters, no surrounding white space, at most 255 bytes; None otherwise.
    A stable key that cannot be kept is no stable key: the item is then known
    by its external id alone."""
    try:
        kept = normalize_external_id(key)
    except InvalidExternalId:
        return None
    return key if kept == key else None


def moved_name(external_id: str) -> str:
    """``external_id`` (or an external-id prefix) as a move names it: as the
    task store would keep it. :class:`UnsupportedPayload` for one it could not."""
    try:
        kept = normalize_external_id(external_id)
    except InvalidExternalId as error:
        raise UnsupportedPayload(f"the move names an unusable id ({error})") from error
    if kept != external_id:
        raise UnsupportedPayload("the move names an id with surrounding white space")
    return external_id


def storable_text(raw: str) -> str:
    """``raw`` with what no database can store replaced by U+FFFD.

    JSON may escape a lone surrogate (``"\\ud800"``) or a NUL (``"\\u0000"``);
    neither can be encoded into PostgreSQL text. A task with one odd
    character replaced beats a delivery that can never become a task.
    """
    return UNSTORABLE_TEXT.sub("\ufffd", raw)
