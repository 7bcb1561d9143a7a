"""Which unique index did an INSERT violate?

The create sequence may turn a unique violation into a Found outcome only when
the violated index is ``uniq_tasks_external_id`` -- "some unique index" is not
enough (docs/contract.md, "Data model"). PostgreSQL names the constraint in
the error's diagnostics. SQLite names only the columns of a plain-column unique
index ("UNIQUE constraint failed: tasks.workspace_id, tasks.external_id"), so the
columns are matched back to the one index of ours that has exactly them.
"""

from __future__ import annotations

import re

from sqlalchemy import MetaData, PrimaryKeyConstraint, UniqueConstraint
from sqlalchemy.exc import IntegrityError

_PG_UNIQUE_VIOLATION = "23505"
_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: (?:index '(?P<index>[^']+)'|(?P<cols>.+))")


def violated_unique_index(error: IntegrityError, metadata: MetaData) -> str | None:
    """The name of the unique index or constraint ``error`` reports, if any."""
    orig = error.orig
    if getattr(orig, "sqlstate", None) == _PG_UNIQUE_VIOLATION:
        return orig.diag.constraint_name
    match = _SQLITE_UNIQUE.search(str(orig))
    if match is None:
        return None
    if match["index"]:
        return match["index"]
    columns = tuple(part.strip() for part in match["cols"].split(","))
    return _unique_index_on(columns, metadata)


def _unique_index_on(qualified_columns: tuple[str, ...], metadata: MetaData) -> str | None:
    for table in metadata.tables.values():
        uniques = [ix for ix in table.indexes if ix.unique] + [
            c for c in table.constraints if isinstance(c, UniqueConstraint | PrimaryKeyConstraint)
        ]
        for unique in uniques:
            names = tuple(f"{table.name}.{column.name}" for column in unique.columns)
            if names == qualified_columns:
                return str(unique.name)
    return None
