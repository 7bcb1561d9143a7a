"""Output: the ``--json`` option, JSON documents, aligned tables, fields, times and ages."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, is_dataclass
from datetime import datetime
from typing import Any

import click

# Re-exported: the CLI's modules take every output helper from here.
from models.display import format_age, format_when  # noqa: F401


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document, for scripts."
    )(command)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, frozenset | set):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def emit_json(document: Any) -> None:
    if is_dataclass(document) and not isinstance(document, type):
        document = asdict(document)
    click.echo(json.dumps(document, indent=2, ensure_ascii=False, default=_jsonable))


def _cell(value: Any, width: int = 60) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return format_when(value)
    text = " ".join(str(value).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str) -> None:
    """Plain aligned columns: readable, and still easy to grep or cut."""
    cells = [[_cell(value) for value in row] for row in rows]
    if not cells:
        click.echo(empty)
        return
    widths = [max(len(header), *(len(row[i]) for row in cells)) for i, header in enumerate(headers)]
    for row in [list(headers), *cells]:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def print_fields(fields: Sequence[tuple[str, Any]], *, err: bool = False) -> None:
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        text = value if isinstance(value, str) else _cell(value, width=200)
        click.echo(f"  {name.ljust(width)}  {text}", err=err)
