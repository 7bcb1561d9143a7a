"""``taskhook``: the operator's command line, and every step of ``docs/runbook.md``.

A thin shell over the same service functions the worker and the ingress use
(``models.workspaces``, ``models.sources``, ``models.inbox``, ``models.tasks``)
and the read-only ``models.reports``. Each command opens one unit of work,
calls one service, commits, and only then talks to the broker.

For people, commands print aligned plain-text tables; for scripts, every
command takes ``--json`` and prints one JSON document on stdout. Exit codes:

- 0: done;
- 1: refused or not found (unknown workspace, source or delivery, an invalid
  external id, a duplicate, a declined confirmation, an unreachable database
  or broker, a bad setting, no database at the configured SQLite path: only
  ``db upgrade`` creates one) -- one line on stderr, never a traceback;
- 2: a usage error, as click reports it (a missing option, an unknown event,
  a confirmation no one could answer without ``--yes``);
- 3: ``release`` sent its request but no operator worker answered in time, so
  the outcome is unknown (the request may still run when a worker starts).

Nothing is built at import: the settings, the engine and the Celery app are
made when a command runs (the app only by the commands that send a message).
Secrets are printed exactly once -- when ``taskhook`` generates one -- and
never listed.

Layout: ``runtime`` (settings, engine, sessions, the Celery app hook; the
errors and the root group's error translation), ``output`` (every line
printed, control characters escaped: ``--json``, tables, fields, ``echo``),
``prompts`` (a confirmation, and what no answer means), and
one module per command group: ``db``, ``workspaces`` (add, list, the steps'
WIP limits), ``sources``, ``tasks`` (task lookup, task archive, explain,
release), ``identities`` (the names tasks answer to, and operator merges),
``deliveries`` (list, show, replay, replay-matching, stats), ``operations``
(the history of bulk replays and by-hand marks), ``catchup`` (recover
deliveries from a provider's log or its items, or mark a window as handled by
hand), ``tokens``, ``demo`` (a workspace to try, signed samples to send it),
``mcp`` (the MCP server on stdio), ``start`` (the Procfile's processes, as
``scripts/run`` starts them).
"""

from __future__ import annotations

# Not used here: tests patch ``getpass.getuser`` through ``worker.cli.getpass``.
import getpass  # noqa: F401

import click

from models import logs
from worker.cli.catchup import catch_up
from worker.cli.db import db
from worker.cli.deliveries import deliveries, stats
from worker.cli.demo import demo
from worker.cli.identities import identities
from worker.cli.mcp import mcp
from worker.cli.operations import operations
from worker.cli.runtime import EXIT_NO_ANSWER, CommandRuntime, TaskhookGroup
from worker.cli.secrets import secrets
from worker.cli.sources import source
from worker.cli.start import start
from worker.cli.tasks import explain, release, task
from worker.cli.tokens import token
from worker.cli.workspaces import workspace

__all__ = ["EXIT_NO_ANSWER", "cli", "main"]


@click.group(cls=TaskhookGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def cli(ctx: click.Context) -> None:
    """taskhook: GitHub, GitLab and Jira webhooks in, tasks out, exactly once per external id.

    Settings come from TASKHOOK_ environment variables (TASKHOOK_DATABASE_URL,
    TASKHOOK_BROKER_URL, TASKHOOK_PUBLIC_URL). Every command takes --json.
    """
    runtime = ctx.ensure_object(CommandRuntime)
    ctx.call_on_close(runtime.close)


for _command in (
    db,
    workspace,
    source,
    task,
    explain,
    release,
    identities,
    deliveries,
    operations,
    stats,
    secrets,
    catch_up,
    token,
    demo,
    mcp,
    start,
):
    cli.add_command(_command)


def main() -> None:
    """The ``taskhook`` console script."""
    logs.configure_cli()
    cli(prog_name="taskhook")
