"""The test process's open file descriptors, counted per test module, so the
session fails when they grow (``descriptors_watched`` in tests/conftest.py).

A leak of one descriptor per test goes unseen until the suite, in some order,
passes the process's limit (1,024 on many machines) and an unrelated test
fails to open a file: every SQLite engine once kept its writer lock's file
open (models/sqlite_writer.py).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

#: Linux lists a process's descriptors here; macOS and the BSDs under /dev/fd.
_FD_FOLDER = Path("/proc/self/fd") if Path("/proc/self/fd").is_dir() else Path("/dev/fd")


def open_descriptors() -> int:
    """How many file descriptors this process holds now."""
    return len(os.listdir(_FD_FOLDER))


class DescriptorWatch:
    """The descriptors held when the session began, and each module's growth."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.start = open_descriptors()
        self.growth: dict[str, int] = {}

    def module_ran(self, module: str, before: int) -> None:
        self.growth[module] = self.growth.get(module, 0) + open_descriptors() - before

    def excess(self) -> str | None:
        """What is wrong when the process holds more than ``limit`` descriptors
        above its start, else None. Garbage is collected first: what only a
        cycle still holds is closed by its finalizer, not leaked."""
        gc.collect()
        grown = open_descriptors() - self.start
        if grown <= self.limit:
            return None
        worst = sorted(self.growth.items(), key=lambda item: -item[1])[:5]
        modules = "\n".join(f"  {count:+d}  {module}" for module, count in worst if count > 0)
        return (
            f"the tests left {grown} file descriptors open ({self.start} at the start, "
            f"{self.start + grown} now; at most {self.limit} may stay, for caches that "
            f"live as long as the process). The modules that grew them most:\n{modules}"
        )
