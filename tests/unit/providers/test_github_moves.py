"""GitHub's stable keys and moves (docs/contract.md §15, "Stable keys"),
against recorded payloads from tests/fixtures/github."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from models.external_id import normalize_external_id
from models.names import Move, Name
from models.providers.drafts import UnsupportedPayload
from models.providers.github import GITHUB as github

FIXTURES = Path(__file__).parents[2] / "fixtures" / "github"

#: The two sides of one transfer (tests/fixtures/github/SOURCES.md).
FROM = "gh-issue/octo-org/octo-repo#1"
TO = "gh-issue/Codertocat/Hello-World#1"
HELLO_WORLD_ID = 186853002  # Codertocat/Hello-World's repository.id


@cache
def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_bytes())


def payload(name: str) -> dict[str, Any]:
    return copy.deepcopy(_fixture(name))


def event_of(name: str) -> str | None:
    return github.event_of({"X-GitHub-Event": name.split("__", 1)[0]}, payload(name))


# --- stable keys -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "event", "stable_key"),
    [
        ("issues__opened", "issues.opened", f"gh-issue-in-repo:{HELLO_WORLD_ID}#1"),
        ("issues__reopened", "issues.reopened", f"gh-issue-in-repo:{HELLO_WORLD_ID}#1"),
        ("pull_request__opened", "pull_request.opened", f"gh-pr-in-repo:{HELLO_WORLD_ID}#2"),
        ("issues__opened_via_transfer", "issues.opened", f"gh-issue-in-repo:{HELLO_WORLD_ID}#1"),
    ],
)
def test_a_create_names_the_repository_id_and_the_number(
    name: str, event: str, stable_key: str
) -> None:
    assert event_of(name) == event

    assert github.to_draft(event, payload(name)).stable_key == stable_key


def test_the_stable_key_survives_a_rename_of_the_repository() -> None:
    before = payload("issues__opened")
    after = payload("issues__opened")
    after["repository"]["full_name"] = "Octocoders/Renamed-World"

    old, new = (github.to_draft("issues.opened", body) for body in (before, after))

    assert old.external_id != new.external_id
    assert old.stable_key == new.stable_key == f"gh-issue-in-repo:{HELLO_WORLD_ID}#1"


def test_issues_and_pull_requests_never_share_a_stable_key() -> None:
    issue = payload("issues__opened")
    pull = payload("pull_request__opened")
    pull["number"] = issue["issue"]["number"]

    keys = {
        github.to_draft("issues.opened", issue).stable_key,
        github.to_draft("pull_request.opened", pull).stable_key,
    }

    assert len(keys) == 2


@pytest.mark.parametrize("repository_id", ["absent", None, 0, -5, True, 1.5, "abc", "", [1]])
def test_without_a_repository_id_there_is_no_stable_key(repository_id: object) -> None:
    body = payload("issues__opened")
    if repository_id == "absent":
        del body["repository"]["id"]
    else:
        body["repository"]["id"] = repository_id

    draft = github.to_draft("issues.opened", body)

    assert draft.stable_key is None
    assert draft.external_id == "gh-issue/Codertocat/Hello-World#1"  # the task all the same


# --- a create that a transfer caused -------------------------------------------


def test_an_issue_opened_by_a_transfer_names_where_it_was() -> None:
    draft = github.to_draft("issues.opened", payload("issues__opened_via_transfer"))

    assert draft.external_id == TO
    assert draft.moved_from == (FROM,)


@pytest.mark.parametrize("name", ["issues__opened", "issues__opened_with_organization"])
def test_an_issue_opened_as_new_names_no_earlier_name(name: str) -> None:
    assert github.to_draft("issues.opened", payload(name)).moved_from == ()


@pytest.mark.parametrize("changes", [{"title": {"from": "an older title"}}, [], "x", None])
def test_changes_without_a_transfer_name_no_earlier_name(changes: object) -> None:
    body = payload("issues__opened")
    body["changes"] = changes

    draft = github.to_draft("issues.opened", body)

    assert (draft.moved_from, draft.external_id) == ((), "gh-issue/Codertocat/Hello-World#1")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda changes: changes.pop("old_repository"), "old_repository"),
        (lambda changes: changes.pop("old_issue"), "old_issue"),
        (lambda changes: changes["old_issue"].update(number="1"), "old_issue.number"),
        (lambda changes: changes["old_repository"].update(full_name="no-slash"), "old_repository"),
        (lambda changes: changes.update(old_issue=None), "old_issue"),
    ],
)
def test_a_half_told_transfer_is_unsupported(change, field: str) -> None:
    body = payload("issues__opened_via_transfer")
    change(body["changes"])

    with pytest.raises(UnsupportedPayload, match=f"issues.opened payload .*{field}"):
        github.to_draft("issues.opened", body)


def test_a_create_never_announces_a_move_of_its_own() -> None:
    # The create names where it came from (moved_from); moves() is for the
    # deliveries that create nothing.
    assert "issues.opened" not in github.move_events
    assert github.moves("issues.opened", payload("issues__opened_via_transfer")) == ()


# --- moves -------------------------------------------------------------------


def test_move_events_are_known_events_that_create_nothing() -> None:
    assert github.move_events == {
        "issues.transferred",
        "repository.renamed",
        "repository.transferred",
    }
    assert github.move_events <= github.ignored_events
    assert github.move_events.isdisjoint(github.handled_events)


def test_issues__transferred_moves_the_issue_to_its_new_repository() -> None:
    assert event_of("issues__transferred") == "issues.transferred"

    moves = github.moves("issues.transferred", payload("issues__transferred"))

    assert moves == (Move(Name.external(FROM), Name.external(TO)),)


def test_both_sides_of_a_transfer_name_the_same_move_in_either_order() -> None:
    (move,) = github.moves("issues.transferred", payload("issues__transferred"))
    draft = github.to_draft("issues.opened", payload("issues__opened_via_transfer"))

    assert (move.before.value, move.after.value) == (draft.moved_from[0], draft.external_id)
    # A redelivery of either says the very same again.
    assert github.moves("issues.transferred", payload("issues__transferred")) == (move,)


def test_repository__transferred_moves_every_item_of_the_repository() -> None:
    assert event_of("repository__transferred") == "repository.transferred"

    moves = github.moves("repository.transferred", payload("repository__transferred"))

    assert moves == (
        Move(
            Name.external("gh-issue/octocat/Hello-World#"),
            Name.external("gh-issue/Octocoders/Hello-World#"),
            prefix=True,
        ),
        Move(
            Name.external("gh-pr/octocat/Hello-World#"),
            Name.external("gh-pr/Octocoders/Hello-World#"),
            prefix=True,
        ),
    )


def test_a_repository_transferred_from_an_organization() -> None:
    body = payload("repository__transferred")
    body["changes"]["owner"]["from"] = {"organization": {"login": "octo-org", "id": 6811672}}

    moves = github.moves("repository.transferred", body)

    assert [(m.before.value, m.after.value) for m in moves] == [
        ("gh-issue/octo-org/Hello-World#", "gh-issue/Octocoders/Hello-World#"),
        ("gh-pr/octo-org/Hello-World#", "gh-pr/Octocoders/Hello-World#"),
    ]


def test_the_recorded_rename_names_no_change_a_name_can_show() -> None:
    # octokit's example says it was renamed from the name it has now
    # (tests/fixtures/github/SOURCES.md): no external id changed.
    assert event_of("repository__renamed") == "repository.renamed"

    assert github.moves("repository.renamed", payload("repository__renamed")) == ()


def test_repository__renamed_moves_every_item_of_the_repository() -> None:
    body = payload("repository__renamed")
    body["changes"]["repository"]["name"]["from"] = "Old-World"

    moves = github.moves("repository.renamed", body)

    assert moves == (
        Move(
            Name.external("gh-issue/Octocoders/Old-World#"),
            Name.external("gh-issue/Octocoders/Hello-World#"),
            prefix=True,
        ),
        Move(
            Name.external("gh-pr/Octocoders/Old-World#"),
            Name.external("gh-pr/Octocoders/Hello-World#"),
            prefix=True,
        ),
    )


def test_a_renamed_repositorys_next_create_is_under_the_new_prefix_with_the_same_stable_key():
    renamed = payload("repository__renamed")
    renamed["changes"]["repository"]["name"]["from"] = "Old-World"
    (issues, _) = github.moves("repository.renamed", renamed)
    opened = payload("issues__opened")
    opened["repository"]["full_name"] = renamed["repository"]["full_name"]
    opened["repository"]["id"] = renamed["repository"]["id"]

    draft = github.to_draft("issues.opened", opened)

    assert draft.external_id.startswith(issues.after.value)
    assert draft.stable_key == f"gh-issue-in-repo:{renamed['repository']['id']}#1"


@pytest.mark.parametrize(
    ("event", "name"),
    [
        ("issues.opened", "issues__opened"),
        ("issues.closed", "issues__closed"),
        ("issues.edited", "issues__edited"),
        ("push", "push__new_branch"),
        ("repository.created", "repository__transferred"),
    ],
)
def test_other_events_announce_no_move(event: str, name: str) -> None:
    assert github.moves(event, payload(name)) == ()


@pytest.mark.parametrize(
    ("event", "name", "change"),
    [
        ("issues.transferred", "issues__transferred", lambda body: body.pop("changes")),
        ("issues.transferred", "issues__transferred", lambda body: body.update(changes="x")),
        (
            "issues.transferred",
            "issues__transferred",
            lambda body: body["changes"].pop("new_repository"),
        ),
        (
            "issues.transferred",
            "issues__transferred",
            lambda body: body["changes"]["new_issue"].update(number=0),
        ),
        ("issues.transferred", "issues__transferred", lambda body: body.pop("issue")),
        ("issues.transferred", "issues__transferred", lambda body: body.clear()),
        ("repository.renamed", "repository__renamed", lambda body: body.pop("changes")),
        (
            "repository.renamed",
            "repository__renamed",
            lambda body: body["changes"]["repository"]["name"].update({"from": "a/b"}),
        ),
        (
            "repository.renamed",
            "repository__renamed",
            lambda body: body["changes"]["repository"]["name"].update({"from": 7}),
        ),
        ("repository.renamed", "repository__renamed", lambda body: body.pop("repository")),
        (
            "repository.transferred",
            "repository__transferred",
            lambda body: body["changes"]["owner"].update({"from": {}}),
        ),
        (
            "repository.transferred",
            "repository__transferred",
            lambda body: body["changes"]["owner"]["from"]["user"].pop("login"),
        ),
        ("repository.transferred", "repository__transferred", lambda body: body.pop("changes")),
    ],
)
def test_a_malformed_move_is_unsupported_naming_the_event(event, name, change) -> None:
    body = payload(name)
    change(body)

    with pytest.raises(UnsupportedPayload, match=f"^{event} payload does not have"):
        github.moves(event, body)


def test_a_move_to_a_name_no_task_could_hold_is_unsupported() -> None:
    body = payload("issues__transferred")
    body["changes"]["new_repository"]["full_name"] = "acme/wid\x00gets"

    with pytest.raises(UnsupportedPayload, match="unusable id"):
        github.moves("issues.transferred", body)


@pytest.mark.parametrize(
    ("event", "name"),
    [
        ("issues.transferred", "issues__transferred"),
        ("repository.transferred", "repository__transferred"),
    ],
)
def test_every_name_a_move_gives_is_an_external_id_as_the_store_keeps_it(
    event: str, name: str
) -> None:
    for move in github.moves(event, payload(name)):
        for named in (move.before, move.after):
            assert named.kind == "external"
            assert normalize_external_id(named.value) == named.value
