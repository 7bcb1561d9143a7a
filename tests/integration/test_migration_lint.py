"""The migration lint (migrations/lint.py, a step of scripts/test): squawk
reads the PostgreSQL SQL each revision renders, a new revision that would
lock the ingress out fails it, and the released revisions' exceptions excuse
only what they name. Needs squawk installed (scripts/lib.sh, ensure_squawk):
without it these fail, they never skip."""

from __future__ import annotations

from pathlib import Path

import pytest

from migrations.lint import LAST_RELEASED_UNLINTED, Finding, main, render_upgrades, unexcused
from tests.support.migrations import EXPAND_THE_INBOX, config_with, write_revision

#: What a careless new revision does to the inbox, three ways.
LOCKS_THE_INBOX = """
    op.add_column("deliveries", sa.Column("priority", sa.Text(), nullable=False))
    op.create_index("ix_deliveries_priority", "deliveries", ["priority"])
    op.drop_column("deliveries", "draft_url")
"""


def lint_with(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(["--extra-versions", str(folder)])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def test_a_new_revision_that_locks_the_inbox_fails_the_lint(tmp_path, capsys):
    revision = write_revision(tmp_path, LOCKS_THE_INBOX)

    status, output = lint_with(tmp_path, capsys)

    assert status == 1, output
    for rule in ("adding-required-field", "require-concurrent-index-creation", "ban-drop-column"):
        assert f"revision {revision}, line" in output and rule in output, output
    assert "Changing the schema" in output


def test_an_expand_step_done_the_safe_way_passes_the_lint(tmp_path, capsys):
    write_revision(tmp_path, EXPAND_THE_INBOX)

    status, output = lint_with(tmp_path, capsys)

    assert status == 0, output


def test_a_contract_step_excuses_its_drop_in_its_own_file_with_why(tmp_path, capsys):
    write_revision(
        tmp_path,
        'op.drop_column("deliveries", "draft_url")',
        declarations='lint_exceptions = {"ban-drop-column": "unused since release 1.8 (0024)"}',
    )
    assert lint_with(tmp_path, capsys)[0] == 0

    write_revision(
        tmp_path,
        'op.drop_column("deliveries", "draft_url")',
        declarations='lint_exceptions = {"ban-drop-column": ""}',
    )
    status, output = lint_with(tmp_path, capsys)
    assert status == 1
    assert "lint_exceptions must map each rule to why" in output


def test_every_revision_renders_with_the_timeouts_first(tmp_path):
    write_revision(tmp_path, EXPAND_THE_INBOX)
    rendered = render_upgrades(config_with(tmp_path))

    for revision, sql in rendered.items():
        statements = [s.strip() for s in sql.split(";") if s.strip()]
        assert statements[1:3] == [
            "SET LOCAL lock_timeout = '4s'",
            "SET LOCAL statement_timeout = '5s'",
        ], revision
    assert "CREATE INDEX CONCURRENTLY" in rendered["9001"]


def test_exceptions_excuse_released_revisions_only_and_must_still_match():
    findings = [
        Finding("0007", "constraint-missing-not-valid", 3, "..."),
        Finding("9001", "constraint-missing-not-valid", 3, "..."),
    ]
    exceptions = {
        "0007": {"constraint-missing-not-valid": "released", "ban-drop-column": "released"},
        "9001": {"constraint-missing-not-valid": "a new revision cannot be excused"},
    }
    assert LAST_RELEASED_UNLINTED == "0023"

    left, stale = unexcused(findings, exceptions)

    assert left == [findings[1]]
    assert stale == ["revision 0007: exception for ban-drop-column matches no finding (remove it)"]
