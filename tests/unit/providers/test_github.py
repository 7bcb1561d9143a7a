"""The GitHub adapter, against real payloads from tests/fixtures/github."""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from models.providers.drafts import TaskDraft, UnsupportedContentType, UnsupportedPayload
from models.providers.github import GITHUB as github

FIXTURES = Path(__file__).parents[2] / "fixtures" / "github"
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"

DOCS_SECRET = "It's a Secret to Everybody"
DOCS_BODY = b"Hello, World!"
DOCS_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
# A valid SHA-1 signature of the same body with the same secret.
DOCS_SHA1_SIGNATURE = "sha1=" + hmac.new(DOCS_SECRET.encode(), DOCS_BODY, hashlib.sha1).hexdigest()


@cache
def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / f"{name}.json").read_bytes()


def fixture_payload(name: str) -> dict[str, Any]:
    return copy.deepcopy(github.decode_body(JSON, fixture_bytes(name)))


def event_header(name: str) -> dict[str, str]:
    """The X-GitHub-Event GitHub sends with fixture ``name``: its ``<event>__`` prefix."""
    return {"X-GitHub-Event": name.split("__", 1)[0]}


def check_fixture(
    name: str,
    *,
    expect_event: str,
    expect_external_id: str,
    expect_title: str,
    expect_url: str,
) -> TaskDraft:
    """Fixture ``name`` is a handled event and becomes exactly this draft."""
    payload = github.decode_body(JSON, fixture_bytes(name))
    event = github.event_of(event_header(name), payload)
    assert event == expect_event
    assert event in github.handled_events and event not in github.ignored_events

    draft = github.to_draft(event, payload)

    assert draft.provider == "github"
    assert draft.external_id == expect_external_id
    assert draft.title == expect_title
    assert draft.url == expect_url
    assert draft.remote_key == expect_external_id.split("/", 1)[1]
    return draft


def check_ignored(name: str, *, expect_event: str) -> None:
    """Fixture ``name`` is a known event that never becomes a task."""
    payload = github.decode_body(JSON, fixture_bytes(name))
    event = github.event_of(event_header(name), payload)
    assert event == expect_event
    assert event in github.ignored_events and event not in github.handled_events
    with pytest.raises(UnsupportedPayload, match="do not become tasks"):
        github.to_draft(event, payload)


# --- one sentence per fixture ------------------------------------------------

HELLO_ISSUE = "https://github.com/Codertocat/Hello-World/issues/1"
HELLO_PR = "https://github.com/Codertocat/Hello-World/pull/2"
SPELLING = "Spelling error in the README file"


def test_issues__opened() -> None:
    draft = check_fixture(
        "issues__opened",
        expect_event="issues.opened",
        expect_external_id="gh-issue/Codertocat/Hello-World#1",
        expect_title=SPELLING,
        expect_url=HELLO_ISSUE,
    )
    assert draft.description == "It looks like you accidently spelled 'commit' with two 't's."


def test_issues__opened_with_organization() -> None:
    check_fixture(
        "issues__opened_with_organization",
        expect_event="issues.opened",
        expect_external_id="gh-issue/Codertocat/Hello-World#1",
        expect_title=SPELLING,
        expect_url=HELLO_ISSUE,
    )


def test_issues__reopened() -> None:
    draft = check_fixture(
        "issues__reopened",
        expect_event="issues.reopened",
        expect_external_id="gh-issue/Codertocat/Hello-World#1",
        expect_title=SPELLING,
        expect_url=HELLO_ISSUE,
    )
    assert draft.description is None  # the body is "" in this payload


def test_pull_request__opened() -> None:
    draft = check_fixture(
        "pull_request__opened",
        expect_event="pull_request.opened",
        expect_external_id="gh-pr/Codertocat/Hello-World#2",
        expect_title="Update the README with new information.",
        expect_url=HELLO_PR,
    )
    assert draft.description == "This is a pretty simple change that we need to pull into master."


@pytest.mark.parametrize(
    ("name", "event"),
    [
        ("ping__basic", "ping"),
        ("ping__with_app_id", "ping"),
        ("push__tag_deleted", "push"),
        ("push__new_branch", "push"),
        ("installation__created", "installation.created"),
        ("issue_comment__created", "issue_comment.created"),
        ("issue_comment__created_with_installation", "issue_comment.created"),
        ("issues__assigned_with_installation", "issues.assigned"),
        ("issues__closed", "issues.closed"),
        ("issues__deleted", "issues.deleted"),
        ("issues__edited", "issues.edited"),
        ("issues__labeled", "issues.labeled"),
        ("issues__transferred", "issues.transferred"),
        ("pull_request__closed_merged", "pull_request.closed"),
        ("pull_request__closed_unmerged", "pull_request.closed"),
        ("pull_request__synchronize", "pull_request.synchronize"),
    ],
)
def test_ignored_fixture(name: str, event: str) -> None:
    check_ignored(name, expect_event=event)


# --- the event lists ---------------------------------------------------------


def test_handled_and_ignored_events_are_disjoint() -> None:
    assert github.handled_events.isdisjoint(github.ignored_events)


def test_the_default_create_events_are_handled() -> None:
    assert {"issues.opened", "pull_request.opened"} == github.default_create_events
    assert github.default_create_events <= github.handled_events


#: Every action GitHub documents for the events a source's hook is subscribed
#: to ("Webhook events and payloads": issues, pull_request; installation for a
#: GitHub App's own hook). Each must be known -- handled or ignored -- so that
#: the unknown-event count means an event GitHub added, or a hook subscribed to
#: more than it needs.
DOCUMENTED_ACTIONS = {
    "issues": (
        "assigned closed deleted demilestoned edited labeled locked milestoned opened "
        "pinned reopened transferred typed unassigned unlabeled unlocked unpinned untyped"
    ),
    "pull_request": (
        "assigned auto_merge_disabled auto_merge_enabled closed converted_to_draft "
        "demilestoned dequeued edited enqueued labeled locked milestoned opened "
        "ready_for_review reopened review_request_removed review_requested synchronize "
        "unassigned unlabeled unlocked"
    ),
    "installation": "created deleted new_permissions_accepted suspend unsuspend",
}


@pytest.mark.parametrize(
    "event",
    [
        f"{name}.{action}"
        for name, actions in DOCUMENTED_ACTIONS.items()
        for action in actions.split()
    ],
)
def test_every_documented_action_of_a_subscribed_event_is_known(event: str) -> None:
    assert (event in github.handled_events) != (event in github.ignored_events)


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda path: path.stem)
def test_every_fixture_event_is_either_handled_or_ignored(path: Path) -> None:
    payload = github.decode_body(JSON, path.read_bytes())
    event = github.event_of(event_header(path.stem), payload)

    assert (event in github.handled_events) != (event in github.ignored_events)


# --- signatures --------------------------------------------------------------


def test_the_github_docs_test_vector_verifies() -> None:
    headers = {"X-Hub-Signature-256": DOCS_SIGNATURE}

    assert github.verify(DOCS_BODY, headers, [DOCS_SECRET])


def test_a_sha1_signature_alone_is_never_enough() -> None:
    headers = {"X-Hub-Signature": DOCS_SHA1_SIGNATURE}

    assert not github.verify(DOCS_BODY, headers, [DOCS_SECRET])


def test_a_sha256_signature_in_the_sha1_header_is_not_read() -> None:
    headers = {"X-Hub-Signature": DOCS_SIGNATURE}

    assert not github.verify(DOCS_BODY, headers, [DOCS_SECRET])


def test_the_sha256_header_decides_even_beside_a_valid_sha1_one() -> None:
    headers = {"X-Hub-Signature": DOCS_SHA1_SIGNATURE, "X-Hub-Signature-256": "sha256=00"}

    assert not github.verify(DOCS_BODY, headers, [DOCS_SECRET])


def test_a_wrong_secret_does_not_verify() -> None:
    headers = {"X-Hub-Signature-256": DOCS_SIGNATURE}

    assert not github.verify(DOCS_BODY, headers, ["It's a Secret to Nobody"])


def test_either_of_two_active_secrets_verifies_during_rotation() -> None:
    body = fixture_bytes("issues__opened")
    old, new = "old secret", "new secret"
    signed_with = {
        secret: {"X-Hub-Signature-256": "sha256=" + _hmac(secret, body)} for secret in (old, new)
    }

    assert github.verify(body, signed_with[old], [new, old])
    assert github.verify(body, signed_with[new], [new, old])
    assert not github.verify(body, signed_with[old], [new])


@pytest.mark.parametrize(
    "name", ["x-hub-signature-256", "X-HUB-SIGNATURE-256", "X-Hub-signature-256"]
)
def test_the_signature_header_name_matches_in_any_case(name: str) -> None:
    assert github.verify(DOCS_BODY, {name: DOCS_SIGNATURE}, [DOCS_SECRET])


def test_a_missing_signature_does_not_verify() -> None:
    assert not github.verify(DOCS_BODY, {}, [DOCS_SECRET])


def _hmac(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


# --- delivery id, hook id, event ---------------------------------------------

DELIVERY = "72d3162e-cc78-11e3-81ab-4c9367dc0958"  # from GitHub's example delivery


@pytest.mark.parametrize("name", ["X-GitHub-Delivery", "x-github-delivery", "X-GITHUB-DELIVERY"])
def test_the_delivery_id_is_the_x_github_delivery_header(name: str) -> None:
    assert github.delivery_id({name: DELIVERY}, b"{}") == DELIVERY


@pytest.mark.parametrize("headers", [{}, {"X-GitHub-Delivery": ""}, {"X-GitHub-Delivery": "  "}])
def test_a_missing_delivery_id_is_none(headers: dict[str, str]) -> None:
    assert github.delivery_id(headers, fixture_bytes("issues__opened")) is None


def test_the_hook_id_is_the_x_github_hook_id_header() -> None:
    assert github.hook_id({"x-github-hook-id": "292430182"}) == "292430182"
    assert github.hook_id({}) is None


def test_the_event_joins_header_and_action() -> None:
    assert github.event_of({"x-github-event": "issues"}, {"action": "opened"}) == "issues.opened"


def test_an_event_without_action_is_the_header_alone() -> None:
    assert github.event_of({"X-GitHub-Event": "ping"}, fixture_payload("ping__basic")) == "ping"


def test_a_missing_event_header_is_none() -> None:
    assert github.event_of({}, fixture_payload("issues__opened")) is None


# --- bodies ------------------------------------------------------------------


def test_a_json_body_with_a_charset_decodes() -> None:
    payload = github.decode_body("application/json; charset=utf-8", fixture_bytes("issues__opened"))

    assert payload["issue"]["number"] == 1


def test_a_form_encoded_body_decodes_its_payload_field() -> None:
    text = fixture_bytes("issues__opened").decode("utf-8")
    body = urlencode({"payload": text}).encode("ascii")

    assert github.decode_body(FORM, body) == json.loads(text)


def test_a_form_encoded_body_becomes_the_same_draft_as_json() -> None:
    raw = fixture_bytes("pull_request__opened")
    form = urlencode({"payload": raw.decode("utf-8")}).encode("ascii")
    headers = {"X-GitHub-Event": "pull_request"}

    payload = github.decode_body(FORM, form)

    assert github.to_draft(github.event_of(headers, payload), payload) == github.to_draft(
        "pull_request.opened", github.decode_body(JSON, raw)
    )


@pytest.mark.parametrize(
    "body",
    [b"", b"other=1", b"payload=1&payload=2", "payload=é".encode(), b"payload=%FF"],
    ids=["empty", "no-payload-field", "two-payload-fields", "not-ascii", "not-utf8"],
)
def test_a_form_body_without_exactly_one_payload_field_is_unsupported(body: bytes) -> None:
    with pytest.raises(UnsupportedPayload):
        github.decode_body(FORM, body)


def test_a_form_payload_field_that_is_not_json_is_unsupported() -> None:
    with pytest.raises(UnsupportedPayload, match="not valid JSON"):
        github.decode_body(FORM, b"payload=%7Bnot+json")


def test_invalid_json_is_unsupported() -> None:
    with pytest.raises(UnsupportedPayload, match="not valid JSON"):
        github.decode_body(JSON, fixture_bytes("issues__opened")[:-20])


@pytest.mark.parametrize("body", [b"[]", b'"issues"', b"null", b"42"])
def test_json_that_is_not_an_object_is_unsupported(body: bytes) -> None:
    with pytest.raises(UnsupportedPayload, match="must be a JSON object"):
        github.decode_body(JSON, body)


@pytest.mark.parametrize("content_type", [None, "", "text/plain", "multipart/form-data; b=x"])
def test_other_content_types_are_unsupported(content_type: str | None) -> None:
    with pytest.raises(UnsupportedContentType):
        github.decode_body(content_type, b"{}")


def test_unsupported_content_type_is_distinct_from_unsupported_payload() -> None:
    assert not issubclass(UnsupportedContentType, UnsupportedPayload)
    assert not issubclass(UnsupportedPayload, UnsupportedContentType)


# --- drafts ------------------------------------------------------------------


@pytest.mark.parametrize("event", ["push", "issues.closed", "issues", "made.up"])
def test_an_event_that_is_not_handled_is_unsupported(event: str) -> None:
    with pytest.raises(UnsupportedPayload, match="do not become tasks"):
        github.to_draft(event, fixture_payload("issues__opened"))


def test_a_reopened_pull_request_is_drafted_like_an_opened_one() -> None:
    payload = fixture_payload("pull_request__opened")
    payload["action"] = "reopened"

    assert github.to_draft("pull_request.reopened", payload) == github.to_draft(
        "pull_request.opened", fixture_payload("pull_request__opened")
    )


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("issue", "number"), "1"),
        (("issue", "number"), 0),
        (("issue", "html_url"), None),
        (("issue", "html_url"), "javascript:alert(1)"),
        (("issue", "html_url"), "/Codertocat/Hello-World/issues/1"),
        (("issue", "title"), 12),
        (("repository", "full_name"), "no-slash"),
        (("repository", "full_name"), "a/b/c"),
    ],
)
def test_an_issue_payload_of_the_wrong_shape_is_unsupported(
    path: tuple[str, str], value: object
) -> None:
    payload = fixture_payload("issues__opened")
    payload[path[0]][path[1]] = value

    with pytest.raises(UnsupportedPayload, match=rf"issues\.opened payload .*{path[0]}"):
        github.to_draft("issues.opened", payload)


@pytest.mark.parametrize("missing", ["issue", "repository"])
def test_an_issue_payload_without_its_objects_is_unsupported(missing: str) -> None:
    payload = fixture_payload("issues__opened")
    del payload[missing]

    with pytest.raises(UnsupportedPayload, match=missing):
        github.to_draft("issues.opened", payload)


@pytest.mark.parametrize("missing", ["number", "pull_request", "repository"])
def test_a_pull_request_payload_without_its_parts_is_unsupported(missing: str) -> None:
    payload = fixture_payload("pull_request__opened")
    del payload[missing]

    with pytest.raises(UnsupportedPayload, match=missing):
        github.to_draft("pull_request.opened", payload)


def test_without_full_name_the_repository_is_owner_login_and_name() -> None:
    payload = fixture_payload("issues__opened")
    del payload["repository"]["full_name"]

    assert github.to_draft("issues.opened", payload).external_id == (
        "gh-issue/Codertocat/Hello-World#1"
    )


@pytest.mark.parametrize("title", [None, "", "   "])
def test_a_missing_or_blank_title_becomes_the_remote_key(title: str | None) -> None:
    payload = fixture_payload("issues__opened")
    payload["issue"]["title"] = title

    assert github.to_draft("issues.opened", payload).title == "Codertocat/Hello-World#1"


def test_a_long_title_is_truncated_to_500_characters() -> None:
    payload = fixture_payload("pull_request__opened")
    payload["pull_request"]["title"] = "t" * 1000

    assert len(github.to_draft("pull_request.opened", payload).title) == 500


def test_a_null_body_is_no_description() -> None:
    payload = fixture_payload("issues__opened")
    payload["issue"]["body"] = None

    assert github.to_draft("issues.opened", payload).description is None


def test_the_draft_is_a_valid_new_task() -> None:
    new = github.to_draft("issues.opened", fixture_payload("issues__opened")).new_task()

    assert new.external_id == "gh-issue/Codertocat/Hello-World#1"
    assert new.source is not None and new.source.provider == "github"
    assert new.source.remote_key == "Codertocat/Hello-World#1"
