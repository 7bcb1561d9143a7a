"""The GitLab provider, against the documented payloads in tests/fixtures/gitlab."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from models.providers import PROVIDERS, UNKNOWN_EVENT, ignored_reason
from models.providers.drafts import TaskDraft, UnsupportedContentType, UnsupportedPayload
from models.providers.gitlab import GITLAB as gitlab
from tests.support.deliveries import GITLAB_EVENT_OF

FIXTURES = Path(__file__).parents[2] / "fixtures" / "gitlab"
JSON = "application/json"
TOKEN = "gl-token-1"


@cache
def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / f"{name}.json").read_bytes()


def fixture_payload(name: str) -> dict[str, Any]:
    return copy.deepcopy(gitlab.decode_body(JSON, fixture_bytes(name)))


def event_header(name: str) -> dict[str, str]:
    """The X-Gitlab-Event GitLab sends with fixture ``name``: from its ``<event>__`` prefix."""
    return {"X-Gitlab-Event": GITLAB_EVENT_OF[name.split("__", 1)[0]]}


def event_of(name: str) -> str | None:
    return gitlab.event_of(event_header(name), fixture_payload(name))


# --- one sentence per fixture ------------------------------------------------


def test_issue_hook__open() -> None:
    event = event_of("issue_hook__open")
    assert event == "Issue Hook.open"
    assert event in gitlab.handled_events and event not in gitlab.ignored_events

    draft = gitlab.to_draft(event, fixture_payload("issue_hook__open"))

    assert draft == TaskDraft(
        provider="gitlab",
        title="New API: create/update/delete file",
        description="Create new API for manipulations with repository",
        url="http://example.com/diaspora/issues/23",
        remote_key="gitlabhq/gitlab-test#23",
        external_id="gl-issue/gitlabhq/gitlab-test#23",
        stable_key="gl-issue-id:example.com/301",
    )


def test_merge_request_hook__open() -> None:
    event = event_of("merge_request_hook__open")
    assert event == "Merge Request Hook.open"
    assert event in gitlab.handled_events and event not in gitlab.ignored_events

    draft = gitlab.to_draft(event, fixture_payload("merge_request_hook__open"))

    assert draft == TaskDraft(
        provider="gitlab",
        title="MS-Viewport",
        description=None,  # "" in the payload
        url="http://example.com/diaspora/merge_requests/1",
        remote_key="gitlabhq/gitlab-test!1",
        external_id="gl-mr/gitlabhq/gitlab-test!1",
        stable_key="gl-mr-id:example.com/99",
    )


@pytest.mark.parametrize(
    ("name", "event"),
    [
        ("issue_hook__close", "Issue Hook.close"),
        ("issue_hook__close_moved", "Issue Hook.close"),
        ("issue_hook__update", "Issue Hook.update"),
        ("note_hook__issue_create", "Note Hook.create"),
        ("push_hook__two_commits", "Push Hook"),
    ],
)
def test_ignored_fixture(name: str, event: str) -> None:
    assert event_of(name) == event
    assert event in gitlab.ignored_events and event not in gitlab.handled_events
    assert ignored_reason(gitlab, event) == f"{event} does not create tasks for this source"
    with pytest.raises(UnsupportedPayload, match="do not become tasks"):
        gitlab.to_draft(event, fixture_payload(name))


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda path: path.stem)
def test_every_fixture_event_is_either_handled_or_ignored(path: Path) -> None:
    event = event_of(path.stem)

    assert (event in gitlab.handled_events) != (event in gitlab.ignored_events)


# --- the event lists ---------------------------------------------------------


def test_it_is_registered() -> None:
    assert PROVIDERS["gitlab"] is gitlab


def test_handled_and_ignored_events_are_disjoint() -> None:
    assert gitlab.handled_events.isdisjoint(gitlab.ignored_events)


def test_the_default_create_events_are_handled() -> None:
    assert gitlab.default_create_events == {"Issue Hook.open", "Merge Request Hook.open"}
    assert gitlab.default_create_events <= gitlab.handled_events


def test_a_comment_from_before_gitlab_16_11_has_no_action_and_is_still_known() -> None:
    payload = fixture_payload("note_hook__issue_create")
    del payload["object_attributes"]["action"]

    assert gitlab.event_of({"X-Gitlab-Event": "Note Hook"}, payload) in gitlab.ignored_events


def test_an_event_gitlab_never_documented_is_unknown() -> None:
    reason = ignored_reason(gitlab, "Made Up Hook")

    assert reason.startswith(UNKNOWN_EVENT) and "Made Up Hook" in reason


# --- the secret token --------------------------------------------------------


def test_the_token_verifies_whatever_the_body() -> None:
    headers = {"X-Gitlab-Token": TOKEN}

    assert gitlab.verify(b"", headers, [TOKEN])
    assert gitlab.verify(fixture_bytes("issue_hook__open"), headers, [TOKEN])


@pytest.mark.parametrize("name", ["x-gitlab-token", "X-GITLAB-TOKEN"])
def test_the_token_header_name_matches_in_any_case(name: str) -> None:
    assert gitlab.verify(b"{}", {name: TOKEN}, [TOKEN])


@pytest.mark.parametrize(
    "presented", ["", "gl-token-2", TOKEN + " ", TOKEN[:-1], TOKEN.upper(), "gl-tökén-1"]
)
def test_anything_but_an_active_token_does_not_verify(presented: str) -> None:
    assert not gitlab.verify(b"{}", {"X-Gitlab-Token": presented}, [TOKEN])


def test_a_missing_token_does_not_verify() -> None:
    assert not gitlab.verify(b"{}", {}, [TOKEN])


def test_an_empty_secret_never_verifies_an_empty_token() -> None:
    assert not gitlab.verify(b"{}", {"X-Gitlab-Token": ""}, [""])


def test_either_of_two_active_tokens_verifies_during_rotation() -> None:
    assert gitlab.verify(b"{}", {"X-Gitlab-Token": "old"}, ["new", "old"])
    assert gitlab.verify(b"{}", {"X-Gitlab-Token": "new"}, ["new", "old"])
    assert not gitlab.verify(b"{}", {"X-Gitlab-Token": "old"}, ["new"])


def test_a_signature_header_is_no_token() -> None:
    assert not gitlab.verify(b"{}", {"X-Hub-Signature-256": TOKEN}, [TOKEN])


# --- delivery id and event ---------------------------------------------------

KEY, EVENT_UUID = "908a6d9e-45fd-46c8-97e6-c4f350f219dd", "0f1e2d3c-0000-4000-8000-000000000001"


def test_the_delivery_id_is_the_idempotency_key_when_gitlab_sends_one() -> None:
    headers = {"Idempotency-Key": KEY, "X-Gitlab-Event-UUID": EVENT_UUID}

    assert gitlab.delivery_id(headers, b"{}") == KEY


@pytest.mark.parametrize("key", [None, "", "  "])
def test_without_a_key_the_delivery_id_is_the_event_uuid(key: str | None) -> None:
    headers = {"x-gitlab-event-uuid": EVENT_UUID} | (
        {} if key is None else {"Idempotency-Key": key}
    )

    assert gitlab.delivery_id(headers, b"{}") == EVENT_UUID


def test_without_either_the_delivery_id_is_none() -> None:
    assert gitlab.delivery_id({"X-Gitlab-Webhook-UUID": EVENT_UUID}, b"{}") is None


def test_a_missing_event_header_is_none() -> None:
    assert gitlab.event_of({}, fixture_payload("issue_hook__open")) is None


def test_the_action_is_object_attributes_action() -> None:
    assert gitlab.action_of(fixture_payload("merge_request_hook__open")) == "open"
    assert gitlab.action_of(fixture_payload("push_hook__two_commits")) is None
    assert gitlab.action_of({"object_attributes": "open"}) is None


def test_gitlab_sends_no_hook_id_and_no_time() -> None:
    assert gitlab.hook_id({"X-Gitlab-Webhook-UUID": EVENT_UUID}) is None
    assert gitlab.sent_at(fixture_payload("issue_hook__open")) is None


# --- bodies ------------------------------------------------------------------


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_only_json_is_supported(content_type: str | None) -> None:
    with pytest.raises(UnsupportedContentType):
        gitlab.decode_body(content_type, fixture_bytes("issue_hook__open"))


@pytest.mark.parametrize("body", [b"[]", b"{not json", b"null"])
def test_a_body_that_is_not_a_json_object_is_unsupported(body: bytes) -> None:
    with pytest.raises(UnsupportedPayload):
        gitlab.decode_body(JSON, body)


# --- drafts ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        ("Issue Hook.reopen", "gl-issue"),
        ("Confidential Issue Hook.open", "gl-issue"),
        ("Merge Request Hook.reopen", "gl-mr"),
    ],
)
def test_the_opt_in_events_are_drafted_like_an_open(event: str, kind: str) -> None:
    name = "merge_request_hook__open" if kind == "gl-mr" else "issue_hook__open"

    assert gitlab.to_draft(event, fixture_payload(name)).external_id.startswith(f"{kind}/")


def test_a_nested_group_is_part_of_the_path() -> None:
    payload = fixture_payload("issue_hook__open")
    payload["project"]["path_with_namespace"] = "acme/platform/api"

    draft = gitlab.to_draft("Issue Hook.open", payload)

    assert draft.external_id == "gl-issue/acme/platform/api#23"


@pytest.mark.parametrize(
    ("part", "field", "value"),
    [
        ("object_attributes", "iid", "23"),
        ("object_attributes", "iid", 0),
        ("object_attributes", "url", "javascript:alert(1)"),
        ("object_attributes", "url", None),
        ("project", "path_with_namespace", "no-slash"),
        ("project", "path_with_namespace", "a b/c"),
    ],
)
def test_a_payload_of_the_wrong_shape_is_unsupported(part: str, field: str, value: object) -> None:
    payload = fixture_payload("issue_hook__open")
    payload[part][field] = value

    with pytest.raises(UnsupportedPayload, match=rf"Issue Hook\.open payload .*{part}"):
        gitlab.to_draft("Issue Hook.open", payload)


@pytest.mark.parametrize("title", [None, "", "  "])
def test_a_missing_or_blank_title_becomes_the_remote_key(title: str | None) -> None:
    payload = fixture_payload("merge_request_hook__open")
    payload["object_attributes"]["title"] = title

    assert gitlab.to_draft("Merge Request Hook.open", payload).title == "gitlabhq/gitlab-test!1"


def test_the_draft_is_a_valid_new_task() -> None:
    new = gitlab.to_draft("Issue Hook.open", fixture_payload("issue_hook__open")).new_task()

    assert new.source is not None and new.source.provider == "gitlab"
    assert new.source.remote_key == "gitlabhq/gitlab-test#23"


def test_the_fixtures_are_the_documented_bodies() -> None:
    # The derived close/update fixtures differ from the open one in action and state only.
    opened = json.loads(fixture_bytes("issue_hook__open"))
    for name, action in (("issue_hook__close", "close"), ("issue_hook__update", "update")):
        derived = json.loads(fixture_bytes(name))
        assert derived["object_attributes"].pop("action") == action
        derived["object_attributes"].pop("state")
        expected = copy.deepcopy(opened)
        del expected["object_attributes"]["action"], expected["object_attributes"]["state"]
        assert derived == expected
    # The moved close differs from the close in moved_to_id only.
    moved = json.loads(fixture_bytes("issue_hook__close_moved"))
    assert moved["object_attributes"].pop("moved_to_id") == 302
    closed = json.loads(fixture_bytes("issue_hook__close"))
    assert closed["object_attributes"].pop("moved_to_id") is None
    assert moved == closed
