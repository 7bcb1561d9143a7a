"""``GET /console/deliveries/live`` on SQLite and PostgreSQL: the console's
delivery stream, on the task event stream's loop (``ingest.events.sse_stream``)
over a source that polls -- new deliveries in order after the page's newest,
watched ones as their status changes, nothing of another workspace's."""

from __future__ import annotations

import json

from tests.support.console import Console


def deliveries_seen(console: Console, query: str) -> list[dict]:
    answer = console.client.get(f"/console/deliveries/live?{query}&timeout=0.5")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.text.startswith("retry: 1000\n\n")
    return [
        json.loads(line.removeprefix("data: "))
        for line in answer.text.splitlines()
        if line.startswith("data: ")
    ]


def test_the_live_stream_sends_new_deliveries_in_order_once_and_a_watched_one_as_it_changes(
    console: Console,
):
    console.sign_in("acme-operator")
    first, second = console.deliver(number=1), console.deliver(number=2)
    seen = deliveries_seen(console, "after=0")
    assert [event["id"] for event in seen] == [first, second]
    assert [event["id"] for event in deliveries_seen(console, f"after={first}")] == [second]
    status = console.status_of(second)
    # Watched and unchanged since it was told: said once (its status now), then nothing.
    assert deliveries_seen(console, f"after={second}&watch={second}") == [
        {"id": second, "status": status}
    ]
    console.kill(second)
    assert deliveries_seen(console, f"after={second}&watch={second}") == [
        {"id": second, "status": "dead"}
    ]


def test_the_live_stream_shows_nothing_of_another_workspace(console: Console):
    console.sign_in("acme-operator")
    acme = console.deliver(number=3)
    console.sign_in("globex-operator")
    assert deliveries_seen(console, f"after=0&watch={acme}") == []
