"""``taskhook source catch-up`` and ``taskhook catch-up``: the credentials a
catch-up reads a provider with (never shown), and runs against the fake
GitHub and Jira APIs of bench/fakes."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from bench.fakes.github_api import FakeGitHub
from bench.fakes.gitlab_api import FakeGitLab
from bench.fakes.jira_api import FakeJira
from bench.fakes.server import Answer
from models.broker.messages import BACKGROUND_QUEUE, PROCESS_DELIVERIES
from models.db import session_scope
from models.sources import add_source
from models.tables import CatchUpRun, CatchUpSource
from tests.support.cli import FakeApp, as_json, refused, taskhook, usage_error
from tests.support.console import open_console
from tests.support.deliveries import FIXTURES
from tests.support.scenarios import SECRET, a_source
from tests.support.stores import Store

CATCH_UP_TOKEN = "ghp_cli_token_never_printed"


def _opened(number: int) -> dict[str, Any]:
    payload = json.loads((FIXTURES / "github" / "issues__opened.json").read_text())
    payload["issue"]["number"] = number
    return payload


@pytest.fixture
def github_log(store: Store) -> Iterator[FakeGitHub]:
    workspace = store.workspace()
    a_source(store, workspace.id)
    with FakeGitHub(token=CATCH_UP_TOKEN) as github:
        for number in (1, 2, 3):
            github.log_delivery(
                hook="repos/acme/widgets/hooks/77",
                event="issues",
                action="opened",
                payload=_opened(number),
                status_code=502,
            )
        yield github


def test_source_catch_up_takes_the_token_without_echo_and_never_shows_it(
    store: Store, github_log: FakeGitHub
):
    given = ("source", "catch-up", "acme-github", "--repo", "acme/widgets", "--hook-id", "77")
    result = taskhook(store, *given, "--api-url", github_log.base_url, input=f"{CATCH_UP_TOKEN}\n")

    assert result.exit_code == 0, result.output
    assert CATCH_UP_TOKEN not in result.output
    assert "taskhook catch-up github --source acme-github --dry-run" in result.stdout
    for listing in (("source", "list"), ("source", "list", "--json")):
        assert CATCH_UP_TOKEN not in taskhook(store, *listing).output


@pytest.mark.parametrize(
    "case",
    [
        ("--repo", "acme/widgets", "--org", "acme"),
        ("--repo", "not a repo"),
        ("--org", "acme", "--hook-id", "seven"),
        ("--org", "acme", "--api-url", "ftp://ghe.example"),
    ],
    ids=["two owners", "bad repo", "bad hook id", "bad api url"],
)
def test_source_catch_up_refuses_bad_values_and_stores_nothing(store: Store, case):
    workspace = store.workspace()
    a_source(store, workspace.id)
    result = taskhook(
        store, "source", "catch-up", "acme-github", *case, "--token-stdin", input="t\n"
    )
    assert usage_error(result)
    with session_scope(store.sessions) as session:
        assert session.get(CatchUpSource, 1) is None


def test_catch_up_github_dry_run_then_run_then_nothing_new(
    store: Store, github_log: FakeGitHub, celery: FakeApp
):
    taskhook(
        store,
        "source",
        "catch-up",
        "acme-github",
        "--repo",
        "acme/widgets",
        "--api-url",
        github_log.base_url,
        "--hook-id",
        "77",
        "--token-stdin",
        input=f"{CATCH_UP_TOKEN}\n",
    )
    run = ("catch-up", "github", "--source", "acme-github", "--json")

    dry = as_json(taskhook(store, *run, "--dry-run"))
    assert len(dry["missed"]) == 3 and dry["recovered"] == [] and celery.sent == []

    done = as_json(taskhook(store, *run))
    assert len(done["recovered"]) == 3
    # The three, committed together, share one worker message.
    assert celery.sent == [(PROCESS_DELIVERIES, [done["recovered"]], BACKGROUND_QUEUE)]

    again = as_json(taskhook(store, *run, "--since", "1d"))
    assert again["missed"] == [] and len(celery.sent) == 1
    people = taskhook(store, "catch-up", "github", "--source", "acme-github")
    assert "Missed creates" in people.stdout and CATCH_UP_TOKEN not in people.output


def test_catch_up_github_with_a_wrong_token_is_one_clear_line(store: Store, github_log: FakeGitHub):
    taskhook(
        store,
        "source",
        "catch-up",
        "acme-github",
        "--org",
        "acme",
        "--api-url",
        github_log.base_url,
        "--hook-id",
        "77",
        "--token-stdin",
        input="ghp_wrong_one\n",
    )
    line = refused(taskhook(store, "catch-up", "github", "--source", "acme-github"))
    assert line.startswith("Error: catch-up of acme-github stopped:")
    assert "ghp_wrong_one" not in line


#: A token as long as GitHub's, that the echoing GitHub below quotes back.
ECHOED_TOKEN = "ghp_EchoedByTheProvider0123456789abcdefXYZ"


class EchoingGitHub(FakeGitHub):
    """A GitHub whose 401 quotes the credential it refused: a prefix first, as
    a provider shortening it would, then all of it, placed so that a cut to
    200 characters falls inside it."""

    def _token_refusal(self, authorization: str) -> Answer | None:
        refusal = super()._token_refusal(authorization)
        if refusal is None:
            return None
        credential = authorization.partition(" ")[2]
        said = f"Bad credentials ({credential[:12]}...); "
        said += "x" * (185 - len(said)) + f" {credential} was refused"
        return Answer(401, {"message": said})


def _pieces(secret: str, size: int = 8) -> set[str]:
    return {secret[at : at + size] for at in range(len(secret) - size + 1)}


def test_a_provider_echoing_the_token_near_the_cut_leaves_no_piece_of_it_anywhere(
    store: Store,
):
    for console in open_console(store):
        with EchoingGitHub(token=CATCH_UP_TOKEN) as github:
            github.add_hook("repos/acme/widgets/hooks/77")
            taskhook(
                store,
                *("source", "catch-up", "acme-github", "--repo", "acme/widgets"),
                *("--hook-id", "77", "--api-url", github.base_url, "--token-stdin"),
                input=f"{ECHOED_TOKEN}\n",
            )
            line = refused(taskhook(store, "catch-up", "github", "--source", "acme-github"))
        with session_scope(store.sessions) as session:
            (stored,) = session.scalars(select(CatchUpRun.error)).all()
        console.sign_in("acme-member")
        overview = html.unescape(console.client.get("/console/").text)
        seen = {
            "the CLI's error": line,
            "the stored run": stored,
            "stats": taskhook(store, "stats").output,
            "stats --json": taskhook(store, "stats", "--json").output,
            "the console overview": overview,
        }
        assert "stopped: BadCredentials" in seen["stats"]
        assert "stopped: BadCredentials" in overview
        for where, text in seen.items():
            leaked = {piece for piece in _pieces(ECHOED_TOKEN) if piece in text}
            assert not leaked, f"{where} shows {sorted(leaked)}"
        assert "401 Bad credentials ([credential]" in line


class EscapingGitHub(FakeGitHub):
    """A GitHub whose refusal holds terminal escapes: a retitle and a clear screen."""

    def _token_refusal(self, authorization: str) -> Answer | None:
        refusal = super()._token_refusal(authorization)
        said = "Bad credentials \x1b]0;pwned\x07\x1b[2J"
        return None if refusal is None else Answer(401, {"message": said})


def test_a_providers_terminal_escapes_reach_no_terminal(store: Store):
    workspace = store.workspace()
    a_source(store, workspace.id)
    with EscapingGitHub(token=CATCH_UP_TOKEN) as github:
        github.add_hook("repos/acme/widgets/hooks/77")
        taskhook(
            store,
            *("source", "catch-up", "acme-github", "--repo", "acme/widgets"),
            *("--hook-id", "77", "--api-url", github.base_url, "--token-stdin"),
            input="ghp_wrong_one\n",
        )
        line = refused(taskhook(store, "catch-up", "github", "--source", "acme-github"))
    assert r"(401 Bad credentials \x1b]0;pwned\x07\x1b[2J)" in line
    for shown in (line, taskhook(store, "stats").output, taskhook(store, "stats", "--json").output):
        assert "\x1b" not in shown and "\x07" not in shown


def test_catch_up_github_since_must_be_a_duration_or_a_date(store: Store):
    line = usage_error(taskhook(store, "catch-up", "github", "--source", "x", "--since", "soon"))
    assert "neither a duration" in line


def test_catch_up_of_a_source_without_log_access_says_how_to_give_it(store: Store):
    workspace = store.workspace()
    a_source(store, workspace.id)
    line = refused(taskhook(store, "catch-up", "github", "--source", "acme-github"))
    assert "taskhook source catch-up acme-github --repo OWNER/REPO" in line


def _app_key_file(tmp_path: Path) -> tuple[Path, Any]:
    """A throwaway GitHub App private key, written as GitHub hands it out (PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "app.private-key.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return path, key


def test_source_catch_up_of_an_app_reads_its_hook_with_a_jwt_and_never_shows_the_key(
    store: Store, github_log: FakeGitHub, celery: FakeApp, tmp_path: Path
):
    import jwt

    key_file, key = _app_key_file(tmp_path)
    for number in (4, 5):
        github_log.log_delivery(
            hook="app/hook", event="issues", action="opened", payload=_opened(number)
        )
    given = ("source", "catch-up", "acme-github", "--app-id", "4200")
    result = taskhook(
        store, *given, "--private-key-file", str(key_file), "--api-url", github_log.base_url
    )

    assert result.exit_code == 0, result.output
    assert "GitHub App 4200's own hook" in result.stdout
    key_line = key_file.read_text().splitlines()[1]
    assert key_line not in result.output
    done = as_json(taskhook(store, "catch-up", "github", "--source", "acme-github", "--json"))
    assert len(done["recovered"]) == 2  # the App's hook, not the repository's
    assert key_line not in json.dumps(done)
    jwt.decode(github_log.app_jwts[0], key.public_key(), algorithms=["RS256"], issuer="4200")
    for listing in (("source", "list"), ("source", "list", "--json")):
        assert key_line not in taskhook(store, *listing).output


@pytest.mark.parametrize(
    "case",
    ["not a key", "missing file", "bad app id", "no key", "and a repo", "and a token", "hook id"],
)
def test_source_catch_up_of_an_app_refuses_bad_values_and_stores_nothing(
    store: Store, tmp_path: Path, case: str
):
    workspace = store.workspace()
    a_source(store, workspace.id)
    key_file, _ = _app_key_file(tmp_path)
    broken = tmp_path / "broken.pem"
    secret_line = key_file.read_text().splitlines()[1]
    broken.write_text(key_file.read_text().replace(secret_line, secret_line[::-1]))
    app = ("--app-id", "4200", "--private-key-file", str(key_file))
    args = {
        "not a key": ("--app-id", "4200", "--private-key-file", str(broken)),
        "missing file": ("--app-id", "4200", "--private-key-file", str(tmp_path / "none.pem")),
        "bad app id": ("--app-id", "Iv1.abc", "--private-key-file", str(key_file)),
        "no key": ("--app-id", "4200"),
        "and a repo": (*app, "--repo", "acme/widgets"),
        "and a token": (*app, "--token-stdin"),
        "hook id": (*app, "--hook-id", "77"),
    }[case]

    result = taskhook(store, "source", "catch-up", "acme-github", *args, input="t\n")

    assert usage_error(result)
    assert secret_line not in result.output and secret_line[::-1] not in result.output
    with session_scope(store.sessions) as session:
        assert session.get(CatchUpSource, 1) is None


def _with_token(store: Store, github: FakeGitHub, *owner: str) -> None:
    given = ("source", "catch-up", "acme-github", *(owner or ("--repo", "acme/widgets")))
    result = taskhook(
        store,
        *given,
        "--hook-id",
        "77",
        "--api-url",
        github.base_url,
        "--token-stdin",
        input=f"{CATCH_UP_TOKEN}\n",
    )
    assert result.exit_code == 0, result.output


def test_catch_up_github_scan_stores_each_item_once_however_often_it_runs(
    store: Store, github_log: FakeGitHub, celery: FakeApp
):
    _with_token(store, github_log)
    for number in (1, 2, 3, 4):
        github_log.open_issue("acme/widgets", title=f"Opened long ago, #{number}")
    scan = ("catch-up", "github", "--source", "acme-github", "--scan", "--since", "2026-11-01")

    done = as_json(taskhook(store, *scan, "--json"))
    assert done["kind"] == "scan" and len(done["recovered"]) == 4
    assert done["missed"][0] == "scan:gh-issue/acme/widgets#1"
    assert celery.sent == [(PROCESS_DELIVERIES, [done["recovered"]], BACKGROUND_QUEUE)]

    again = taskhook(store, *scan)
    assert again.exit_code == 0, again.output
    assert "GitHub's issues and pull requests" in again.stdout
    assert "Missed creates" in again.stdout and len(celery.sent) == 1
    stats = taskhook(store, "stats").stdout
    assert "Last catch-up of acme-github (scan)" in stats
    assert CATCH_UP_TOKEN not in again.output + stats


def test_catch_up_github_scan_of_an_organization_hook_names_its_repository(
    store: Store, github_log: FakeGitHub, celery: FakeApp
):
    _with_token(store, github_log, "--org", "acme")
    github_log.open_issue("acme/widgets", title="One")
    scan = ("catch-up", "github", "--source", "acme-github", "--scan", "--since", "3d")
    line = refused(taskhook(store, *scan))
    assert "name the repository to scan (--repo OWNER/REPO)" in line
    done = taskhook(store, *scan, "--repo", "acme/widgets")
    assert done.exit_code == 0, done.output
    assert "the source is not covered by it" in done.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--scan", "--redeliver"), "a --scan reads no log"),
        (("--repo", "acme/widgets"), "--repo names the repository a --scan lists"),
        (("--scan", "--repo", "not a repo"), "OWNER/REPO"),
    ],
    ids=["scan and redeliver", "repo without scan", "bad repo"],
)
def test_catch_up_github_scan_options_that_do_not_fit_are_usage_errors(store: Store, args, says):
    line = usage_error(taskhook(store, "catch-up", "github", "--source", "x", *args))
    assert says in line


JIRA_EMAIL, JIRA_TOKEN = "ops@acme.example", "ATATT3x-cli-jira-token-never-printed"


@pytest.fixture
def jira_site(store: Store) -> Iterator[FakeJira]:
    workspace = store.workspace()
    with FakeJira(email=JIRA_EMAIL, api_token=JIRA_TOKEN, pat=JIRA_TOKEN) as jira:
        with session_scope(store.sessions) as session:
            add_source(
                session=session,
                provider="jira",
                workspace_id=workspace.id,
                slug="acme-jira",
                secret=SECRET,
                create_events=["jira:issue_created"],
                site_url=jira.base_url,
            )
        for number in (1, 2, 3):
            jira.create_issue(summary=f"Opened while we were down, #{number}")
        yield jira


@pytest.mark.parametrize("access", [("--email", JIRA_EMAIL), ("--pat",)], ids=["cloud", "pat"])
def test_catch_up_jira_searches_the_site_and_stores_each_issue_once(
    store: Store, jira_site: FakeJira, celery: FakeApp, access
):
    given = taskhook(store, "source", "catch-up", "acme-jira", *access, input=f"{JIRA_TOKEN}\n")
    assert given.exit_code == 0, given.output
    assert "taskhook catch-up jira --source acme-jira --dry-run" in given.stdout
    run = ("catch-up", "jira", "--source", "acme-jira")

    dry = as_json(taskhook(store, *run, "--dry-run", "--json"))
    assert dry["missed"] == [f"scan:jira:PROJ-{n}" for n in (1, 2, 3)] and celery.sent == []
    done = as_json(taskhook(store, *run, "--json"))
    assert done["kind"] == "search" and len(done["recovered"]) == 3
    assert celery.sent == [(PROCESS_DELIVERIES, [done["recovered"]], BACKGROUND_QUEUE)]
    again = taskhook(store, *run)
    assert again.exit_code == 0 and "Jira's issue search" in again.stdout
    assert len(celery.sent) == 1
    stats = taskhook(store, "stats").stdout
    assert "Last catch-up of acme-jira (Jira search)" in stats
    for output in (given.output, dry, done, again.output, stats):
        assert JIRA_TOKEN not in str(output)


def test_catch_up_jira_with_a_wrong_token_is_one_clear_line(store: Store, jira_site: FakeJira):
    taskhook(store, "source", "catch-up", "acme-jira", "--email", JIRA_EMAIL, input="wrong-token\n")
    line = refused(taskhook(store, "catch-up", "jira", "--source", "acme-jira"))
    assert line.startswith("Error: catch-up of acme-jira stopped: Jira rejected")
    assert "wrong-token" not in line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--email", "ops@acme.example", "--pat"), "one of them"),
        (("--jql", "project = PROJ"), "one of them"),
        (("--email", "not an email"), "not an email address"),
        (("--pat", "--jql", "project = PROJ ORDER BY key"), "ORDER BY"),
        (("--pat", "--site", "ftp://jira.example"), "http(s) URL"),
        (("--pat", "--repo", "acme/widgets"), "for a Jira source"),
    ],
    ids=["both", "neither", "bad email", "order by", "bad site", "and a repo"],
)
def test_source_catch_up_of_jira_refuses_bad_values_and_stores_nothing(
    store: Store, jira_site: FakeJira, args, says
):
    result = taskhook(store, "source", "catch-up", "acme-jira", *args, input="t\n")
    assert says in usage_error(result)
    with session_scope(store.sessions) as session:
        assert session.get(CatchUpSource, 1) is None


def test_catch_up_jira_of_a_github_source_says_which_it_is(store: Store, github_log: FakeGitHub):
    line = refused(taskhook(store, "catch-up", "jira", "--source", "acme-github"))
    assert "is a github source, not Jira's" in line
    given = taskhook(store, "source", "catch-up", "acme-github", "--pat", input="t\n")
    assert "this access is for a Jira site" in refused(given)


GITLAB_TOKEN = "glpat-cli-token-never-printed"


@pytest.fixture
def gitlab_project(store: Store) -> Iterator[FakeGitLab]:
    workspace = store.workspace()
    with session_scope(store.sessions) as session:
        add_source(
            session=session,
            provider="gitlab",
            workspace_id=workspace.id,
            slug="acme-gitlab",
            secret=SECRET,
            create_events=["Issue Hook.open", "Merge Request Hook.open"],
        )
    with FakeGitLab(token=GITLAB_TOKEN) as gitlab:
        gitlab.add_project("acme/widgets")
        for _ in range(2):
            gitlab.create_issue("acme/widgets")
        gitlab.create_merge_request("acme/widgets")
        yield gitlab


def test_catch_up_gitlab_scans_the_project_and_stores_each_item_once(
    store: Store, gitlab_project: FakeGitLab, celery: FakeApp
):
    given = taskhook(
        store,
        "source",
        "catch-up",
        "acme-gitlab",
        "--project",
        "acme/widgets",
        "--site",
        gitlab_project.base_url,
        input=f"{GITLAB_TOKEN}\n",
    )
    assert given.exit_code == 0, given.output
    assert "Then: taskhook catch-up gitlab --source acme-gitlab --dry-run" in given.stdout
    run = ("catch-up", "gitlab", "--source", "acme-gitlab")

    dry = as_json(taskhook(store, *run, "--dry-run", "--json"))
    assert len(dry["missed"]) == 3 and celery.sent == []
    done = as_json(taskhook(store, *run, "--json"))
    assert done["kind"] == "gitlab" and len(done["recovered"]) == 3
    again = taskhook(store, *run)
    assert again.exit_code == 0 and "GitLab's hook events, then its issues" in again.stdout
    assert "Hook events listed" in again.stdout and "no hook id set" in again.stdout
    stats = taskhook(store, "stats").stdout
    assert "Last catch-up of acme-gitlab (GitLab hook events and scan)" in stats
    for output in (given.output, dry, done, again.output, stats):
        assert GITLAB_TOKEN not in str(output)


def test_catch_up_gitlab_with_a_wrong_token_is_one_clear_line(
    store: Store, gitlab_project: FakeGitLab
):
    taskhook(
        store,
        "source",
        "catch-up",
        "acme-gitlab",
        "--group",
        "acme",
        "--site",
        gitlab_project.base_url,
        input="glpat-wrong\n",
    )
    line = refused(taskhook(store, "catch-up", "gitlab", "--source", "acme-gitlab"))
    assert line.startswith("Error: catch-up of acme-gitlab stopped: GitLab rejected the token")
    assert "glpat-wrong" not in line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--project", "a/b", "--group", "a"), "a project's (--project) or a group's"),
        (("--project", "not a path"), "numeric id or its full path"),
        (("--project", "a/b", "--repo", "acme/widgets"), "for a GitLab source"),
        (("--group", "acme", "--site", "ftp://gitlab.example"), "http(s) URL"),
    ],
    ids=["both", "bad path", "and a repo", "bad site"],
)
def test_source_catch_up_of_gitlab_refuses_bad_values_and_stores_nothing(
    store: Store, gitlab_project: FakeGitLab, args, says
):
    result = taskhook(store, "source", "catch-up", "acme-gitlab", *args, input="t\n")
    assert says in usage_error(result)
    with session_scope(store.sessions) as session:
        assert session.get(CatchUpSource, 1) is None


def test_catch_up_github_of_a_gitlab_source_says_which_it_is_and_gitlab_needs_access(
    store: Store, gitlab_project: FakeGitLab
):
    line = refused(taskhook(store, "catch-up", "github", "--source", "acme-gitlab"))
    assert "is a gitlab source, not GitHub's" in line
    line = refused(taskhook(store, "catch-up", "gitlab", "--source", "acme-gitlab"))
    assert "taskhook source catch-up acme-gitlab --project ID (or --group ID)" in line
    line = refused(taskhook(store, "catch-up", "gitlab", "--source", "nobody"))
    assert line == "Error: no webhook source named 'nobody'"
