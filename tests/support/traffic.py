"""Webhook traffic for the scenarios: real fixture bodies varied per issue, signed,
posted concurrently to a real ingress, every answer and its time kept."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import httpx

from tests.support.deliveries import fixture, github_headers, jira_headers

JIRA_SITE = "https://reliability.atlassian.net"


def numeric_id(key: str) -> str:
    """A positive numeric id of its own for ``key``: a Jira issue's, a GitHub
    repository's. Each is part of an item's stable key (models/names.py), so
    two items built from one fixture must not share it."""
    return str(int(hashlib.sha256(key.encode()).hexdigest()[:12], 16))


def jira_issue_created(key: str, *, timestamp: int | None = None, summary: str | None = None):
    """A real ``jira:issue_created`` body for issue ``key``. Two deliveries for the
    same issue differ in their millisecond ``timestamp``, as Jira's do."""
    payload = json.loads(fixture("jira", "jira_issue_created__cloud"))
    payload["issue"]["key"] = key
    # Its own id too: a Jira issue's id is its stable key (models/names.py).
    payload["issue"]["id"] = numeric_id(key)
    payload["issue"]["fields"]["summary"] = summary or f"Issue {key}"
    payload["timestamp"] = timestamp if timestamp is not None else time.time_ns() // 1000
    return json.dumps(payload).encode()


def github_issue_opened(number: int, *, repository: str = "acme/api") -> bytes:
    payload = json.loads(fixture("github", "issues__opened"))
    payload["issue"]["number"] = number
    payload["issue"]["title"] = f"Issue #{number}"
    payload["issue"]["html_url"] = f"https://github.com/{repository}/issues/{number}"
    payload["repository"]["full_name"] = repository
    return json.dumps(payload).encode()


@dataclass(frozen=True)
class Delivery:
    """One signed delivery, ready to post (and to post again: a redelivery)."""

    path: str
    body: bytes
    headers: dict[str, str]
    delivery_id: str
    external_id: str

    @classmethod
    def jira(cls, source: str, secret: str, key: str, *, delivery_id: str | None = None):
        body = jira_issue_created(key)
        delivery_id = delivery_id or uuid.uuid4().hex
        headers = jira_headers(body, secret, delivery=delivery_id)
        return cls(f"/webhooks/jira/{source}", body, headers, delivery_id, f"jira:{key}")

    @classmethod
    def github(cls, source: str, secret: str, number: int, *, repository: str = "acme/api"):
        body = github_issue_opened(number, repository=repository)
        delivery_id = str(uuid.uuid4())
        headers = github_headers("issues__opened", body, secret, delivery=delivery_id)
        external_id = f"gh-issue/{repository}#{number}"
        return cls(f"/webhooks/github/{source}", body, headers, delivery_id, external_id)


@dataclass
class Answer:
    delivery: Delivery
    status: int  # 0: no HTTP answer at all (connection refused, reset, timed out)
    body: dict
    seconds: float
    sent_at: float  # time.time() when the request went out
    error: str | None = None

    @property
    def accepted(self) -> bool:
        return 200 <= self.status < 300


@dataclass
class Answers:
    answers: list[Answer] = field(default_factory=list)

    def statuses(self) -> Counter:
        return Counter(answer.status for answer in self.answers)

    def results(self) -> Counter:
        """202 answers by their ``status`` field (queued, duplicate, ignored)."""
        return Counter(a.body.get("status") for a in self.answers if a.accepted)

    def accepted(self) -> list[Answer]:
        return [answer for answer in self.answers if answer.accepted]

    def slowest(self) -> float:
        return max((answer.seconds for answer in self.answers), default=0.0)

    def percentile(self, fraction: float) -> float:
        times = sorted(answer.seconds for answer in self.answers)
        if not times:
            return 0.0
        return times[min(len(times) - 1, int(fraction * len(times)))]

    def __len__(self) -> int:
        return len(self.answers)


async def _post(client: httpx.AsyncClient, delivery: Delivery, timeout: float) -> Answer:
    sent_at, started = time.time(), time.perf_counter()
    try:
        response = await client.post(
            delivery.path, content=delivery.body, headers=delivery.headers, timeout=timeout
        )
    except httpx.HTTPError as error:
        elapsed = time.perf_counter() - started
        return Answer(delivery, 0, {}, elapsed, sent_at, f"{type(error).__name__}: {error}")
    elapsed = time.perf_counter() - started
    try:
        body = response.json()
    except ValueError:
        body = {"raw": response.text[:200]}
    return Answer(delivery, response.status_code, body, elapsed, sent_at)


async def _post_all(
    base_url: str,
    deliveries: Sequence[Delivery],
    concurrency: int,
    timeout: float,
    rate: float | None,
) -> Answers:
    answers = Answers()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits) as client:

        async def one(index: int, delivery: Delivery) -> None:
            if rate:
                await asyncio.sleep(index / rate)
            async with gate:
                answers.answers.append(await _post(client, delivery, timeout))

        await asyncio.gather(*(one(index, d) for index, d in enumerate(deliveries)))
    return answers


def post_all(
    base_url: str,
    deliveries: Iterable[Delivery],
    *,
    concurrency: int = 20,
    timeout: float = 30.0,
    rate: float | None = None,
) -> Answers:
    """Post every delivery, ``concurrency`` at a time (or spread at ``rate`` per
    second); every answer comes back, including the ones that never came."""
    return asyncio.run(_post_all(base_url, list(deliveries), concurrency, timeout, rate))


def stream_until(
    base_url: str,
    make: Callable[[int], Delivery],
    *,
    rate: float,
    stop: threading.Event,
    connections: int = 256,
    timeout: float = 30.0,
) -> Answers:
    """Post ``make(0)``, ``make(1)``, ... at a steady ``rate`` per second until
    ``stop`` is set, never waiting for an answer before the next is due, so a
    stalled server shows as slow answers rather than as fewer requests. A wait
    for one of the ``connections`` counts in the answer's time."""
    return asyncio.run(_stream(base_url, make, rate, stop, connections, timeout))


async def _stream(base_url, make, rate, stop, connections, timeout) -> Answers:
    answers = Answers()
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=base_url, limits=limits) as client:

        async def one(delivery: Delivery) -> None:
            answers.answers.append(await _post(client, delivery, timeout))

        pending = []
        started = time.perf_counter()
        index = 0
        while not stop.is_set():
            delay = started + index / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            pending.append(asyncio.create_task(one(make(index))))
            index += 1
        await asyncio.gather(*pending)
    return answers
