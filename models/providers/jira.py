"""Jira webhooks: how to verify a delivery, name its event and turn it into a TaskDraft.

Provider documentation this module follows:

- Webhooks, payloads and the ``webhookEvent`` names (Cloud):
  https://developer.atlassian.com/cloud/jira/platform/webhooks/
- Signatures: an admin webhook registered with a secret is signed with HMAC-SHA256 of the
  raw body, sent as ``X-Hub-Signature: sha256=<hex>`` (the WebSub format; note: *not*
  GitHub's ``X-Hub-Signature-256`` name):
  https://developer.atlassian.com/cloud/jira/platform/webhooks/#secure-admin-webhooks
- Retries and ``X-Atlassian-Webhook-Identifier`` / ``X-Atlassian-Webhook-Retry``:
  https://developer.atlassian.com/cloud/jira/platform/webhooks/#retry-policy
- Jira Server / Data Center webhooks: https://developer.atlassian.com/server/jira/platform/webhooks/
- Atlassian Document Format, which a description may arrive in instead of wiki markup:
  https://developer.atlassian.com/cloud/jira/platform/apis/document/structure/

The event name is the body's ``webhookEvent`` (``jira:issue_created``,
``comment_created``); Jira sends no event header.

Names (docs/contract.md §15, "Stable keys"):

- external id: ``jira:<issue key>`` (``jira:PROJ-12``);
- stable key: ``jira-issue:<host of the site>/<issue.id>``
  (``jira-issue:jira.example.com/10002``). ``issue.id`` stays when the issue
  moves to another project and its key changes; the host is the configured
  site's, else that of ``issue.self`` (as for links). None without a numeric
  ``issue.id``.

Moves (:meth:`Jira.moves`): a ``jira:issue_updated`` whose ``changelog.items``
holds a ``Key`` item (``fromString`` ``TCP-2``, ``toString`` ``INDEV-130``: the
issue moved to another project) moves ``jira:TCP-2`` to ``jira:INDEV-130``.
Any other update announces nothing.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models.names import Move, Name
from models.providers.base import Provider, Verifier
from models.providers.drafts import (
    TaskDraft,
    UnsupportedContentType,
    UnsupportedPayload,
    bounded_key,
    draft_description,
    draft_title,
    header_text,
    lookup_header,
    media_type,
    moved_name,
    not_handled,
    parse_json_object,
    positive_id,
    unsupported_because_invalid,
    url_host,
)
from models.providers.signing import HmacSignature, hmac_sha256_signature

NAME = "jira"

SIGNATURE_HEADER = "X-Hub-Signature"
DELIVERY_HEADER = "X-Atlassian-Webhook-Identifier"
#: Prefix of the delivery id derived from the body when Jira sends no identifier.
BODY_HASH_PREFIX = "sha256:"

JSON_CONTENT_TYPE = "application/json"

#: How Jira Cloud's webhook client names itself and its body (a sample delivery's).
SAMPLE_CONTENT_TYPE = "application/json; charset=UTF-8"
SAMPLE_USER_AGENT = "Atlassian Webhook HTTP Client"
#: Cloud's identifiers are decimal numbers; a sample's has at most this many digits.
_SAMPLE_ID_DIGITS = 12
#: The body's send time. It leads every recorded body, so the first match is it;
#: rewriting just its digits keeps the rest of the recorded bytes as they were.
_TIMESTAMP = re.compile(rb'("timestamp":\s*)\d+')

DEFAULT_CREATE_EVENTS: frozenset[str] = frozenset({"jira:issue_created"})

#: What :meth:`Jira.to_draft` accepts.
HANDLED_EVENTS: frozenset[str] = DEFAULT_CREATE_EVENTS

#: The events that may announce a move (:meth:`Jira.moves`): an issue moved to
#: another project changes its key in an update.
MOVE_EVENTS: frozenset[str] = frozenset({"jira:issue_updated"})

#: The changelog item of a key change (``fieldtype`` ``jira``: a system field).
KEY_FIELD = "Key"

#: Known events that are stored but never become tasks.
IGNORED_EVENTS: frozenset[str] = frozenset(
    {
        "jira:issue_updated",
        "jira:issue_deleted",
        "comment_created",
        "comment_updated",
        "comment_deleted",
        "attachment_created",
        "attachment_deleted",
        "issuelink_created",
        "issuelink_deleted",
        "worklog_created",
        "worklog_updated",
        "worklog_deleted",
        "jira:worklog_updated",
        "project_created",
        "project_updated",
        "project_deleted",
        "jira:version_created",
        "jira:version_updated",
        "jira:version_released",
        "jira:version_unreleased",
        "jira:version_deleted",
        "sprint_created",
        "sprint_started",
        "sprint_closed",
        "sprint_updated",
        "sprint_deleted",
        "board_created",
        "board_updated",
        "board_deleted",
        "board_configuration_changed",
        "user_created",
        "user_updated",
        "user_deleted",
    }
)

#: Issue keys are the project key (a letter, then letters, digits or "_"), a hyphen
#: and the issue number. The key ends up in a URL path and in the external id.
_ISSUE_KEY_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*-[0-9]+$"
_ISSUE_KEY = re.compile(_ISSUE_KEY_PATTERN)

#: Nesting deeper than this in an ADF description is not rendered (nothing real nests so far).
_MAX_ADF_DEPTH = 64
#: ADF nodes whose children are inline and run together on one line.
_ADF_INLINE_CONTAINERS = frozenset({"paragraph", "heading", "codeBlock"})
#: Inline ADF nodes whose text lives in ``attrs.text`` (``@Name``, ``:smile:``).
_ADF_ATTRS_TEXT_NODES = frozenset({"mention", "emoji"})


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore")


class IssueFields(_Payload):
    summary: str | None = None
    #: Wiki markup (a string) or null in every captured payload; Atlassian Document
    #: Format (an object) where a site sends REST v3 style bodies. See issue_description().
    description: Any = None


class Issue(_Payload):
    key: str = Field(pattern=_ISSUE_KEY_PATTERN)
    #: A number in a string; read as :func:`~models.providers.drafts.positive_id`
    #: reads it, so an odd one costs the stable key, not the task.
    id: Any = None
    #: ``issue.self``: a REST API URL, never a link for people. Only used to derive
    #: the site when none is configured.
    api_url: str | None = Field(default=None, alias="self")
    fields: IssueFields = Field(default_factory=IssueFields)


class IssueEvent(_Payload):
    """A ``jira:issue_*`` delivery."""

    issue: Issue


class ChangelogItem(_Payload):
    field: str | None = None
    fieldtype: str | None = None
    from_string: str | None = Field(default=None, alias="fromString")
    to_string: str | None = Field(default=None, alias="toString")

    def is_key_change(self) -> bool:
        # A custom field may be called "Key" too; its fieldtype says "custom".
        return self.field == KEY_FIELD and self.fieldtype in (None, "jira")


class Changelog(_Payload):
    items: list[ChangelogItem] = Field(default_factory=list)


class IssueUpdated(_Payload):
    """A ``jira:issue_updated`` delivery: what changed is in ``changelog``."""

    changelog: Changelog | None = None


class Jira(Provider):
    """Jira (Cloud, Server and Data Center), as :class:`models.providers.Provider`
    describes a provider."""

    name = NAME
    label = "Jira"
    delivery_header = DELIVERY_HEADER
    event_header = None  # Jira names the event only in the body
    kept_headers = ("x-atlassian-webhook-identifier", "x-atlassian-webhook-retry")
    default_create_events = DEFAULT_CREATE_EVENTS
    handled_events = HANDLED_EVENTS
    ignored_events = IGNORED_EVENTS
    move_events = MOVE_EVENTS
    takes_site = True
    secret_help = "Jira's webhook secret"
    setup_help = (
        "In Jira:     Settings → System → WebHooks → Create a WebHook;",
        "             send Issue created events.",
    )
    route_summary = "A Jira delivery, signed with X-Hub-Signature (sha256=...)."

    def verifier(self, headers: Mapping[str, str], secrets: Iterable[str]) -> Verifier:
        """``X-Hub-Signature``: ``sha256=`` + the HMAC of the raw body under one of ``secrets``."""
        return HmacSignature(lookup_header(headers, SIGNATURE_HEADER), secrets)

    def delivery_id(self, headers: Mapping[str, str], body: bytes) -> str:
        """``X-Atlassian-Webhook-Identifier``, or ``sha256:<hex of body>`` without it.

        The identifier (a decimal number in a string on Cloud) is the same on every
        retry of a delivery. Jira Server / Data Center and older Cloud webhooks do
        not send it, and a delivery without an id could not be deduplicated at all.
        The body hash stands in for it: a redelivery carries the very same bytes,
        while two different events differ at least in their millisecond
        ``timestamp``, so equal hashes mean the same delivery. The ``sha256:``
        prefix keeps these apart from real (numeric) identifiers.
        """
        identifier = header_text(headers, DELIVERY_HEADER)
        if identifier is not None:
            return identifier
        return BODY_HASH_PREFIX + hashlib.sha256(body).hexdigest()

    def decode_body(self, content_type: str | None, body: bytes) -> dict[str, Any]:
        """The JSON object of a delivery (Jira sends ``application/json; charset=UTF-8``)."""
        kind = media_type(content_type)
        if kind != JSON_CONTENT_TYPE:
            raise UnsupportedContentType(f"Jira deliveries must be {JSON_CONTENT_TYPE}")
        return parse_json_object(body)

    def event_of(self, headers: Mapping[str, str], payload: dict[str, Any]) -> str | None:
        """The body's ``webhookEvent``, e.g. ``jira:issue_created``; None when absent."""
        event = payload.get("webhookEvent")
        if isinstance(event, str) and event.strip():
            return event.strip()
        return None

    def to_draft(
        self, event: str, payload: dict[str, Any], *, site: str | None = None
    ) -> TaskDraft:
        """The task an issue delivery describes, linked as ``<site>/browse/<key>``.

        ``site`` is the Jira base URL from configuration (with its context path,
        e.g. ``https://jira.example.com/jira``). Without it, the site is what
        precedes ``/rest/`` in ``issue.self``; a payload from which none can be
        derived is unsupported.
        """
        if event not in HANDLED_EVENTS:
            raise not_handled(event)
        try:
            issue = IssueEvent.model_validate(payload).issue
        except ValidationError as error:
            raise unsupported_because_invalid(event, error) from error
        base = site.rstrip("/") if site else _site_from_api_url(issue.api_url)
        return TaskDraft(
            provider=NAME,
            title=draft_title(issue.fields.summary, fallback=issue.key),
            description=issue_description(issue.fields.description),
            url=f"{base}/browse/{issue.key}",
            remote_key=issue.key,
            external_id=f"jira:{issue.key}",
            stable_key=_stable_key(base, issue.id),
        )

    def moves(
        self, event: str, payload: dict[str, Any], site: str | None = None
    ) -> tuple[Move, ...]:
        """The key changes an issue update's changelog holds (see the module
        docstring); ``()`` for any other update or event. ``site`` plays no
        part: keys name no site."""
        if event not in MOVE_EVENTS:
            return ()
        try:
            changelog = IssueUpdated.model_validate(payload).changelog
        except ValidationError as error:
            raise unsupported_because_invalid(event, error) from error
        items = changelog.items if changelog is not None else []
        return tuple(_key_move(item) for item in items if item.is_key_change())

    def sent_at(self, payload: dict[str, Any]) -> float | None:
        """The body's ``timestamp`` (milliseconds since the epoch) as a Unix time;
        None when it has none a number can be read from."""
        timestamp = payload.get("timestamp")
        if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
            return None
        return timestamp / 1000

    def sample_headers(
        self,
        body: bytes,
        secret: str,
        *,
        event: str | None = None,
        delivery_id: str | None = None,
    ) -> dict[str, str]:
        """Jira Cloud's headers, signed in ``X-Hub-Signature``; a fresh numeric
        identifier unless given one. ``event`` plays no part: the body names it."""
        if delivery_id is None:
            delivery_id = str(uuid.uuid4().int % 10**_SAMPLE_ID_DIGITS)
        return {
            "Content-Type": SAMPLE_CONTENT_TYPE,
            "User-Agent": SAMPLE_USER_AGENT,
            DELIVERY_HEADER: delivery_id,
            SIGNATURE_HEADER: hmac_sha256_signature(body, secret),
        }

    def with_sent_at(self, body: bytes, sent_at: float) -> bytes:
        """``body`` with its ``timestamp`` (milliseconds) saying ``sent_at``."""
        milliseconds = round(sent_at * 1000)
        return _TIMESTAMP.sub(rb"\g<1>%d" % milliseconds, body, count=1)


JIRA = Jira()


def _stable_key(site: str, issue_id: object) -> str | None:
    """``jira-issue:<host>/<issue.id>``; None without a numeric id or a host."""
    number, host = positive_id(issue_id), url_host(site)
    if number is None or host is None:
        return None
    return bounded_key(f"jira-issue:{host}/{number}")


def _key_move(item: ChangelogItem) -> Move:
    keys = (item.from_string, item.to_string)
    if not all(isinstance(key, str) and _ISSUE_KEY.fullmatch(key) for key in keys):
        raise UnsupportedPayload(
            "jira:issue_updated payload has a Key change whose fromString and toString "
            "are not both issue keys"
        )
    before, after = (moved_name(f"jira:{key}") for key in keys)
    return Move(Name.external(before), Name.external(after))


def _site_from_api_url(api_url: str | None) -> str:
    # issue.self is https://<site>[/<context path>]/rest/api/2/issue/<id> -- or, in
    # some Cloud payloads, .../rest/api/2/<id>: only the part before /rest/ is reliable.
    unusable = UnsupportedPayload(
        "cannot derive the Jira site from issue.self; configure the site explicitly"
    )
    try:
        parts = urlsplit(api_url or "")
    except ValueError as error:  # "https://[/...", a host NFKC would change (U+FF0F)
        raise unusable from error
    rest = parts.path.find("/rest/")
    host = parts.netloc.rpartition("@")[2]  # never carry credentials into a link
    if parts.scheme not in ("http", "https") or not host or rest < 0:
        raise unusable
    # A link that splits but holds text no database stores (a NUL in the host)
    # is refused with the rest of the task, by the task store's own check.
    return f"{parts.scheme}://{host}{parts.path[:rest]}"


def issue_description(raw: object) -> str | None:
    """The description as text: wiki markup as sent, ADF flattened to plain text.

    Anything else (a number, a list) is not a description Jira produces; it is
    dropped rather than failing the whole delivery.
    """
    if isinstance(raw, str):
        return draft_description(raw)
    if isinstance(raw, dict) and raw.get("type") == "doc":
        return draft_description(_adf_text(raw, depth=0))
    return None


def _adf_text(node: object, *, depth: int) -> str:
    if depth > _MAX_ADF_DEPTH or not isinstance(node, dict):
        return ""
    kind = node.get("type")
    if kind == "text":
        text = node.get("text")
        return text if isinstance(text, str) else ""
    if kind == "hardBreak":
        return "\n"
    if kind in _ADF_ATTRS_TEXT_NODES:
        attrs = node.get("attrs")
        text = attrs.get("text") if isinstance(attrs, dict) else None
        return text if isinstance(text, str) else ""
    content = node.get("content")
    if not isinstance(content, list):
        return ""
    parts = [_adf_text(child, depth=depth + 1) for child in content]
    if kind in _ADF_INLINE_CONTAINERS:
        return "".join(parts)
    # Block containers (doc, lists, quotes, tables): one child per line.
    return "\n".join(part for part in parts if part)
