"""How times and ages read to a person, the same in the CLI and the console."""

from __future__ import annotations

from datetime import datetime


def format_when(value: datetime | None) -> str:
    """A UTC timestamp to the second (``2026-12-02 04:21:10``); ``-`` for none."""
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def format_age(seconds: float) -> str:
    """A duration in its two largest units: ``3d 4h``, ``5m``, ``12s``."""
    seconds = int(seconds)
    for unit, size, smaller, smaller_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if seconds >= size:
            rest = (seconds % size) // smaller_size
            return (
                f"{seconds // size}{unit} {rest}{smaller}" if rest else f"{seconds // size}{unit}"
            )
    return f"{seconds}s"
