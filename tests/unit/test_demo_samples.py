"""The demo's samples (worker/cli/demo_samples/, shipped in the wheel) are the
test fixtures they are copies of, byte for byte: their provenance is the
fixtures' SOURCES.md, and every provider taskhook has has one."""

from __future__ import annotations

from pathlib import Path

from models.providers import PROVIDERS
from worker.cli.demo import SAMPLES, SAMPLES_FOLDER

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
COPY_OF = {
    "github": FIXTURES / "github" / "issues__opened.json",
    "gitlab": FIXTURES / "gitlab" / "issue_hook__open.json",
    "jira": FIXTURES / "jira" / "jira_issue_created__cloud.json",
}


def test_every_provider_has_a_sample_and_nothing_else_does():
    assert sorted(SAMPLES) == sorted(PROVIDERS) == sorted(COPY_OF)
    assert sorted(path.name for path in SAMPLES_FOLDER.glob("*.json")) == sorted(
        f"{provider}.json" for provider in SAMPLES
    )


def test_each_sample_is_its_fixture_byte_for_byte():
    for provider, fixture in COPY_OF.items():
        assert (SAMPLES_FOLDER / f"{provider}.json").read_bytes() == fixture.read_bytes(), provider
