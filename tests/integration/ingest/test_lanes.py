"""Which lane the ingress sends each delivery down (models.broker.lanes).

A source within its share of the live lane goes live; past it, its flood goes
to the background lane, and the workspace's other sources stay live. An
operator can send a source to the background lane, or pause it: a paused
source's deliveries are stored and answered as ever, and sent nowhere.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import update

from models.broker.lanes import Lane
from models.db import session_scope
from models.tables import WebhookSource, utcnow
from tests.support.deliveries import fixture, jira_headers
from tests.support.ingress import JIRA_SECRET, Ingress, open_ingress, wait_until
from tests.support.stores import Store

BURST = 3


@pytest.fixture
def ingress(store: Store) -> Iterator[Ingress]:
    # A burst of three, and a rate so low that no token comes back in a test.
    yield from open_ingress(store, live_lane_burst=BURST, live_lane_rate=0.001)


def jira_issue(ingress: Ingress, number: int):
    body = fixture("jira", "jira_issue_created__cloud").replace(b"TES-41", b"TES-%d" % number)
    headers = jira_headers(body, JIRA_SECRET, delivery=f"lanes-{number}")
    return ingress.client.post("/webhooks/jira/acme-jira", content=body, headers=headers)


def lanes_of(ingress: Ingress, answers) -> list[Lane]:
    keys = [answer.json()["delivery"] for answer in answers]
    wait_until(lambda: set(keys) <= set(ingress.published))
    return [ingress.published.lanes[key] for key in keys]


def set_source(store: Store, slug: str, **values: object) -> None:
    with session_scope(store.sessions) as session:
        session.execute(update(WebhookSource).where(WebhookSource.slug == slug).values(**values))


def test_a_flood_past_its_burst_goes_background_and_the_other_sources_stay_live(
    ingress: Ingress,
):
    flood = [jira_issue(ingress, number) for number in range(1, 8)]
    assert [answer.status_code for answer in flood] == [202] * 7
    assert lanes_of(ingress, flood) == [Lane.LIVE] * BURST + [Lane.BACKGROUND] * 4

    # The workspace's GitHub source is not flooding: it goes live.
    other = ingress.github("issues__opened")
    assert lanes_of(ingress, [other]) == [Lane.LIVE]

    metrics = ingress.client.get("/metrics").text
    assert 'taskhook_lane_deliveries_total{lane="live"} 4.0' in metrics
    assert 'taskhook_lane_deliveries_total{lane="background"} 4.0' in metrics
    assert "taskhook_flooding_sources 1.0" in metrics


def test_a_source_an_operator_sent_to_the_background_lane_goes_there(
    ingress: Ingress, store: Store
):
    set_source(store, "acme-jira", lane="background")
    assert lanes_of(ingress, [jira_issue(ingress, 1)]) == [Lane.BACKGROUND]
    assert lanes_of(ingress, [ingress.github("issues__opened")]) == [Lane.LIVE]


def test_a_paused_source_is_stored_and_answered_and_sent_nowhere(ingress: Ingress, store: Store):
    set_source(store, "acme-jira", paused_at=utcnow())
    paused = jira_issue(ingress, 1)
    assert paused.status_code == 202
    assert paused.json() == {"delivery": paused.json()["delivery"], "status": "queued"}
    # Sent after it: once it is published, the paused one would have been too.
    live = ingress.github("issues__opened")
    assert lanes_of(ingress, [live]) == [Lane.LIVE]
    assert paused.json()["delivery"] not in ingress.published
    (row,) = [row for row in ingress.deliveries() if row.id == paused.json()["delivery"]]
    assert row.status == "queued"
