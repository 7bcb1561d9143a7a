"""The console's lineage, on SQLite and PostgreSQL: a delivery parked before
any task held its external id shows that id and the deliveries that named
it, and a task released from an identity keeps its history."""

from __future__ import annotations

import html
import re

from sqlalchemy import text

from models.db import session_scope
from models.tasks import release_external_id
from tests.support.console import Console

#: What the console's sample delivery (``Console.deliver``) names.
EXTERNAL_ID = "gh-issue/Codertocat/Hello-World#1"
WIP_FULL = "workspace 1: step 'Inbox' is at its WIP limit of 0"


def park(console: Console, delivery: int) -> None:
    """Park the delivery as the worker does when the intake step stays full."""
    with console.store.engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE deliveries SET status = 'needs_operator', status_reason = :why "
                "WHERE id = :d"
            ),
            {"why": WIP_FULL, "d": delivery},
        )


def rows_of(page: str, table: str) -> list[list[str]]:
    """The text of each cell of each body row of table ``id="table"``."""
    body = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', page, re.S).group(1)
    return [
        [
            html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    ]


def test_a_parked_delivery_shows_its_external_id_and_the_deliveries_that_named_it(
    console: Console,
) -> None:
    parked = console.deliver()
    park(console, parked)
    console.deliver(number=2)  # another issue: not in this one's lineage
    console.sign_in("acme-member")

    page = console.client.get(f"/console/deliveries/{parked}").text
    found = console.client.get(
        "/console/tasks", params={"workspace": "acme", "external_id": EXTERNAL_ID}
    ).text

    assert "names no external id" not in page
    assert f"delivery {parked} needs_operator" in page
    for shown in (page, found):
        rows = rows_of(shown, "without-task")
        assert [(row[0], row[1], row[3]) for row in rows] == [
            (str(parked), "console-1", "needs_operator")
        ]
        assert rows[0][4] == WIP_FULL
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", rows[0][2])


def test_a_released_holder_keeps_its_settled_history(console: Console) -> None:
    created = console.client.post(
        "/api/v1/tasks",
        json={"workspace_id": console.acme, "title": "Held", "external_id": "jira:REL-1"},
        headers={"Authorization": f"Bearer {console.tokens['acme-operator']}"},
    )
    assert created.status_code == 200, created.text
    with session_scope(console.store.sessions) as session:
        release_external_id(
            session=session,
            workspace_id=console.acme,
            external_id="jira:REL-1",
            operator="alice",
            reason="moved to another project",
        )
    console.sign_in("acme-member")

    page = console.client.get(
        "/console/tasks", params={"workspace": "acme", "external_id": "jira:REL-1"}
    ).text

    former = re.search(r'<section id="former-holders">(.*?)</section>', page, re.S).group(1)
    assert '<td class="state">settled, then released</td>' in former
    assert "not settled" not in former
    assert "task ACME-1 settled" in page
    assert rows_of(page, "releases")[0][1:3] == ["ACME-1", "alice"]
