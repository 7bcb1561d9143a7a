"""taskhook on RabbitMQ, the broker Celery recommends for at-least-once work:
quorum queues, publisher confirms, and the consumer timeout -- against the
machine's real RabbitMQ, in a virtual host of each test's own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kombu.exceptions import OperationalError

from ingest.relay import celery_publisher
from models.broker.connection import broker_queues, broker_transport_options
from models.broker.messages import DELIVERIES_QUEUE, OPERATOR_QUEUE, PROCESS_DELIVERY
from models.settings import Settings
from tests.support.brokers import rabbitmq_vhost, rabbitmqctl
from worker.celery_app import make_celery_app

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def vhost_url() -> Iterator[str]:
    with rabbitmq_vhost() as url:
        yield url


def queues_of(url: str) -> dict[str, tuple[str, str]]:
    vhost = url.rsplit("/", 1)[1]
    listed = rabbitmqctl(
        "list_queues", "-p", vhost, "name", "type", "arguments", "--no-table-headers", "-q"
    )
    found = {}
    for line in listed.strip().splitlines():
        name, kind, arguments = line.split("\t")
        found[name] = (kind, arguments)
    return found


def test_both_queues_are_quorum_queues_with_a_delivery_limit(vhost_url: str):
    settings = Settings(broker_url=vhost_url, broker_delivery_limit=7)
    app = make_celery_app(settings)
    try:
        app.send_task(PROCESS_DELIVERY, args=[1])  # the sender declares the queue
        with app.connection_for_write() as connection:
            for queue in broker_queues(settings):
                queue(connection.default_channel).declare()
    finally:
        app.close()
    found = queues_of(vhost_url)
    for name in (DELIVERIES_QUEUE, OPERATOR_QUEUE):
        kind, arguments = found[name]
        assert kind == "quorum", found
        assert '"x-delivery-limit",7' in arguments.replace(" ", ""), arguments


def test_the_relay_declares_the_queue_as_the_worker_does(vhost_url: str):
    # Declared first by the relay, the queue must be the worker's quorum queue:
    # RabbitMQ refuses to redeclare a queue with other arguments.
    celery_publisher(Settings(broker_url=vhost_url))([1, 2, 3])
    assert queues_of(vhost_url)[DELIVERIES_QUEUE][0] == "quorum"
    app = make_celery_app(Settings(broker_url=vhost_url))
    try:
        app.send_task(PROCESS_DELIVERY, args=[4])
    finally:
        app.close()


def test_a_publish_the_broker_refuses_is_an_error_the_sender_sees(vhost_url: str):
    """Publisher confirms: RabbitMQ refusing a message (a full queue that
    rejects publishes) reaches the relay as an error -- without confirms the
    message would vanish and the relay count it as sent."""
    publish = celery_publisher(Settings(broker_url=vhost_url))
    publish([1])  # the queue exists, as the worker declares it
    vhost = vhost_url.rsplit("/", 1)[1]
    rabbitmqctl(
        "set_policy",
        "-p",
        vhost,
        "full",
        f"^{DELIVERIES_QUEUE}$",
        '{"max-length": 1, "overflow": "reject-publish"}',
        "--apply-to",
        "queues",
    )
    refused = None
    for key in range(2, 6):  # the first fills the queue (its one place), then it refuses
        try:
            publish([key])
        except OperationalError as error:
            refused = error
            break
    assert refused is not None, "every publish was taken by a full queue: no confirms"
    cause = refused.__cause__ or refused.__context__
    assert type(cause).__name__ == "MessageNacked", repr(cause)


#: A ten-minute task limit, with the lease and Redis's timeout above it.
LONG_TASKS = {
    "task_time_limit_seconds": 600,
    "lease_seconds": 900,
    "visibility_timeout_seconds": 3600,
}


@pytest.mark.parametrize("url", ["amqp://guest:guest@127.0.0.1:5672//", "amqps://rabbit//"])
def test_a_consumer_timeout_a_worker_could_outlast_is_refused_at_start(url: str):
    with pytest.raises(ValueError, match="consumer_timeout") as refused:
        Settings(broker_url=url, **LONG_TASKS, broker_consumer_timeout_seconds=1000)
    assert "1200 s" in str(refused.value)
    Settings(broker_url=url, **LONG_TASKS, broker_consumer_timeout_seconds=1201)


def test_the_consumer_timeout_is_only_rabbitmqs_concern():
    Settings(broker_url="redis://127.0.0.1:6379/0", broker_consumer_timeout_seconds=1)
    settings = Settings(broker_url="amqp://guest:guest@127.0.0.1:5672//")
    assert broker_transport_options(settings) == {"confirm_publish": True}
    redis = Settings(broker_url="redis://127.0.0.1:6379/0")
    assert {queue.queue_arguments for queue in broker_queues(redis)} == {None}
