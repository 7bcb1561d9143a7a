"""``python -m bench BENCHMARK [--smoke|--full] [--set FIELD=N]``.

BENCHMARK: all, ingress, e2e, storm, scale, memory, sqlite, catch-up,
latency, messages, workspaces, streams, ... (``python -m bench --help`` lists them all).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from bench.suites import BENCHMARKS, Bench, parse_overrides
from models import sealing

RESULTS = Path(__file__).resolve().parent / "results"
#: The processes' logs: under var/ (not committed), one folder per benchmark.
LOGS = Path(__file__).resolve().parents[1] / "var" / "bench"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("benchmark", choices=["all", *BENCHMARKS])
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--smoke",
        action="store_const",
        const="smoke",
        dest="size",
        help="about 10 s each: proves the harness, not the goals",
    )
    size.add_argument(
        "--full",
        action="store_const",
        const="full",
        dest="size",
        help="the full sizes (200,000-delivery memory run, more repeats)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=N",
        help="override one size, e.g. --set memory_deliveries=200000 (see bench.suites.Sizes)",
    )
    parser.add_argument(
        "--broker",
        choices=["redis", "rabbitmq", "both"],
        default="both",
        help="the broker(s) bench fairness runs on (both, one after the other, by default)",
    )
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="where <name>.json and <name>.png go"
    )
    options = parser.parse_args(argv)
    # Sources are added here and read by the processes started from the
    # repository: the embedded default's key file, as scripts/run makes it.
    sealing.create_key_file(str(LOGS.parent / "encryption.key"))
    try:
        parse_overrides(options.set)
    except ValueError as error:
        parser.error(str(error))
    # Stop what was started (by pid) on Ctrl-C or a plain kill, even when the
    # shell that started us in the background set SIGINT to be ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    size = options.size or "default"
    names = list(BENCHMARKS) if options.benchmark == "all" else [options.benchmark]
    summary = {}

    def say(line: str) -> None:
        print(line, flush=True)

    for name in names:
        started = time.monotonic()
        print(f"==> {name} ({size})", flush=True)
        brokers = ("redis", "rabbitmq") if options.broker == "both" else (options.broker,)
        with Bench(name, size, options.results, log=say, logs=LOGS, brokers=brokers) as bench:
            bench.override(options.set)
            result = BENCHMARKS[name](bench)
        summary[name] = result["goals"]
        print(
            f"    goals: {json.dumps(result['goals'])}  ({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
