"""taskhook's releases as the upgrade test needs them: the one before this
code, named by its commit in this clone's history, and its code laid out in
a folder of its own to run beside this one.

When a release is made, PREVIOUS moves to it (CHANGELOG.md, "Making a
release"): the upgrade test always runs the release before against this code,
one version back, both ways (docs/deploy.md, "Upgrades").
"""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHANGELOG = ROOT / "CHANGELOG.md"


@dataclass(frozen=True)
class Release:
    version: str
    commit: str  # the full hash: a short one may grow ambiguous


#: The release before this code: 0.1.0, main as it stood at dd323bf.
PREVIOUS = Release(version="0.1.0", commit="dd323bffd681ffe4b3e84f13e3e027c63a5dac4a")


def current_version() -> str:
    """The version this code says it is (pyproject.toml)."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def changelog_sections() -> dict[str, str]:
    """CHANGELOG.md's sections by version: ``## [0.2.0] - ...`` -> its text."""
    sections: dict[str, str] = {}
    parts = re.split(r"^## \[([^\]]+)\]", CHANGELOG.read_text(), flags=re.MULTILINE)
    for version, text in zip(parts[1::2], parts[2::2], strict=True):
        sections[version] = text
    return sections


def _git(*args: str, binary: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=not binary, timeout=60
    )


def require_commit(release: Release) -> None:
    """Fail, saying how to mend it, when the release's commit is not in this
    clone (a shallow clone, or a history rewritten since)."""
    found = _git("cat-file", "-e", f"{release.commit}^{{commit}}")
    if found.returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        pytest.fail(
            f"release {release.version}'s commit {release.commit} is not in the clone at {ROOT}"
            + (
                " (a shallow clone: `git fetch --unshallow`, or clone with its whole history)"
                if shallow
                else ": it must be in main's history (tests/support/releases.py names it)"
            ),
            pytrace=False,
        )


def version_at(release: Release) -> str:
    """The version pyproject.toml said at the release's commit."""
    shown = _git("show", f"{release.commit}:pyproject.toml")
    assert shown.returncode == 0, shown.stderr
    return tomllib.loads(shown.stdout)["project"]["version"]


def lay_out(release: Release, folder: Path) -> Path:
    """The release's files, as committed, in ``folder``.

    ``git archive`` from this clone, not ``git worktree add``: it leaves no
    worktree behind in the clone's metadata when a run is killed midway.
    """
    require_commit(release)
    archived = _git("archive", "--format=tar", release.commit, binary=True)
    assert archived.returncode == 0, archived.stderr.decode(errors="replace")
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archived.stdout)) as archive:
        archive.extractall(folder, filter="data")
    return folder
