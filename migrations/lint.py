"""The migration lint: squawk over the PostgreSQL SQL of every revision.

``python -m migrations.lint`` renders each revision's upgrade as Alembic's
offline mode writes it (``alembic upgrade PREV:REV --sql``: the SQL a
PostgreSQL server runs, with the timeouts env.py sets) and has squawk
(https://squawkhq.com, installed by ``ensure_squawk`` in scripts/lib.sh)
check it for statements that lock the ingress out or break the release
before it. Every rule applies to every new revision. The revisions released
up to 0023 were written before the lint; they cannot be rewritten, so their
findings are listed in :data:`RELEASED_EXCEPTIONS`, rule by rule, with why.
A new revision that breaks a rule on purpose -- the contract step dropping a
column a release before stopped using -- says so in its own file:
``lint_exceptions = {"ban-drop-column": "why"}``. An exception that no
longer matches a finding fails the lint too, so none hides more than it says.

Exit status 0 when clean, 1 on a finding, 2 when squawk is missing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from migrations import alembic_config

#: Where ensure_squawk (scripts/lib.sh) installs squawk; TASKHOOK_SQUAWK overrides.
DEFAULT_SQUAWK = Path(__file__).resolve().parent.parent / ".tools/node_modules/.bin/squawk"
#: The PostgreSQL the tests run on: squawk's advice depends on the version.
PG_VERSION = "15"
#: Only the dialect matters to offline mode: nothing connects.
RENDER_URL = "postgresql+psycopg://lint@localhost/lint"

_INT_IDS = (
    "integer keys and counters, as the models declare them (SQLite's INTEGER "
    "PRIMARY KEY AUTOINCREMENT on the other side)"
)
_SERIAL = "serial keys, as the models declare them (sqlite_autoincrement on the other side)"
_VARCHAR = "bounded String(n) columns, as the models declare them"
_NEW_TABLE_INDEX = "index on a table the same revision creates: empty, nothing to block"

#: The last revision released before the lint: no exception counts past it.
LAST_RELEASED_UNLINTED = "0023"

#: Findings of revisions released before the lint, per revision and rule,
#: with the reason each is accepted there.
RELEASED_EXCEPTIONS: dict[str, dict[str, str]] = {
    "0001": {
        "prefer-bigint-over-int": _INT_IDS,
        "prefer-identity": _SERIAL,
        "prefer-text-field": _VARCHAR,
    },
    "0002": {
        "prefer-bigint-over-int": _INT_IDS,
        "prefer-identity": _SERIAL,
        "prefer-text-field": _VARCHAR,
    },
    "0003": {
        "prefer-bigint-over-int": _INT_IDS,
        "prefer-identity": _SERIAL,
        "prefer-text-field": _VARCHAR,
    },
    "0004": {
        "prefer-bigint-over-int": _INT_IDS,
        "prefer-identity": _SERIAL,
        "prefer-text-field": _VARCHAR,
    },
    "0007": {
        "adding-foreign-key-constraint": (
            "task_events -> event_streams: validated in place, a short lock while "
            "the events table was small"
        ),
        "constraint-missing-not-valid": "the same foreign key, added valid at once",
    },
    "0008": {"prefer-bigint-over-int": _INT_IDS},
    "0009": {"prefer-bigint-over-int": _INT_IDS},
    "0010": {"prefer-bigint-over-int": _INT_IDS},
    "0011": {
        "require-concurrent-index-creation": (
            "blocks inbox inserts while it builds; its docstring tells the operator "
            "to build it CONCURRENTLY by hand first on a large inbox"
        ),
    },
    "0012": {
        "prefer-bigint-over-int": _INT_IDS,
        "prefer-identity": _SERIAL,
        "prefer-text-field": _VARCHAR,
    },
    "0013": {
        "prefer-bigint-over-int": _INT_IDS,
        "prefer-identity": _SERIAL,
        "prefer-text-field": _VARCHAR,
    },
    "0014": {
        "prefer-bigint-over-int": _INT_IDS,
        "prefer-text-field": _VARCHAR,
        "require-concurrent-index-creation": (
            "partial index on deliveries.catchup_run_id, a column the same revision "
            "adds: every row NULL, so the build reads the inbox but indexes nothing"
        ),
    },
    "0016": {"prefer-bigint-over-int": _INT_IDS},
    "0017": {
        "prefer-bigint-over-int": _INT_IDS,
        "prefer-identity": _SERIAL,
        "prefer-text-field": _VARCHAR,
    },
    "0018": {
        "prefer-bigint-over-int": _INT_IDS,
        "prefer-identity": _SERIAL,
        "prefer-text-field": _VARCHAR,
    },
    "0019": {
        "require-concurrent-index-creation": (
            "uniq_tasks_stable_key on tasks, built with the backfill that fills the "
            "column, in one transaction"
        ),
    },
    "0021": {"prefer-text-field": _VARCHAR},
    "0022": {"prefer-text-field": _VARCHAR},
    "0023": {
        "prefer-bigint-over-int": _INT_IDS,
        "prefer-identity": _SERIAL,
        "prefer-text-field": _VARCHAR,
    },
}


@dataclass(frozen=True)
class Finding:
    revision: str
    rule: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"revision {self.revision}, line {self.line}: {self.rule}: {self.message}"


class SquawkMissing(Exception):
    pass


def render_upgrades(config: Config | None = None) -> dict[str, str]:
    """Each revision's upgrade as PostgreSQL SQL, oldest first."""
    config = config or alembic_config()
    config.attributes["offline_url"] = RENDER_URL
    rendered = {}
    for script in reversed(list(ScriptDirectory.from_config(config).walk_revisions())):
        output = io.StringIO()
        config.output_buffer = output
        previous = script.down_revision
        if isinstance(previous, tuple):
            raise ValueError(f"revision {script.revision} merges {previous}: lint it by hand")
        span = f"{previous}:{script.revision}" if previous else script.revision
        command.upgrade(config, span, sql=True)
        rendered[script.revision] = output.getvalue()
    return rendered


def squawk_path() -> Path:
    path = Path(os.environ.get("TASKHOOK_SQUAWK") or DEFAULT_SQUAWK)
    if not os.access(path, os.X_OK):
        raise SquawkMissing(
            f"squawk not found at {path}: `source scripts/lib.sh && ensure_squawk` "
            "installs it (scripts/test does)"
        )
    return path


def squawk_findings(rendered: dict[str, str], squawk: Path) -> list[Finding]:
    """What squawk says of each revision's SQL, every rule on."""
    with tempfile.TemporaryDirectory(prefix="taskhook-lint-") as folder:
        paths = []
        for revision, sql in rendered.items():
            path = Path(folder) / f"{revision}.sql"
            path.write_text(sql)
            paths.append(str(path))
        result = subprocess.run(
            [str(squawk), "--reporter", "json", "--pg-version", PG_VERSION, *paths],
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode not in (0, 1) or not result.stdout.strip():
        raise RuntimeError(f"squawk failed (exit {result.returncode}): {result.stderr.strip()}")
    return [
        Finding(
            revision=Path(item["file"]).stem,
            rule=item["rule_name"],
            line=item["line"] + 1,
            message=item["message"],
        )
        for item in json.loads(result.stdout)
    ]


def unexcused(
    findings: Sequence[Finding],
    exceptions: dict[str, dict[str, str]],
    *,
    released_only: bool = True,
) -> tuple[list[Finding], list[str]]:
    """The findings no exception covers, and the exceptions nothing matched.
    In the central list (``released_only``) an exception for a revision after
    :data:`LAST_RELEASED_UNLINTED` covers nothing: a new revision excuses a
    finding in its own file, or not at all."""
    if released_only:
        exceptions = {r: rules for r, rules in exceptions.items() if r <= LAST_RELEASED_UNLINTED}
    left = [f for f in findings if f.rule not in exceptions.get(f.revision, {})]
    seen = {(f.revision, f.rule) for f in findings}
    stale = [
        f"revision {revision}: exception for {rule} matches no finding (remove it)"
        for revision, rules in exceptions.items()
        for rule in rules
        if (revision, rule) not in seen
    ]
    return left, stale


def declared_exceptions(config: Config | None = None) -> dict[str, dict[str, str]]:
    """What revisions excuse in their own file: ``lint_exceptions = {rule: why}``
    (the contract step of a change drops what a release before stopped using)."""
    script = ScriptDirectory.from_config(config or alembic_config())
    declared = {}
    for revision in script.walk_revisions():
        own = getattr(revision.module, "lint_exceptions", None)
        if own is None:
            continue
        if not isinstance(own, dict) or not all(
            isinstance(why, str) and why.strip() for why in own.values()
        ):
            raise ValueError(
                f"revision {revision.revision}: lint_exceptions must map each rule to why"
            )
        declared[revision.revision] = own
    return declared


def lint(config: Config | None = None) -> list[str]:
    """Every problem in the revisions' SQL; empty when clean."""
    config = config or alembic_config()
    rendered = render_upgrades(config)
    released, declared = RELEASED_EXCEPTIONS, declared_exceptions(config)
    findings = squawk_findings(rendered, squawk_path())
    left, stale = unexcused(findings, released)
    left, stale_declared = unexcused(left, declared, released_only=False)
    return [str(f) for f in left] + stale + stale_declared


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m migrations.lint", description=__doc__)
    parser.add_argument(
        "--extra-versions",
        metavar="FOLDER",
        help="lint the revisions in FOLDER too (tests: a revision that must fail)",
    )
    args = parser.parse_args(argv)
    config = alembic_config()
    if args.extra_versions:
        own = Path(__file__).resolve().parent / "versions"
        config.set_main_option("path_separator", "os")
        config.set_main_option(
            "version_locations",
            os.pathsep.join([str(own), str(Path(args.extra_versions).resolve())]),
        )
    try:
        problems = lint(config)
    except SquawkMissing as error:
        print(f"migration lint: {error}", file=sys.stderr)
        return 2
    except ValueError as error:  # a revision the lint cannot read as it should
        print(f"migration lint: {error}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"migration lint: {problem}", file=sys.stderr)
    if problems:
        print(
            "migration lint: see docs/deploy.md, 'Changing the schema', for the safe "
            "way to make each change",
            file=sys.stderr,
        )
        return 1
    print(
        "migration lint: clean (released revisions up to "
        f"{LAST_RELEASED_UNLINTED} with their listed exceptions)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
