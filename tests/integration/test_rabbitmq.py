"""taskhook on RabbitMQ, the broker Celery recommends for at-least-once work:
quorum queues, publisher confirms, and the consumer timeout -- against the
machine's real RabbitMQ, in a virtual host of each test's own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kombu import Connection, Exchange, Queue
from kombu.exceptions import OperationalError

from ingest.relay import celery_publisher
from models.broker.connection import (
    broker_countdown,
    broker_queues,
    broker_transport_options,
    queue_exchange,
)
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


def exchanges_of(url: str) -> dict[str, str]:
    vhost = url.rsplit("/", 1)[1]
    listed = rabbitmqctl("list_exchanges", "-p", vhost, "name", "type", "--no-table-headers", "-q")
    # The default exchange's name is empty: its line starts with the tab.
    return dict(line.split("\t") for line in listed.splitlines() if line.strip())


def test_the_queues_are_bound_to_topic_exchanges_for_delayed_delivery(vhost_url: str):
    # Celery's native delayed delivery brings a message back by a "#.<queue>"
    # binding, which only a topic exchange holds (docs/runbook.md, "RabbitMQ").
    settings = Settings(broker_url=vhost_url)
    for queue in broker_queues(settings):
        assert queue.exchange.type == "topic", queue
        assert queue.exchange.name == f"taskhook.{queue.name}"
    app = make_celery_app(settings)
    try:
        app.send_task(PROCESS_DELIVERY, args=[1])
    finally:
        app.close()
    assert exchanges_of(vhost_url)[f"taskhook.{DELIVERIES_QUEUE}"] == "topic"


def test_a_virtual_host_an_older_version_used_keeps_working(vhost_url: str):
    """Before, each queue was bound to a direct exchange of its own name.
    RabbitMQ refuses to redeclare an exchange with another type, so the topic
    exchanges have names of their own: the new processes start on the old
    virtual host, and what an old process still publishes reaches the queue."""
    settings = Settings(broker_url=vhost_url)
    with Connection(vhost_url) as connection:
        channel = connection.default_channel
        for new in broker_queues(settings):  # as the previous version declared them
            Queue(
                new.name,
                Exchange(new.name),
                routing_key=new.name,
                queue_arguments=new.queue_arguments,
            )(channel).declare()
        # An old sender publishes to the direct exchange.
        connection.Producer(channel).publish(
            {"old": True}, exchange=DELIVERIES_QUEUE, routing_key=DELIVERIES_QUEUE
        )
    app = make_celery_app(settings)
    try:
        app.send_task(PROCESS_DELIVERY, args=[1])  # the new exchange, beside the old one
    finally:
        app.close()
    exchanges = exchanges_of(vhost_url)
    assert exchanges[DELIVERIES_QUEUE] == "direct"
    assert exchanges[queue_exchange(DELIVERIES_QUEUE).name] == "topic"
    with Connection(vhost_url) as connection:
        declared = connection.default_channel.queue_declare(DELIVERIES_QUEUE, passive=True)
    assert declared.message_count == 2


@pytest.mark.parametrize(
    ("seconds", "rabbitmq", "elsewhere"), [(0.6, 1.0, 0.6), (1.0, 1.0, 1.0), (21.5, 22.0, 21.5)]
)
def test_a_countdown_on_rabbitmq_is_whole_seconds_never_early(seconds, rabbitmq, elsewhere):
    # Celery truncates a countdown to whole seconds for RabbitMQ, and refuses
    # one under a second: rounded up, the message never comes back early.
    assert broker_countdown(Settings(broker_url="amqp://guest:guest@h//"), seconds) == rabbitmq
    assert broker_countdown(Settings(broker_url="redis://127.0.0.1:6379/0"), seconds) == elsewhere
