"""The parts every adapter shares: drafts, signatures, headers, JSON bodies, titles."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from models.providers import Provider
from models.providers import github as github_module
from models.providers import jira as jira_module
from models.providers.drafts import (
    TRUNCATION_MARKER,
    TaskDraft,
    UnsupportedPayload,
    bounded_key,
    draft_description,
    draft_title,
    header_text,
    lookup_header,
    moved_name,
    parse_json_object,
    positive_id,
    unsupported_because_invalid,
    url_host,
)
from models.providers.github import GITHUB as github
from models.providers.jira import JIRA as jira
from models.providers.signing import verify_hmac_sha256
from models.tasks import MAX_DESCRIPTION_LENGTH, MAX_TITLE_LENGTH, NewTask, SourceLink
from tests.support.deliveries import fixture

# GitHub's published test vector ("Validating webhook deliveries").
DOCS_SECRET = "It's a Secret to Everybody"
DOCS_BODY = b"Hello, World!"
DOCS_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


# --- TaskDraft ---------------------------------------------------------------


def test_a_draft_becomes_a_new_task_with_its_source_link() -> None:
    draft = TaskDraft(
        provider="github",
        title="Fix the README",
        description="It is wrong.",
        url="https://github.com/octo/repo/issues/12",
        remote_key="octo/repo#12",
        external_id="gh-issue/octo/repo#12",
    )

    assert draft.new_task() == NewTask(
        title="Fix the README",
        description="It is wrong.",
        external_id="gh-issue/octo/repo#12",
        source=SourceLink(
            provider="github",
            url="https://github.com/octo/repo/issues/12",
            remote_key="octo/repo#12",
        ),
    )


# --- signatures --------------------------------------------------------------


def test_the_github_docs_test_vector_verifies() -> None:
    assert sign(DOCS_SECRET, DOCS_BODY) == DOCS_SIGNATURE
    assert verify_hmac_sha256(DOCS_BODY, DOCS_SIGNATURE, [DOCS_SECRET])


def test_a_wrong_secret_does_not_verify() -> None:
    assert not verify_hmac_sha256(DOCS_BODY, DOCS_SIGNATURE, ["It's a Secret to Nobody"])


def test_a_changed_body_does_not_verify() -> None:
    assert not verify_hmac_sha256(b"Hello, World?", DOCS_SIGNATURE, [DOCS_SECRET])


def test_either_of_two_active_secrets_verifies_during_rotation() -> None:
    secrets = ["new secret", DOCS_SECRET]

    assert verify_hmac_sha256(DOCS_BODY, DOCS_SIGNATURE, secrets)
    assert verify_hmac_sha256(DOCS_BODY, sign("new secret", DOCS_BODY), secrets)
    assert not verify_hmac_sha256(DOCS_BODY, sign("retired secret", DOCS_BODY), secrets)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        DOCS_SIGNATURE.removeprefix("sha256="),  # the bare digest
        DOCS_SIGNATURE.upper(),
        DOCS_SIGNATURE.replace("sha256=", "sha1="),
        DOCS_SIGNATURE + " ",
        DOCS_SIGNATURE[:-1],
        DOCS_SIGNATURE[:-1] + "é",  # not ASCII: refused, not a TypeError
    ],
)
def test_anything_but_the_exact_sha256_form_does_not_verify(header: str | None) -> None:
    assert not verify_hmac_sha256(DOCS_BODY, header, [DOCS_SECRET])


def test_no_active_secret_verifies_nothing() -> None:
    assert not verify_hmac_sha256(DOCS_BODY, DOCS_SIGNATURE, [])


def test_an_empty_secret_is_skipped_rather_than_used_as_a_key() -> None:
    assert not verify_hmac_sha256(DOCS_BODY, sign("", DOCS_BODY), [""])


def test_a_single_string_of_secrets_is_refused() -> None:
    with pytest.raises(TypeError):
        verify_hmac_sha256(DOCS_BODY, DOCS_SIGNATURE, DOCS_SECRET)


@pytest.mark.parametrize(
    ("adapter", "signature_header"),
    [(github, github_module.SIGNATURE_HEADER), (jira, jira_module.SIGNATURE_HEADER)],
    ids=["github", "jira"],
)
@given(
    body=st.binary(max_size=200),
    active_secrets=st.lists(st.text(min_size=1, max_size=16), min_size=1, max_size=3),
    data=st.data(),
)
def test_verify_signature_holds_exactly_for_sha256_of_an_active_secret(
    adapter: Provider,
    signature_header: str,
    body: bytes,
    active_secrets: list[str],
    data: st.DataObject,
) -> None:
    valid = sorted({sign(secret, body) for secret in active_secrets})
    header = data.draw(
        st.one_of(
            st.sampled_from(valid),
            st.sampled_from(valid).map(str.upper),
            st.sampled_from(valid).map(lambda value: value[:-1]),
            st.sampled_from(valid).map(lambda value: value.replace("sha256=", "sha1=")),
            st.text(min_size=1, max_size=16).map(lambda other: sign(other, body)),
            st.binary(max_size=200).map(lambda other: sign(active_secrets[0], other)),
            st.text(max_size=80),
        ),
        label="header value",
    )
    name = data.draw(
        st.sampled_from(
            [
                signature_header,
                signature_header.lower(),
                signature_header.upper(),
            ]
        ),
        label="header name",
    )

    verified = adapter.verify(body, {name: header}, active_secrets)

    assert verified == (header in valid)


# --- headers -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["X-GitHub-Delivery", "x-github-delivery", "X-GITHUB-DELIVERY"])
def test_a_header_is_found_whatever_the_case_of_its_name(name: str) -> None:
    assert lookup_header({name: "72d3162e"}, "X-GitHub-Delivery") == "72d3162e"
    assert lookup_header({"X-GitHub-Delivery": "72d3162e"}, name) == "72d3162e"


def test_a_missing_header_is_none() -> None:
    assert lookup_header({"X-GitHub-Event": "issues"}, "X-GitHub-Delivery") is None


@pytest.mark.parametrize(("raw", "expected"), [(" abc \t", "abc"), ("   ", None), ("", None)])
def test_header_text_strips_and_treats_blank_as_absent(raw: str, expected: str | None) -> None:
    assert header_text({"x-github-delivery": raw}, "X-GitHub-Delivery") == expected


# --- JSON bodies -------------------------------------------------------------


def test_a_json_object_parses() -> None:
    assert parse_json_object(b'{"action": "opened", "number": 1}') == {
        "action": "opened",
        "number": 1,
    }


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"not json",
        b'{"a": 1} trailing',
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": "\xff"}',  # not UTF-8
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser goes
    ],
    ids=[
        "empty",
        "truncated",
        "text",
        "trailing",
        "nan",
        "infinity",
        "invalid-utf8",
        "too-deep",
    ],
)
def test_invalid_json_is_an_unsupported_payload(body: bytes) -> None:
    with pytest.raises(UnsupportedPayload, match="not valid JSON"):
        parse_json_object(body)


@pytest.mark.parametrize(
    ("body", "kind"),
    [(b"[]", "an array"), (b'"x"', "a string"), (b"1", "a number"), (b"null", "null")],
)
def test_json_that_is_not_an_object_is_an_unsupported_payload(body: bytes, kind: str) -> None:
    with pytest.raises(UnsupportedPayload, match=f"must be a JSON object, not {kind}"):
        parse_json_object(body)


class _Shape(BaseModel):
    number: int
    title: str


def test_a_validation_error_becomes_a_message_that_names_fields_but_not_values() -> None:
    with pytest.raises(ValidationError) as raised:
        _Shape.model_validate({"number": "secret-looking-value"})

    error = unsupported_because_invalid("issues.opened", raised.value)

    assert isinstance(error, UnsupportedPayload)
    assert "issues.opened" in str(error)
    assert "number" in str(error) and "title" in str(error)
    assert "secret-looking-value" not in str(error)


# --- titles and descriptions -------------------------------------------------


def test_a_title_is_stripped() -> None:
    assert draft_title("  Fix it \n", fallback="octo/repo#1") == "Fix it"


@pytest.mark.parametrize("raw", [None, "", "   \n"])
def test_a_missing_or_blank_title_becomes_the_fallback(raw: str | None) -> None:
    assert draft_title(raw, fallback="PROJ-1234") == "PROJ-1234"


def test_a_long_title_is_cut_to_what_the_task_store_accepts() -> None:
    title = draft_title("x" * 10_000, fallback="octo/repo#1")

    assert len(title) == MAX_TITLE_LENGTH
    assert title.endswith("…")


def test_a_title_of_exactly_the_limit_is_kept_whole() -> None:
    assert draft_title("y" * MAX_TITLE_LENGTH, fallback="k") == "y" * MAX_TITLE_LENGTH


@pytest.mark.parametrize(("raw", "expected"), [(None, None), ("", None), (" \r\n", None)])
def test_a_missing_or_blank_description_is_none(raw: str | None, expected: None) -> None:
    assert draft_description(raw) is expected


def test_a_description_is_kept_as_sent() -> None:
    assert draft_description("  *bold*\r\n") == "  *bold*\r\n"


def test_a_description_of_exactly_the_limit_is_kept_whole() -> None:
    # GitHub's own cap on an issue body: a real issue never loses a character.
    assert draft_description("y" * MAX_DESCRIPTION_LENGTH) == "y" * MAX_DESCRIPTION_LENGTH


def test_a_longer_description_is_cut_to_the_limit_and_says_so() -> None:
    description = draft_description("x" * (MAX_DESCRIPTION_LENGTH + 1))

    assert len(description) == MAX_DESCRIPTION_LENGTH
    assert description.endswith(TRUNCATION_MARKER)
    assert description.startswith("x" * (MAX_DESCRIPTION_LENGTH - len(TRUNCATION_MARKER)))


def test_an_issue_with_a_body_over_the_limit_still_becomes_a_task() -> None:
    # GitHub counts a body's length its own way (its payloads end lines with
    # \r\n): a body over the limit here is cut, never a dead delivery.
    payload = json.loads(fixture("github", "issues__opened"))
    payload["issue"]["body"] = "line\r\n" * 20_000

    draft = github.to_draft("issues.opened", payload)

    assert len(draft.description) == MAX_DESCRIPTION_LENGTH
    assert draft.description.endswith(TRUNCATION_MARKER)


@pytest.mark.parametrize(
    ("raw", "stored"),
    [("a\ud800b", "a\ufffdb"), ("nul\x00here", "nul\ufffdhere"), ("fine 😀", "fine 😀")],
)
def test_titles_and_descriptions_hold_only_storable_text(raw, stored):
    assert draft_title(raw, "PROJ-1") == stored
    assert draft_description(raw) == stored
    stored.encode("utf-8")  # would raise for a lone surrogate


# --- the parts of a stable key and of a move -----------------------------------


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://jira.example.com", "jira.example.com"),
        ("https://Jira.Example.COM/jira/rest/api/2/issue/1", "jira.example.com"),
        ("https://jira.example.com:443/", "jira.example.com"),
        ("http://jira.example.com:80", "jira.example.com"),
        ("http://jira.example.com:443", "jira.example.com:443"),
        ("https://jira.example.com:8443", "jira.example.com:8443"),
        ("https://user:secret@jira.example.com", "jira.example.com"),
        ("http://[::1]:2990/jira", "[::1]:2990"),
    ],
)
def test_url_host_is_the_host_and_any_port_but_the_default(url: str, host: str) -> None:
    assert url_host(url) == host


@pytest.mark.parametrize(
    "url",
    [None, 7, "", "jira.example.com", "ftp://jira.example.com", "https://", "https://h:port/"],
)
def test_url_host_of_what_is_no_http_url_is_none(url: object) -> None:
    assert url_host(url) is None


@pytest.mark.parametrize(("value", "number"), [(1, 1), (10002, 10002), ("10002", 10002)])
def test_positive_id_takes_a_number_or_its_digits(value: object, number: int) -> None:
    assert positive_id(value) == number


@pytest.mark.parametrize(
    "value", [None, 0, -1, True, False, 1.0, "", "0", "-1", "1e3", "١٢", "9" * 21, [1]]
)
def test_positive_id_of_anything_else_is_none(value: object) -> None:
    assert positive_id(value) is None


def test_bounded_key_keeps_what_an_external_id_could_be() -> None:
    assert bounded_key("jira-issue:jira.example.com/10002") == "jira-issue:jira.example.com/10002"
    assert bounded_key("k" * 255) == "k" * 255


@pytest.mark.parametrize("key", ["k" * 256, "a\x00b", " padded", "line\n", ""])
def test_bounded_key_of_what_no_external_id_could_be_is_none(key: str) -> None:
    assert bounded_key(key) is None


def test_moved_name_keeps_an_external_id_or_a_prefix() -> None:
    assert moved_name("gh-issue/acme/widgets#") == "gh-issue/acme/widgets#"


@pytest.mark.parametrize("name", ["jira:A-1\x7f", "x" * 256, " jira:A-1"])
def test_moved_name_refuses_what_no_task_could_hold(name: str) -> None:
    with pytest.raises(UnsupportedPayload, match="the move names"):
        moved_name(name)
