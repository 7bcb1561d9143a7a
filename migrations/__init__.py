"""Alembic migrations: the only way taskhook's schema changes."""

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
