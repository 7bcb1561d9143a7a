"""Asking the person at the terminal before a command acts, and what no answer means."""

from __future__ import annotations

import sys

import click

from worker.cli.output import printable


def someone_can_answer() -> bool:
    """Whether a person can answer a question: stdin is a terminal. From a
    script (a pipe, /dev/null, a cron job) nobody can."""
    return sys.stdin.isatty()


def confirmed(question: str, *, err: bool, action: str) -> None:
    """Ask ``question``; a no aborts (exit 1). Without a terminal, the end of
    input means the caller forgot ``--yes``, and the usage error says so
    ("pass --yes to ``action`` without asking")."""
    try:
        answer = click.confirm(printable(question), err=err)
    except click.Abort:  # the end of input, or Ctrl-C
        if someone_can_answer():
            raise
        raise click.UsageError(
            f"{question!r} got no answer (stdin is not a terminal): "
            f"pass --yes to {action} without asking"
        ) from None
    if not answer:
        raise click.Abort()
