"""The embedded broker writes each message whole, hands each to one consumer,
sets aside what it cannot read, and Celery uses it for filesystem://."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from queue import Empty

import pytest
from celery import Celery
from kombu import Connection

from models.broker import filesystem_transport
from models.broker.connection import broker_transport, broker_transport_options
from models.settings import Settings
from worker.celery_app import celery_config

ROOT = Path(__file__).resolve().parents[2]


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

    monkeypatch.setattr(filesystem_transport.os, "replace", watching)
    with Connection(
        settings.broker_url,
        transport=broker_transport(settings),
        transport_options=broker_transport_options(settings),
    ) as connection:
        # The channel's own put and get: what every publish and consume comes
        # down to (without kombu's routing, whose state its transport classes
        # share across connections in one process).
        channel = connection.default_channel
        assert isinstance(channel, filesystem_transport.Channel)
        channel._put("deliveries", {"key": 7})
        assert seen_before_the_rename == [[]]  # only the partial file existed
        (name,) = os.listdir(queue_folder)
        assert name.endswith(".deliveries.msg")
        assert json.loads((queue_folder / name).read_bytes()) == {"key": 7}  # whole
        assert channel._get("deliveries") == {"key": 7}
        assert os.listdir(queue_folder) == []


def test_celery_uses_it_for_the_filesystem_broker_only(tmp_path: Path):
    embedded = celery_config(Settings(broker_folder=tmp_path / "broker"))
    assert embedded["broker_transport"] == "models.broker.filesystem_transport:Transport"
    app = Celery("check", set_as_current=False)
    app.conf.update(embedded)
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, filesystem_transport.Transport)
    redis = celery_config(Settings(broker_url="redis://127.0.0.1:6379/0"))
    assert redis["broker_transport"] == "models.broker.redis_transport:Transport"


def test_its_folders_are_made_when_it_opens_not_by_the_settings(tmp_path: Path):
    settings = Settings(broker_folder=tmp_path / "var" / "broker")
    options = broker_transport_options(settings)
    assert not (tmp_path / "var").exists()
    with _connection(settings) as connection:
        connection.ensure_connection(max_retries=1)
    for name in ("data_folder_in", "processed_folder", "control_folder"):
        assert Path(options[name]).is_dir()


def _channel(connection: Connection) -> filesystem_transport.Channel:
    channel = connection.default_channel
    assert isinstance(channel, filesystem_transport.Channel)
    return channel


def _connection(settings: Settings) -> Connection:
    return Connection(
        settings.broker_url,
        transport=broker_transport(settings),
        transport_options=broker_transport_options(settings),
    )


def test_messages_come_out_oldest_first_and_new_ones_are_found(tmp_path: Path):
    settings = Settings(broker_folder=tmp_path / "broker")
    with _connection(settings) as connection:
        channel = _channel(connection)
        for key in (1, 2, 3):
            channel._put("deliveries", {"key": key})
            time.sleep(0.002)  # names order by the millisecond, then at random
        channel._put("operator", {"key": "not this queue's"})
        assert channel._get("deliveries") == {"key": 1}  # lists the folder once ...
        channel._put("deliveries", {"key": 4})  # ... so this one came after the listing
        assert [channel._get("deliveries") for _ in range(3)] == [
            {"key": 2},
            {"key": 3},
            {"key": 4},
        ]
        with pytest.raises(Empty):
            channel._get("deliveries")
        assert channel._get("operator") == {"key": "not this queue's"}
        # Taken messages are gone; nothing is kept (store_processed is off).
        assert os.listdir(tmp_path / "broker" / "queue") == []
        assert os.listdir(tmp_path / "broker" / "processed") == []


def test_of_two_consumers_one_takes_each_message(tmp_path: Path):
    settings = Settings(broker_folder=tmp_path / "broker")
    with _connection(settings) as first, _connection(settings) as second:
        one, other = _channel(first), _channel(second)
        for key in range(4):
            one._put("deliveries", {"key": key})
            time.sleep(0.002)
        assert one._get("deliveries") == {"key": 0}  # both list all four ...
        assert other._get("deliveries") == {"key": 1}  # ... the other skips the taken one
        assert one._get("deliveries") == {"key": 2}  # ... and so does this one
        assert other._get("deliveries") == {"key": 3}
        for channel in (one, other):
            with pytest.raises(Empty):
                channel._get("deliveries")


def test_a_message_that_is_not_whole_is_set_aside_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """After a power cut a renamed file can be empty or cut short: the worker
    must go on (Celery stops it on an error here), and the inbox row of that
    message is still queued for the sweeper."""
    settings = Settings(broker_folder=tmp_path / "broker")
    queue = tmp_path / "broker" / "queue"
    with _connection(settings) as connection:
        channel = _channel(connection)
        (queue / "0000000001_empty.deliveries.msg").write_bytes(b"")
        (queue / "0000000002_cut.deliveries.msg").write_bytes(b'{"body": "eyJr')
        channel._put("deliveries", {"key": 9})
        assert channel._get("deliveries") == {"key": 9}
        with pytest.raises(Empty):
            channel._get("deliveries")
    damaged = sorted(os.listdir(tmp_path / "broker" / filesystem_transport.DAMAGED_FOLDER))
    assert damaged == ["0000000001_empty.deliveries.msg", "0000000002_cut.deliveries.msg"]
    assert "0000000002_cut.deliveries.msg is not whole (14 bytes)" in caplog.text


def test_a_published_message_survives_the_publisher_being_killed(tmp_path: Path):
    """Written and renamed, then kill -9: the message is there, whole. (Not
    fsynced: a power cut may lose it; its inbox row stays queued.)"""
    folder = tmp_path / "broker"
    script = textwrap.dedent(
        f"""
        import os, signal
        from kombu import Connection
        from models.broker.connection import broker_transport, broker_transport_options
        from models.settings import Settings
        settings = Settings(broker_folder={str(folder)!r})
        connection = Connection(
            settings.broker_url,
            transport=broker_transport(settings),
            transport_options=broker_transport_options(settings),
        )
        connection.default_channel._put("deliveries", {{"key": 41}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=False)
    assert done.returncode == -signal.SIGKILL
    with _connection(Settings(broker_folder=folder)) as connection:
        assert _channel(connection)._get("deliveries") == {"key": 41}
