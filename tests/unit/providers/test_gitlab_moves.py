"""GitLab's stable keys and moves (docs/contract.md §15, "Stable keys"),
against the documented payloads in tests/fixtures/gitlab."""

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
from models.providers.gitlab import GITLAB as gitlab
from tests.support.deliveries import GITLAB_EVENT_OF

FIXTURES = Path(__file__).parents[2] / "fixtures" / "gitlab"
MOVED = "issue_hook__close_moved"
OLD = "gl-issue/gitlabhq/gitlab-test#23"


@cache
def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_bytes())


def payload(name: str) -> dict[str, Any]:
    return copy.deepcopy(_fixture(name))


def event_of(name: str) -> str | None:
    headers = {"X-Gitlab-Event": GITLAB_EVENT_OF[name.split("__", 1)[0]]}
    return gitlab.event_of(headers, payload(name))


def the_issue_it_became() -> dict[str, Any]:
    """The ``Issue Hook.open`` GitLab sends for the issue the moved one became:
    in another project, with a new iid, under the id ``moved_to_id`` named."""
    opened = payload("issue_hook__open")
    opened["project"]["path_with_namespace"] = "gitlabhq/other-project"
    item = opened["object_attributes"]
    item.update(id=302, iid=7, url="http://example.com/gitlabhq/other-project/issues/7")
    return opened


# --- stable keys -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "stable_key"),
    [
        ("issue_hook__open", "gl-issue-id:example.com/301"),
        ("merge_request_hook__open", "gl-mr-id:example.com/99"),
    ],
)
def test_a_create_names_the_items_global_id_on_its_instance(name: str, stable_key: str) -> None:
    event = event_of(name)

    assert gitlab.to_draft(event, payload(name)).stable_key == stable_key


def test_a_confidential_issue_is_an_issue_all_the_same() -> None:
    draft = gitlab.to_draft("Confidential Issue Hook.open", payload("issue_hook__open"))

    assert draft.stable_key == "gl-issue-id:example.com/301"


def test_the_instance_is_the_host_of_the_items_url() -> None:
    body = payload("issue_hook__open")
    body["object_attributes"]["url"] = "https://GitLab.Example.org:8443/group/project/-/issues/23"

    draft = gitlab.to_draft("Issue Hook.open", body)

    assert draft.stable_key == "gl-issue-id:gitlab.example.org:8443/301"


@pytest.mark.parametrize("item_id", ["absent", None, 0, -1, False, "x", 2.5])
def test_without_a_numeric_id_there_is_no_stable_key(item_id: object) -> None:
    body = payload("issue_hook__open")
    if item_id == "absent":
        del body["object_attributes"]["id"]
    else:
        body["object_attributes"]["id"] = item_id

    draft = gitlab.to_draft("Issue Hook.open", body)

    assert draft.stable_key is None
    assert draft.external_id == OLD  # the task all the same


# --- moves -------------------------------------------------------------------


def test_move_events_are_an_issues_close_and_update() -> None:
    assert gitlab.move_events == {
        "Issue Hook.close",
        "Issue Hook.update",
        "Confidential Issue Hook.close",
        "Confidential Issue Hook.update",
    }
    assert gitlab.move_events <= gitlab.ignored_events
    assert gitlab.move_events.isdisjoint(gitlab.handled_events)


def test_a_close_with_moved_to_id_moves_the_issue_to_the_id_it_became() -> None:
    assert event_of(MOVED) == "Issue Hook.close"

    moves = gitlab.moves("Issue Hook.close", payload(MOVED))

    assert moves == (Move(Name.external(OLD), Name.stable("gl-issue-id:example.com/302")),)
    assert normalize_external_id(moves[0].before.value) == OLD


def test_the_open_elsewhere_names_the_stable_key_the_move_named() -> None:
    (move,) = gitlab.moves("Issue Hook.close", payload(MOVED))

    draft = gitlab.to_draft("Issue Hook.open", the_issue_it_became())

    assert draft.external_id == "gl-issue/gitlabhq/other-project#7"
    assert draft.stable_key == move.after.value


@pytest.mark.parametrize("event", ["Issue Hook.update", "Confidential Issue Hook.close"])
def test_an_update_or_a_confidential_close_with_moved_to_id_moves_too(event: str) -> None:
    assert gitlab.moves(event, payload(MOVED)) == gitlab.moves("Issue Hook.close", payload(MOVED))


@pytest.mark.parametrize("moved_to_id", ["absent", None, 0])
def test_a_close_that_names_no_issue_announces_no_move(moved_to_id: object) -> None:
    body = payload(MOVED)
    if moved_to_id == "absent":
        del body["object_attributes"]["moved_to_id"]
    else:
        body["object_attributes"]["moved_to_id"] = moved_to_id

    assert gitlab.moves("Issue Hook.close", body) == ()


def test_a_close_that_names_no_issue_is_not_read_further() -> None:
    body = payload("issue_hook__close")
    del body["project"], body["object_attributes"]["url"], body["object_attributes"]["iid"]

    assert gitlab.moves("Issue Hook.close", body) == ()


def test_a_move_on_an_instance_a_url_cannot_name_is_unsupported() -> None:
    body = payload(MOVED)
    body["object_attributes"]["url"] = "http://example.com:port/diaspora/issues/23"

    with pytest.raises(UnsupportedPayload, match="names no instance"):
        gitlab.moves("Issue Hook.close", body)


@pytest.mark.parametrize(
    ("event", "name"),
    [
        ("Issue Hook.open", MOVED),
        ("Issue Hook.reopen", MOVED),
        ("Merge Request Hook.close", MOVED),
        ("Note Hook.create", "note_hook__issue_create"),
        ("Push Hook", "push_hook__two_commits"),
    ],
)
def test_other_events_announce_no_move(event: str, name: str) -> None:
    assert gitlab.moves(event, payload(name)) == ()


@pytest.mark.parametrize(
    "change",
    [
        lambda body: body["object_attributes"].update(moved_to_id="302"),
        lambda body: body["object_attributes"].update(moved_to_id=-302),
        lambda body: body["object_attributes"].update(moved_to_id=3.5),
        lambda body: body["object_attributes"].update(url="javascript:alert(1)"),
        lambda body: body["object_attributes"].pop("iid"),
        lambda body: body.pop("object_attributes"),
        lambda body: body.pop("project"),
        lambda body: body.update(object_attributes=[]),
    ],
)
def test_a_malformed_move_is_unsupported_naming_the_event(change) -> None:
    body = payload(MOVED)
    change(body)

    with pytest.raises(UnsupportedPayload, match=r"^Issue Hook\.close payload does not have"):
        gitlab.moves("Issue Hook.close", body)
