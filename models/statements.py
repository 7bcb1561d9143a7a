"""What the task store's statement builders share.

A write the worker runs on more than one path (the general path, and the
fast path on PostgreSQL or SQLite) has one builder, which takes each value
either as a Python value or as an SQL expression: a bound parameter that a
statement compiled once fills per run, or a column of a common table
expression that PostgreSQL's fast path composes into one statement. The
builders write ``INSERT ... SELECT``, which takes both kinds alike and
inserts nothing when the SELECT yields no row, as PostgreSQL's composed
statement needs when a delivery is not the plain case.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Insert, insert, literal, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import InstrumentedAttribute
from sqlalchemy.sql.elements import ClauseElement


def sql_value(column: InstrumentedAttribute, value: object):
    """``value`` as a SELECT's column for ``column``: an SQL expression as it
    is, a Python value as a parameter of the column's type."""
    if isinstance(value, ClauseElement):
        return value
    return literal(value, column.type)


def insert_from_values(table: type, values: Mapping[InstrumentedAttribute, object]) -> Insert:
    """``INSERT INTO table (columns) SELECT values``: one row of ``values``,
    or none when they are columns of a SELECT that yields none."""
    return insert(table).from_select(
        list(values), select(*(sql_value(column, value) for column, value in values.items()))
    )


def dialect_insert(dialect: str):
    """The dialect's own ``insert``, whose statements take ``ON CONFLICT``:
    PostgreSQL's, or SQLite's (the only two databases taskhook runs on)."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert
