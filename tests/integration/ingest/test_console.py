"""The console over HTTP, on SQLite and PostgreSQL: sign-in and sessions, who
may act, CSRF, the security headers, escaping, and each action's effect in
the store. The same pages in a real browser: tests/e2e/test_console.py."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select, text

from ingest.console import pages as console_pages
from ingest.console.pages import web_link
from models.db import session_scope
from models.operations import list_operations
from models.sources import add_source, pause_source
from models.tables import ConsoleSession, IngressHeartbeat, SourceSecret, WebhookSource, utcnow
from models.tokens import issue_token
from tests.support.console import Console, csrf_of, open_console
from tests.support.runs import deleted_before_it_settled
from tests.support.scenarios import a_backlog
from tests.support.stores import Store

XSS_TITLE = "<script>alert(1)</script><img src=x onerror=alert(2)>"
TEMPLATES = Path(__file__).resolve().parents[3] / "ingest" / "console" / "templates"


# --- signing in -----------------------------------------------------------------------------


def test_a_wrong_token_is_refused_and_starts_no_session(console: Console) -> None:
    form = console.client.get("/console/sign-in")
    answer = console.client.post(
        "/console/sign-in", data={"token": "th_not-a-token", "csrf": csrf_of(form.text)}
    )
    assert answer.status_code == 401
    assert "not valid" in answer.text
    assert "taskhook_session" not in answer.headers.get("set-cookie", "")
    assert console.store.scalar("SELECT count(*) FROM console_sessions") == 0


def test_a_sign_in_form_from_elsewhere_is_refused(console: Console) -> None:
    console.client.get("/console/sign-in")
    answer = console.client.post(
        "/console/sign-in", data={"token": console.tokens["acme-operator"], "csrf": "forged"}
    )
    assert answer.status_code == 403
    assert console.store.scalar("SELECT count(*) FROM console_sessions") == 0


def test_the_session_cookie_is_http_only_strict_and_expires(console: Console) -> None:
    form = console.client.get("/console/sign-in")
    answer = console.client.post(
        "/console/sign-in",
        data={"token": console.tokens["acme-member"], "csrf": csrf_of(form.text)},
        follow_redirects=False,
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/console/"
    cookie = next(c for c in answer.headers.get_list("set-cookie") if "taskhook_session=" in c)
    flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "max-age", "expires", "path"} <= flags
    assert "samesite=strict" in cookie.lower()
    assert "secure" not in flags  # plain http here
    # The token never reaches a cookie or a page.
    assert console.tokens["acme-member"] not in answer.headers.get("set-cookie", "")


def test_over_https_the_cookie_is_secure(store: Store) -> None:
    for console in open_console(store):
        https = TestClient(console.client.app, base_url="https://testserver")
        form = https.get("/console/sign-in")
        answer = https.post(
            "/console/sign-in",
            data={"token": console.tokens["acme-member"], "csrf": csrf_of(form.text)},
            follow_redirects=False,
        )
        cookie = next(c for c in answer.headers.get_list("set-cookie") if "taskhook_session=" in c)
        assert "secure" in {part.strip().lower() for part in cookie.split(";")}


def test_a_signed_out_browser_is_sent_to_sign_in_and_back(console: Console) -> None:
    answer = console.client.get("/console/deliveries?status=dead", follow_redirects=False)
    assert answer.status_code == 303
    assert (
        answer.headers["location"]
        == "/console/sign-in?next=%2Fconsole%2Fdeliveries%3Fstatus%3Ddead"
    )


def test_signing_in_never_sends_the_browser_to_another_site(console: Console) -> None:
    form = console.client.get("/console/sign-in")
    answer = console.client.post(
        "/console/sign-in",
        data={
            "token": console.tokens["acme-member"],
            "csrf": csrf_of(form.text),
            "next": "//evil.example/console/",
        },
        follow_redirects=False,
    )
    assert answer.headers["location"] == "/console/"


def test_signing_out_ends_the_session(console: Console) -> None:
    csrf = console.sign_in("acme-member")
    key = console.client.cookies["taskhook_session"]
    answer = console.post("/console/sign-out", csrf)
    assert answer.status_code == 303
    assert console.store.scalar("SELECT count(*) FROM console_sessions") == 0
    console.client.cookies.set("taskhook_session", key)  # the old cookie, kept by someone
    assert console.client.get("/console/", follow_redirects=False).status_code == 303


def test_a_revoked_tokens_session_ends(console: Console) -> None:
    console.sign_in("acme-member")
    with session_scope(console.store.sessions) as session:
        session.execute(text("UPDATE api_tokens SET revoked_at = created_at"))
    assert console.client.get("/console/", follow_redirects=False).status_code == 303
    with console.store.sessions() as session:
        assert session.scalars(select(ConsoleSession)).all() == []


# --- who may act ------------------------------------------------------------------------


def test_a_member_sees_every_view_but_no_action(console: Console) -> None:
    delivery = console.deliver()
    console.kill(delivery)
    console.sign_in("acme-member")
    for path in [
        "/console/",
        "/console/deliveries",
        f"/console/deliveries/{delivery}",
        "/console/tasks?workspace=acme&external_id=gh-issue/Codertocat/Hello-World%231",
        "/console/sources",
        "/console/tokens",
        "/console/operations",
    ]:
        page = console.client.get(path)
        assert page.status_code == 200, (path, page.text)
        for action in (
            'id="replay"',
            'id="dry-run"',
            'id="release"',
            'class="rotate"',
            'class="revoke"',
        ):
            assert action not in page.text, (path, action)


def test_a_member_cannot_replay(console: Console) -> None:
    delivery = console.deliver()
    console.kill(delivery)
    csrf = console.sign_in("acme-member")
    answer = console.post(f"/console/deliveries/{delivery}/replay", csrf)
    assert answer.status_code == 403
    assert "operator" in answer.text
    assert console.status_of(delivery) == "dead"


def test_an_action_without_the_sessions_csrf_token_is_refused(console: Console) -> None:
    delivery = console.deliver()
    console.kill(delivery)
    console.sign_in("acme-operator")
    for csrf in (None, "forged"):
        answer = console.post(f"/console/deliveries/{delivery}/replay", csrf)
        assert answer.status_code == 403
    assert console.status_of(delivery) == "dead"


def test_an_action_from_another_origin_is_refused(console: Console) -> None:
    delivery = console.deliver()
    console.kill(delivery)
    csrf = console.sign_in("acme-operator")
    answer = console.client.post(
        f"/console/deliveries/{delivery}/replay",
        data={"csrf": csrf},
        headers={"Origin": "https://evil.example"},
        follow_redirects=False,
    )
    assert answer.status_code == 403
    assert console.status_of(delivery) == "dead"


def test_no_get_takes_an_action(console: Console) -> None:
    """Every route that acts answers POST only; a GET of it changes nothing."""
    # The sign-in form's GET only shows the form.
    acting = [
        route
        for route in console_pages.router.routes
        if "POST" in route.methods and route.path != "/console/sign-in"
    ]
    assert len(acting) >= 8
    console.sign_in("acme-operator")
    for route in acting:
        assert "GET" not in route.methods, route.path
        path = route.path
        for placeholder in ("{delivery_id:int}", "{token_id:int}", "{merge_id:int}"):
            path = path.replace(placeholder, "1")
        answer = console.client.get(path.replace("{slug}", "acme-github"), follow_redirects=False)
        assert answer.status_code == 405, route.path


def test_an_operator_replays_a_delivery(console: Console) -> None:
    delivery = console.deliver()
    console.kill(delivery)
    console.published.clear()
    csrf = console.sign_in("acme-operator")
    answer = console.post(f"/console/deliveries/{delivery}/replay", csrf)
    assert answer.status_code == 303
    assert console.status_of(delivery) == "queued"
    assert "queued again" in console.client.get(answer.headers["location"]).text


def test_another_workspaces_delivery_answers_not_found(console: Console) -> None:
    delivery = console.deliver()
    console.kill(delivery)
    csrf = console.sign_in("globex-operator")
    assert console.client.get(f"/console/deliveries/{delivery}").status_code == 404
    assert console.post(f"/console/deliveries/{delivery}/replay", csrf).status_code == 404
    assert console.status_of(delivery) == "dead"
    page = console.client.get("/console/deliveries")
    assert f'data-delivery-id="{delivery}"' not in page.text


# --- safety ---------------------------------------------------------------------------------


def test_every_console_response_forbids_inline_script(console: Console) -> None:
    console.sign_in("acme-member")
    for path in ["/console/sign-in", "/console/", "/console/deliveries", "/console/no-such-page"]:
        answer = console.client.get(path)
        policy = answer.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        assert "frame-ancestors 'none'" in policy
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["cache-control"] == "no-store"


def test_the_templates_hold_no_inline_script_or_handler() -> None:
    for template in TEMPLATES.glob("*.html"):
        source = template.read_text()
        for tag in re.findall(r"<script\b[^>]*>", source):
            assert "src=" in tag or 'type="application/json"' in tag, (template.name, tag)
        assert not re.search(r"\son[a-z]+\s*=", source), template.name
        assert not re.search(r"\sstyle\s*=", source), template.name
        assert "|safe" not in source.replace(" ", ""), template.name


def test_webhook_text_is_shown_as_text(console: Console) -> None:
    delivery = console.deliver(title=XSS_TITLE)
    console.sign_in("acme-operator")
    page = console.client.get(f"/console/deliveries/{delivery}").text
    assert "<script>alert(1)" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_task_title_is_shown_as_text(console: Console) -> None:
    created = console.client.post(
        "/api/v1/tasks",
        json={"workspace_id": console.acme, "title": XSS_TITLE, "external_id": "jira:XSS-1"},
        headers={"Authorization": f"Bearer {console.tokens['acme-operator']}"},
    )
    assert created.status_code == 200, created.text
    console.sign_in("acme-member")
    page = console.client.get("/console/tasks?workspace=acme&external_id=jira:XSS-1").text
    assert "<script>alert(1)" not in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page


def test_only_web_links_become_links() -> None:
    assert web_link("https://github.com/o/r/issues/1") == "https://github.com/o/r/issues/1"
    for url in ("javascript:alert(1)", "data:text/html,x", "JaVaScRiPt:alert(1)", "", None):
        assert web_link(url) == ""


# --- the event stream and CORS -------------------------------------------------------------


def test_the_event_stream_takes_the_session_cookie(console: Console) -> None:
    url = f"/api/v1/workspaces/{console.acme}/events"
    assert console.client.get(url).status_code == 401
    console.sign_in("acme-member")
    assert console.client.get(url).status_code == 200
    assert console.client.get(f"/api/v1/workspaces/{console.globex}/events").status_code == 404


def test_nothing_else_in_the_api_takes_the_cookie(console: Console) -> None:
    console.sign_in("acme-operator")
    answer = console.client.post(
        "/api/v1/tasks", json={"workspace_id": console.acme, "title": "by cookie"}
    )
    assert answer.status_code == 401
    assert console.store.scalar("SELECT count(*) FROM tasks") == 0


def test_cors_is_closed_unless_origins_are_listed(console: Console) -> None:
    preflight = console.client.options(
        "/api/v1/tasks",
        headers={"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers
    answer = console.client.get("/healthz", headers={"Origin": "https://app.example.com"})
    assert "access-control-allow-origin" not in answer.headers


def test_a_listed_origin_may_call_the_api(store: Store) -> None:
    for console in open_console(store, cors_origins=["https://app.example.com"]):
        preflight = console.client.options(
            f"/api/v1/workspaces/{console.acme}/events",
            headers={
                "Origin": "https://app.example.com",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "authorization, last-event-id",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://app.example.com"
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        other = console.client.options(
            "/api/v1/tasks",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in other.headers


# --- deliveries, bulk replay ---------------------------------------------------------------


def test_filtering_and_searching_deliveries(console: Console) -> None:
    first, second = console.deliver(number=1), console.deliver(number=2)
    console.kill(second)
    console.sign_in("acme-member")
    dead = console.client.get("/console/deliveries?status=dead").text
    assert f'data-delivery-id="{second}"' in dead and f'data-delivery-id="{first}"' not in dead
    found = console.client.get("/console/deliveries?q=console-1").text
    assert f'data-delivery-id="{first}"' in found and f'data-delivery-id="{second}"' not in found
    by_external_id = console.client.get(
        "/console/deliveries", params={"q": "gh-issue/Codertocat/Hello-World#2"}
    ).text
    assert f'data-delivery-id="{second}"' in by_external_id
    assert f'data-delivery-id="{first}"' not in by_external_id


def test_a_bad_filter_is_a_clear_400(console: Console) -> None:
    console.sign_in("acme-member")
    for query in ("status=nonsense", "since=yesterday", "before=x"):
        answer = console.client.get(f"/console/deliveries?{query}")
        assert answer.status_code == 400, query
        assert 'class="error"' in answer.text


def test_bulk_replay_counts_first_then_runs_named(console: Console) -> None:
    deliveries = [console.deliver(number=n) for n in range(1, 4)]
    console.kill(*deliveries[:2])
    console.published.clear()
    csrf = console.sign_in("acme-operator")
    dry = console.post("/console/replays/dry-run", csrf, status="dead")
    assert dry.status_code == 200
    assert re.search(r'id="dry-run-count">2<', dry.text)
    assert [console.status_of(d) for d in deliveries[:2]] == ["dead", "dead"]
    run = console.post(
        "/console/replays", csrf_of(dry.text), status="dead", expected="2", name="after the outage"
    )
    assert run.status_code == 303 and run.headers["location"].startswith("/console/operations")
    assert [console.status_of(d) for d in deliveries[:2]] == ["queued", "queued"]
    history = console.client.get("/console/operations").text
    assert "after the outage" in history and "acme-operator" in history
    assert console.store.scalar("SELECT matched FROM operations WHERE kind = 'bulk-replay'") == 2


def test_bulk_replay_leaves_out_a_create_whose_task_was_deleted_unless_ticked(
    console: Console,
) -> None:
    parked = console.deliver(number=1)
    deleted_before_it_settled(console.store, parked)
    dead = console.deliver(number=2)
    console.kill(dead)
    csrf = console.sign_in("acme-operator")

    dry = console.post("/console/replays/dry-run", csrf)
    run = console.post("/console/replays", csrf_of(dry.text), expected="1", name="outage")
    statuses_after_run = [console.status_of(d) for d in (parked, dead)]
    ticked = console.post(
        "/console/replays", csrf, name="TES-41 should exist", recreate=str(parked)
    )
    wrong = console.post("/console/replays", csrf, name="typo", recreate="12a")

    assert re.search(r'id="dry-run-count">1<', dry.text)
    assert re.search(r'id="task-deleted-count">1<', dry.text)
    assert f'<input type="checkbox" name="recreate" value="{parked}">' in dry.text
    assert run.status_code == 303 and statuses_after_run == ["needs_operator", "queued"]
    assert ticked.status_code == 303 and console.status_of(parked) == "queued"
    with console.store.sessions() as session:
        history = {
            o.name: o.criteria for o in list_operations(session=session, kinds=["bulk-replay"])
        }
    assert history == {"outage": {}, "TES-41 should exist": {"recreate": [parked]}}
    assert wrong.status_code == 400 and "is not a delivery&#39;s id" in wrong.text


def test_a_delivery_page_says_what_replaying_it_will_do(console: Console) -> None:
    parked = console.deliver()
    deleted = deleted_before_it_settled(console.store, parked)
    console.sign_in("acme-operator")

    page = console.client.get(f"/console/deliveries/{parked}").text

    plan = re.search(r'id="replay-plan">([^<]*)<', page).group(1)
    assert plan.startswith(f"Replaying: its task (id {deleted}) was deleted on ")
    assert plan.endswith(
        "before its creation settled: replaying creates a new task for "
        "&#39;gh-issue/Codertocat/Hello-World#1&#39;."
    )
    assert re.search(r'id="replay-warning">someone deleted that task: replay only if', page)


def test_a_bulk_replay_needs_a_name(console: Console) -> None:
    delivery = console.deliver()
    console.kill(delivery)
    csrf = console.sign_in("acme-operator")
    answer = console.post("/console/replays", csrf, status="dead", name="  ")
    assert answer.status_code == 400
    assert console.status_of(delivery) == "dead"


# --- release, sources, tokens --------------------------------------------------------------


def _task(console: Console, external_id: str = "jira:REL-1") -> dict:
    created = console.client.post(
        "/api/v1/tasks",
        json={"workspace_id": console.acme, "title": "Held", "external_id": external_id},
        headers={"Authorization": f"Bearer {console.tokens['acme-operator']}"},
    )
    assert created.status_code == 200, created.text
    return created.json()


def test_release_needs_the_right_holder_a_reason_and_the_typed_id(console: Console) -> None:
    held = _task(console)
    csrf = console.sign_in("acme-operator")
    release = {"workspace": "acme", "external_id": "jira:REL-1", "reason": "abandoned"}
    wrong = console.post(
        "/console/tasks/release", csrf, **release, expected_holder="ACME-99", confirm="jira:REL-1"
    )
    assert wrong.status_code == 400 and 'class="error"' in wrong.text
    untyped = console.post(
        "/console/tasks/release", csrf, **release, expected_holder=held["identifier"], confirm="x"
    )
    assert untyped.status_code == 400
    no_reason = console.post(
        "/console/tasks/release",
        csrf,
        **(release | {"reason": " "}),
        expected_holder=held["identifier"],
        confirm="jira:REL-1",
    )
    assert no_reason.status_code == 400
    assert console.store.scalar("SELECT count(*) FROM identity_releases") == 0
    done = console.post(
        "/console/tasks/release",
        csrf,
        **release,
        expected_holder=held["identifier"],
        confirm="jira:REL-1",
    )
    assert done.status_code == 200 and 'class="notice"' in done.text
    assert console.store.scalar("SELECT operator FROM identity_releases") == "acme-operator"


def test_the_task_page_shows_who_deleted_a_former_holder(console: Console) -> None:
    held = _task(console, "jira:DEL-1")
    deleted = console.client.delete(
        f"/api/v1/tasks/{held['id']}",
        headers={"Authorization": f"Bearer {console.tokens['acme-member']}"},
    )
    assert deleted.status_code == 204
    console.sign_in("acme-operator")
    page = console.client.get("/console/tasks?workspace=acme&external_id=jira:DEL-1")
    assert page.status_code == 200
    deletes = page.text[page.text.index('id="deletions"') :]
    deletes = deletes[: deletes.index("</table>")]
    assert f"task {held['id']}" in deletes
    assert '<td class="operator">acme-member (member)</td>' in deletes


def test_release_by_another_holder_is_a_conflict(console: Console) -> None:
    first = _task(console, "jira:REL-2")
    other = _task(console, "jira:REL-3")
    csrf = console.sign_in("acme-operator")
    answer = console.post(
        "/console/tasks/release",
        csrf,
        workspace="acme",
        external_id="jira:REL-2",
        reason="abandoned",
        expected_holder=other["identifier"],
        confirm="jira:REL-2",
    )
    assert answer.status_code == 409
    assert first["identifier"] in answer.text
    assert console.store.scalar("SELECT count(*) FROM identity_releases") == 0


def test_rotating_a_secret_shows_it_once_then_finishes(console: Console) -> None:
    csrf = console.sign_in("acme-operator")
    rotated = console.post("/console/sources/acme-github/rotate-secret", csrf)
    assert rotated.status_code == 200
    secret = re.search(r'id="new-secret">([^<]+)<', rotated.text).group(1)
    with console.store.sessions() as session:
        stored = session.scalars(select(SourceSecret.secret)).all()
    assert secret in stored
    assert secret not in console.client.get("/console/sources").text
    assert "rotating" in console.client.get("/console/sources").text
    finished = console.post(
        "/console/sources/acme-github/finish-rotation", csrf, confirm="acme-github"
    )
    assert finished.status_code == 303
    assert "rotating" not in console.client.get("/console/sources").text


def test_finishing_a_rotation_needs_the_sources_name_typed(console: Console) -> None:
    csrf = console.sign_in("acme-operator")
    console.post("/console/sources/acme-github/rotate-secret", csrf)
    page = console.client.get("/console/sources").text
    untyped = console.post("/console/sources/acme-github/finish-rotation", csrf)
    mistyped = console.post(
        "/console/sources/acme-github/finish-rotation", csrf, confirm="globex-github"
    )
    foreign = console.post(
        "/console/sources/globex-github/finish-rotation", csrf, confirm="globex-github"
    )

    form = re.search(r'<form class="finish-rotation".*?</form>', page, re.S).group(0)
    assert 'name="confirm" required' in form and "refused (401)" in form
    for refused in (untyped, mistyped):
        assert refused.status_code == 400
        assert "Type the source&#39;s name (acme-github) to confirm" in refused.text
        assert 'id="sources"' in refused.text  # the sources page, with the refusal on it
    assert foreign.status_code == 404
    assert console.store.scalar("SELECT count(*) FROM source_secrets WHERE retired_at IS NULL") == 3


def test_another_workspaces_source_cannot_be_rotated(console: Console) -> None:
    csrf = console.sign_in("acme-operator")
    answer = console.post("/console/sources/globex-github/rotate-secret", csrf)
    assert answer.status_code == 404
    assert console.store.scalar("SELECT count(*) FROM source_secrets") == 2


def test_revoking_a_token(console: Console) -> None:
    csrf = console.sign_in("acme-operator")
    page = console.client.get("/console/tokens").text
    assert "acme-member" in page and "globex-operator" not in page
    with console.store.sessions() as session:
        member = session.execute(
            text("SELECT id FROM api_tokens WHERE name = 'acme-member'")
        ).scalar()
        foreign = session.execute(
            text("SELECT id FROM api_tokens WHERE name = 'globex-operator'")
        ).scalar()
    assert (
        console.post(f"/console/tokens/{foreign}/revoke", csrf, confirm="globex-operator")
    ).status_code == 404
    untyped = console.post(f"/console/tokens/{member}/revoke", csrf)
    mistyped = console.post(f"/console/tokens/{member}/revoke", csrf, confirm="acme-operator")
    for refused in (untyped, mistyped):
        assert refused.status_code == 400
        assert "Type the token&#39;s name (acme-member) to confirm" in refused.text
        assert 'id="tokens"' in refused.text
    assert console.store.scalar("SELECT count(*) FROM api_tokens WHERE revoked_at IS NOT NULL") == 0
    done = console.post(f"/console/tokens/{member}/revoke", csrf, confirm="acme-member")
    assert done.status_code == 303 and done.headers["location"] == "/console/tokens?done=revoked"
    assert console.store.scalar("SELECT count(*) FROM api_tokens WHERE revoked_at IS NOT NULL") == 1


def test_revoking_ones_own_token_warns_and_signs_out(console: Console) -> None:
    csrf = console.sign_in("acme-operator")
    own, other = (
        console.store.scalar("SELECT id FROM api_tokens WHERE name = :n", n=name)
        for name in ("acme-operator", "acme-member")
    )
    page = console.client.get("/console/tokens").text
    rows = dict(re.findall(r'<tr data-token-id="(\d+)">(.*?)</tr>', page, re.S))

    answer = console.post(f"/console/tokens/{own}/revoke", csrf, confirm="acme-operator")

    assert "revoking it signs you out" in rows[str(own)]
    assert "revoking it signs you out" not in rows[str(other)]
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/sign-in?done=revoked-own"
    assert (
        "Your own token is revoked: you are signed out"
        in console.client.get(answer.headers["location"]).text
    )
    assert console.store.scalar("SELECT count(*) FROM console_sessions") == 0
    assert console.client.get("/console/", follow_redirects=False).status_code == 303


def test_the_operations_history_shows_only_runs_within_the_tokens_workspaces(
    console: Console,
) -> None:
    csrf = console.sign_in("globex-operator")
    run = console.post("/console/replays", csrf, status="dead", name="globex's own run")
    assert run.status_code == 303
    assert "globex&#39;s own run" in console.client.get("/console/operations").text
    console.sign_in("acme-operator")
    assert "globex" not in console.client.get("/console/operations").text


def test_a_filter_naming_another_workspaces_source_answers_not_found(console: Console) -> None:
    delivery = console.deliver()
    console.kill(delivery)
    csrf = console.sign_in("globex-operator")
    assert console.client.get("/console/deliveries?source=acme-github").status_code == 404
    dry = console.post("/console/replays/dry-run", csrf, source="acme-github")
    assert dry.status_code == 404
    assert console.post("/console/replays", csrf, source="acme-github", name="x").status_code == 404
    assert console.status_of(delivery) == "dead"


def test_the_overview_shows_each_uncovered_window_with_its_providers_catch_up(
    console: Console,
):
    with session_scope(console.store.sessions) as session:
        add_source(
            session=session,
            provider="gitlab",
            workspace_id=console.acme,
            slug="acme-gitlab",
            secret="gl-secret",
            create_events=["Issue Hook.open"],
        )
        stopped = utcnow() - timedelta(hours=2)
        session.add(
            IngressHeartbeat(
                host="h",
                pid=1,
                started_at=stopped - timedelta(hours=1),
                last_seen_at=stopped,
                stopped_at=stopped,
            )
        )
    console.sign_in("acme-operator")

    page = html.unescape(console.client.get("/console/").text)

    table = page[page.index('id="uncovered-downtime"') : page.index('id="catch-ups"')]
    since = stopped.strftime("%Y-%m-%dT%H:%M:%S")
    assert f"taskhook catch-up gitlab --source acme-gitlab --since {since}" in table
    assert f"taskhook catch-up github --source acme-github --since {since}" in table
    assert "taskhook catch-up mark-handled --source acme-gitlab" in table
    assert "globex-github" not in table  # another workspace's source


def _backed_up(console: Console) -> None:
    """acme: 2 queued for 3 hours and 1 processing; globex: 5 queued for an hour.
    Hours, not minutes: the page shows two units, so its ages read the same
    for the next minute however slowly the test runs."""
    with console.store.sessions() as session:
        source = dict(session.execute(select(WebhookSource.slug, WebhookSource.id)).all())
    now = utcnow()
    a_backlog(console.store, source["acme-github"], queued=2, received_at=now - timedelta(hours=3))
    a_backlog(console.store, source["acme-github"], processing=1, finished=4)
    a_backlog(
        console.store, source["globex-github"], queued=5, received_at=now - timedelta(hours=1)
    )


def _backlog_rows(console: Console) -> list[tuple[str, str, str]]:
    """The overview's backed-up workspaces: (workspace, backlog, oldest queued waiting)."""
    page = console.client.get("/console/").text
    section = page[page.index('id="workspace-backlogs"') : page.index("Deliveries by status")]
    return re.findall(
        r'<tr data-workspace="([^"]+)">\s*<td>[^<]*</td><td class="backlog num">(\d+)</td>'
        r'\s*<td class="oldest-age">([^<]*)</td>',
        section,
    )


def _both_workspaces(console: Console) -> str:
    """A member token of acme and globex, signed in."""
    with session_scope(console.store.sessions) as session:
        console.tokens["both"] = issue_token(
            session=session,
            name="both",
            role="member",
            workspace_ids=[console.acme, console.globex],
        ).token
    return console.sign_in("both")


def test_the_overview_lists_the_backed_up_workspaces_a_token_may_see(console: Console) -> None:
    _backed_up(console)

    console.sign_in("acme-operator")
    acme_sees = _backlog_rows(console)
    console.sign_in("globex-operator")
    globex_sees = _backlog_rows(console)
    _both_workspaces(console)
    both_see = _backlog_rows(console)

    assert acme_sees == [("acme", "3", "3h")]
    assert globex_sees == [("globex", "5", "1h")]
    assert both_see == [("globex", "5", "1h"), ("acme", "3", "3h")]  # largest first


def test_the_overview_says_when_no_workspace_it_may_see_is_backed_up(console: Console) -> None:
    console.sign_in("acme-operator")
    empty = console.client.get("/console/").text
    with console.store.sessions() as session:
        globex_source = session.scalar(
            select(WebhookSource.id).where(WebhookSource.slug == "globex-github")
        )
    a_backlog(console.store, globex_source, queued=5)
    others_only = console.client.get("/console/").text

    for page in (empty, others_only):
        assert "No workspace is backed up." in page
        assert "globex" not in page[page.index('id="workspace-backlogs"') :]


def test_the_overview_sums_the_workspaces_beyond_those_it_lists(
    console: Console, monkeypatch
) -> None:
    _backed_up(console)
    monkeypatch.setattr(console_pages, "LISTED_BACKLOGS", 1)
    _both_workspaces(console)

    rows = _backlog_rows(console)
    page = html.unescape(console.client.get("/console/").text)

    assert rows == [("globex", "5", "1h")]
    assert "And 1 more workspace: 3 deliveries, the oldest queued waiting 3h." in page


def test_the_overview_names_the_paused_sources_a_token_may_see(console: Console) -> None:
    console.sign_in("acme-operator")
    assert "paused-source" not in console.client.get("/console/").text
    with session_scope(console.store.sessions) as session:
        for slug in ("acme-github", "globex-github"):
            pause_source(session=session, slug=slug)

    page = html.unescape(console.client.get("/console/").text)

    paused = re.findall(r'<span class="paused-source">([^<]*)</span>', page)
    assert len(paused) == 1 and paused[0].startswith("acme-github (acme, since ")
    assert "taskhook source resume NAME" in page


# --- what an operator reads: the workspace, replays to confirm, times, URLs, words ----------


def test_the_ingress_root_leads_to_the_console(console: Console) -> None:
    answer = console.client.get("/", follow_redirects=False)
    assert answer.status_code == 307 and answer.headers["location"] == "/console/"


def test_a_task_looked_up_without_a_workspace_is_in_the_one_the_form_shows(
    console: Console,
) -> None:
    held = _task(console, "jira:WS-1")
    console.sign_in("acme-operator")
    answer = console.client.get("/console/tasks?external_id=jira:WS-1")
    unknown = console.client.get("/console/tasks?workspace=nowhere&external_id=jira:WS-1")
    assert answer.status_code == 200, answer.text
    assert f'<td class="identifier">{held["identifier"]}</td>' in answer.text
    assert '<option value="acme" selected>' in answer.text
    assert unknown.status_code == 404 and "no workspace &#39;nowhere&#39;" in unknown.text


def _resent(console: Console, status: str, number: int = 1) -> int:
    """A delivery stored as ``status`` (replay, mismatch), as the ingress stores a resent body."""
    delivery = console.deliver(number=number)
    with console.store.engine.begin() as connection:
        connection.execute(
            text("UPDATE deliveries SET status = :s WHERE id = :d"), {"s": status, "d": delivery}
        )
    return delivery


def test_replaying_a_resent_body_says_what_it_is_and_needs_a_tick(console: Console) -> None:
    replayed = _resent(console, "replay")
    csrf = console.sign_in("acme-operator")
    page = console.client.get(f"/console/deliveries/{replayed}").text
    refused = console.post(f"/console/deliveries/{replayed}/replay", csrf)
    status_after_refusal = console.status_of(replayed)
    done = console.post(f"/console/deliveries/{replayed}/replay", csrf, consent="yes")

    meaning = re.search(r'id="resent-meaning">(.*?)</p>', page, re.S).group(1)
    assert "someone resent a captured, signed body" in meaning
    assert '<input type="checkbox" name="consent" value="yes" required>' in page
    assert refused.status_code == 400 and "was not replayed" in refused.text
    assert status_after_refusal == "replay"
    assert done.status_code == 303 and console.status_of(replayed) == "queued"

    mismatched = _resent(console, "mismatch", number=2)
    page = console.client.get(f"/console/deliveries/{mismatched}").text
    meaning = re.search(r'id="resent-meaning">(.*?)</p>', page, re.S).group(1)
    assert "differs from the one stored under the same delivery id" in meaning
    assert console.post(f"/console/deliveries/{mismatched}/replay", csrf).status_code == 400
    assert console.status_of(mismatched) == "mismatch"

    # A dead delivery's replay undoes nothing: one click, as before.
    dead = console.deliver(number=3)
    console.kill(dead)
    page = console.client.get(f"/console/deliveries/{dead}").text
    assert 'name="consent"' not in page and 'id="resent-meaning"' not in page


def test_the_deliveries_filter_takes_24_hour_utc_text(console: Console) -> None:
    delivery = console.deliver()
    console.sign_in("acme-member")
    page = console.client.get("/console/deliveries").text
    since = console.client.get("/console/deliveries", params={"since": "2000-01-01 18:21"})
    until = console.client.get("/console/deliveries", params={"until": "2000-01-01 18:21"})

    assert 'type="datetime-local"' not in page  # a browser shows that in its own 12-hour locale
    assert "(UTC, 24-hour)" in page
    assert f'data-delivery-id="{delivery}"' in since.text
    assert f'data-delivery-id="{delivery}"' not in until.text


def test_a_webhook_url_wraps_only_after_a_slash(console: Console) -> None:
    console.sign_in("acme-member")
    page = console.client.get("/console/sources").text
    shown = re.search(r'<code class="webhook-url" id="url-1">(.*?)</code>', page).group(1)
    parts = shown.split("<wbr>")
    assert all(re.fullmatch(r"<span>[^<]*</span>", part) for part in parts), shown
    assert all(part.endswith("/</span>") for part in parts[:-1]), shown
    assert parts[-1] == "<span>acme-github</span>"  # a slug is never cut at its hyphen


def test_no_placeholder_reads_as_a_filled_answer() -> None:
    """A placeholder is a hint (``e.g. ...``, ``a ...``), never data of the page
    (a task's identifier) that looks as if the field were filled in."""
    for template in TEMPLATES.glob("*.html"):
        for hint in re.findall(r'placeholder="([^"]*)"', template.read_text()):
            assert "{{" not in hint, (template.name, hint)
            assert hint.startswith(("e.g. ", "a ", "an ")), (template.name, hint)


def test_the_task_pages_notices_name_tasks_by_identifier(console: Console) -> None:
    held = _task(console, "jira:ID-1")
    other = _task(console, "jira:ID-2")
    csrf = console.sign_in("acme-operator")
    release = {"workspace": "acme", "external_id": "jira:ID-1", "reason": "abandoned"}

    conflict = console.post(
        "/console/tasks/release",
        csrf,
        **release,
        expected_holder=other["identifier"],
        confirm="jira:ID-1",
    )
    done = console.post(
        "/console/tasks/release",
        csrf,
        **release,
        expected_holder=held["identifier"],
        confirm="jira:ID-1",
    )

    error = re.search(r'class="error" role="alert">([^<]*)<', conflict.text).group(1)
    assert conflict.status_code == 409
    assert error == (
        f"jira:ID-1 is held by {held['identifier']}, not by {other['identifier']} "
        "(the task you named); nothing was released."
    )
    notice = re.search(r'class="notice" role="status">([^<]*)<', done.text).group(1)
    assert notice.startswith(f"Released jira:ID-1: {held['identifier']} stays, without it.")


def test_merge_and_undo_notices_name_tasks_by_identifier(console: Console) -> None:
    into, from_ = _task(console, "jira:MRG-1"), _task(console, "jira:MRG-2")
    csrf = console.sign_in("acme-operator")
    merged = console.post(
        "/console/tasks/merge",
        csrf,
        workspace="acme",
        external_id="jira:MRG-1",
        into=str(into["id"]),
        **{"from": from_["identifier"], "confirm": from_["identifier"]},
        reason="one item",
    )
    merge_id = console.store.scalar("SELECT id FROM identity_merges")
    undone = console.post(
        f"/console/merges/{merge_id}/undo",
        csrf,
        workspace="acme",
        external_id="jira:MRG-1",
        reason="two items after all",
    )

    notices = [
        re.search(r'class="notice" role="status">([^<]*)<', answer.text).group(1)
        for answer in (merged, undone)
    ]
    assert notices == [
        f"Merged {from_['identifier']} into {into['identifier']}: its names are aliases of "
        f"{into['identifier']} now, and {from_['identifier']} is archived.",
        f"Undone: the names merged into {into['identifier']} are {from_['identifier']}&#39;s "
        "again.",
    ]
