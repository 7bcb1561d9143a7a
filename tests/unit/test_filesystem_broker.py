"""The embedded broker writes each message whole, and Celery uses it for filesystem://."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from celery import Celery
from kombu import Connection

from models import filesystem_broker
from models.settings import Settings
from worker.celery_app import celery_config


def test_a_consumer_never_sees_a_message_before_it_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    settings = Settings(broker_folder=tmp_path / "broker")
    queue_folder = tmp_path / "broker" / "queue"
    seen_before_the_rename: list[list[str]] = []
    replace = os.replace

    def watching(source, destination):
        # What a consumer listing the folder would find at this instant.
        seen_before_the_rename.append(
            [name for name in os.listdir(queue_folder) if name.endswith(".deliveries.msg")]
        )
        replace(source, destination)

    monkeypatch.setattr(filesystem_broker.os, "replace", watching)
    with Connection(
        settings.broker_url,
        transport=settings.broker_transport(),
        transport_options=settings.broker_transport_options(),
    ) as connection:
        # The channel's own put and get: what every publish and consume comes
        # down to (without kombu's routing, whose state its transport classes
        # share across connections in one process).
        channel = connection.default_channel
        assert isinstance(channel, filesystem_broker.Channel)
        channel._put("deliveries", {"key": 7})
        assert seen_before_the_rename == [[]]  # only the partial file existed
        (name,) = os.listdir(queue_folder)
        assert name.endswith(".deliveries.msg")
        assert json.loads((queue_folder / name).read_bytes()) == {"key": 7}  # whole
        assert channel._get("deliveries") == {"key": 7}
        assert os.listdir(queue_folder) == []


def test_celery_uses_it_for_the_filesystem_broker_only(tmp_path: Path):
    embedded = celery_config(Settings(broker_folder=tmp_path / "broker"))
    assert embedded["broker_transport"] == "models.filesystem_broker:Transport"
    app = Celery("check", set_as_current=False)
    app.conf.update(embedded)
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, filesystem_broker.Transport)
    redis = celery_config(Settings(broker_url="redis://127.0.0.1:6379/0"))
    assert redis["broker_transport"] is None
