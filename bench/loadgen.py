"""The load generator: a process of its own, so its CPU is not the server's.

    python -m bench.loadgen '<json spec>'   ->  one JSON result on stdout

Two modes, both with an aiohttp client over keep-alive connections:

- ``closed``: ``concurrency`` requests in flight, each sent as soon as the
  previous one on its slot answered -- the maximum rate the server sustains;
- ``open``: requests start on a fixed schedule (``rate`` per second) whatever
  the server does, and latency counts from the scheduled start, so a server
  that falls behind shows it in its percentiles (no coordinated omission).

Requests are delivery indexes into :class:`bench.deliveries.DeliveryFactory`;
``order`` (optional) lists them, so a redelivery storm can post the same
index several times. A run stops at ``requests`` or after ``duration``
seconds, whichever comes first, and never runs past ``timeout``. An open run
also stops once the file ``stop_when_exists`` names appears, but not before it
sent ``least_before_stop`` requests (default 1): a load told to last as long
as another must not end before its first request because the other ended
while this process was still starting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter, defaultdict
from typing import Any

import aiohttp

from bench.deliveries import DeliveryFactory


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50/p95/p99/max and mean of ``samples`` (seconds), in milliseconds."""
    if not samples:
        return {"p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "mean_ms": 0.0}
    ordered = sorted(samples)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000

    return {
        "p50_ms": round(at(0.50), 3),
        "p95_ms": round(at(0.95), 3),
        "p99_ms": round(at(0.99), 3),
        "max_ms": round(ordered[-1] * 1000, 3),
        "mean_ms": round(sum(ordered) / len(ordered) * 1000, 3),
    }


class Run:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.base = spec["url"].rstrip("/")
        kinds = {"kinds": tuple(spec["kinds"])} if spec.get("kinds") else {}
        self.factories = [
            DeliveryFactory(
                secret=spec["secret"],
                sources=sources,
                tag=spec["tag"],
                first_number=spec.get("first_number", 1),
                sent_at=spec.get("sent_at"),
                **kinds,
            )
            for sources in spec.get("source_sets") or [spec["sources"]]
        ]
        self.stop_file = spec.get("stop_when_exists")
        self.least_before_stop = spec.get("least_before_stop", 1)
        order = spec.get("order")
        self.order: list[int] = order if order is not None else []
        self.limit = len(self.order) if order is not None else spec.get("requests") or 10**12
        self.next = 0
        self.statuses: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.latencies: list[float] = []
        #: Latency by the answer's "status" field (queued, duplicate, ...).
        self.by_answer: dict[str, list[float]] = defaultdict(list)

    def take(self) -> int | None:
        if self.next >= self.limit:
            return None
        index = self.order[self.next] if self.order else self.next
        self.next += 1
        return index

    async def send(self, session: aiohttp.ClientSession, index: int, started: float) -> None:
        delivery = self.factories[index % len(self.factories)].delivery(index)
        try:
            async with session.post(
                self.base + delivery.path, data=delivery.body, headers=delivery.headers
            ) as response:
                answer = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError) as error:
            self.errors[type(error).__name__] += 1
            return
        elapsed = time.perf_counter() - started
        self.statuses[str(status)] += 1
        if status >= 300:
            self.errors[f"http_{status}"] += 1
            return
        self.latencies.append(elapsed)
        kind = "ok"
        if answer.startswith(b"{") and b'"status"' in answer:
            with contextlib.suppress(ValueError):
                kind = str(json.loads(answer).get("status", "ok"))
        self.by_answer[kind].append(elapsed)

    async def closed(self, session: aiohttp.ClientSession, deadline: float) -> None:
        async def slot() -> None:
            while time.perf_counter() < deadline:
                index = self.take()
                if index is None:
                    return
                await self.send(session, index, time.perf_counter())

        await asyncio.gather(*(slot() for _ in range(self.spec.get("concurrency", 32))))

    async def open(self, session: aiohttp.ClientSession, deadline: float) -> None:
        rate = float(self.spec["rate"])
        cap = self.spec.get("max_in_flight", 2000)
        start = time.perf_counter()
        in_flight: set[asyncio.Task] = set()
        sent = 0
        while True:
            due = start + sent / rate
            if due >= deadline or self._told_to_stop(sent):
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            index = self.take()
            if index is None:
                break
            sent += 1
            if len(in_flight) >= cap:
                self.errors["client_overloaded"] += 1
                continue
            task = asyncio.create_task(self.send(session, index, due))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.wait(in_flight, timeout=max(1.0, deadline + 30 - time.perf_counter()))

    def _told_to_stop(self, sent: int) -> bool:
        if not self.stop_file or sent < self.least_before_stop:
            return False
        return os.path.exists(self.stop_file)

    async def run(self) -> dict[str, Any]:
        spec = self.spec
        mode = spec.get("mode", "closed")
        connections = (
            spec.get("concurrency", 32) if mode == "closed" else spec.get("connections", 256)
        )
        connector = aiohttp.TCPConnector(limit=connections, force_close=False)
        timeout = aiohttp.ClientTimeout(total=spec.get("request_timeout", 30))
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            started = time.perf_counter()
            deadline = started + min(spec.get("duration") or 10**9, spec.get("timeout", 3600))
            await (self.closed if mode == "closed" else self.open)(session, deadline)
            elapsed = time.perf_counter() - started
        completed = len(self.latencies)
        return {
            "mode": mode,
            "rate": spec.get("rate"),
            "concurrency": spec.get("concurrency") if mode == "closed" else None,
            "sent": self.next,
            "completed": completed,
            "elapsed_s": round(elapsed, 3),
            "throughput_rps": round(completed / elapsed, 1) if elapsed else 0.0,
            "errors": sum(self.errors.values()),
            "error_kinds": dict(self.errors),
            "statuses": dict(self.statuses),
            "latency": percentiles(self.latencies),
            "by_answer": {
                kind: {"count": len(samples), **percentiles(samples)}
                for kind, samples in self.by_answer.items()
            },
        }


def main() -> None:
    spec = json.loads(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read())
    try:  # the client's own overhead, kept as low as it goes
        import uvloop

        result = uvloop.run(Run(spec).run())
    except ImportError:
        result = asyncio.run(Run(spec).run())
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
