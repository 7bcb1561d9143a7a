"""The ingress's open files (``ingest/connections.py``): the soft limit raised
at start, in a process of its own started at a limit, and the bound on
connections drawn from it. The gate at work, on the real server at 1,024 open
files, is tests/e2e/test_descriptor_limits.py."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

from ingest.connections import HEADROOM, connection_bound, limits_line

RAISE = (
    "import json, resource; from ingest.connections import raise_open_files_limit; "
    "print(json.dumps([raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)]))"
)


def raised_from(soft: int, hard: int) -> list:
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    command = [sys.executable, "-c", RAISE]
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=limited, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)
    # Below the hard limit, whatever this machine's is: never a skip.
    soft = min(1024, hard // 2)
    assert raised_from(soft, hard) == [[soft, hard, hard], [hard, hard]]


def test_a_soft_limit_at_the_hard_one_stays() -> None:
    assert raised_from(1024, 1024) == [[1024, 1024, 1024], [1024, 1024]]


def test_the_bound_leaves_headroom_below_the_soft_limit_unless_set() -> None:
    assert connection_bound(1024, None) == 1024 - HEADROOM == 896
    assert connection_bound(65_536, None) == 65_536 - HEADROOM
    assert connection_bound(200, None) == 100  # too small for the headroom: half
    assert connection_bound(1024, 300) == 300


def test_the_start_says_what_was_done_in_one_line() -> None:
    line = limits_line(1024, 524_288, 524_288, 524_160, None)
    assert line == (
        "Open files: soft limit raised from 1,024 to 524,288 (hard limit 524,288); "
        "at most 524,160 connections at once (the soft limit less 128)."
    )
    line = limits_line(1024, 1024, 1024, 1000, 1000)
    assert "not raised" in line and "(TASKHOOK_MAX_CONNECTIONS)" in line
    assert "fewer than 128 descriptors" in line
