"""``bench streams``' holder, waited on through its pipe."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from bench.streams import _Holder


def test_the_stream_holder_reads_a_pipe_numbered_past_what_select_takes(tmp_path: Path) -> None:
    """A long test session can hold over 1,024 descriptors; select() refuses
    those, and the holder's wait for its "open" line must not."""
    spare = []
    try:
        while not spare or spare[-1] < 1100:
            spare.append(os.open(os.devnull, os.O_RDONLY))
        holder = _Holder(SimpleNamespace(logs=tmp_path), {})
        holder.popen = subprocess.Popen(
            [sys.executable, "-c", "print('open', flush=True)"], stdout=subprocess.PIPE
        )
        assert holder.popen.stdout.fileno() > 1024
        assert holder._wait_for(b"open", time.monotonic() + 30)
        holder.popen.wait(timeout=30)
        holder.popen.stdout.close()
    finally:
        for descriptor in spare:
            os.close(descriptor)
