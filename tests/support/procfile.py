"""The Procfile as the tests read it: each process's command, and a command
with its ``${VAR:-default}`` expanded as the shell that runs it would."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_DEFAULTED = re.compile(r"\$\{(\w+):-([^}]*)\}")


def procfile(path: Path = ROOT / "Procfile") -> dict[str, str]:
    """Each process's name (``release`` included) and its command line."""
    entries = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, command = line.partition(":")
            entries[name.strip()] = command.strip()
    return entries


def expanded(command: str, env: Mapping[str, str]) -> list[str]:
    """``command`` as argv, each ``${VAR:-default}`` replaced as a shell would
    with ``env`` (the default when VAR is unset or empty)."""
    return shlex.split(_DEFAULTED.sub(lambda m: env.get(m[1]) or m[2], command))
