"""What the upgrade test needs beyond the reliability harness: a stream of
signed deliveries that goes on while processes come and go behind a load
balancer, where its code comes from, and what no log of either release may say.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.support.processes import worker_environment
from tests.support.traffic import Answer, Answers, Delivery

#: Lines no process of either release may log during an upgrade: a message it
#: could not read, or a task that failed on its arguments or on the schema.
UNREADABLE = re.compile(
    r"Received unregistered task|TypeError|unexpected keyword|Traceback|"
    r"UndefinedColumn|UndefinedTable|ProgrammingError|"
    r"Task \S+\[[^\]]+\] raised unexpected|InvalidTaskError|ContentDisallowed"
)


def unreadable_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if UNREADABLE.search(line)]


def imported_from(root: Path, database_url: str, broker_url: str) -> dict[str, str]:
    """Where a process started as the Stack starts one from ``root`` finds
    taskhook's packages: a checkout's virtualenv has this checkout installed
    (editable), which must not win over ``root``."""
    code = (
        "import importlib.util, json, ingest, migrations, models, worker; "
        "print(json.dumps({m.__name__: m.__file__ for m in (ingest, migrations, models, worker)}"
        " | {'models.broker.versions': bool(importlib.util.find_spec('models.broker.versions'))}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env=worker_environment(database_url, broker_url, PYTHONPATH=str(root)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class DeliveryStream:
    """Signed deliveries posted at ``rate`` a second, by a few senders, to the
    ingresses in rotation (``route_to``) -- a load balancer in front of them.

    An answer that is not 2xx is posted again, the same delivery, after a
    short pause, as GitHub and Jira redeliver: what counts is that every
    delivery is answered 2xx in the end, and what each answer promised.
    """

    def __init__(self, make: Callable[[int], Delivery], *, rate: float, senders: int = 4) -> None:
        self._make, self._rate, self._senders = make, rate, senders
        self._urls: list[str] = []
        self._turn = itertools.count()
        self._next = itertools.count()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.answers = Answers()
        #: Which ingress gave each final answer.
        self.answered_by: list[tuple[str, Answer]] = []
        #: Answers that were not 2xx before a repost: (url, status, error).
        self.refused: list[tuple[str, int, str | None]] = []

    def route_to(self, *urls: str) -> None:
        with self._lock:
            self._urls = list(urls)

    def _url(self) -> str:
        with self._lock:
            return self._urls[next(self._turn) % len(self._urls)]

    def start(self) -> DeliveryStream:
        self._started = time.monotonic()
        for number in range(self._senders):
            thread = threading.Thread(target=self._send, name=f"stream-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> Answers:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=60)
        return self.answers

    def _send(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stopping.is_set():
                index = next(self._next)
                due = self._started + index / self._rate
                if (wait := due - time.monotonic()) > 0 and self._stopping.wait(wait):
                    return
                delivery = self._make(index)
                url, answer = self._post_until_accepted(client, delivery)
                with self._lock:
                    self.answers.answers.append(answer)
                    self.answered_by.append((url, answer))

    def _post_until_accepted(self, client: httpx.Client, delivery: Delivery) -> tuple[str, Answer]:
        for _ in range(20):  # bounded: about 10 s of redeliveries
            url = self._url()
            sent_at, started = time.time(), time.perf_counter()
            try:
                response = client.post(
                    url + delivery.path, content=delivery.body, headers=delivery.headers
                )
                status, error = response.status_code, None
            except httpx.HTTPError as problem:
                response, status, error = None, 0, f"{type(problem).__name__}: {problem}"
            seconds = time.perf_counter() - started
            if 200 <= status < 300:
                return url, Answer(delivery, status, response.json(), seconds, sent_at)
            with self._lock:
                self.refused.append((url, status, error))
            time.sleep(0.5)
        return url, Answer(delivery, status, {}, seconds, sent_at, error)
