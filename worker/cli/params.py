"""Parameter types the commands share: a bad value is a usage error (exit 2),
caught before any database or broker is touched."""

from __future__ import annotations

import functools
import getpass
import os
from collections.abc import Callable
from typing import Any

import click

from models.idempotency import checked_key, cli_actor
from models.tables import MAX_ROW_ID
from models.tasks import MAX_OPERATOR_LENGTH, clean_release_text


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


def _default_operator() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (some containers)
        return os.environ.get("USER") or None


_operator = functools.partial(
    clean_release_text,
    what="the operator",
    missing="cannot tell who you are; pass --operator",
    limit=MAX_OPERATOR_LENGTH,
)


def operator_or_os_user(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """The ``--operator`` callback: the name given, else the OS user's, as an
    audit row keeps it (``models.tasks.clean_release_text``)."""
    given = value if value is not None else (_default_operator() or "")
    return checked_by(_operator)(ctx, param, given)


def idempotency_key_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--idempotency-key KEY`` (docs/contract.md §16): a key to run a change
    again under, checked as every surface checks one; ``help`` says what a
    run again with it does."""
    return click.option(
        "--idempotency-key", default=None, callback=checked_by(checked_key), help=help
    )


def os_user_actor() -> str:
    """The actor of a CLI change that names no ``--operator``: the OS user."""
    return cli_actor(_default_operator() or "")
