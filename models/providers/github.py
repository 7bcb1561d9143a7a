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
- Moves: https://docs.github.com/en/webhooks/webhook-events-and-payloads#issues
  (``transferred``: ``changes.new_issue`` and ``changes.new_repository``; an
  ``opened`` after a transfer carries ``changes.old_issue`` and
  ``changes.old_repository``) and
  https://docs.github.com/en/webhooks/webhook-events-and-payloads#repository
  (``renamed``: ``changes.repository.name.from``; ``transferred``:
  ``changes.owner.from.user`` or ``changes.owner.from.organization``).

The event name is ``X-GitHub-Event`` joined to the body's ``action`` with a dot
(``issues.opened``), or the header alone when the body has no action (``ping``, ``push``).

Names (docs/contract.md §15, "Stable keys"):

- external id: ``gh-issue/<owner>/<repository>#<number>``, ``gh-pr/<owner>/<repository>#<number>``;
- stable key: ``gh-issue-in-repo:<repository.id>#<number>``,
  ``gh-pr-in-repo:<repository.id>#<number>`` where the payload carries the
  repository's numeric ``id``, which survives a rename or a transfer of the
  repository (None without it). An issue transferred to another repository
  gets a new number and a new id: that move is announced, not a stable key.

Moves (:meth:`GitHub.moves`):

- ``issues.transferred``: the issue's external id → the one it has in
  ``changes.new_repository`` under ``changes.new_issue.number``;
- ``repository.renamed`` and ``repository.transferred``: every external id of
  the repository, issues and pull requests, as a prefix
  (``gh-issue/<old full name>#``) → the same under the new full name. A
  transfer that also renames says only the old owner, so the old full name
  read is the old owner with the new name.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.names import Move, Name
from models.providers.base import Provider, Verifier
from models.providers.drafts import (
    HttpUrlText,
    TaskDraft,
    UnsupportedContentType,
    UnsupportedPayload,
    bounded_key,
    draft_description,
    draft_title,
    event_header_value,
    header_text,
    lookup_header,
    media_type,
    moved_name,
    not_handled,
    parse_json_object,
    positive_id,
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
        "installation.suspend",
        "installation.unsuspend",
        "installation.new_permissions_accepted",
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
        "issues.typed",
        "issues.untyped",
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
        "pull_request.locked",
        "pull_request.unlocked",
        "pull_request.milestoned",
        "pull_request.demilestoned",
        "pull_request.auto_merge_enabled",
        "pull_request.auto_merge_disabled",
        "pull_request.enqueued",
        "pull_request.dequeued",
        "repository.renamed",
        "repository.transferred",
    }
)

#: The events that may announce a move (:meth:`GitHub.moves`); none creates a task.
MOVE_EVENTS: frozenset[str] = frozenset(
    {"issues.transferred", "repository.renamed", "repository.transferred"}
)

#: The kinds of item a repository holds, as external ids name them: a rename
#: or a transfer of the repository moves every one of each.
_ITEM_KINDS = ("gh-issue", "gh-pr")

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
    #: Read as :func:`~models.providers.drafts.positive_id` reads it: an id
    #: that is not one leaves the item without a stable key, not without a task.
    id: Any = None

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


class Numbered(_Payload):
    """An issue where only its number matters (the other side of a transfer)."""

    number: int = Field(strict=True, gt=0)


class OpenedByTransfer(_Payload):
    """``changes`` of an ``issues.opened`` that a transfer caused: where it was."""

    old_issue: Numbered
    old_repository: Repository


class IssuesEvent(_Payload):
    """An ``issues`` delivery (opened, reopened, ...)."""

    issue: Issue
    repository: Repository
    #: Read only for a transfer's ``old_issue`` and ``old_repository``: what
    #: else it holds never costs the create.
    changes: Any = None

    def moved_from(self) -> OpenedByTransfer | None:
        """Where the issue was before the transfer this create announces, if one did."""
        changes = self.changes if isinstance(self.changes, dict) else {}
        if "old_issue" not in changes and "old_repository" not in changes:
            return None
        return OpenedByTransfer.model_validate(changes)


class TransferredTo(_Payload):
    """``changes`` of an ``issues.transferred``: where the issue went."""

    new_issue: Numbered
    new_repository: Repository


class IssueTransferred(_Payload):
    """An ``issues.transferred`` delivery, sent to the repository the issue left."""

    issue: Numbered
    repository: Repository
    changes: TransferredTo


class NameChange(_Payload):
    #: A repository's name alone: no owner, no slash.
    from_: str = Field(alias="from", pattern=r"^[^/\s]+$")


class RepositoryNameChange(_Payload):
    name: NameChange


class RenamedChanges(_Payload):
    repository: RepositoryNameChange


class RepositoryRenamed(_Payload):
    """A ``repository.renamed`` delivery: ``repository`` is as it is now."""

    changes: RenamedChanges
    repository: Repository

    def old_full_name(self) -> str:
        owner = self.repository.full_name.partition("/")[0]
        return f"{owner}/{self.changes.repository.name.from_}"


class PreviousOwner(_Payload):
    """The account a repository was transferred from: a user or an organization."""

    user: Owner | None = None
    organization: Owner | None = None

    @model_validator(mode="after")
    def _names_one(self) -> PreviousOwner:
        if self.user is None and self.organization is None:
            raise ValueError("names neither a user nor an organization")
        return self

    def login(self) -> str:
        return (self.organization or self.user).login


class OwnerChange(_Payload):
    from_: PreviousOwner = Field(alias="from")


class TransferredChanges(_Payload):
    owner: OwnerChange


class RepositoryTransferred(_Payload):
    """A ``repository.transferred`` delivery: ``repository`` is as it is now."""

    changes: TransferredChanges
    repository: Repository

    def old_full_name(self) -> str:
        name = self.repository.full_name.partition("/")[2]
        return f"{self.changes.owner.from_.login()}/{name}"


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
    move_events = MOVE_EVENTS
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

    def moves(
        self, event: str, payload: dict[str, Any], site: str | None = None
    ) -> tuple[Move, ...]:
        """An issue transferred, or a repository renamed or transferred (see the
        module docstring); ``()`` for anything else."""
        if event not in MOVE_EVENTS:
            return ()
        try:
            if event == "issues.transferred":
                return (_transfer_move(IssueTransferred.model_validate(payload)),)
            if event == "repository.renamed":
                delivery = RepositoryRenamed.model_validate(payload)
            else:
                delivery = RepositoryTransferred.model_validate(payload)
        except ValidationError as error:
            raise unsupported_because_invalid(event, error) from error
        return _repository_moves(delivery.old_full_name(), delivery.repository.full_name)

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
    transfer = delivery.moved_from()
    moved_from = ()
    if transfer is not None:
        old = f"gh-issue/{transfer.old_repository.full_name}#{transfer.old_issue.number}"
        moved_from = (moved_name(old),)
    return TaskDraft(
        provider=NAME,
        title=draft_title(issue.title, fallback=remote_key),
        description=draft_description(issue.body),
        url=issue.html_url,
        remote_key=remote_key,
        external_id=f"gh-issue/{remote_key}",
        stable_key=_stable_key("gh-issue", delivery.repository, issue.number),
        moved_from=moved_from,
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
        stable_key=_stable_key("gh-pr", delivery.repository, delivery.number),
    )


def _stable_key(kind: str, repository: Repository, number: int) -> str | None:
    """``<kind>-in-repo:<repository.id>#<number>``; None without a repository id."""
    repository_id = positive_id(repository.id)
    if repository_id is None:
        return None
    return bounded_key(f"{kind}-in-repo:{repository_id}#{number}")


def _transfer_move(delivery: IssueTransferred) -> Move:
    before = f"gh-issue/{delivery.repository.full_name}#{delivery.issue.number}"
    new = delivery.changes
    after = f"gh-issue/{new.new_repository.full_name}#{new.new_issue.number}"
    return Move(Name.external(moved_name(before)), Name.external(moved_name(after)))


def _repository_moves(old_full_name: str, new_full_name: str) -> tuple[Move, ...]:
    if old_full_name == new_full_name:
        return ()  # nothing any external id says has changed
    return tuple(
        Move(
            Name.external(moved_name(f"{kind}/{old_full_name}#")),
            Name.external(moved_name(f"{kind}/{new_full_name}#")),
            prefix=True,
        )
        for kind in _ITEM_KINDS
    )
