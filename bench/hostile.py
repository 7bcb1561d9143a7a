"""``python -m bench.hostile``: signed GitHub deliveries while two connections
send 96 MiB headers (docs/reliability.md, "Hostile input: header size and slow
senders").

Against plain ``uvicorn ingest.app:app`` (before the bound) and ``python -m
ingest.server`` (after), each on a throwaway PostgreSQL database and a private
Redis: 10 deliveries a second for PHASE s each, first idle, then while two
attacker processes each send one request whose one header is 96 MiB (the
attack of issue 15), then while they send such requests again and again.
Prints the deliveries' latency in each phase (p50, p99, max, how many took
longer than GitHub's 10 s, how many were not a 202), and what the attack cost
the ingress in CPU. Not part of ``python -m bench all``: it measures a
defence, not a speed.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import socket
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import httpx

from bench import taskhook
from bench.deliveries import DeliveryFactory
from bench.processes import Process, Processes, free_port, throwaway_database, wait_until

RATE, PHASE = 10, 20.0
#: (first delivery index, name, attackers: None for none, else whether they repeat)
PHASES = ((1000, "idle", None), (2000, "one header each", False), (3000, "again and again", True))
MiB = 1024 * 1024
HEADER_MIB = 96
LOGS = Path(__file__).resolve().parents[1] / "var" / "bench" / "hostile"
SERVERS = {
    "before": ["-m", "uvicorn", "ingest.app:app"],
    "after": ["-m", "ingest.server"],
}


def attacker(port: int, attempts: Synchronized, again: bool) -> None:
    """Send a request with a 96 MiB header as fast as the socket takes it;
    ``again`` and again."""
    chunk = b"j" * MiB
    while True:
        with attempts.get_lock():
            attempts.value += 1
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", port), timeout=120) as sock,
        ):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: bench\r\nX-Junk: ")
            for _ in range(HEADER_MIB):
                sock.sendall(chunk)
            sock.sendall(b"\r\n\r\n")
            sock.recv(65536)  # the answer, or the close
        if not again:
            return


def deliver(url: str, factory: DeliveryFactory, first: int, seconds: float) -> list[tuple]:
    """Post RATE deliveries a second for ``seconds`` (whatever the answers
    take); the status and latency of each."""

    def post(index: int) -> tuple[int, float]:
        delivery = factory.delivery(index)
        started = time.monotonic()
        response = httpx.post(
            url + delivery.path, content=delivery.body, headers=delivery.headers, timeout=120
        )
        return response.status_code, time.monotonic() - started

    count = int(seconds * RATE)
    with ThreadPoolExecutor(max_workers=64) as pool:
        started, futures = time.monotonic(), []
        for index in range(first, first + count):
            time.sleep(max(0.0, started + (index - first) / RATE - time.monotonic()))
            futures.append(pool.submit(post, index))
        return [future.result() for future in futures]


def summary(answers: list[tuple[int, float]]) -> str:
    latencies = [latency for _, latency in answers]
    p99 = statistics.quantiles(latencies, n=100, method="inclusive")[98]
    late = sum(latency > 10 for latency in latencies)
    refused = sum(status != 202 for status, _ in answers)
    return (
        f"n={len(latencies)} p50 {statistics.median(latencies) * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms, "
        f"over 10 s: {late}, not 202: {refused}"
    )


def measure(procs: Processes, name: str, module: list[str], redis_url: str) -> None:
    with throwaway_database() as database:
        taskhook.prepare(database)
        port = free_port()
        args = [sys.executable, *module, "--host", "127.0.0.1", "--port", str(port)]
        ingress: Process = procs.start(
            "ingress", [*args, "--no-access-log"], taskhook.environment(database, redis_url)
        )
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            ingress.check_alive()
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            return False

        wait_until(healthy, timeout=60, what=name)
        factory = DeliveryFactory(
            secret=taskhook.SECRET,
            sources=taskhook.SOURCES,
            tag=name,
            kinds=("github:issues__opened",),
        )
        deliver(url, factory, 0, 2.0)  # warm-up: imports, pools, caches
        print(f"{name}: {' '.join(module[1:])}")
        for first, phase, again in PHASES:
            cpu_before = ingress.cpu_seconds()
            attempts = multiprocessing.Value("i", 0)
            attackers = [
                multiprocessing.Process(target=attacker, args=(port, attempts, again))
                for _ in range(2 if again is not None else 0)
            ]
            for process in attackers:
                process.start()
            try:
                answers = deliver(url, factory, first, PHASE)
            finally:
                for process in attackers:  # ours, by pid
                    process.terminate()
                    process.join()
            cpu = ingress.cpu_seconds() - cpu_before
            print(f"  {phase + ':':17} {summary(answers)}")
            print(f"  {'':17} ingress CPU {cpu:.1f} s; {attempts.value} headers begun", flush=True)
        procs.stop(ingress)


def main() -> None:
    LOGS.mkdir(parents=True, exist_ok=True)
    procs = Processes(LOGS)
    try:
        redis_url = procs.redis()
        for name, module in SERVERS.items():
            measure(procs, name, module, redis_url)
    finally:
        procs.stop_all()


if __name__ == "__main__":
    main()
