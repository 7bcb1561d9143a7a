"""``python -m bench streams``: what open SSE event streams cost the ingress.

One ingress process on PostgreSQL, and a stream holder -- a process of its
own, so its CPU is not the ingress's -- that keeps ``streams_open`` event
streams open on it (aiohttp, reconnecting with ``Last-Event-ID`` when a
stream's lifetime ends). Two measures:

- throughput: closed-loop webhooks with no stream open and with all of them
  open and idle (no worker runs, so no event is appended), in rounds whose
  order alternates; the ratio is taken per round and the median reported,
  with the ingress's CPU per webhook each way, and its CPU per second while
  nothing but the streams is there;
- latency: with every stream open and a worker running, webhooks at a fixed
  rate; each task's ``task.created`` is timed from its settlement (the
  event's ``occurred_at``, stamped just before the settlement commits) to its
  arrival on each stream. Every stream must see every event, exactly once.

The holder runs as ``python -m bench.streams '<json spec>'``: it prints
``open`` once every stream is open, and its result as one JSON line when its
stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from typing import Any

import aiohttp
import psycopg
import redis
from sqlalchemy import select

from bench import report, taskhook
from bench.loadgen import percentiles
from bench.processes import (
    BenchError,
    Process,
    libpq_url,
    python_module,
    throwaway_database,
    wait_until,
)
from models.db import make_engine, make_session_factory, session_scope
from models.tables import Workspace
from models.tokens import issue_token

#: A stream's lifetime as the holder asks for it (the most the API allows).
STREAM_SECONDS = 300
#: How long the holder may take to open every stream.
OPEN_TIMEOUT = 120.0


def streams(bench) -> dict[str, Any]:
    """The benchmark: see the module's docstring."""
    sizes, procs = bench.sizes, bench.processes
    count = sizes.streams_open
    redis_url = procs.redis()
    with throwaway_database() as database:
        taskhook.prepare(database)
        workspace, token = _reader(database)
        env = taskhook.environment(
            database,
            redis_url,
            TASKHOOK_MAX_EVENT_STREAMS=str(count + 10),
            TASKHOOK_MAX_EVENT_STREAMS_PER_TOKEN=str(count + 10),
            TASKHOOK_STREAM_LISTENER=str(bool(sizes.streams_listener)).lower(),
        )
        ingress, url = procs.uvicorn("taskhook", "ingest.app:app", env)
        bench.load(url, tag=f"warm-{uuid.uuid4().hex[:6]}", duration=1.0, concurrency=8)
        holder_spec = {"url": url, "workspace": workspace, "token": token, "streams": count}

        def reset() -> None:
            with contextlib.suppress(Exception):
                _flush(redis_url)
            taskhook.reset(database)

        rounds = []
        for round_ in range(sizes.streams_rounds):
            with_first = round_ % 2 == 1
            pair: dict[str, dict] = {}
            for open_ in (True, False) if with_first else (False, True):
                reset()
                holder = _Holder(bench, {**holder_spec, "after": _position(database, workspace)})
                if open_:
                    holder.start()
                    _settled(ingress)
                try:
                    pair["with" if open_ else "without"] = _throughput(bench, ingress, url)
                finally:
                    if open_:
                        held = holder.stop()
                        if held["opened"] < count:
                            raise BenchError(f"only {held['opened']} of {count} streams opened")
            ratio = report.ratio(pair["with"]["throughput_rps"], pair["without"]["throughput_rps"])
            bench.say(
                f"  round {round_}: {pair['without']['throughput_rps']}/s without streams,"
                f" {pair['with']['throughput_rps']}/s with {count}: {ratio}x;"
                f" ingress CPU ms per webhook {pair['without']['cpu_ms_per_webhook']}"
                f" -> {pair['with']['cpu_ms_per_webhook']}"
            )
            rounds.append({**pair, "ratio": ratio})
        idle = _idle_cost(bench, ingress, holder_spec, database, workspace)
        reset()
        latency = _latency(bench, ingress, env, url, holder_spec, database, workspace)
    return _report(bench, rounds, idle, latency)


def _reader(database: str) -> tuple[int, str]:
    """The bench workspace's id, and a token that may read its events."""
    engine = make_engine(database)
    try:
        with session_scope(make_session_factory(engine)) as session:
            workspace = session.scalar(select(Workspace.id).where(Workspace.slug == "bench"))
            token = issue_token(
                session=session, name="bench-streams", role="member", workspace_ids=[workspace]
            ).token
    finally:
        engine.dispose()
    return workspace, token


def _position(database: str, workspace: int) -> int:
    """The workspace's last event position: streams open after it, so they
    never replay what earlier rounds appended."""
    with psycopg.connect(libpq_url(database)) as connection:
        found = connection.execute(
            "SELECT last_position FROM event_streams WHERE workspace_id = %s", (workspace,)
        ).fetchone()
    return found[0] if found else 0


def _flush(redis_url: str) -> None:
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        client.flushdb()


def _throughput(bench, ingress: Process, url: str) -> dict[str, Any]:
    """One closed-loop run, and the ingress's CPU per webhook answered."""
    sizes = bench.sizes
    cpu_before = ingress.cpu_seconds()
    run = bench.load(
        url,
        tag=f"streams-{uuid.uuid4().hex[:8]}",
        duration=sizes.streams_seconds,
        concurrency=sizes.concurrency,
    )
    cpu = ingress.cpu_seconds() - cpu_before
    if run["errors"]:
        raise BenchError(f"the load saw errors: {run['error_kinds']}")
    return {
        "throughput_rps": run["throughput_rps"],
        "completed": run["completed"],
        "latency": run["latency"],
        "cpu_ms_per_webhook": round(1000 * cpu / max(run["completed"], 1), 4),
    }


def _settled(ingress: Process, *, timeout: float = 30.0) -> None:
    """Until the ingress is done with the streams' opening (their first reads):
    under a tenth of a core over half a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = ingress.cpu_seconds()
        time.sleep(0.5)
        if ingress.cpu_seconds() - before < 0.05:
            return


def _idle_cost(bench, ingress: Process, spec: dict, database: str, workspace: int) -> dict:
    """The ingress's CPU per second with nothing to do, without and with the streams."""
    seconds = bench.sizes.streams_seconds

    def cpu_per_second() -> float:
        before = ingress.cpu_seconds()
        time.sleep(seconds)
        return round(1000 * (ingress.cpu_seconds() - before) / seconds, 3)

    without = cpu_per_second()
    holder = _Holder(bench, {**spec, "after": _position(database, workspace)})
    holder.start()
    _settled(ingress)
    try:
        with_streams = cpu_per_second()
    finally:
        holder.stop()
    per_stream = (with_streams - without) / spec["streams"]
    bench.say(
        f"  idle ingress: {without} CPU ms/s without streams, {with_streams} with"
        f" {spec['streams']} ({per_stream * 1000:.2f} CPU us/s per stream)"
    )
    return {
        "cpu_ms_per_s_without": without,
        "cpu_ms_per_s_with": with_streams,
        "cpu_us_per_s_per_stream": round(per_stream * 1000, 3),
    }


def _latency(
    bench,
    ingress: Process,
    env: dict[str, str],
    url: str,
    spec: dict,
    database: str,
    workspace: int,
) -> dict[str, Any]:
    """Webhooks at ``streams_latency_rate`` with every stream open and a
    worker running; the holder's timings of every task.created on every stream."""
    sizes, procs = bench.sizes, bench.processes
    n = sizes.streams_latency_deliveries
    holder = _Holder(bench, {**spec, "after": _position(database, workspace), "expect": n})
    holder.start()
    _settled(ingress)
    worker = procs.celery_worker("taskhook-worker", "worker", env)
    cpu_before = ingress.cpu_seconds()
    try:
        posted = bench.load(
            url,
            tag=f"latency-{uuid.uuid4().hex[:8]}",
            mode="open",
            rate=sizes.streams_latency_rate,
            requests=n,
            request_timeout=10,
        )
        with psycopg.connect(libpq_url(database), autocommit=True) as connection:
            wait_until(
                lambda: taskhook.finished_count(connection) >= n,
                timeout=600,
                what="every delivery to finish",
                every=0.2,
            )
        holder.wait_for_all(timeout=60)
        cpu = ingress.cpu_seconds() - cpu_before
    finally:
        held = holder.stop()
        procs.stop(worker)
    counts = taskhook.outcome_counts(database)
    summary = percentiles(held["latencies_s"])
    bench.say(
        f"  latency with {spec['streams']} streams: p50 {summary['p50_ms']} ms,"
        f" p95 {summary['p95_ms']} ms, p99 {summary['p99_ms']} ms"
        f" over {len(held['latencies_s'])} arrivals; first stream p50"
        f" {percentiles(held['first_arrivals_s'])['p50_ms']} ms, first-to-last spread p50"
        f" {percentiles(held['spreads_s'])['p50_ms']} ms;"
        f" ingress {1e6 * cpu / max(len(held['latencies_s']), 1):.1f} CPU us per arrival,"
        f" holder {held['cpu_s']} CPU s"
    )
    return {
        "deliveries": n,
        "rate_per_s": sizes.streams_latency_rate,
        "ingress_post": {key: posted[key] for key in ("throughput_rps", "completed", "errors")},
        "tasks_settled": counts["tasks_settled"],
        "arrivals": len(held["latencies_s"]),
        "events_per_stream": held["events_per_stream"],
        "duplicates": held["duplicates"],
        "reconnects": held["reconnects"],
        "latency": summary,
        # Settlement to the first stream: the notification's path; first to
        # last stream: the fan-out.
        "first_stream_latency": percentiles(held["first_arrivals_s"]),
        "fan_out_spread": percentiles(held["spreads_s"]),
        # The whole phase's: the webhooks taken, the relay, and every frame sent.
        "ingress_cpu_us_per_arrival": round(1e6 * cpu / max(len(held["latencies_s"]), 1), 2),
        "holder_cpu_s": held["cpu_s"],
    }


def _report(bench, rounds: list[dict], idle: dict, latency: dict) -> dict[str, Any]:
    sizes = bench.sizes
    ratio = report.median([one["ratio"] for one in rounds])
    count = sizes.streams_open

    def median_of(side: str, key: str) -> float:
        return report.median([one[side][key] for one in rounds])

    rows = [
        {
            "label": "no stream open",
            "rate": median_of("without", "throughput_rps"),
            "low": min(one["without"]["throughput_rps"] for one in rounds),
            "high": max(one["without"]["throughput_rps"] for one in rounds),
        },
        {
            "label": f"{count} streams open",
            "rate": median_of("with", "throughput_rps"),
            "low": min(one["with"]["throughput_rps"] for one in rounds),
            "high": max(one["with"]["throughput_rps"] for one in rounds),
        },
    ]
    exact = (
        latency["tasks_settled"] == latency["deliveries"]
        and latency["arrivals"] == latency["deliveries"] * count
        and latency["duplicates"] == 0
    )
    result = {
        "streams": count,
        "woken_by": "LISTEN/NOTIFY" if sizes.streams_listener else "polling",
        "rounds": rounds,
        "throughput_ratio": ratio,
        "cpu_ms_per_webhook": {
            "without": median_of("without", "cpu_ms_per_webhook"),
            "with": median_of("with", "cpu_ms_per_webhook"),
        },
        "idle": idle,
        "latency": latency,
        "exact": exact,
        "goals": {
            f"throughput with {count} streams >= 0.9x none": ratio >= 0.9,
            "event latency p99 < 100 ms": latency["latency"]["p99_ms"] < 100,
            "every stream saw every event once": exact,
        },
    }
    return bench.finish(
        result,
        rows,
        f"Ingress throughput with {count} idle SSE streams open, and without",
        rate_label="webhooks per s",
    )


class _Holder:
    """The stream-holding process: started, waited on until every stream is
    open, stopped by closing its stdin (then by pid)."""

    def __init__(self, bench, spec: dict) -> None:
        self.bench, self.spec = bench, spec
        self.popen: subprocess.Popen | None = None
        self.log = bench.logs / f"holder-{uuid.uuid4().hex[:6]}.log"
        self._said = b""  # what the holder printed, read so far

    def _wait_for(self, word: bytes, deadline: float) -> bool:
        """Until the holder prints a line starting with ``word``; False if it
        exits or ``deadline`` passes first."""
        output = self.popen.stdout.fileno()
        # A selector, not select.select, which refuses descriptors numbered
        # 1024 or more (a long test session can hold that many).
        with selectors.DefaultSelector() as watch:
            watch.register(output, selectors.EVENT_READ)
            while not any(line.startswith(word) for line in self._said.splitlines()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if watch.select(min(remaining, 1.0)):
                    chunk = os.read(output, 65536)
                    if not chunk:
                        return False
                    self._said += chunk
        return True

    def start(self) -> None:
        with self.log.open("wb") as errors:
            self.popen = python_module("bench.streams", json.dumps(self.spec), stderr=errors)
        if not self._wait_for(b"open", time.monotonic() + OPEN_TIMEOUT):
            self._kill()
            raise BenchError(f"the stream holder did not open: {self.log.read_text()[-2000:]}")

    def wait_for_all(self, timeout: float) -> None:
        """Until the holder says every stream saw every expected event, or
        ``timeout``: then :meth:`stop` reports what arrived, and the counts
        show what did not."""
        self._wait_for(b"complete", time.monotonic() + timeout)

    def stop(self) -> dict[str, Any]:
        assert self.popen is not None
        try:
            out, _ = self.popen.communicate(b"", timeout=60)
        except subprocess.TimeoutExpired:
            self._kill()
            raise BenchError("the stream holder did not stop") from None
        if self.popen.returncode != 0:
            raise BenchError(f"the stream holder failed: {self.log.read_text()[-2000:]}")
        return json.loads((self._said + out).splitlines()[-1])

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


# --- the holder process -------------------------------------------------------------------


class _Held:
    """The holder's streams and what arrived on them."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        #: Streams that opened (each counted once, reconnects not again).
        self.open = 0
        self.latencies: list[float] = []
        self.seen: list[set[int]] = [set() for _ in range(spec["streams"])]
        self.duplicates = 0
        self.reconnects = 0
        #: Per event: its latency on the first stream it reached, and on the last.
        self.by_event: dict[int, tuple[float, float]] = {}
        self.all_open = asyncio.Event()
        self.expect = spec.get("expect")
        self.complete = asyncio.Event()

    async def hold(self, session: aiohttp.ClientSession, index: int) -> None:
        url = f"{self.spec['url']}/api/v1/workspaces/{self.spec['workspace']}/events"
        cursor = self.spec["after"]
        headers = {"Authorization": f"Bearer {self.spec['token']}", "Accept": "text/event-stream"}
        counted = False
        while True:
            try:
                async with session.get(
                    url,
                    params={"timeout": STREAM_SECONDS},
                    headers={**headers, "Last-Event-ID": str(cursor)},
                ) as response:
                    if response.status != 200:  # the setup is wrong: no point waiting
                        print(f"stream {index}: HTTP {response.status}", file=sys.stderr)
                        os._exit(3)
                    pending = b""
                    # Timed per chunk read, not per line: the client's own
                    # parsing is not the server's latency.
                    async for chunk in response.content.iter_any():
                        arrived = time.time()
                        *lines, pending = (pending + chunk).split(b"\n")
                        for line in lines:
                            if line.startswith(b"data: "):
                                event = json.loads(line[6:])
                                cursor = event["id"]
                                self._arrived(index, event, arrived)
                            elif not counted and line.startswith(b"retry:"):
                                counted = True
                                self.open += 1
                                if self.open == self.spec["streams"]:
                                    self.all_open.set()
            except (TimeoutError, aiohttp.ClientError):
                pass
            self.reconnects += 1
            await asyncio.sleep(0.05)

    def _arrived(self, index: int, event: dict, arrived: float) -> None:
        if event["id"] in self.seen[index]:
            self.duplicates += 1
            return
        self.seen[index].add(event["id"])
        if event["type"] == "task.created":
            occurred = datetime.fromisoformat(event["occurred_at"]).timestamp()
            latency = max(arrived - occurred, 0.0)
            self.latencies.append(latency)
            first, last = self.by_event.get(event["id"], (latency, latency))
            self.by_event[event["id"]] = (min(first, latency), max(last, latency))
        if self.expect and len(self.latencies) >= self.expect * self.spec["streams"]:
            self.complete.set()

    async def run(self) -> dict[str, Any]:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        loop = asyncio.get_running_loop()
        stdin_closed = asyncio.Event()
        loop.add_reader(sys.stdin.fileno(), lambda: _drain_stdin(stdin_closed))
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            holders = [
                asyncio.create_task(self.hold(session, index))
                for index in range(self.spec["streams"])
            ]
            await self.all_open.wait()
            print("open", flush=True)
            if self.expect:
                waiter = asyncio.create_task(self.complete.wait())
                closed = asyncio.create_task(stdin_closed.wait())
                await asyncio.wait({waiter, closed}, return_when=asyncio.FIRST_COMPLETED)
                if self.complete.is_set():
                    print("complete", flush=True)
            await stdin_closed.wait()
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
        return {
            "opened": self.open,
            "latencies_s": self.latencies,
            "first_arrivals_s": [first for first, _ in self.by_event.values()],
            "spreads_s": [last - first for first, last in self.by_event.values()],
            "events_per_stream": sorted({len(seen) for seen in self.seen}),
            "duplicates": self.duplicates,
            "reconnects": self.reconnects,
            "cpu_s": round(time.process_time(), 3),
        }


def _drain_stdin(closed: asyncio.Event) -> None:
    if not os.read(sys.stdin.fileno(), 4096):
        asyncio.get_running_loop().remove_reader(sys.stdin.fileno())
        closed.set()


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:  # the client's own overhead, kept as low as it goes
        import uvloop

        result = uvloop.run(_Held(spec).run())
    except ImportError:
        result = asyncio.run(_Held(spec).run())
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
