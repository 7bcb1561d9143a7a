"""``python -m bench tracing``: the end-to-end drain with tracing on against
the same drain with it off, side by side (docs/performance.md, "Tracing").

Two rigs of ``bench e2e`` (an ingress on a throwaway database, a private
Redis), one with the OTEL_* variables that turn tracing on, exporting over
OTLP/HTTP to a receiver in this process that counts the spans and discards
them. Each round drains the same number of deliveries through both, in an
order that alternates by round; the ratio on/off is taken per round and its
median reported. Goal: >= 0.9x (tracing on costs a delivery at most a tenth
of its drain rate). Off, tracing adds nothing to any process: ``bench e2e``
is that case.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from bench import report
from bench.drains import end_to_end_rig
from bench.fakes.otlp import otlp_receiver
from models.settings import Settings


class SpanSink:
    """What the OTLP/HTTP receiver got: requests and bytes, counted."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self.url = ""

    def export(self, body: bytes) -> None:
        self.bytes += len(body)
        self.requests += 1


@contextlib.contextmanager
def span_sink() -> Iterator[SpanSink]:
    sink = SpanSink()
    with otlp_receiver(sink.export) as sink.url:
        yield sink


def tracing(bench: Any) -> dict[str, Any]:
    sizes = bench.sizes
    keys_per_message = (
        sizes.e2e_keys_per_message or Settings.model_fields["relay_keys_per_message"].default
    )
    workers = max(sizes.e2e_workers)
    rounds: list[dict[str, Any]] = []
    with span_sink() as sink:
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_SERVICE_NAME": "bench"}
        with (
            end_to_end_rig(bench, keys_per_message) as off,
            end_to_end_rig(bench, keys_per_message, **traced) as on,
        ):
            for round_ in range(sizes.e2e_rounds):
                order = [("off", off), ("on", on)]
                if round_ % 2:
                    order.reverse()
                runs = {name: rig.drain_deliveries(workers) for name, rig in order}
                ratio = report.ratio(
                    runs["on"]["drain"]["rate_per_s"], runs["off"]["drain"]["rate_per_s"]
                )
                bench.say(f"  round {round_}: tracing on {ratio}x off")
                rounds.append({"ratio": ratio, **runs})
    ratio = report.median([one["ratio"] for one in rounds])
    rows = [
        {
            "label": f"tracing {name}",
            "rate": report.median([one[name]["drain"]["rate_per_s"] for one in rounds]),
        }
        for name in ("off", "on")
    ]
    result = {
        "deliveries": sizes.e2e_deliveries,
        "workers": workers,
        "rounds": rounds,
        "ratio_on_vs_off": ratio,
        "spans_exported": {"requests": sink.requests, "bytes": sink.bytes},
        "goals": {
            "drain with tracing on >= 0.9x off": ratio >= 0.9,
            "every delivery done, both ways": all(
                one[name]["exact"] for one in rounds for name in ("off", "on")
            ),
            "spans were exported": sink.requests > 0,
        },
    }
    return bench.finish(
        result,
        rows,
        f"Tracing: {sizes.e2e_deliveries} deliveries drained with tracing on and off",
        rate_label="deliveries per s",
    )
