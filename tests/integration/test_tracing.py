"""One trace per delivery (models/tracing.py), with the SDK's in-memory
exporter, on SQLite and PostgreSQL: the POST and its steps, the row's
context, the relay's send, the worker's run as its child, and every later
run a new trace linked to the first. Across real processes, with OTLP:
tests/e2e/test_tracing.py."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator

import pytest
from celery.app.task import Context
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import update

from bench.fakes.github_api import FakeGitHub
from models import logs, tracing
from models.db import make_engine, make_session_factory, session_scope
from models.tables import Delivery
from tests.support.deliveries import fixture
from tests.support.ingress import Ingress, open_ingress, wait_until
from tests.support.runs import SETTINGS, run
from tests.support.scenarios import a_source, reading_the_github_log
from tests.support.stores import Store
from worker.catchup.service import catch_up_github
from worker.processing import process_delivery


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.start("test", exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.stop()


@pytest.fixture
def traced_ingress(store: Store, spans) -> Iterator[Ingress]:
    # Made after tracing starts: the app's middleware is added only then.
    with contextlib.contextmanager(open_ingress)(store) as ingress:
        yield ingress


def by_name(exporter: InMemorySpanExporter, name: str) -> list:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def first_trace(ingress: Ingress, spans: InMemorySpanExporter) -> tuple[int, str]:
    """A GitHub delivery posted: its inbox id and the context its row keeps."""
    response = ingress.github("issues__opened")
    assert response.status_code == 202
    (row,) = ingress.deliveries()
    return row.id, row.trace_context


def run_message(store: Store, pk: int, request: Context) -> None:
    """The worker's run of ``pk`` as a Celery task runs it for ``request``."""
    with tracing.message(request):
        run(store, pk)


def test_the_post_its_verification_and_inbox_write_are_one_trace_the_row_keeps(
    traced_ingress: Ingress, spans
):
    pk, stored = first_trace(traced_ingress, spans)

    (server,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    (verify,) = by_name(spans, "verify")
    (write,) = by_name(spans, "inbox write")
    trace_id = server.context.trace_id
    assert verify.context.trace_id == write.context.trace_id == trace_id
    assert verify.parent.span_id == write.parent.span_id == server.context.span_id
    assert stored.split("-")[1:3] == [f"{trace_id:032x}", f"{server.context.span_id:016x}"]
    wait_until(lambda: traced_ingress.published == [pk])


def test_the_workers_first_run_is_a_child_of_the_relays_send(traced_ingress: Ingress, spans):
    pk, stored = first_trace(traced_ingress, spans)
    header = tracing.relay_send({pk: stored})

    run_message(
        traced_ingress.store, pk, Context(delivery_info={}, retries=0, taskhook_traces=header)
    )

    (send,) = by_name(spans, "relay send")
    (process,) = by_name(spans, "process delivery")
    trace_id = int(stored.split("-")[1], 16)
    assert send.context.trace_id == process.context.trace_id == trace_id
    assert process.parent.span_id == send.context.span_id
    # Its steps, as timed events of the run's span.
    assert [event.name for event in process.events][:2] == ["claim", "claimed"]
    assert process.events[-1].name in {"settled", "created or ended"}
    assert process.attributes["taskhook.inbox_id"] == pk
    assert process.attributes["taskhook.outcome"] == "created"
    assert not process.links


@pytest.mark.parametrize(
    "request_of",
    [
        pytest.param(
            lambda header: Context(
                delivery_info={"redelivered": True}, retries=0, taskhook_traces=header
            ),
            id="broker-redelivery",
        ),
        pytest.param(
            lambda header: Context(delivery_info={}, retries=2, taskhook_traces=header), id="retry"
        ),
        pytest.param(lambda header: Context(delivery_info={}, retries=0), id="sweeper-or-replay"),
    ],
)
def test_a_later_run_is_a_new_trace_linked_to_the_first(traced_ingress: Ingress, spans, request_of):
    pk, stored = first_trace(traced_ingress, spans)
    header = tracing.relay_send({pk: stored})
    with session_scope(traced_ingress.store.sessions) as session:  # a row put back in the queue
        session.execute(update(Delivery).where(Delivery.id == pk).values(status="queued"))

    run_message(traced_ingress.store, pk, request_of(header))

    (process,) = by_name(spans, "process delivery")
    first_trace_id = int(stored.split("-")[1], 16)
    assert process.context.trace_id != first_trace_id
    assert process.parent is None
    (link,) = process.links
    assert link.context.trace_id == first_trace_id


def test_off_nothing_is_traced_and_nothing_is_stored(store: Store):
    assert not tracing.ON
    with contextlib.contextmanager(open_ingress)(store) as ingress:
        pk, stored = first_trace(ingress, None)
    assert stored is None
    assert tracing.current_traceparent() is None
    assert tracing.take([pk]) == {}


def test_the_general_paths_statements_are_spans_of_its_run(traced_ingress: Ingress, spans):
    # The SQLAlchemy instrumentation traces the engines made after tracing
    # starts, as a process's are (the store's own was made before).
    pk, stored = first_trace(traced_ingress, spans)
    engine = make_engine(traced_ingress.store.url)
    try:
        with (
            session_scope(make_session_factory(engine)) as session,
            tracing.message(
                Context(delivery_info={}, retries=0, taskhook_traces={str(pk): stored})
            ),
        ):
            process_delivery(
                session=session,
                delivery_pk=pk,
                settings=SETTINGS.model_copy(update={"worker_fast_path": False}),
            )
    finally:
        engine.dispose()

    (run_span,) = by_name(spans, "process delivery")
    inside = [
        s
        for s in spans.get_finished_spans()
        if s.parent and s.parent.span_id == run_span.context.span_id
    ]
    assert any(s.attributes.get("db.statement", "").startswith("INSERT INTO tasks") for s in inside)


def test_a_json_line_inside_a_run_carries_its_trace_and_span(spans):
    line = logs.JsonLines().format
    record = logging.LogRecord("x", logging.INFO, __file__, 0, "inside", None, None)
    with tracing.span("outer") as outer:
        inside = json.loads(line(record))
    outside = json.loads(line(record))

    assert inside["trace_id"] == format(outer.get_span_context().trace_id, "032x")
    assert inside["span_id"] == format(outer.get_span_context().span_id, "016x")
    assert "trace_id" not in outside


def test_a_catch_up_stores_under_its_own_trace_and_the_run_links_to_it(store: Store, spans):
    """The catch-up's task span (the Celery instrumentation's, here one of
    ours) holds its requests to GitHub -- the listing, and each delivery's,
    read ahead on a thread of its own -- and the rows it stores; the
    worker's run of such a row is a new trace linked to it."""
    token = "ghp_traced_catch_up"
    with FakeGitHub(token=token) as github:
        a_source(store, store.workspace().id)
        reading_the_github_log(store.sessions, github.base_url, token)
        github.log_delivery(
            hook="repos/acme/widgets/hooks/123",
            guid="00000000-0000-4000-8000-000000000001",
            event="issues",
            action="opened",
            payload=json.loads(fixture("github", "issues__opened")),
            status_code=502,
        )
        sent: list[int] = []
        with tracing.span("run/taskhook.catch_up") as catch_up:
            catch_up_github(sessions=store.sessions, slug="acme-github", send=sent.extend)

    catch_up_trace = catch_up.get_span_context().trace_id
    requests = [
        s
        for s in spans.get_finished_spans()
        if s.kind == SpanKind.CLIENT and {"http.url", "url.full"} & set(s.attributes)
    ]
    assert requests and {s.context.trace_id for s in requests} == {catch_up_trace}
    (pk,) = sent
    with session_scope(store.sessions) as session:
        stored = session.get(Delivery, pk).trace_context
    assert int(stored.split("-")[1], 16) == catch_up_trace

    run_message(store, pk, Context(delivery_info={}, retries=0))  # the catch-up's send

    (process,) = by_name(spans, "process delivery")
    assert process.context.trace_id != catch_up_trace and process.parent is None
    (link,) = process.links
    assert link.context.trace_id == catch_up_trace
    assert process.attributes["taskhook.outcome"] == "created"
