"""Alembic environment: the URL comes from taskhook's settings, never from a file.

Tests and tools may hand in a ready connection as ``config.attributes["connection"]``,
and a URL to render ``--sql`` for as ``config.attributes["offline_url"]``.
"""

from alembic import context
from sqlalchemy import Connection

from migrations.timeouts import timeout_statements
from models.db import make_engine
from models.settings import Settings
from models.tables import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata


def _render_item(kind: str, obj: object, autogen_context) -> str | bool:
    """Autogenerate writes our column types as plain SQLAlchemy types, so a
    revision never imports the models it migrates."""
    if kind == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_item=_render_item,
        # SQLite cannot ALTER most things in place; batch mode rebuilds tables.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        _limit_waits(connection.dialect.name)
        context.run_migrations()


def _limit_waits(dialect: str) -> None:
    """On PostgreSQL, a migration gives up on a lock instead of queueing the
    ingress behind it (migrations/timeouts.py). Set on the transaction itself,
    first thing in it; rendered into ``--sql`` output as well."""
    if dialect == "postgresql":
        for statement in timeout_statements():
            context.execute(statement)


def run_migrations_offline() -> None:
    # The migration lint renders PostgreSQL's SQL whatever database is configured.
    url = config.attributes.get("offline_url") or Settings().database_url
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        _limit_waits(context.get_context().dialect.name)
        context.run_migrations()


def run_migrations_online() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _configure_and_run(given)
        return
    settings = Settings()
    engine = make_engine(settings.database_url, settings=settings)
    try:
        with engine.connect() as connection:
            _configure_and_run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
