"""Prometheus metrics of the ingress, in a registry of the app's own (so two
apps in one test process never share counters)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models.credentials import PLAIN, credential_counts
from models.inbox import DeliveryStatus
from models.providers import PROVIDERS
from models.reports import Backlogs, Gaps, LastDeliveries, inbox_disk_use, workspace_backlogs
from models.tables import Delivery, WebhookSource, utcnow

#: The statuses ``taskhook_inbox_deliveries`` counts: every one but ``done``
#: and ``ignored``, which grow with every delivery (counting them would read
#: the whole inbox at each scrape; ``taskhook_deliveries`` has their rate).
#: Each of these is small on a healthy inbox, so counting it is cheap.
COUNTED_STATUSES = tuple(
    status
    for status in DeliveryStatus
    if status not in (DeliveryStatus.DONE, DeliveryStatus.IGNORED)
)

#: How many workspaces have series of their own in the workspace backlog
#: gauges: those with the largest backlogs. A storm backs up one workspace or
#: a few (a Jira bulk import, a labelling bot, a bulk replay), so ten name
#: every one of them, while an inbox of thousands of workspaces still writes
#: at most 2 x 11 series a scrape; the other workspaces are summed into
#: :data:`OTHER_WORKSPACES`, so no delivery leaves the gauges.
BACKLOG_WORKSPACES = 10
#: The series of the workspaces beyond :data:`BACKLOG_WORKSPACES`; no
#: workspace's slug can be it (slugs are lowercase letters, digits, dashes).
OTHER_WORKSPACES = "_other"


@dataclass(frozen=True)
class InboxReading:
    """What the inbox gauges show, read at scrape time (:meth:`IngressMetrics.read_inbox`)."""

    now: datetime
    #: Rows of each of :data:`COUNTED_STATUSES`.
    counts: dict[str, int]
    #: The oldest queued row's ``received_at`` (the backlog's age) and its
    #: oldest ``updated_at`` (the ingress's insert, or the sweeper's last
    #: re-send: the sweeper's lag); None when nothing is queued.
    oldest_queued_received_at: datetime | None
    oldest_queued_updated_at: datetime | None
    #: Each enabled source's last webhook delivery (``origin = webhook``)
    #: received, by slug; the source's creation while it has none.
    last_delivery: dict[str, datetime]
    #: The inbox's disk, as the database measures it (``inbox_disk_use``).
    storage_bytes: int = 0
    #: The workspaces with the largest backlogs, and the rest folded.
    backlogs: Backlogs = field(default_factory=lambda: Backlogs(largest=[]))
    #: Stored credentials by the key id that seals them, ``plain`` for those
    #: stored before sealing (``models.credentials.credential_counts``).
    credentials: dict[str, int] = field(default_factory=dict)


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
        self.deliveries_per_commit = Histogram(
            "taskhook_ingress_deliveries_per_commit",
            "Webhook deliveries stored by each commit of the ingress on SQLite, which "
            "stores those that arrive while a commit runs together in the next "
            "(ingest.group_commit); none on PostgreSQL.",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=self.registry,
        )
        self.relay_published = Counter(
            "taskhook_relay_published",
            "Delivery keys handed to the broker by the relay.",
            registry=self.registry,
        )
        self.lane_deliveries = Counter(
            "taskhook_lane_deliveries",
            "Webhook deliveries this process sent down each lane (live, background): "
            "a source past its share of the live lane floods into the background lane "
            "(models.broker.lanes). Two series.",
            ["lane"],
            registry=self.registry,
        )
        self.flooding_sources = Gauge(
            "taskhook_flooding_sources",
            "Sources whose deliveries this process sends down the background lane now, "
            "because they sent past their share of the live lane.",
            registry=self.registry,
        )
        self.relay_dropped = Counter(
            "taskhook_relay_dropped",
            "Delivery keys the relay could not hand to the broker (left to the sweeper).",
            registry=self.registry,
        )
        self.relay_pending = Gauge(
            "taskhook_relay_pending",
            "Delivery keys waiting in this process's relay for the broker (its lag: "
            "a healthy broker takes them within milliseconds).",
            registry=self.registry,
        )
        # Every provider's series from the start: a series born with its
        # first request would hide that request from increase().
        for provider in PROVIDERS:
            self.latency.labels(provider)
        self.registry.register(_UnexpectedErrors(self))

        self.inbox = Gauge(
            "taskhook_inbox_deliveries",
            "Inbox rows by status, read from the database at each scrape (every status "
            "but done and ignored, which grow with every delivery).",
            ["status"],
            registry=self.registry,
        )
        self.oldest_queued_age = Gauge(
            "taskhook_inbox_oldest_queued_age_seconds",
            "How long the oldest queued delivery has waited since it was received "
            "(0: nothing queued).",
            registry=self.registry,
        )
        bound = (
            f"Only the {BACKLOG_WORKSPACES} workspaces with the largest backlogs have a series "
            "of their own (workspace=<slug>), and only while they are among them; the others "
            f'are folded into workspace="{OTHER_WORKSPACES}", always present'
        )
        self.sealed_credentials = Gauge(
            "taskhook_sealed_credentials",
            "Stored credentials (signing secrets, catch-up tokens, App keys) each encryption "
            "key seals, by key id, read at each scrape: a key whose count is 0 may be removed "
            '(docs/runbook.md, "Rotate the encryption key").',
            ["key_id"],
            registry=self.registry,
        )
        self.plain_credentials = Gauge(
            "taskhook_plain_credentials",
            "Stored credentials not sealed yet (stored before sealing existed): "
            "`taskhook secrets rotate` seals them.",
            registry=self.registry,
        )
        self.workspace_backlog = Gauge(
            "taskhook_workspace_backlog",
            "The workspace's deliveries queued or processing (received, not finished), read "
            f"from the database at each scrape. {bound}: their sum.",
            ["workspace"],
            registry=self.registry,
        )
        self.workspace_oldest_queued = Gauge(
            "taskhook_workspace_oldest_queued_seconds",
            "How long the workspace's oldest queued delivery has waited since it was received "
            f"(0: none queued). {bound}: the longest wait among them.",
            ["workspace"],
            registry=self.registry,
        )
        #: The workspaces the backlog gauges show now: a scrape removes the
        #: series of those no longer among them rather than leave them stale.
        self._backlog_series: set[str] = set()
        self.sweeper_lag = Gauge(
            "taskhook_sweeper_lag_seconds",
            "How long past its grace period (TASKHOOK_QUEUED_GRACE_SECONDS) a queued "
            "delivery has waited for the sweeper to send it again: under one sweep "
            "interval while the sweeper runs (0: none waits).",
            registry=self.registry,
        )
        self.inbox_storage = Gauge(
            "taskhook_inbox_storage_bytes",
            "Disk the inbox takes, as the database measures it: PostgreSQL's "
            "pg_total_relation_size('deliveries'), SQLite's pages in use.",
            registry=self.registry,
        )
        self.source_last_delivery = Gauge(
            "taskhook_source_last_delivery_timestamp_seconds",
            "When the enabled source's last webhook delivery was received, or when the "
            "source was made while it has none ('-': the most silent source's).",
            ["source"],
            registry=self.registry,
        )
        #: Shared with the console's sources page: one reader per process.
        self.last_deliveries = LastDeliveries()

        self.uncovered_downtime = Gauge(
            "taskhook_uncovered_downtime_seconds",
            "How long no ingress was up, in the windows of the last 7 days no complete "
            "catch-up of the source has read nor an operator marked as handled ('-': the "
            "most of any source, without TASKHOOK_METRICS_SOURCE_LABELS); command: the "
            "catch-up that covers them (the worst source's, for '-').",
            ["source", "command"],
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
        # From the oldest window on: one run covers them all.
        commands = {
            source: gaps.command(source, windows[0]) for source, windows in gaps.uncovered.items()
        }
        runs = gaps.last_catch_ups
        if by_source:
            for source, seconds in uncovered.items():
                self.uncovered_downtime.labels(source, commands[source]).set(seconds)
            for run in runs:
                self.catchup_last_run.labels(run.source).set(run.started_at.timestamp())
                self.catchup_last_recovered.labels(run.source).set(run.recovered)
                self.catchup_last_failed.labels(run.source).set(int(run.error is not None))
            return
        worst = max(uncovered, key=uncovered.__getitem__, default=None)
        self.uncovered_downtime.labels("-", commands.get(worst, "")).set(uncovered.get(worst, 0))
        if runs:
            self.catchup_last_run.labels("-").set(min(r.started_at.timestamp() for r in runs))
            self.catchup_last_recovered.labels("-").set(sum(r.recovered for r in runs))
            self.catchup_last_failed.labels("-").set(max(int(r.error is not None) for r in runs))

    def read_inbox(self, *, session: Session, now: datetime | None = None) -> InboxReading:
        """What :meth:`show_inbox` shows, in four indexed queries -- the counted
        statuses' rows and the unfinished ones by workspace (both by
        ``ix_deliveries_status_updated_at``), the enabled sources, and the
        deliveries stored since the last scrapes (by key) -- and the
        database's measure of the inbox's disk."""
        now = now or utcnow()
        counts = dict.fromkeys(COUNTED_STATUSES, 0)
        received = updated = None
        for status, count, oldest_received, oldest_updated in session.execute(
            select(
                Delivery.status,
                func.count(),
                func.min(Delivery.received_at),
                func.min(Delivery.updated_at),
            )
            .where(Delivery.status.in_([status.value for status in COUNTED_STATUSES]))
            .group_by(Delivery.status)
        ):
            counts[DeliveryStatus(status)] = count
            if status == DeliveryStatus.QUEUED:
                received, updated = oldest_received, oldest_updated
        last = self.last_deliveries.read(session)
        sources = {
            slug: last.get(source_id, created_at)
            for source_id, slug, created_at in session.execute(
                select(WebhookSource.id, WebhookSource.slug, WebhookSource.created_at).where(
                    WebhookSource.enabled.is_(True)
                )
            )
        }
        return InboxReading(
            now=now,
            counts={status.value: count for status, count in counts.items()},
            oldest_queued_received_at=received,
            oldest_queued_updated_at=updated,
            last_delivery=sources,
            # The database's own measure only: counting the bodies reads every row.
            storage_bytes=inbox_disk_use(session=session, count_bodies=False).storage_bytes,
            backlogs=workspace_backlogs(session=session, top=BACKLOG_WORKSPACES, now=now),
            credentials=dict(credential_counts(session)),
        )

    def show_inbox(
        self, reading: InboxReading, *, by_source: bool, queued_grace_seconds: float
    ) -> None:
        """Set the inbox gauges from ``reading``."""
        for status, count in reading.counts.items():
            self.inbox.labels(status).set(count)

        def waited(since: datetime | None) -> float:
            return 0.0 if since is None else max(0.0, (reading.now - since).total_seconds())

        self.oldest_queued_age.set(waited(reading.oldest_queued_received_at))
        self.inbox_storage.set(reading.storage_bytes)
        self.sweeper_lag.set(
            max(0.0, waited(reading.oldest_queued_updated_at) - queued_grace_seconds)
        )
        self.show_backlogs(reading.backlogs)
        self.sealed_credentials.clear()
        for key_id, count in reading.credentials.items():
            if key_id != PLAIN:
                self.sealed_credentials.labels(key_id).set(count)
        self.plain_credentials.set(reading.credentials.get(PLAIN, 0))
        self.source_last_delivery.clear()
        last = {slug: at.timestamp() for slug, at in reading.last_delivery.items()}
        if by_source:
            for slug, timestamp in last.items():
                self.source_last_delivery.labels(slug).set(timestamp)
        elif last:
            self.source_last_delivery.labels("-").set(min(last.values()))

    def show_backlogs(self, backlogs: Backlogs) -> None:
        """Set the workspace backlog gauges: a series for each of the
        workspaces in ``backlogs.largest`` and one for the rest, always; the
        series of a workspace no longer among them are removed."""
        shown = {
            workspace.slug: (workspace.backlog, workspace.oldest_queued_age_seconds)
            for workspace in backlogs.largest
        }
        shown[OTHER_WORKSPACES] = (backlogs.rest_backlog, backlogs.rest_oldest_queued_age_seconds)
        for workspace in self._backlog_series - shown.keys():
            self.workspace_backlog.remove(workspace)
            self.workspace_oldest_queued.remove(workspace)
        for workspace, (backlog, age) in shown.items():
            self.workspace_backlog.labels(workspace).set(backlog)
            self.workspace_oldest_queued.labels(workspace).set(age or 0.0)
        self._backlog_series = set(shown)

    def show_relay(self, *, pending: int) -> None:
        self.relay_pending.set(pending)

    def count_lane(self, lane: str) -> None:
        """One more webhook delivery sent down ``lane`` (``taskhook_lane_deliveries``)."""
        self._child("lane_deliveries", lane).inc()

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


class _UnexpectedErrors(Collector):
    """``taskhook_ingress_unexpected_errors``: webhook requests timed
    (``taskhook_ingress_seconds``) whose route never counted a result
    (``taskhook_deliveries``), because an unexpected error ended them -- the
    app's catch-all answered those 503 (``ingest.app.UnexpectedErrors``).
    Exact: a request is timed and counted in one step of the event loop, and
    the scrape reads both in another."""

    def __init__(self, metrics: IngressMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[CounterMetricFamily]:
        timed = dict.fromkeys(PROVIDERS, 0.0)
        for metric in self._metrics.latency.collect():
            for sample in metric.samples:
                if sample.name.endswith("_count"):
                    provider = sample.labels["provider"]
                    timed[provider] = timed.get(provider, 0.0) + sample.value
        for metric in self._metrics.deliveries.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    provider = sample.labels["provider"]
                    timed[provider] = timed.get(provider, 0.0) - sample.value
        family = self._family()
        for provider, errors in sorted(timed.items()):
            family.add_metric([provider], max(0.0, errors))
        yield family

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "taskhook_ingress_unexpected_errors",
            "Webhook requests an unexpected error ended, answered 503 by the app's "
            "catch-all (timed in taskhook_ingress_seconds, no result counted in "
            "taskhook_deliveries).",
            labels=["provider"],
        )
