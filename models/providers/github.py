"""GitHub webhooks: how to verify a delivery, name its event and turn it into a TaskDraft.

Provider documentation this module follows:

- Delivery headers (``X-GitHub-Event``, ``X-GitHub-Delivery``, ``X-GitHub-Hook-ID``,
  ``X-Hub-Signature-256``):
  https://docs.github.com/en/webhooks/webhook-events-and-payloads#delivery-headers
- Signatures (HMAC-SHA256 of the raw body, ``sha256=<hex>``, constant-time compare):
  https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
- Content types (``application/json``, or a form with the JSON in a ``payload`` field --
  still the REST API's default for a new hook):
  https://docs.github.com/en/webhooks/using-webhooks/creating-webhooks
- Payloads: https://docs.github.com/en/webhooks/webhook-events-and-payloads#issues and
  https://docs.github.com/en/webhooks/webhook-events-and-payloads#pull_request

The event name is ``X-GitHub-Event`` joined to the body's ``action`` with a dot
(``issues.opened``), or the header alone when the body has no action (``ping``, ``push``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.providers.base import Provider, Verifier
from models.providers.drafts import (
    HttpUrlText,
    TaskDraft,
    UnsupportedContentType,
    UnsupportedPayload,
    draft_description,
    draft_title,
    event_header_value,
    header_text,
    lookup_header,
    media_type,
    not_handled,
    parse_json_object,
    unsupported_because_invalid,
)
from models.providers.signing import HmacSignature, hmac_sha256_signature

NAME = "github"

#: The SHA-256 signature. GitHub also sends the legacy SHA-1 ``X-Hub-Signature``
#: "for compatibility"; it is never enough on its own and is never read here.
SIGNATURE_HEADER = "X-Hub-Signature-256"
EVENT_HEADER = "X-GitHub-Event"
DELIVERY_HEADER = "X-GitHub-Delivery"
HOOK_ID_HEADER = "X-GitHub-Hook-ID"

JSON_CONTENT_TYPE = "application/json"
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"
#: A form body from GitHub carries one field; a few more are tolerated, not thousands.
_MAX_FORM_FIELDS = 16

#: Who a sample delivery says sent it: GitHub's ``GitHub-Hookshot/<build>`` and a
#: webhook's numeric id (tests/fixtures/HEADERS.md has real ones).
SAMPLE_USER_AGENT = "GitHub-Hookshot/abc123"
SAMPLE_HOOK_ID = "123456"

DEFAULT_CREATE_EVENTS: frozenset[str] = frozenset({"issues.opened", "pull_request.opened"})

#: What :meth:`GitHub.to_draft` accepts. The ``reopened`` actions carry the same payload
#: as ``opened``, so a workspace may opt in to them; the external id is the same
#: too, so reopening an item that already has a task finds that task.
HANDLED_EVENTS: frozenset[str] = DEFAULT_CREATE_EVENTS | {
    "issues.reopened",
    "pull_request.reopened",
}

#: Known events that are stored but never become tasks.
IGNORED_EVENTS: frozenset[str] = frozenset(
    {
        "ping",
        "push",
        "installation.created",
        "installation.deleted",
        "issue_comment.created",
        "issue_comment.edited",
        "issue_comment.deleted",
        "issues.edited",
        "issues.closed",
        "issues.deleted",
        "issues.transferred",
        "issues.labeled",
        "issues.unlabeled",
        "issues.assigned",
        "issues.unassigned",
        "issues.milestoned",
        "issues.demilestoned",
        "issues.locked",
        "issues.unlocked",
        "issues.pinned",
        "issues.unpinned",
        "pull_request.closed",
        "pull_request.synchronize",
        "pull_request.edited",
        "pull_request.labeled",
        "pull_request.unlabeled",
        "pull_request.assigned",
        "pull_request.unassigned",
        "pull_request.review_requested",
        "pull_request.review_request_removed",
        "pull_request.ready_for_review",
        "pull_request.converted_to_draft",
    }
)

# owner and repository names never contain a slash or white space.
_FULL_NAME = re.compile(r"[^/\s]+/[^/\s]+")


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Owner(_Payload):
    login: str = Field(min_length=1)


class Repository(_Payload):
    full_name: str | None = None
    owner: Owner | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _has_full_name(self) -> Repository:
        # full_name is what every payload has; owner.login + name is the same
        # fact spelled out, used only when full_name is missing.
        if self.full_name is None and self.owner is not None and self.name:
            self.full_name = f"{self.owner.login}/{self.name}"
        if self.full_name is None or not _FULL_NAME.fullmatch(self.full_name):
            raise ValueError("repository.full_name must be '<owner>/<repository>'")
        return self


class Issue(_Payload):
    number: int = Field(strict=True, gt=0)
    title: str | None = None
    body: str | None = None
    html_url: HttpUrlText


class IssuesEvent(_Payload):
    """An ``issues`` delivery (opened, reopened, ...)."""

    issue: Issue
    repository: Repository


class PullRequest(_Payload):
    title: str | None = None
    body: str | None = None
    html_url: HttpUrlText


class PullRequestEvent(_Payload):
    """A ``pull_request`` delivery; the number is top-level, beside the pull request."""

    number: int = Field(strict=True, gt=0)
    pull_request: PullRequest
    repository: Repository


class GitHub(Provider):
    """GitHub, as :class:`models.providers.Provider` describes a provider."""

    name = NAME
    label = "GitHub"
    delivery_header = DELIVERY_HEADER
    event_header = EVENT_HEADER
    kept_headers = (
        "x-github-event",
        "x-github-delivery",
        "x-github-hook-id",
        "x-github-hook-installation-target-id",
        "x-github-hook-installation-target-type",
    )
    default_create_events = DEFAULT_CREATE_EVENTS
    handled_events = HANDLED_EVENTS
    ignored_events = IGNORED_EVENTS
    takes_site = False
    secret_help = "GitHub's webhook “Secret” field"
    setup_help = (
        "In GitHub:   Settings → Webhooks → Add webhook; content type application/json;",
        "             send the Issues and Pull requests events.",
    )
    route_summary = "A GitHub delivery (JSON or form-encoded), signed with X-Hub-Signature-256."

    def verifier(self, headers: Mapping[str, str], secrets: Iterable[str]) -> Verifier:
        """``X-Hub-Signature-256``: the HMAC-SHA256 of the raw body under one of ``secrets``."""
        return HmacSignature(lookup_header(headers, SIGNATURE_HEADER), secrets)

    def delivery_id(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """The ``X-GitHub-Delivery`` GUID: the same on a redelivery, so it deduplicates."""
        return header_text(headers, DELIVERY_HEADER)

    def hook_id(self, headers: Mapping[str, str]) -> str | None:
        """``X-GitHub-Hook-ID``: which configured webhook sent the delivery."""
        return header_text(headers, HOOK_ID_HEADER)

    def decode_body(self, content_type: str | None, body: bytes) -> dict[str, Any]:
        """The JSON object of a delivery sent as JSON or as GitHub's form encoding."""
        kind = media_type(content_type)
        if kind == JSON_CONTENT_TYPE:
            return parse_json_object(body)
        if kind == FORM_CONTENT_TYPE:
            return parse_json_object(_form_payload_field(body))
        raise UnsupportedContentType(
            f"GitHub deliveries must be {JSON_CONTENT_TYPE} or {FORM_CONTENT_TYPE}"
        )

    def event_of(self, headers: Mapping[str, str], payload: dict[str, Any]) -> str | None:
        """``X-GitHub-Event`` plus the body's ``action``: ``issues.opened``, ``ping``; None
        when the header is missing."""
        name = header_text(headers, EVENT_HEADER)
        if name is None:
            return None
        action = self.action_of(payload)
        return f"{name}.{action}" if action else name

    def action_of(self, payload: dict[str, Any]) -> str | None:
        """The body's ``action`` (``opened``); None for ``ping`` and ``push``."""
        action = payload.get("action")
        return action if isinstance(action, str) and action else None

    def to_draft(
        self, event: str, payload: dict[str, Any], *, site: str | None = None
    ) -> TaskDraft:
        """The task an issue or pull request delivery describes (GitHub payloads
        carry their own URLs, so ``site`` plays no part)."""
        if event not in HANDLED_EVENTS:
            raise not_handled(event)
        try:
            if event.startswith("issues."):
                return _issue_draft(IssuesEvent.model_validate(payload))
            return _pull_request_draft(PullRequestEvent.model_validate(payload))
        except ValidationError as error:
            raise unsupported_because_invalid(event, error) from error

    def sample_headers(
        self,
        body: bytes,
        secret: str,
        *,
        event: str | None = None,
        delivery_id: str | None = None,
    ) -> dict[str, str]:
        """A JSON delivery's headers, signed in ``X-Hub-Signature-256``; a fresh
        GUID as the delivery id unless given one."""
        return {
            "Content-Type": JSON_CONTENT_TYPE,
            "User-Agent": SAMPLE_USER_AGENT,
            EVENT_HEADER: event_header_value(event, EVENT_HEADER),
            DELIVERY_HEADER: str(uuid.uuid4()) if delivery_id is None else delivery_id,
            HOOK_ID_HEADER: SAMPLE_HOOK_ID,
            SIGNATURE_HEADER: hmac_sha256_signature(body, secret),
        }


GITHUB = GitHub()


def _form_payload_field(body: bytes) -> str:
    try:
        fields = parse_qs(
            body.decode("ascii"),
            keep_blank_values=True,
            strict_parsing=False,
            errors="strict",
            max_num_fields=_MAX_FORM_FIELDS,
        )
    except ValueError as error:  # UnicodeDecodeError, too many fields
        raise UnsupportedPayload("form body is not valid form encoding") from error
    values = fields.get("payload", [])
    if len(values) != 1:
        raise UnsupportedPayload("form body must have exactly one 'payload' field")
    return values[0]


def _issue_draft(delivery: IssuesEvent) -> TaskDraft:
    full_name, issue = delivery.repository.full_name, delivery.issue
    remote_key = f"{full_name}#{issue.number}"
    return TaskDraft(
        provider=NAME,
        title=draft_title(issue.title, fallback=remote_key),
        description=draft_description(issue.body),
        url=issue.html_url,
        remote_key=remote_key,
        external_id=f"gh-issue/{remote_key}",
    )


def _pull_request_draft(delivery: PullRequestEvent) -> TaskDraft:
    full_name, pull_request = delivery.repository.full_name, delivery.pull_request
    remote_key = f"{full_name}#{delivery.number}"
    return TaskDraft(
        provider=NAME,
        title=draft_title(pull_request.title, fallback=remote_key),
        description=draft_description(pull_request.body),
        url=pull_request.html_url,
        remote_key=remote_key,
        external_id=f"gh-pr/{remote_key}",
    )
