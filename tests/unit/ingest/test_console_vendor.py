"""The console's vendored files are the published ones: each file's sha256 is
the one ingest/console/static/vendor/README.md records, and every file there
is recorded -- so a hand edit, or a file added without its provenance, fails."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

VENDOR = Path(__file__).parents[3] / "ingest" / "console" / "static" / "vendor"
README = VENDOR / "README.md"

#: A row of the README's table: | `file` | what | from | `sha256` |
ROW = re.compile(r"^\|\s*`(?P<name>[^`]+)`\s*\|.*\|\s*`(?P<sha256>[0-9a-f]{64})`\s*\|\s*$")


def recorded() -> dict[str, str]:
    rows = (ROW.match(line) for line in README.read_text().splitlines())
    return {row["name"]: row["sha256"] for row in rows if row}


def test_the_readme_records_every_vendored_file():
    present = {path.name for path in VENDOR.iterdir() if path.name != "README.md"}
    assert present, "nothing vendored"
    assert sorted(recorded()) == sorted(present)


@pytest.mark.parametrize("name", sorted(recorded()))
def test_a_vendored_file_is_byte_for_byte_the_one_recorded(name: str):
    digest = hashlib.sha256((VENDOR / name).read_bytes()).hexdigest()
    assert digest == recorded()[name], f"{name} differs from the published file"


def test_no_cdn_is_referenced_by_the_console():
    console = VENDOR.parents[1]
    texts = [
        path.read_text(errors="replace")
        for path in console.rglob("*")
        if path.is_file() and path.suffix in {".html", ".js", ".py"} and VENDOR not in path.parents
    ]
    for cdn in ("cdn.jsdelivr.net", "unpkg.com", "cdnjs.cloudflare.com"):
        assert not any(cdn in text for text in texts), f"the console loads from {cdn}"
