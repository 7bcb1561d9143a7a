"""Alembic migrations: the only way taskhook's schema changes.

A migration runs while the previous release still serves, so:

- it never stops the ingress: on PostgreSQL it gives up on a lock after 4 s
  and stops a statement after 5 s (timeouts.py); a revision that needs
  longer says so in its own file (``longer_statements``, ``concurrently``);
- a destructive change comes in two releases, expand then contract: add what
  the old code can ignore now, drop what it used a release later;
- ``python -m migrations.lint`` (squawk, in scripts/test) holds every new
  revision to both.

docs/deploy.md, "Changing the schema", has the table of safe changes.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

_HERE = Path(__file__).resolve().parent


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's config for this project, independent of the working directory."""
    config = Config()
    config.set_main_option("script_location", str(_HERE))
    config.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_to_head(connection: Connection | None = None) -> None:
    command.upgrade(alembic_config(connection), "head")
