"""Jira's stable keys and moves (docs/contract.md §15, "Stable keys"),
against recorded payloads from tests/fixtures/jira."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from models.names import Move, Name
from models.providers.drafts import UnsupportedPayload
from models.providers.jira import JIRA as jira

FIXTURES = Path(__file__).parents[2] / "fixtures" / "jira"
MOVED = "jira_issue_updated__cloud_issue_moved"


@cache
def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_bytes())


def payload(name: str) -> dict[str, Any]:
    return copy.deepcopy(_fixture(name))


def key_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in body["changelog"]["items"] if item["field"] == "Key"]


# --- stable keys -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "stable_key"),
    [
        ("jira_issue_created__cloud", "jira-issue:some-instance-test.atlassian.net/10040"),
        ("jira_issue_created__cloud_many_fields", "jira-issue:mmtest.atlassian.net/10509"),
        # A Server site with a context path (/jira) and a port: the host keeps the port.
        ("jira_issue_created__server_trigger_plugin", "jira-issue:localhost:2990/10003"),
    ],
)
def test_without_a_site_the_host_comes_from_issue_self(name: str, stable_key: str) -> None:
    assert jira.to_draft("jira:issue_created", payload(name)).stable_key == stable_key


@pytest.mark.parametrize(
    "site",
    [
        "https://jira.example.com",
        "https://jira.example.com/",
        "https://Jira.Example.COM:443/jira",
        "https://jira.example.com/some/context/",
    ],
)
def test_with_a_site_the_host_is_the_sites_however_spelt(site: str) -> None:
    draft = jira.to_draft("jira:issue_created", payload("jira_issue_created__cloud"), site=site)

    assert draft.stable_key == "jira-issue:jira.example.com/10040"


def test_a_sites_own_port_is_part_of_its_host() -> None:
    draft = jira.to_draft(
        "jira:issue_created",
        payload("jira_issue_created__cloud"),
        site="http://jira.example.com:8080",
    )

    assert draft.stable_key == "jira-issue:jira.example.com:8080/10040"


@pytest.mark.parametrize("issue_id", ["absent", None, "", "abc", "-3", "0", 0, True, 1.5, {}])
def test_without_a_numeric_issue_id_there_is_no_stable_key(issue_id: object) -> None:
    body = payload("jira_issue_created__cloud")
    if issue_id == "absent":
        del body["issue"]["id"]
    else:
        body["issue"]["id"] = issue_id

    draft = jira.to_draft("jira:issue_created", body)

    assert draft.stable_key is None
    assert draft.external_id == "jira:TES-41"  # the task all the same


def test_an_issue_moved_to_another_project_keeps_its_stable_key() -> None:
    # The create as Jira sent it before the move, under the old key, and a
    # search's create after it, under the new: one issue.id, one stable key.
    moved = payload(MOVED)
    before = {"webhookEvent": "jira:issue_created", "issue": copy.deepcopy(moved["issue"])}
    before["issue"]["key"] = "TCP-2"
    after = {"webhookEvent": "jira:issue_created", "issue": moved["issue"]}

    old, new = (jira.to_draft("jira:issue_created", body) for body in (before, after))

    assert (old.external_id, new.external_id) == ("jira:TCP-2", "jira:INDEV-130")
    assert old.stable_key == new.stable_key == "jira-issue:jira.test-example.ru/12490"


# --- moves -------------------------------------------------------------------


def test_the_move_event_is_a_known_event_that_creates_nothing() -> None:
    assert jira.move_events == {"jira:issue_updated"}
    assert jira.move_events <= jira.ignored_events
    assert jira.move_events.isdisjoint(jira.handled_events)


def test_a_key_change_moves_the_old_key_to_the_new() -> None:
    assert jira.event_of({}, payload(MOVED)) == "jira:issue_updated"

    moves = jira.moves("jira:issue_updated", payload(MOVED))

    assert moves == (Move(Name.external("jira:TCP-2"), Name.external("jira:INDEV-130")),)


def test_the_site_plays_no_part_in_a_move() -> None:
    assert jira.moves("jira:issue_updated", payload(MOVED), "https://jira.example.com") == (
        jira.moves("jira:issue_updated", payload(MOVED))
    )


@pytest.mark.parametrize(
    "name",
    [
        "jira_issue_updated__cloud_assigned",
        "jira_issue_updated__cloud_description_edited",
        "jira_issue_updated__cloud_resolved",
        "jira_issue_updated__server_commented",
        "jira_issue_updated__server_status_trigger_plugin",
    ],
)
def test_any_other_update_announces_no_move(name: str) -> None:
    assert jira.moves("jira:issue_updated", payload(name)) == ()


@pytest.mark.parametrize(
    ("event", "name"),
    [
        ("jira:issue_created", "jira_issue_created__cloud"),
        ("jira:issue_deleted", "jira_issue_deleted__cloud"),
        ("comment_created", "comment_created__cloud"),
        # Only an update announces a move, whatever another event's body holds.
        ("jira:issue_deleted", MOVED),
    ],
)
def test_other_events_announce_no_move(event: str, name: str) -> None:
    assert jira.moves(event, payload(name)) == ()


@pytest.mark.parametrize("changelog", ["absent", None, {}, {"items": []}])
def test_an_update_without_changelog_items_announces_no_move(changelog: object) -> None:
    body = payload(MOVED)
    if changelog == "absent":
        del body["changelog"]
    else:
        body["changelog"] = changelog

    assert jira.moves("jira:issue_updated", body) == ()


def test_a_custom_field_called_key_is_not_the_issue_key() -> None:
    body = payload(MOVED)
    (item,) = key_items(body)
    item["fieldtype"] = "custom"

    assert jira.moves("jira:issue_updated", body) == ()


@pytest.mark.parametrize(
    ("side", "value"),
    [
        ("fromString", None),
        ("toString", None),
        ("toString", ""),
        ("toString", "INDEV 130"),
        ("fromString", "TCP-2\n"),
        ("toString", 130),
    ],
)
def test_a_key_change_without_two_keys_is_unsupported(side: str, value: object) -> None:
    body = payload(MOVED)
    (item,) = key_items(body)
    item[side] = value

    with pytest.raises(UnsupportedPayload, match=r"^jira:issue_updated payload"):
        jira.moves("jira:issue_updated", body)


@pytest.mark.parametrize(
    "change",
    [
        lambda body: body.update(changelog="moved"),
        lambda body: body["changelog"].update(items={"field": "Key"}),
        lambda body: body["changelog"]["items"].append("Key"),
        lambda body: key_items(body)[0].update(field=["Key"]),
    ],
)
def test_a_malformed_changelog_is_unsupported(change) -> None:
    body = payload(MOVED)
    change(body)

    with pytest.raises(UnsupportedPayload, match=r"^jira:issue_updated payload does not have"):
        jira.moves("jira:issue_updated", body)
