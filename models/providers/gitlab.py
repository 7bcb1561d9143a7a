"""GitLab webhooks: how to verify a delivery, name its event and turn it into a TaskDraft.

What this module follows, from the gitlab-org/gitlab repository (its GitHub
mirror gitlabhq/gitlabhq; tests/fixtures/gitlab/SOURCES.md has the commits):

- ``doc/user/project/integrations/webhook_events.md``: every event's
  ``X-Gitlab-Event`` header and payload; ``object_attributes.action`` is
  ``open``, ``close``, ``reopen`` or ``update`` for issues, and also
  ``approved``, ``unapproved``, ``approval``, ``unapproval`` or ``merge`` for
  merge requests.
- ``doc/user/project/integrations/webhooks.md``: the secret token is sent as it
  is, in ``X-Gitlab-Token`` -- no signature, so it is compared in constant time
  against each active secret, and the body plays no part.
- ``app/services/web_hook_service.rb`` (``build_headers``): every delivery
  carries ``Content-Type: application/json``, ``User-Agent: GitLab/<version>``,
  ``Idempotency-Key``, ``X-Gitlab-Event``, ``X-Gitlab-Webhook-UUID`` (new for
  every request), ``X-Gitlab-Instance`` and, from
  ``lib/gitlab/web_hooks/recursion_detection.rb``, ``X-Gitlab-Event-UUID``.

The event name is ``X-Gitlab-Event`` joined to the body's
``object_attributes.action`` with a dot (``Issue Hook.open``,
``Merge Request Hook.open``), or the header alone when the body has no action
(``Push Hook``).

Names (docs/contract.md §15, "Stable keys"):

- external id: ``gl-issue/<project path>#<iid>``, ``gl-mr/<project path>!<iid>``;
- stable key: ``gl-issue-id:<host>/<object_attributes.id>``,
  ``gl-mr-id:<host>/<object_attributes.id>``: the item's id, global to the
  instance (the ``iid`` counts per project), with the host of
  ``object_attributes.url`` naming the instance. None without either.

Moves (:meth:`GitLab.moves`): moving an issue to another project closes it
with ``object_attributes.moved_to_id``, the global id of the issue it became,
and opens that one in the other project. So an issue ``close`` or ``update``
carrying ``moved_to_id`` moves the closed issue's external id to the stable
key ``gl-issue-id:<host>/<moved_to_id>`` -- the one the new issue's own
delivery names.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    url_host,
)
from models.providers.signing import SecretToken

NAME = "gitlab"

TOKEN_HEADER = "X-Gitlab-Token"
EVENT_HEADER = "X-Gitlab-Event"
#: The id of one event sent to one webhook, the same on every retry of it
#: (``WebHookService#idempotency_key``, passed on to the retrying worker).
IDEMPOTENCY_HEADER = "Idempotency-Key"
#: The id of the request that triggered the hooks (recursion detection): what
#: older GitLab versions, which send no Idempotency-Key, offer instead.
EVENT_UUID_HEADER = "X-Gitlab-Event-UUID"
#: New for every request, retries included; kept, never read.
WEBHOOK_UUID_HEADER = "X-Gitlab-Webhook-UUID"
INSTANCE_HEADER = "X-Gitlab-Instance"

JSON_CONTENT_TYPE = "application/json"

#: What a sample delivery's ``User-Agent`` names (``GitLab/<version>``), and the
#: instance it says it comes from.
SAMPLE_VERSION = "18.4.0"
SAMPLE_INSTANCE = "https://gitlab.example.com"

ISSUE_HOOK, CONFIDENTIAL_ISSUE_HOOK = "Issue Hook", "Confidential Issue Hook"
MERGE_REQUEST_HOOK = "Merge Request Hook"

DEFAULT_CREATE_EVENTS: frozenset[str] = frozenset(
    {f"{ISSUE_HOOK}.open", f"{MERGE_REQUEST_HOOK}.open"}
)

#: What :meth:`GitLab.to_draft` accepts. ``reopen`` carries the same payload as
#: ``open``, and a confidential issue the same as any issue: a source may opt
#: in to them. The external id is the same, so reopening finds the task.
HANDLED_EVENTS: frozenset[str] = DEFAULT_CREATE_EVENTS | {
    f"{ISSUE_HOOK}.reopen",
    f"{CONFIDENTIAL_ISSUE_HOOK}.open",
    f"{CONFIDENTIAL_ISSUE_HOOK}.reopen",
    f"{MERGE_REQUEST_HOOK}.reopen",
}

#: The events that may announce a move (:meth:`GitLab.moves`): a moved issue is
#: closed (``close``), or, where it was closed already, updated (``update``).
MOVE_EVENTS: frozenset[str] = frozenset(
    f"{hook}.{action}"
    for hook in (ISSUE_HOOK, CONFIDENTIAL_ISSUE_HOOK)
    for action in ("close", "update")
)

#: Known events that are stored but never become tasks (webhook_events.md).
IGNORED_EVENTS: frozenset[str] = frozenset(
    {
        "Push Hook",
        "Tag Push Hook",
        *(
            f"{hook}.{action}"
            for hook in (ISSUE_HOOK, CONFIDENTIAL_ISSUE_HOOK)
            for action in ("close", "update")
        ),
        # Comments: the action is there since GitLab 16.11, absent before.
        *(
            f"{hook}{action}"
            for hook in ("Note Hook", "Confidential Note Hook")
            for action in ("", ".create", ".update")
        ),
        *(
            f"{MERGE_REQUEST_HOOK}.{action}"
            for action in (
                "close",
                "update",
                "approved",
                "unapproved",
                "approval",
                "unapproval",
                "merge",
            )
        ),
        *(f"Wiki Page Hook.{action}" for action in ("create", "update", "delete")),
        "Pipeline Hook",
        "Job Hook",
        "Deployment Hook",
        "Release Hook",
    }
)

# A project's full path: a namespace (groups nest) and the project, no white space.
_PATH_WITH_NAMESPACE = r"^[^/\s]+(?:/[^/\s]+)+$"


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Project(_Payload):
    path_with_namespace: str = Field(pattern=_PATH_WITH_NAMESPACE)


class Attributes(_Payload):
    """``object_attributes`` of an issue or a merge request."""

    iid: int = Field(strict=True, gt=0)
    title: str | None = None
    description: str | None = None
    url: HttpUrlText
    #: Global to the instance; read as :func:`~models.providers.drafts.positive_id`
    #: reads it, so an odd one costs the stable key, not the task.
    id: Any = None


class MovedTo(_Payload):
    """``object_attributes`` of an issue update or close, for ``moved_to_id``
    alone: null (or 0) unless the issue was moved."""

    moved_to_id: int | None = Field(default=None, strict=True, ge=0)


class MoveMarker(_Payload):
    """An issue ``close`` or ``update``, for whether it says the issue moved."""

    object_attributes: MovedTo


class ObjectEvent(_Payload):
    """An ``Issue Hook`` or ``Merge Request Hook`` delivery: the item is
    ``object_attributes``, in ``project``."""

    project: Project
    object_attributes: Attributes


class GitLab(Provider):
    """GitLab (GitLab.com and self-managed), as :class:`models.providers.Provider`
    describes a provider."""

    name = NAME
    label = "GitLab"
    delivery_header = f"{IDEMPOTENCY_HEADER} or {EVENT_UUID_HEADER}"
    event_header = EVENT_HEADER
    kept_headers = (
        "x-gitlab-event",
        "x-gitlab-event-uuid",
        "x-gitlab-webhook-uuid",
        "x-gitlab-instance",
        "idempotency-key",
    )
    default_create_events = DEFAULT_CREATE_EVENTS
    handled_events = HANDLED_EVENTS
    ignored_events = IGNORED_EVENTS
    move_events = MOVE_EVENTS
    takes_site = False
    secret_help = "GitLab's webhook “Secret token” field"
    setup_help = (
        "In GitLab:   Settings → Webhooks → Add new webhook;",
        "             trigger on Issues events and Merge request events.",
    )
    route_summary = "A GitLab delivery, authenticated by its X-Gitlab-Token secret token."

    def verifier(self, headers: Mapping[str, str], secrets: Iterable[str]) -> Verifier:
        """``X-Gitlab-Token``: one of ``secrets``, as it is."""
        return SecretToken(lookup_header(headers, TOKEN_HEADER), secrets)

    def delivery_id(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """``Idempotency-Key``, else ``X-Gitlab-Event-UUID``.

        ``Idempotency-Key`` names one event sent to one webhook, unchanged across
        its retries. ``X-Gitlab-Event-UUID`` names the request that triggered
        the hooks, so two events one request caused (an issue and its comment)
        share it; it stands in only for a GitLab that sends no key.
        """
        return header_text(headers, IDEMPOTENCY_HEADER) or header_text(headers, EVENT_UUID_HEADER)

    def decode_body(self, content_type: str | None, body: bytes) -> dict[str, Any]:
        """The JSON object of a delivery (GitLab sends ``application/json``)."""
        if media_type(content_type) != JSON_CONTENT_TYPE:
            raise UnsupportedContentType(f"GitLab deliveries must be {JSON_CONTENT_TYPE}")
        return parse_json_object(body)

    def event_of(self, headers: Mapping[str, str], payload: dict[str, Any]) -> str | None:
        """``X-Gitlab-Event`` plus ``object_attributes.action``: ``Issue Hook.open``,
        ``Push Hook``; None when the header is missing."""
        name = header_text(headers, EVENT_HEADER)
        if name is None:
            return None
        action = self.action_of(payload)
        return f"{name}.{action}" if action else name

    def action_of(self, payload: dict[str, Any]) -> str | None:
        """``object_attributes.action`` (``open``); None when the body has none."""
        attributes = payload.get("object_attributes")
        action = attributes.get("action") if isinstance(attributes, dict) else None
        return action if isinstance(action, str) and action else None

    def to_draft(
        self, event: str, payload: dict[str, Any], *, site: str | None = None
    ) -> TaskDraft:
        """The task an issue or merge request delivery describes (GitLab payloads
        carry their own URLs, so ``site`` plays no part)."""
        if event not in HANDLED_EVENTS:
            raise not_handled(event)
        try:
            delivery = ObjectEvent.model_validate(payload)
        except ValidationError as error:
            raise unsupported_because_invalid(event, error) from error
        path, item = delivery.project.path_with_namespace, delivery.object_attributes
        # GitLab's own references: group/project#12 for an issue, group/project!3
        # for a merge request.
        if event.startswith(f"{MERGE_REQUEST_HOOK}."):
            remote_key, kind = f"{path}!{item.iid}", "gl-mr"
        else:
            remote_key, kind = f"{path}#{item.iid}", "gl-issue"
        return TaskDraft(
            provider=NAME,
            title=draft_title(item.title, fallback=remote_key),
            description=draft_description(item.description),
            url=item.url,
            remote_key=remote_key,
            external_id=f"{kind}/{remote_key}",
            stable_key=_stable_key(kind, item.url, item.id),
        )

    def moves(
        self, event: str, payload: dict[str, Any], site: str | None = None
    ) -> tuple[Move, ...]:
        """An issue moved to another project (see the module docstring); ``()``
        for anything else. GitLab payloads carry their own URLs, so ``site``
        plays no part."""
        if event not in MOVE_EVENTS:
            return ()
        try:
            moved_to_id = MoveMarker.model_validate(payload).object_attributes.moved_to_id
            if not moved_to_id:
                return ()  # most closes and updates: the rest of the body is not read
            delivery = ObjectEvent.model_validate(payload)
        except ValidationError as error:
            raise unsupported_because_invalid(event, error) from error
        item = delivery.object_attributes
        after = _stable_key("gl-issue", item.url, moved_to_id)
        if after is None:
            raise UnsupportedPayload(f"{event} payload names no instance in object_attributes.url")
        before = moved_name(f"gl-issue/{delivery.project.path_with_namespace}#{item.iid}")
        return (Move(Name.external(before), Name.stable(after)),)

    def sample_headers(
        self,
        body: bytes,
        secret: str,
        *,
        event: str | None = None,
        delivery_id: str | None = None,
    ) -> dict[str, str]:
        """The headers of ``WebHookService#build_headers``: the secret token as
        it is (the body plays no part), a fresh ``Idempotency-Key`` unless given
        one, and fresh event and webhook UUIDs, as GitLab makes per request."""
        return {
            "Content-Type": JSON_CONTENT_TYPE,
            "User-Agent": f"GitLab/{SAMPLE_VERSION}",
            EVENT_HEADER: event_header_value(event, EVENT_HEADER),
            TOKEN_HEADER: secret,
            IDEMPOTENCY_HEADER: str(uuid.uuid4()) if delivery_id is None else delivery_id,
            EVENT_UUID_HEADER: str(uuid.uuid4()),
            WEBHOOK_UUID_HEADER: str(uuid.uuid4()),
            INSTANCE_HEADER: SAMPLE_INSTANCE,
        }


GITLAB = GitLab()


def _stable_key(kind: str, url: str, item_id: object) -> str | None:
    """``<kind>-id:<host>/<id>``; None without a numeric id or a host."""
    number, host = positive_id(item_id), url_host(url)
    if number is None or host is None:
        return None
    return bounded_key(f"{kind}-id:{host}/{number}")
