"""Fail points: parsed strictly, free when unset, and acted on when set.

The kill action is proven end to end (tests/e2e/worker): a worker SIGKILLs
itself between the insert and the settle.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker import failpoints


@pytest.fixture(autouse=True)
def _no_failpoints_after() -> Iterator[None]:
    yield
    failpoints.configure(None)


@pytest.mark.parametrize(
    "spec",
    [
        "after_lunch:kill",
        "after_insert",
        "after_insert:explode",
        "after_insert:pause=-1",
        "after_insert:hold=",
        "x:y",
    ],
)
def test_an_unknown_point_or_action_is_refused(spec: str):
    with pytest.raises(ValueError, match="TASKHOOK_FAILPOINT"):
        failpoints.parse(spec)


def test_several_points_parse_and_blank_parts_are_skipped():
    actions = failpoints.parse(" after_insert:pause=0.5 , ,before_ack:kill")
    assert set(actions) == {"after_insert", "before_ack"}


def test_a_pause_sleeps_at_its_point_only():
    failpoints.configure("after_settle:pause=0.2")
    started = time.monotonic()
    failpoints.failpoint("after_insert")
    assert time.monotonic() - started < 0.1
    failpoints.failpoint("after_settle")
    assert time.monotonic() - started >= 0.2


def test_a_hold_lasts_until_its_file_appears(tmp_path: Path, capsys):
    release = tmp_path / "release"
    failpoints.configure(f"after_insert:hold={release}")
    worker = threading.Thread(target=failpoints.failpoint, args=("after_insert",))
    worker.start()
    worker.join(timeout=0.3)
    assert worker.is_alive(), "the hold ended before its file appeared"
    release.touch()
    worker.join(timeout=10)
    assert not worker.is_alive(), "the hold did not end when its file appeared"
    said = capsys.readouterr().err
    assert f"fail point after_insert: holding until {release} exists" in said
    assert "fail point after_insert: released" in said


def test_a_hold_whose_file_never_appears_gives_up_and_says_so(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setattr(failpoints, "HOLD_LIMIT_SECONDS", 0.2)
    failpoints.configure(f"before_settle:hold={tmp_path / 'never'}")
    started = time.monotonic()
    failpoints.failpoint("before_settle")
    assert 0.2 <= time.monotonic() - started < 5
    assert "after 0.2 s, going on" in capsys.readouterr().err


def test_unset_means_no_action_at_all():
    failpoints.configure(None)
    assert failpoints._ACTIONS == {}
    failpoints.failpoint("after_insert")  # returns at once


def test_the_environment_is_read_at_import_and_kill_is_sigkill():
    code = "from worker.failpoints import failpoint; failpoint('before_ack'); print('alive')"
    environ = os.environ | {"TASKHOOK_FAILPOINT": "before_ack:kill"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == -9
    assert "alive" not in done.stdout
    assert "fail point before_ack: SIGKILL" in done.stderr
