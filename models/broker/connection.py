"""How every process of taskhook connects to its broker, from the settings.

The worker, the beat, the CLI (``worker.celery_app``) and the ingress's relay
and readiness check (``ingest.relay``, ``ingest.app``) all build their broker
connection from these, so they declare the same queues and talk through the
same transport: RabbitMQ refuses a queue redeclared with other arguments (a
quorum queue as a classic one).

Nothing here touches the disk: the embedded broker creates its folders when
a channel opens (``models.broker.filesystem_transport``), and the Celery
configuration creates the results folder (``worker.celery_app``).
"""

from __future__ import annotations

import math
from typing import Any

from kombu import Exchange, Queue

from models.broker.messages import DELIVERY_QUEUES, OPERATOR_QUEUE
from models.settings import Settings


def broker_queues(settings: Settings) -> list[Queue]:
    """The queues, as every Celery app of taskhook declares them: the
    deliveries' two lanes (``models.broker.lanes``) and the operator's.

    On RabbitMQ: quorum queues (replicated, at-least-once; a delivery limit
    against a message that kills its worker), each bound to a topic exchange
    of its own. Topic, because Celery's native delayed delivery routes a
    message with a countdown (a delivery's wait for a retry) through its
    ``celery_delayed_*`` queues and back by a ``#.<queue>`` binding, which a
    direct exchange cannot hold: Celery then hands the message to the worker
    at once, and the worker holds it unacknowledged until it is due. The
    exchanges are named apart from the queues (:func:`queue_exchange`),
    because RabbitMQ refuses to redeclare an exchange with another type, and
    a virtual host an earlier version used still has the direct ones (what
    an older process publishes there still reaches the queue).

    Elsewhere plain queues, each on a direct exchange of its name, as Celery
    makes a queue it is not told of.
    """
    if settings.uses_rabbitmq:
        arguments = {"x-queue-type": "quorum", "x-delivery-limit": settings.broker_delivery_limit}
        return [
            Queue(name, queue_exchange(name), routing_key=name, queue_arguments=arguments)
            for name in _QUEUES
        ]
    return [Queue(name, Exchange(name), routing_key=name) for name in _QUEUES]


_QUEUES = (*DELIVERY_QUEUES, OPERATOR_QUEUE)


def queue_exchange(queue: str) -> Exchange:
    """The topic exchange a queue is bound to on RabbitMQ (see :func:`broker_queues`)."""
    return Exchange(f"taskhook.{queue}", type="topic")


def broker_countdown(settings: Settings, seconds: float) -> float:
    """The countdown to send for a wait of ``seconds``.

    RabbitMQ's delayed delivery counts whole seconds, and Celery truncates
    (and refuses a countdown under one second): rounded up, the message
    never comes back before it is due, so no worker holds it meanwhile.
    Elsewhere the worker holds a message with a countdown until it is due
    (Redis and the embedded broker have no delayed delivery), to the
    fraction.
    """
    return float(math.ceil(seconds)) if settings.uses_rabbitmq else seconds


def broker_transport(settings: Settings) -> str | None:
    """The kombu transport for the broker URL, when not the URL's own: the
    embedded broker writes each message whole (``filesystem_transport``);
    Redis reuses one client per channel (``redis_transport``)."""
    if settings.broker_url.startswith("filesystem://"):
        return "models.broker.filesystem_transport:Transport"
    if settings.broker_url.startswith("redis://"):
        return "models.broker.redis_transport:Transport"
    return None


def broker_transport_options(settings: Settings) -> dict[str, Any]:
    """Transport options for the broker, shared by the worker and the ingress."""
    if settings.broker_url.startswith("filesystem://"):
        folder = settings.broker_folder
        return {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            # kombu would otherwise write its exchange files to ./control.
            "control_folder": str(folder / "control"),
            "store_processed": False,
            # kombu's default (1 s) drains about 2 messages/s here.
            "polling_interval": 0.01,
        }
    if settings.uses_rabbitmq:
        # Every publish waits for RabbitMQ's confirm: a message the broker
        # did not take is an error the sender sees (the relay, the sweeper
        # and the CLI then leave the row queued for the sweeper).
        return {"confirm_publish": True}
    if settings.broker_url.startswith(("redis://", "rediss://")):
        return {
            "visibility_timeout": settings.visibility_timeout_seconds,
            # A frozen Redis must not hold a request or a worker forever.
            "socket_timeout": settings.enqueue_timeout_seconds,
            "socket_connect_timeout": settings.enqueue_timeout_seconds,
        }
    return {}


def result_backend(settings: Settings) -> str:
    """The Celery result backend: explicit, else one that matches the broker
    (files beside the embedded broker's, ``results``)."""
    if settings.result_backend_url:
        return settings.result_backend_url
    if settings.broker_url.startswith(("redis://", "rediss://")):
        return settings.broker_url
    if settings.broker_url.startswith("filesystem://"):
        return f"file://{(settings.broker_folder.parent / 'results').resolve()}"
    return "rpc://"
