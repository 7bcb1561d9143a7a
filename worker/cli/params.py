"""Parameter types the commands share: a bad value is a usage error (exit 2),
caught before any database or broker is touched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from models.tables import MAX_ROW_ID


class DatabaseId(click.IntRange):
    """The id of a row (a delivery, a token): 1 to :data:`models.tables.MAX_ROW_ID`."""

    name = "id"

    def __init__(self) -> None:
        super().__init__(1, MAX_ROW_ID)


#: Every id argument and option of ``taskhook`` takes this type.
DATABASE_ID = DatabaseId()


def checked_by(check: Callable[[Any], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback that passes a given value through ``check`` (a model's
    own validation, which raises ``ValueError`` saying what is wrong) and turns
    its refusal into a usage error for that parameter."""

    def callback(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        try:
            return check(value)
        except ValueError as error:
            raise click.BadParameter(str(error)) from None

    return callback
