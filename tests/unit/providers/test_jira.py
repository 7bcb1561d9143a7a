"""The Jira adapter, against real payloads from tests/fixtures/jira."""

from __future__ import annotations

import copy
import hashlib
import hmac
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from models.providers.drafts import TaskDraft, UnsupportedContentType, UnsupportedPayload
from models.providers.jira import JIRA as jira

FIXTURES = Path(__file__).parents[2] / "fixtures" / "jira"
# What Jira Cloud sends (HEADERS.md, J1).
JSON = "application/json; charset=UTF-8"
SECRET = "jira webhook secret"
CLOUD_SITE = "https://some-instance-test.atlassian.net"


@cache
def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / f"{name}.json").read_bytes()


def fixture_payload(name: str) -> dict[str, Any]:
    return copy.deepcopy(jira.decode_body(JSON, fixture_bytes(name)))


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def check_fixture(
    name: str,
    *,
    expect_event: str,
    expect_external_id: str,
    expect_title: str,
    expect_url: str,
    expect_description: str | None,
) -> TaskDraft:
    """Fixture ``name`` is a handled event and becomes exactly this draft (site derived)."""
    payload = jira.decode_body(JSON, fixture_bytes(name))
    event = jira.event_of({}, payload)
    assert event == expect_event
    assert event in jira.handled_events and event not in jira.ignored_events

    draft = jira.to_draft(event, payload)

    assert draft.provider == "jira"
    assert draft.external_id == expect_external_id
    assert draft.remote_key == expect_external_id.removeprefix("jira:")
    assert draft.title == expect_title
    assert draft.url == expect_url
    assert draft.description == expect_description
    return draft


def check_ignored(name: str, *, expect_event: str) -> None:
    """Fixture ``name`` is a known event that never becomes a task."""
    payload = jira.decode_body(JSON, fixture_bytes(name))
    event = jira.event_of({}, payload)
    assert event == expect_event
    assert event in jira.ignored_events and event not in jira.handled_events
    with pytest.raises(UnsupportedPayload, match="do not become tasks"):
        jira.to_draft(event, payload)


# --- one sentence per fixture ------------------------------------------------


def test_jira_issue_created__cloud() -> None:
    check_fixture(
        "jira_issue_created__cloud",
        expect_event="jira:issue_created",
        expect_external_id="jira:TES-41",
        expect_title="Unit test summary",
        expect_url=f"{CLOUD_SITE}/browse/TES-41",
        expect_description="Unit test description, not that long",
    )


def test_jira_issue_created__cloud_many_fields() -> None:
    check_fixture(
        "jira_issue_created__cloud_many_fields",
        expect_event="jira:issue_created",
        expect_external_id="jira:KT-22",
        expect_title="Lots of fields selected",
        expect_url="https://mmtest.atlassian.net/browse/KT-22",
        expect_description="The good description",
    )


def test_jira_issue_created__server_trigger_plugin() -> None:
    # Jira Server under the context path /jira; the description is null.
    check_fixture(
        "jira_issue_created__server_trigger_plugin",
        expect_event="jira:issue_created",
        expect_external_id="jira:TEST-4",
        expect_title="a",
        expect_url="http://localhost:2990/jira/browse/TEST-4",
        expect_description=None,
    )


@pytest.mark.parametrize(
    ("name", "event"),
    [
        ("jira_issue_updated__cloud_assigned", "jira:issue_updated"),
        ("jira_issue_updated__cloud_description_edited", "jira:issue_updated"),
        ("jira_issue_updated__cloud_description_edited_compact", "jira:issue_updated"),
        ("jira_issue_updated__cloud_resolved", "jira:issue_updated"),
        ("jira_issue_updated__server_commented", "jira:issue_updated"),
        ("jira_issue_updated__server_status_trigger_plugin", "jira:issue_updated"),
        ("jira_issue_deleted__cloud", "jira:issue_deleted"),
        ("comment_created__cloud", "comment_created"),
        ("comment_created__cloud_compact", "comment_created"),
        ("comment_created__cloud_trigger_plugin", "comment_created"),
        ("comment_created__server_without_issue", "comment_created"),
    ],
)
def test_ignored_fixture(name: str, event: str) -> None:
    check_ignored(name, expect_event=event)


# --- the event lists ---------------------------------------------------------


def test_handled_and_ignored_events_are_disjoint() -> None:
    assert jira.handled_events.isdisjoint(jira.ignored_events)


def test_the_default_create_events_are_handled() -> None:
    assert {"jira:issue_created"} == jira.default_create_events
    assert jira.default_create_events <= jira.handled_events


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda path: path.stem)
def test_every_fixture_event_is_either_handled_or_ignored(path: Path) -> None:
    event = jira.event_of({}, jira.decode_body(JSON, path.read_bytes()))

    assert (event in jira.handled_events) != (event in jira.ignored_events)


def test_the_event_is_the_webhook_event_field() -> None:
    assert jira.event_of({}, {"webhookEvent": "comment_created"}) == "comment_created"


@pytest.mark.parametrize("payload", [{}, {"webhookEvent": ""}, {"webhookEvent": 7}])
def test_a_missing_event_is_none(payload: dict[str, Any]) -> None:
    assert jira.event_of({"X-Atlassian-Webhook-Identifier": "1"}, payload) is None


# --- signatures --------------------------------------------------------------

# The compact fixture is the closest thing to a raw Jira request body.
RAW_BODY_FIXTURE = "comment_created__cloud_compact"


def test_a_signature_over_the_raw_body_verifies() -> None:
    body = fixture_bytes(RAW_BODY_FIXTURE)

    assert jira.verify(body, {"X-Hub-Signature": sign(SECRET, body)}, [SECRET])


def test_a_signature_over_a_reformatted_body_does_not_verify() -> None:
    body = fixture_bytes(RAW_BODY_FIXTURE)
    pretty = fixture_bytes("comment_created__cloud")  # the same delivery, pretty-printed

    assert not jira.verify(pretty, {"X-Hub-Signature": sign(SECRET, body)}, [SECRET])


def test_a_wrong_secret_does_not_verify() -> None:
    body = fixture_bytes(RAW_BODY_FIXTURE)

    assert not jira.verify(body, {"X-Hub-Signature": sign("other", body)}, [SECRET])


def test_either_of_two_active_secrets_verifies_during_rotation() -> None:
    body = fixture_bytes(RAW_BODY_FIXTURE)

    for secret in ("old", "new"):
        assert jira.verify(body, {"X-Hub-Signature": sign(secret, body)}, ["new", "old"])
    assert not jira.verify(body, {"X-Hub-Signature": sign("old", body)}, ["new"])


@pytest.mark.parametrize("name", ["x-hub-signature", "X-HUB-SIGNATURE", "X-Hub-signature"])
def test_the_signature_header_name_matches_in_any_case(name: str) -> None:
    body = fixture_bytes(RAW_BODY_FIXTURE)

    assert jira.verify(body, {name: sign(SECRET, body)}, [SECRET])


def test_only_x_hub_signature_is_read() -> None:
    body = fixture_bytes(RAW_BODY_FIXTURE)

    assert not jira.verify(body, {"X-Hub-Signature-256": sign(SECRET, body)}, [SECRET])


def test_a_bare_hex_digest_without_the_sha256_prefix_does_not_verify() -> None:
    body = fixture_bytes(RAW_BODY_FIXTURE)
    digest = sign(SECRET, body).removeprefix("sha256=")

    assert not jira.verify(body, {"X-Hub-Signature": digest}, [SECRET])


# --- delivery id -------------------------------------------------------------

IDENTIFIER = "69312270414585119"  # a real Cloud value (HEADERS.md, J1)


@pytest.mark.parametrize(
    "name",
    [
        "X-Atlassian-Webhook-Identifier",
        "x-atlassian-webhook-identifier",
        "X-ATLASSIAN-WEBHOOK-IDENTIFIER",
    ],
)
def test_the_delivery_id_is_the_webhook_identifier_header(name: str) -> None:
    assert jira.delivery_id({name: IDENTIFIER}, fixture_bytes(RAW_BODY_FIXTURE)) == IDENTIFIER


@pytest.mark.parametrize("headers", [{}, {"X-Atlassian-Webhook-Identifier": " "}])
def test_without_an_identifier_the_delivery_id_is_the_body_hash(headers: dict[str, str]) -> None:
    body = fixture_bytes(RAW_BODY_FIXTURE)

    assert jira.delivery_id(headers, body) == "sha256:" + hashlib.sha256(body).hexdigest()


def test_the_fallback_delivery_id_is_the_same_for_a_retry_of_the_same_body() -> None:
    first = jira.delivery_id({}, fixture_bytes(RAW_BODY_FIXTURE))
    retry = jira.delivery_id(
        {"X-Atlassian-Webhook-Retry": "1"}, bytes(fixture_bytes(RAW_BODY_FIXTURE))
    )

    assert first == retry


def test_the_fallback_delivery_id_differs_for_different_bodies() -> None:
    created = jira.delivery_id({}, fixture_bytes("jira_issue_updated__server_commented"))
    commented = jira.delivery_id({}, fixture_bytes("comment_created__server_without_issue"))

    assert created != commented


# --- bodies ------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON ; charset=UTF-8"])
def test_a_json_body_decodes(content_type: str) -> None:
    payload = jira.decode_body(content_type, fixture_bytes("jira_issue_created__cloud"))

    assert payload["issue"]["key"] == "TES-41"


@pytest.mark.parametrize(
    "content_type", [None, "", "text/plain", "application/x-www-form-urlencoded"]
)
def test_other_content_types_are_unsupported(content_type: str | None) -> None:
    with pytest.raises(UnsupportedContentType):
        jira.decode_body(content_type, fixture_bytes("jira_issue_created__cloud"))


def test_invalid_json_is_unsupported() -> None:
    with pytest.raises(UnsupportedPayload, match="not valid JSON"):
        jira.decode_body(JSON, fixture_bytes(RAW_BODY_FIXTURE)[1:])


@pytest.mark.parametrize("body", [b"[]", b'"jira:issue_created"', b"null", b"1704303069063"])
def test_json_that_is_not_an_object_is_unsupported(body: bytes) -> None:
    with pytest.raises(UnsupportedPayload, match="must be a JSON object"):
        jira.decode_body(JSON, body)


# --- site and links ----------------------------------------------------------


def created(name: str = "jira_issue_created__cloud") -> dict[str, Any]:
    return fixture_payload(name)


def test_an_explicit_site_builds_the_link() -> None:
    draft = jira.to_draft("jira:issue_created", created(), site="https://acme.atlassian.net")

    assert draft.url == "https://acme.atlassian.net/browse/TES-41"


def test_a_trailing_slash_on_the_site_is_dropped() -> None:
    draft = jira.to_draft("jira:issue_created", created(), site="https://jira.example.com/jira/")

    assert draft.url == "https://jira.example.com/jira/browse/TES-41"


def test_a_derived_site_keeps_the_context_path() -> None:
    payload = created()
    payload["issue"]["self"] = "https://jira.example.com/jira/rest/api/2/issue/10040"

    assert jira.to_draft("jira:issue_created", payload).url == (
        "https://jira.example.com/jira/browse/TES-41"
    )


def test_a_derived_site_does_not_need_issue_in_the_rest_path() -> None:
    # Some Cloud payloads have issue.self as https://<site>/rest/api/2/<id>.
    payload = created()
    payload["issue"]["self"] = "https://acme.atlassian.net/rest/api/2/10040"

    assert jira.to_draft("jira:issue_created", payload).url == (
        "https://acme.atlassian.net/browse/TES-41"
    )


def test_a_derived_site_never_carries_credentials() -> None:
    payload = created()
    payload["issue"]["self"] = "https://bot:hunter2@jira.example.com/rest/api/2/issue/10040"

    assert jira.to_draft("jira:issue_created", payload).url == (
        "https://jira.example.com/browse/TES-41"
    )


@pytest.mark.parametrize(
    "api_url",
    [None, "", "https://jira.example.com/browse/TES-41", "javascript:x/rest/api", "/rest/api/2"],
)
def test_without_a_site_an_unusable_issue_self_is_unsupported(api_url: str | None) -> None:
    payload = created()
    payload["issue"]["self"] = api_url

    with pytest.raises(UnsupportedPayload, match="configure the site"):
        jira.to_draft("jira:issue_created", payload)


def test_an_explicit_site_does_not_need_issue_self() -> None:
    payload = created()
    del payload["issue"]["self"]

    draft = jira.to_draft("jira:issue_created", payload, site="https://acme.atlassian.net")

    assert draft.url == "https://acme.atlassian.net/browse/TES-41"


# --- drafts ------------------------------------------------------------------


@pytest.mark.parametrize("event", ["jira:issue_updated", "comment_created", "issue_created"])
def test_an_event_that_is_not_handled_is_unsupported(event: str) -> None:
    with pytest.raises(UnsupportedPayload, match="do not become tasks"):
        jira.to_draft(event, created())


@pytest.mark.parametrize("key", [None, "", "TES 41", "TES-41/../x", "41"])
def test_an_unusable_issue_key_is_unsupported(key: str | None) -> None:
    payload = created()
    payload["issue"]["key"] = key

    with pytest.raises(UnsupportedPayload, match=r"issue\.key"):
        jira.to_draft("jira:issue_created", payload)


def test_a_payload_without_an_issue_is_unsupported() -> None:
    # The shape of a Jira Server comment_created, had it been labelled an issue event.
    payload = fixture_payload("comment_created__server_without_issue")

    with pytest.raises(UnsupportedPayload, match="issue"):
        jira.to_draft("jira:issue_created", payload)


@pytest.mark.parametrize("summary", [None, "", "  "])
def test_a_missing_or_blank_summary_becomes_the_issue_key(summary: str | None) -> None:
    payload = created()
    payload["issue"]["fields"]["summary"] = summary

    assert jira.to_draft("jira:issue_created", payload).title == "TES-41"


def test_a_payload_without_fields_is_titled_by_its_key() -> None:
    payload = created()
    del payload["issue"]["fields"]

    draft = jira.to_draft("jira:issue_created", payload)

    assert (draft.title, draft.description) == ("TES-41", None)


def test_a_long_summary_is_truncated_to_500_characters() -> None:
    payload = created()
    payload["issue"]["fields"]["summary"] = "s" * 501

    assert len(jira.to_draft("jira:issue_created", payload).title) == 500


def test_an_adf_description_becomes_plain_text() -> None:
    payload = created()
    payload["issue"]["fields"]["description"] = {
        "type": "doc",
        "version": 1,
        "content": [
            {
                "type": "paragraph",
                "content": [
                    {"type": "text", "text": "Steps for "},
                    {"type": "mention", "attrs": {"id": "557058:x", "text": "@Test User"}},
                    {"type": "text", "text": ":", "marks": [{"type": "strong"}]},
                ],
            },
            {
                "type": "bulletList",
                "content": [
                    {
                        "type": "listItem",
                        "content": [
                            {"type": "paragraph", "content": [{"type": "text", "text": "one"}]}
                        ],
                    },
                    {
                        "type": "listItem",
                        "content": [
                            {
                                "type": "paragraph",
                                "content": [
                                    {"type": "text", "text": "two"},
                                    {"type": "hardBreak"},
                                    {"type": "text", "text": "lines"},
                                ],
                            }
                        ],
                    },
                ],
            },
        ],
    }

    description = jira.to_draft("jira:issue_created", payload).description

    assert description == "Steps for @Test User:\none\ntwo\nlines"


@pytest.mark.parametrize(
    "description",
    [42, ["a", "b"], {"type": "panel"}, {"type": "doc", "content": []}, True],
    ids=["number", "list", "not-adf", "empty-adf", "boolean"],
)
def test_a_description_jira_would_not_send_is_dropped_not_fatal(description: object) -> None:
    payload = created()
    payload["issue"]["fields"]["description"] = description

    draft = jira.to_draft("jira:issue_created", payload)

    assert (draft.title, draft.description) == ("Unit test summary", None)


def test_the_draft_is_a_valid_new_task() -> None:
    new = jira.to_draft("jira:issue_created", created()).new_task()

    assert new.external_id == "jira:TES-41"
    assert new.source is not None and new.source.provider == "jira"
    assert new.source.url == f"{CLOUD_SITE}/browse/TES-41"
