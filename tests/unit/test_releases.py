"""Releases have names: the version in pyproject.toml has its section in
CHANGELOG.md, and the release before it is a commit of this clone that said
that version, so the upgrade test can run it (tests/e2e/test_upgrade.py)."""

from __future__ import annotations

from tests.support.releases import (
    PREVIOUS,
    changelog_sections,
    current_version,
    require_commit,
    version_at,
)


def test_this_version_has_its_section_in_the_changelog():
    sections = changelog_sections()
    assert current_version() in sections, f"CHANGELOG.md has no ## [{current_version()}]"
    assert "### Upgrading" in sections[current_version()]


def test_the_previous_release_is_a_commit_of_this_clone_that_said_its_version():
    require_commit(PREVIOUS)
    assert version_at(PREVIOUS) == PREVIOUS.version
    assert PREVIOUS.version != current_version()


def test_the_changelog_names_the_previous_releases_commit():
    section = changelog_sections()[PREVIOUS.version]
    assert PREVIOUS.commit[:7] in section
