"""Fail points: parsed strictly, free when unset, and acted on when set.

The kill action is proven end to end (tests/e2e/worker): a worker SIGKILLs
itself between the insert and the settle.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from worker import failpoints


@pytest.fixture(autouse=True)
def _no_failpoints_after() -> Iterator[None]:
    yield
    failpoints.configure(None)


@pytest.mark.parametrize(
    "spec",
    ["after_lunch:kill", "after_insert", "after_insert:explode", "after_insert:pause=-1", "x:y"],
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
