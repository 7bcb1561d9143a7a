"""Output: the ``--json`` option, JSON documents, aligned tables, fields, times and ages.

Every line the CLI prints goes through here (:func:`echo`, :func:`emit_json`,
:func:`print_table`, :func:`print_fields`), and none of them lets a control
character reach the terminal: a title, a name or a provider's message holding
``ESC ]0;…BEL`` or ``ESC [2J`` would otherwise retitle the window, clear the
screen or forge lines. Plain output shows each as an escape (``\\x1b``, a
value's newline as ``\\n``) and keeps only the CLI's own newlines; JSON
escapes them as JSON does (``\\u001b``), DEL, C1 and bidirectional controls included.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, is_dataclass
from datetime import datetime
from typing import Any

import click

# Re-exported: the CLI's modules take every output helper from here.
from models.display import format_age, format_when  # noqa: F401

#: What no plain output prints raw: the C0 and C1 controls and DEL (``Cc``), and
#: the bidirectional controls that reorder what a terminal shows.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: The same, less what JSON escapes itself (the C0 controls).
_CONTROL_LEFT_BY_JSON = re.compile(r"[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def printable(value: object) -> str:
    """``value`` as text on one line, each control character shown as its
    escape (ESC as ``\\x1b``, a newline as ``\\n``): for any value from
    outside (a title, a name, a provider's message) put into a line."""
    return _CONTROL.sub(_escape, str(value))


def echo(message: object = "", *, err: bool = False) -> None:
    """Print ``message``, and a newline: its own newlines are the CLI's layout
    and kept, every other control character is shown escaped."""
    click.echo("\n".join(printable(line) for line in str(message).split("\n")), err=err)


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
    text = json.dumps(document, indent=2, ensure_ascii=False, default=_jsonable)
    # json.dumps escapes only C0 controls when it keeps non-ASCII text; in a
    # JSON document these can only stand inside strings, where \uXXXX is theirs.
    click.echo(_CONTROL_LEFT_BY_JSON.sub(lambda char: f"\\u{ord(char[0]):04x}", text))


def _cell(value: Any, width: int = 60) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return format_when(value)
    text = printable(" ".join(str(value).split()))
    return text if len(text) <= width else text[: width - 1] + "…"


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str) -> None:
    """Plain aligned columns: readable, and still easy to grep or cut."""
    cells = [[_cell(value) for value in row] for row in rows]
    if not cells:
        echo(empty)
        return
    widths = [max(len(header), *(len(row[i]) for row in cells)) for i, header in enumerate(headers)]
    for row in [list(headers), *cells]:
        echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def print_fields(fields: Sequence[tuple[str, Any]], *, err: bool = False) -> None:
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        text = printable(value) if isinstance(value, str) else _cell(value, width=200)
        echo(f"  {name.ljust(width)}  {text}", err=err)
