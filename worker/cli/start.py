"""``taskhook start``: the Procfile's processes under honcho, stopped together.

``scripts/run`` ends here. honcho starts each process in a session of its
own, so Ctrl-C reaches honcho alone, and honcho stops the others. That holds
only while honcho can print: with ``scripts/run | tee run.log``, Ctrl-C also
stops ``tee``, honcho's first line after it ("SIGINT received") fails with a
broken pipe inside its signal handler, and honcho dies waiting for children
it never told to stop, which run on. Here honcho prints to an output that
outlives its reader, so it always goes on to stop every process. A closed
terminal (SIGHUP) stops them the same way.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from typing import TextIO

import click


class OutputThatOutlivesItsReader(io.TextIOBase):
    """A text stream that, once its reader is gone, drops what it is given
    instead of raising :class:`BrokenPipeError` in the writer."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._lose_the_reader()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._lose_the_reader()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def _lose_the_reader(self) -> None:
        self._gone = True
        # What the stream still buffers, and anything else written to its file
        # (Python's own flush at exit), now goes nowhere instead of failing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)


@click.command("start")
@click.argument("processes", nargs=-1)
@click.option(
    "-f",
    "--procfile",
    default="Procfile",
    show_default=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The Procfile to start.",
)
def start(processes: tuple[str, ...], procfile: str) -> None:
    """Start the Procfile's PROCESSES (all of them by default) under honcho.

    Ctrl-C, SIGTERM or a closed terminal stops every one of them, however the
    output is redirected (`taskhook start | tee run.log` included).
    """
    from honcho.command import main as honcho

    sys.stdout = OutputThatOutlivesItsReader(sys.stdout)
    sys.stderr = OutputThatOutlivesItsReader(sys.stderr)
    # honcho stops its processes on SIGINT and SIGTERM only; a hang-up is a TERM.
    signal.signal(signal.SIGHUP, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    honcho(["start", "--procfile", procfile, *processes])
