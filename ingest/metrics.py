"""Prometheus metrics of the ingress, in a registry of the app's own (so two
apps in one test process never share counters)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase


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
