"""Prometheus metrics of the ingress, in a registry of the app's own (so two
apps in one test process never share counters)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from models.reports import Gaps


@dataclass
class IngressMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    #: Labelled children by (metric, labels): ``labels()`` takes a lock and
    #: builds the key on every call, and the webhook path counts on every
    #: request. Never more entries than the metrics have series.
    _children: dict[tuple[str, tuple[str, ...]], MetricWrapperBase] = field(
        default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        self.deliveries = Counter(
            "taskhook_deliveries",
            "Webhook deliveries answered, by provider, source and result (queued, "
            "duplicate, ignored, unknown_event -- stored as ignored, but an event the "
            "provider does not know --, or why one was refused). The source is '-' when "
            "it was unknown or could not be read, so random URLs cannot grow the series.",
            ["provider", "source", "result"],
            registry=self.registry,
        )
        self.payload_mismatches = Counter(
            "taskhook_payload_mismatches",
            "Redeliveries under a stored delivery id whose body differed.",
            ["provider"],
            registry=self.registry,
        )
        self.rejected_signatures = Counter(
            "taskhook_rejected_signatures",
            "Deliveries refused because no active secret verified their signature.",
            ["provider"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "taskhook_ingress_seconds",
            "Time from request to answer on the webhook routes.",
            ["provider"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=self.registry,
        )
        self.relay_published = Counter(
            "taskhook_relay_published",
            "Delivery keys handed to the broker by the relay.",
            registry=self.registry,
        )
        self.relay_dropped = Counter(
            "taskhook_relay_dropped",
            "Delivery keys the relay could not hand to the broker (left to the sweeper).",
            registry=self.registry,
        )

        self.uncovered_downtime = Gauge(
            "taskhook_uncovered_downtime_seconds",
            "How long no ingress was up, in the windows of the last 7 days no complete "
            "catch-up of the source has read ('-': the most of any source, without "
            "TASKHOOK_METRICS_SOURCE_LABELS).",
            ["source"],
            registry=self.registry,
        )
        self.catchup_last_run = Gauge(
            "taskhook_catchup_last_run_timestamp_seconds",
            "When the source's last catch-up began ('-': the stalest source's).",
            ["source"],
            registry=self.registry,
        )
        self.catchup_last_recovered = Gauge(
            "taskhook_catchup_last_recovered",
            "Deliveries the source's last catch-up recovered ('-': the sum).",
            ["source"],
            registry=self.registry,
        )
        self.catchup_last_failed = Gauge(
            "taskhook_catchup_last_failed",
            "1 when the source's last catch-up stopped on an error ('-': any source's).",
            ["source"],
            registry=self.registry,
        )

    def show_gaps(self, gaps: Gaps, *, by_source: bool) -> None:
        """Set the catch-up gauges from ``gaps`` (read at scrape time)."""
        for gauge in (
            self.uncovered_downtime,
            self.catchup_last_run,
            self.catchup_last_recovered,
            self.catchup_last_failed,
        ):
            gauge.clear()
        uncovered = {
            source: sum(window.seconds for window in windows)
            for source, windows in gaps.uncovered.items()
        }
        runs = gaps.last_catch_ups
        if by_source:
            for source, seconds in uncovered.items():
                self.uncovered_downtime.labels(source).set(seconds)
            for run in runs:
                self.catchup_last_run.labels(run.source).set(run.started_at.timestamp())
                self.catchup_last_recovered.labels(run.source).set(run.recovered)
                self.catchup_last_failed.labels(run.source).set(int(run.error is not None))
            return
        self.uncovered_downtime.labels("-").set(max(uncovered.values(), default=0))
        if runs:
            self.catchup_last_run.labels("-").set(min(r.started_at.timestamp() for r in runs))
            self.catchup_last_recovered.labels("-").set(sum(r.recovered for r in runs))
            self.catchup_last_failed.labels("-").set(max(int(r.error is not None) for r in runs))

    def count_delivery(self, provider: str, source: str, result: str) -> None:
        """One more webhook delivery answered (``taskhook_deliveries``)."""
        self._child("deliveries", provider, source, result).inc()

    def observe_latency(self, provider: str, seconds: float) -> None:
        self._child("latency", provider).observe(seconds)

    def _child(self, metric: str, *labels: str) -> MetricWrapperBase:
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = getattr(self, metric).labels(*labels)
        return child
