"""One trace per delivery across real processes: the ingress and a worker
(with beat) export their spans over OTLP/HTTP to a receiver this test runs.
A webhook's spans from both processes share one trace id, and the
sweeper's resend of a delivery is a new trace linked back to the first
(models/tracing.py; in process: tests/integration/test_tracing.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.fakes.otlp import otlp_receiver
from models.db import session_scope
from models.sources import add_source
from models.workspaces import create_workspace
from tests.support.deliveries import fixture, github_headers
from tests.support.processes import Ingress, StartWorker, finished, wait_until

pytestmark = pytest.mark.e2e

SECRET = "tracing-secret"


@dataclass
class Span:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    attributes: dict
    links: list[str]  # the trace ids linked to


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: every span exported to it, decoded."""

    url: str
    spans: list[Span] = field(default_factory=list)

    def named(self, name: str, service: str | None = None) -> list[Span]:
        return [
            span
            for span in list(self.spans)
            if span.name == name and (service is None or span.service == service)
        ]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    received = Receiver("")

    def export(body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = next(
                attribute.value.string_value
                for attribute in resource_spans.resource.attributes
                if attribute.key == "service.name"
            )
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    received.spans.append(
                        Span(
                            service,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.name,
                            {a.key: a.value for a in span.attributes},
                            [link.trace_id.hex() for link in span.links],
                        )
                    )

    with otlp_receiver(export) as received.url:
        yield received


def traced(receiver: Receiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within a tenth of a second
    }


def post(ingress: Ingress) -> int:
    body = fixture("github", "issues__opened")
    answer = httpx.post(
        f"{ingress.url}/webhooks/github/tr-github",
        content=body,
        headers=github_headers("issues__opened", body, SECRET),
        timeout=10,
    )
    assert answer.status_code == 202, answer.text
    return answer.json()["delivery"]


def test_a_webhook_is_one_trace_across_processes_and_a_resend_links_back(
    sessions, start_worker: StartWorker, start_ingress: Callable[..., Ingress], receiver
):
    with session_scope(sessions) as session:
        workspace = create_workspace(session=session, slug="tr", name="Traces", task_prefix="TR")
        add_source(
            session=session,
            provider="github",
            workspace_id=workspace.id,
            slug="tr-github",
            secret=SECRET,
            create_events=["issues.opened", "pull_request.opened"],
        )
    # A grace the relay's message beats even on a loaded machine: the first
    # run is the relay's, in the POST's trace, not a sweeper's resend.
    worker = start_worker(
        "tracing", beat=True, TASKHOOK_QUEUED_GRACE_SECONDS="5", **traced(receiver)
    )
    ingress = start_ingress(**traced(receiver))
    processes = [worker, ingress.process]

    pk = post(ingress)
    wait_until(finished(sessions, pk), timeout=60, what="the delivery", logs=processes)

    def post_span() -> Span | None:
        roots = [
            s
            for s in receiver.spans
            if s.service == "taskhook-ingress" and s.name.startswith("POST") and not s.parent_id
        ]
        return roots[0] if roots else None

    root = wait_until(post_span, timeout=30, what="the POST's span", logs=processes)

    def first_run() -> Span | None:
        runs = [
            s
            for s in receiver.named("process delivery", "taskhook-worker")
            if s.attributes["taskhook.inbox_id"].int_value == pk and s.trace_id == root.trace_id
        ]
        return runs[0] if runs else None

    wait_until(first_run, timeout=30, what="the worker's span in the POST's trace", logs=processes)
    # Each process exports on its own schedule: the whole trace, once both have.
    wanted = {"verify", "inbox write", "relay send", "process delivery"}

    def whole_trace() -> bool:
        return wanted <= {s.name for s in receiver.spans if s.trace_id == root.trace_id}

    wait_until(whole_trace, timeout=10, what=f"the spans {wanted}", logs=processes)

    # A second ingress whose broker is gone: it stores the delivery, its relay
    # cannot send it, and beat's sweeper resends it from the row.
    lost = start_ingress(TASKHOOK_BROKER_URL="redis://127.0.0.1:1/0", **traced(receiver))
    body = fixture("github", "pull_request__opened")
    answer = httpx.post(
        f"{lost.url}/webhooks/github/tr-github",
        content=body,
        headers=github_headers("pull_request__opened", body, SECRET),
        timeout=10,
    )
    assert (answer.status_code, answer.json()["status"]) == (202, "queued"), answer.text
    resent = answer.json()["delivery"]
    wait_until(finished(sessions, resent), timeout=60, what="the swept delivery", logs=processes)

    def stored_trace() -> str | None:
        posts = [
            s for s in receiver.spans if s.name == "inbox write" and s.service == "taskhook-ingress"
        ]
        return posts[-1].trace_id if len(posts) == 2 else None

    first_trace = wait_until(
        stored_trace, timeout=30, what="the second POST's spans", logs=processes
    )

    def resend_run() -> Span | None:
        runs = [
            s
            for s in receiver.named("process delivery")
            if s.attributes["taskhook.inbox_id"].int_value == resent
        ]
        return runs[0] if runs else None

    swept = wait_until(resend_run, timeout=30, what="the resend's span", logs=processes)
    assert swept.trace_id != first_trace
    assert swept.links == [first_trace]
