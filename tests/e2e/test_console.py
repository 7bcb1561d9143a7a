"""The operator console (/console) in a real headless Chromium: a real uvicorn
ingress and a real Celery worker on PostgreSQL and Redis, deliveries posted to
the webhook route signed as GitHub and Jira sign them. Every test is a
browser session of its own (tests/support/browser.py), which fails on any dialog,
uncaught script error or Content-Security-Policy violation.

With TASKHOOK_CONSOLE_SCREENSHOTS=DIR set, each view is saved as
``DIR/console-<view>.png`` (docs/console/)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode, urlparse

import httpx
import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from models.db import session_scope
from models.inbox import counts_by_status
from models.sources import add_secret, add_source
from models.tables import ApiToken, Delivery, SourceSecret, Task, WebhookSource
from models.tokens import issue_token
from models.workspaces import create_workspace
from tests.support.browser import BrowserLog, screenshot, sign_in
from tests.support.deliveries import fixture, github_headers, jira_headers
from tests.support.processes import Ingress, StartWorker, finished, wait_until

pytestmark = pytest.mark.e2e

WORKSPACE, PREFIX = "acme", "ACME"
GITHUB, JIRA, SPARE = "acme-github", "acme-jira", "acme-spare"
SECRETS = {GITHUB: "console-github-secret", JIRA: "console-jira-secret", SPARE: "console-spare"}
REPO = "Codertocat/Hello-World"
#: What the sources page shows a webhook URL under (TASKHOOK_PUBLIC_URL).
PUBLIC_URL = "https://hooks.acme.example"
HOSTILE_TITLE = "<script>alert(1)</script><img src=x onerror=alert(2)>"

NAV = [
    "/console/",
    "/console/deliveries",
    "/console/tasks",
    "/console/sources",
    "/console/tokens",
    "/console/operations",
]
ACTION_FORMS = (
    "form#replay, form#dry-run, form#release, form#merge, form.undo-merge, form.rotate, "
    "form.finish-rotation, form.revoke"
)


@dataclass(frozen=True)
class Person:
    name: str
    role: str
    token: str
    token_id: int


@dataclass
class Console:
    url: str
    sessions: sessionmaker[Session]
    workspace_id: int
    operator: Person
    member: Person
    logs: list

    def post(
        self,
        source: str,
        name: str,
        body: bytes,
        delivery: str | None = None,
        secret: str | None = None,
    ) -> int:
        """POST a delivery signed with the source's secret to the webhook
        route; the inbox row's key (looked up: an ignored delivery's answer
        does not name it)."""
        secret = secret or SECRETS[source]
        delivery = delivery or str(uuid.uuid4())
        if name.startswith("jira"):
            headers, provider = jira_headers(body, secret, delivery=delivery), "jira"
        else:
            headers, provider = github_headers(name, body, secret, delivery=delivery), "github"
        answer = httpx.post(
            f"{self.url}/webhooks/{provider}/{source}", content=body, headers=headers, timeout=10
        )
        assert answer.status_code in (200, 202), answer.text
        with self.sessions() as session:
            return session.scalar(
                select(Delivery.id)
                .join(WebhookSource, WebhookSource.id == Delivery.source_id)
                .where(WebhookSource.slug == source, Delivery.delivery_id == delivery)
            )

    def post_issue(self, number: int, title: str, delivery: str | None = None) -> int:
        return self.post(GITHUB, "issues__opened", issue_body(number, title), delivery)

    def wait_done(self, *pks: int) -> None:
        wait_until(finished(self.sessions, *pks), timeout=30, what=f"{pks}", logs=self.logs)

    def holder(self, external_id: str) -> Task | None:
        with self.sessions() as session:
            return session.scalar(
                select(Task).where(
                    Task.workspace_id == self.workspace_id, Task.external_id == external_id
                )
            )

    def delivery_ids(self, *conditions) -> set[int]:
        with self.sessions() as session:
            return set(session.scalars(select(Delivery.id).where(*conditions)))

    def active_secrets(self, slug: str) -> list[str]:
        """The source's secrets that verify, oldest first."""
        with self.sessions() as session:
            return list(
                session.scalars(
                    select(SourceSecret.secret)
                    .join(WebhookSource, WebhookSource.id == SourceSecret.source_id)
                    .where(WebhookSource.slug == slug, SourceSecret.retired_at.is_(None))
                    .order_by(SourceSecret.id)
                )
            )

    def source_id(self, slug: str) -> int:
        with self.sessions() as session:
            return session.scalar(select(WebhookSource.id).where(WebhookSource.slug == slug))


def issue_body(number: int, title: str) -> bytes:
    """GitHub's ``issues.opened`` fixture, for issue ``number`` titled ``title``."""
    payload = json.loads(fixture("github", "issues__opened"))
    html_url = f"https://github.com/{REPO}/issues/{number}"
    payload["issue"] = {**payload["issue"], "number": number, "title": title, "html_url": html_url}
    return json.dumps(payload).encode()


def pull_request_body(number: int) -> bytes:
    payload = json.loads(fixture("github", "pull_request__opened"))
    html_url = f"https://github.com/{REPO}/pull/{number}"
    payload["number"] = number
    payload["pull_request"] = {**payload["pull_request"], "number": number, "html_url": html_url}
    return json.dumps(payload).encode()


def issue_id(number: int) -> str:
    return f"gh-issue/{REPO}#{number}"


@pytest.fixture(scope="module")
def console(
    sessions: sessionmaker[Session],
    start_worker: StartWorker,
    start_ingress: Callable[..., Ingress],
) -> Console:
    with session_scope(sessions) as session:
        workspace = create_workspace(
            session=session, slug=WORKSPACE, name="Acme", task_prefix=PREFIX
        )
        for slug in (GITHUB, SPARE):
            add_source(
                session=session,
                provider="github",
                workspace_id=workspace.id,
                slug=slug,
                secret=SECRETS[slug],
                create_events=["issues.opened", "pull_request.opened"],
            )
        add_source(
            session=session,
            provider="jira",
            workspace_id=workspace.id,
            slug=JIRA,
            secret=SECRETS[JIRA],
            create_events=["jira:issue_created"],
            site_url="https://acme.atlassian.net",
        )
        people = {}
        for name, role in (("ada", "operator"), ("max", "member")):
            issued = issue_token(
                session=session, name=name, role=role, workspace_ids=[workspace.id]
            )
            people[role] = Person(name, role, issued.token, issued.record.id)
        workspace_id = workspace.id
    worker = start_worker("console", beat=True)
    ingress = start_ingress(TASKHOOK_PUBLIC_URL=PUBLIC_URL)
    console = Console(
        ingress.url, sessions, workspace_id, people["operator"], people["member"],
        [worker, ingress.process],
    )  # fmt: skip
    # Something of every kind to look at: created tasks from both providers,
    # and a ping, which is stored as ignored.
    console.wait_done(
        console.post_issue(1, "Spelling error in the README file"),
        console.post(GITHUB, "pull_request__opened", fixture("github", "pull_request__opened")),
        console.post(GITHUB, "ping__basic", fixture("github", "ping__basic")),
        console.post(
            JIRA, "jira_issue_created__cloud", fixture("jira", "jira_issue_created__cloud")
        ),
    )
    return console


def open_page(page: Page, url: str) -> None:
    response = page.goto(url)
    assert response is not None and response.ok, f"{url}: {response and response.status}"


def assert_console_chrome(page: Page, person: Person) -> None:
    """What every console page has: the navigation, who is signed in, and sign-out."""
    links = page.eval_on_selector_all("nav a", "links => links.map(a => new URL(a.href).pathname)")
    assert set(NAV) <= set(links), f"{page.url}: nav links {links}"
    expect(page.locator("#who")).to_contain_text(person.name)
    expect(page.locator("#who")).to_contain_text(person.role)
    expect(page.locator("form#sign-out")).to_have_count(1)


def csrf(page: Page) -> str:
    return page.input_value("form#sign-out input[name=csrf]")


def submit(page: Page, form: str) -> None:
    """Submit ``form`` with its button and wait for the page it leads to."""
    with page.expect_navigation():
        page.click(f"{form} [type=submit]")


def body_text(page: Page) -> str:
    """The delivery page's body, its ``details`` opened as a person would."""
    details = page.locator("details#body-details")
    if not details.evaluate("element => element.open"):
        details.locator("summary").click()
    expect(page.locator("pre#body")).to_be_visible()
    return page.locator("pre#body").text_content()


def table_ids(page: Page) -> set[int]:
    ids = page.eval_on_selector_all(
        "#deliveries tbody tr[data-delivery-id]", "rows => rows.map(r => r.dataset.deliveryId)"
    )
    return {int(value) for value in ids}


def filter_deliveries(page: Page, **fields: str) -> set[int]:
    """Fill the deliveries page's filter (select or input, by name) and apply it."""
    for name, value in fields.items():
        control = page.locator(f"form#filters [name={name}]")
        if control.evaluate("element => element.tagName") == "SELECT":
            control.select_option(value)
        else:
            control.fill(value)
    submit(page, "form#filters")
    return table_ids(page)


def test_signed_out_pages_send_to_sign_in_and_a_wrong_token_is_refused(
    page: Page, console: Console
):
    for path in NAV:
        page.goto(console.url + path)
        assert urlparse(page.url).path == "/console/sign-in", f"{path} led to {page.url}"
    open_page(page, f"{console.url}/console/sign-in")
    expect(page.locator("form#sign-in input[name=token]")).to_be_visible()
    screenshot(page, "sign-in")

    page.fill("form#sign-in input[name=token]", "th_not-a-token-anyone-holds")
    with page.expect_navigation() as refused:
        page.click("form#sign-in [type=submit]")
    assert refused.value.status == 401
    expect(page.locator("form#sign-in input[name=token]")).to_be_visible()
    expect(page.locator(".error")).to_be_visible()

    sign_in(page, console.url, console.operator.token)
    assert_console_chrome(page, console.operator)
    submit(page, "form#sign-out")
    page.goto(f"{console.url}/console/deliveries")
    assert urlparse(page.url).path == "/console/sign-in"


def operator_actions(page: Page, console: Console, dead_pk: int) -> dict[str, tuple[str, dict]]:
    """Every action form an operator is shown, with what it would send: its
    action URL and its fields, filled as the operator would fill them."""
    found: dict[str, tuple[str, dict]] = {}

    def take(action_name: str, form: str, **filled: str) -> None:
        locator = page.locator(form).first
        expect(locator).to_be_attached()
        action, fields = locator.evaluate(
            "form => [form.action, Object.fromEntries(new FormData(form))]"
        )
        found[action_name] = (action, fields | filled)

    open_page(page, f"{console.url}/console/deliveries/{dead_pk}")
    take("replay", "form#replay")
    open_page(page, f"{console.url}/console/deliveries")
    take("dry-run", "form#dry-run")
    submit(page, "form#dry-run")  # counts; replays nothing
    take("run-replay", "form#run-replay", name="a member's run")
    open_page(page, tasks_url(console, issue_id(1)))
    holder = console.holder(issue_id(1))
    take(
        "release",
        "form#release",
        expected_holder=holder.identifier,
        reason="a member tries",
        confirm=issue_id(1),
    )
    take("merge", "form#merge", reason="a member tries", **{"from": "X-1", "confirm": "X-1"})
    open_page(page, f"{console.url}/console/sources")
    take("rotate", f"#sources tr[data-source={SPARE}] form.rotate")
    take("finish-rotation", f"#sources tr[data-source={SPARE}] form.finish-rotation", confirm=SPARE)
    open_page(page, f"{console.url}/console/tokens")
    take(
        "revoke",
        f"#tokens tr[data-token-id='{console.member.token_id}'] form.revoke",
        confirm=console.member.name,
    )
    return found


def tasks_url(console: Console, external_id: str) -> str:
    query = urlencode({"workspace": WORKSPACE, "external_id": external_id})
    return f"{console.url}/console/tasks?{query}"


def test_a_member_sees_every_page_but_cannot_act(page: Page, console: Console):
    dead = console.post(GITHUB, "pull_request__opened", pull_request_body(402))
    console.wait_done(dead)
    # A delivery really goes dead only after its whole retry budget fails; the
    # state is what this test needs, so it is set directly.
    with session_scope(console.sessions) as session:
        session.execute(update(Delivery).where(Delivery.id == dead).values(status="dead"))
        # A rotation under way, so that the operator is shown its finish too.
        add_secret(session=session, slug=SPARE, new_secret=f"{SECRETS[SPARE]}-next")
    secrets = console.active_secrets(SPARE)
    sign_in(page, console.url, console.operator.token)
    actions = operator_actions(page, console, dead)
    submit(page, "form#sign-out")

    sign_in(page, console.url, console.member.token)
    views = [
        "/console/",
        "/console/deliveries",
        f"/console/deliveries/{dead}",
        tasks_url(console, issue_id(1)).removeprefix(console.url),
        "/console/sources",
        "/console/tokens",
        "/console/operations",
    ]
    for path in views:
        open_page(page, console.url + path)
        assert_console_chrome(page, console.member)
        assert page.locator(ACTION_FORMS).count() == 0, f"{path} shows a member an action"

    token = csrf(page)
    for name, (action, fields) in actions.items():
        answer = page.request.post(action, form=fields | {"csrf": token}, max_redirects=0)
        assert answer.status == 403, f"{name}: a member's POST answered {answer.status}"

    with console.sessions() as session:
        assert session.get(Delivery, dead).status == "dead"
        assert session.get(ApiToken, console.member.token_id).revoked_at is None
    assert console.active_secrets(SPARE) == secrets
    assert console.holder(issue_id(1)) is not None


def test_an_operator_filters_and_searches_deliveries_and_opens_one(page: Page, console: Console):
    searched = str(uuid.uuid4())
    body = issue_body(201, "Searched for")
    pk = console.post_issue(201, "Searched for", delivery=searched)
    console.wait_done(pk)
    github, jira = console.source_id(GITHUB), console.source_id(JIRA)

    sign_in(page, console.url, console.operator.token)
    open_page(page, f"{console.url}/console/deliveries")
    assert_console_chrome(page, console.operator)
    assert pk in table_ids(page)
    screenshot(page, "deliveries")

    assert filter_deliveries(page, status="ignored") == console.delivery_ids(
        Delivery.status == "ignored"
    )
    assert filter_deliveries(page, status="", source=JIRA) == console.delivery_ids(
        Delivery.source_id == jira
    )
    assert filter_deliveries(
        page, source=GITHUB, event="pull_request.opened", status="done"
    ) == console.delivery_ids(
        Delivery.source_id == github,
        Delivery.event == "pull_request.opened",
        Delivery.status == "done",
    )
    assert filter_deliveries(page, source="", event="", status="", q=searched) == {pk}
    assert filter_deliveries(page, q=str(pk)) == {pk}
    assert filter_deliveries(page, q="", since="2099-01-01T00:00") == set()
    assert filter_deliveries(page, since="", until="2000-01-01T00:00") == set()
    assert pk in filter_deliveries(page, since="2000-01-01T00:00", until="")

    with page.expect_navigation():
        page.click(f"#deliveries tr[data-delivery-id='{pk}'] td:first-child a")
    assert urlparse(page.url).path == f"/console/deliveries/{pk}"
    assert_console_chrome(page, console.operator)
    expect(page.locator("#summary")).to_contain_text(searched)
    expect(page.locator("#summary")).to_contain_text("issues.opened")
    headers = page.eval_on_selector_all(
        "#headers tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent.trim()))"
    )
    assert any(searched in row for row in headers), headers
    for row in headers:
        if "signature" in row[0].lower():
            assert row[1:] == ["redacted"], row
    signature = github_headers("issues__opened", body, SECRETS[GITHUB])["X-Hub-Signature-256"]
    assert signature.split("=", 1)[1] not in page.content()

    shown = body_text(page)
    assert json.loads(shown) == json.loads(body)
    assert "\n  " in shown, "the body is not pretty-printed"
    assert page.locator("#timeline li").count() >= 1
    # Done and settled: nothing to replay.
    assert page.locator("form#replay").count() == 0
    screenshot(page, "delivery")


def test_a_new_delivery_appears_in_an_open_deliveries_page(page: Page, console: Console):
    sign_in(page, console.url, console.operator.token)
    open_page(page, f"{console.url}/console/deliveries")
    page.evaluate("window.__notReloaded = true")

    pk = console.post_issue(202, "Arrives while the page is open")
    expect(page.locator(f"#deliveries tbody tr[data-delivery-id='{pk}']")).to_be_visible(
        timeout=15_000
    )
    assert page.evaluate("window.__notReloaded === true"), "the page reloaded"
    console.wait_done(pk)


def test_a_bulk_replay_of_dead_deliveries_is_dry_run_named_recorded_and_done(
    page: Page, console: Console
):
    pks = [console.post_issue(300 + n, f"Dead issue {n}") for n in range(3)]
    console.wait_done(*pks)
    # A delivery really goes dead only after its whole retry budget fails; the
    # state is what the replay needs, so it is set directly.
    with session_scope(console.sessions) as session:
        session.execute(
            update(Delivery)
            .where(Delivery.id.in_(pks))
            .values(status="dead", status_reason="set dead by the test")
        )

    sign_in(page, console.url, console.operator.token)
    open_page(page, f"{console.url}/console/deliveries")
    assert filter_deliveries(page, status="dead", event="issues.opened") == set(pks)
    submit(page, "form#dry-run")
    expect(page.locator("#dry-run-count")).to_have_text("3")
    page.fill("form#run-replay input[name=name]", "replay the dead issues")
    submit(page, "form#run-replay")
    assert urlparse(page.url).path == "/console/operations"
    assert_console_chrome(page, console.operator)

    console.wait_done(*pks)
    with console.sessions() as session:
        statuses = session.scalars(select(Delivery.status).where(Delivery.id.in_(pks))).all()
    assert statuses == ["done"] * 3

    page.reload()
    row = page.locator("#operations tbody tr", has_text="replay the dead issues")
    expect(row).to_have_count(1)
    expect(row.locator(".name")).to_have_text("replay the dead issues")
    for column in ("expected", "matched", "done"):
        expect(row.locator(f".{column}")).to_have_text("3")
    screenshot(page, "operations")


def test_a_release_names_the_real_holder_when_the_expected_one_is_wrong(
    page: Page, console: Console
):
    console.wait_done(
        console.post_issue(501, "To be released"), console.post_issue(502, "Another task")
    )
    held, other = console.holder(issue_id(501)), console.holder(issue_id(502))

    sign_in(page, console.url, console.operator.token)
    open_page(page, f"{console.url}/console/tasks")
    page.fill("form#find-task [name=external_id]", issue_id(501))
    workspace = page.locator("form#find-task [name=workspace]")
    if workspace.evaluate("element => element.tagName") == "SELECT":
        workspace.select_option(WORKSPACE)
    else:
        workspace.fill(WORKSPACE)
    submit(page, "form#find-task")
    assert_console_chrome(page, console.operator)
    expect(page.locator("#holder .identifier")).to_have_text(held.identifier)
    expect(page.locator("#holder .title")).to_have_text("To be released")
    screenshot(page, "task")

    def release(expected_holder: str) -> None:
        page.fill("form#release input[name=expected_holder]", expected_holder)
        page.fill("form#release input[name=reason]", "reopened upstream as a new issue")
        page.fill("form#release input[name=confirm]", issue_id(501))
        submit(page, "form#release")

    release(other.identifier)
    expect(page.locator(".error")).to_contain_text(held.identifier)
    assert console.holder(issue_id(501)).id == held.id

    release(held.identifier)
    expect(page.locator(".notice")).to_be_visible()
    assert console.holder(issue_id(501)) is None
    released = page.locator("#releases tbody tr", has_text="reopened upstream as a new issue")
    expect(released).to_have_count(1)
    expect(released).to_contain_text(console.operator.name)
    expect(page.locator("#former-holders")).to_contain_text(held.identifier)


def test_a_hostile_issue_title_is_shown_as_text(
    page: Page, console: Console, browser_log: BrowserLog
):
    pk = console.post_issue(701, HOSTILE_TITLE)
    console.wait_done(pk)

    sign_in(page, console.url, console.operator.token)
    open_page(page, f"{console.url}/console/deliveries/{pk}")
    assert json.loads(body_text(page))["issue"]["title"] == HOSTILE_TITLE
    open_page(page, tasks_url(console, issue_id(701)))
    expect(page.locator("#holder .title")).to_have_text(HOSTILE_TITLE)
    for path in (f"/console/deliveries/{pk}", "/console/deliveries", "/console/"):
        open_page(page, console.url + path)
        assert page.locator("img[src=x]").count() == 0, path
        page.wait_for_timeout(200)  # time for an injected handler to fire, were there one
    assert browser_log.dialogs == []
    assert browser_log.csp_violations == []


def test_an_operator_sees_the_overview_live_and_rotates_a_secret(page: Page, console: Console):
    sign_in(page, console.url, console.operator.token)
    assert_console_chrome(page, console.operator)
    with console.sessions() as session:
        counts = counts_by_status(session=session)
    for status in ("done", "ignored"):
        count = page.locator(f"#status-counts tr[data-status={status}] .count")
        expect(count).to_have_text(str(counts.get(status, 0)))
    expect(page.locator("#backlog .queued")).to_have_text(str(counts.get("queued", 0)))
    expect(page.locator("#backlog .oldest-age")).to_be_attached()
    expect(page.locator("#needs-operator .count")).to_have_text(
        str(counts.get("needs_operator", 0))
    )
    expect(page.locator("#dead .count")).to_have_text(str(counts.get("dead", 0)))
    expect(page.locator("#catch-ups")).to_be_attached()
    expect(page.locator("#chart canvas").first).to_be_visible()

    before = page.locator("#live-events li").count()
    console.wait_done(console.post_issue(801, "Seen live on the overview"))
    expect(page.locator("#live-events li")).not_to_have_count(before, timeout=15_000)
    screenshot(page, "overview")

    open_page(page, f"{console.url}/console/sources")
    assert_console_chrome(page, console.operator)
    for slug, provider in ((GITHUB, "github"), (JIRA, "jira"), (SPARE, "github")):
        row = page.locator(f"#sources tbody tr[data-source={slug}]")
        expect(row.locator("code.webhook-url")).to_have_text(
            f"{PUBLIC_URL}/webhooks/{provider}/{slug}"
        )
        for part in ("button.copy", ".events", ".rotation", ".last-delivery", ".enabled"):
            expect(row.locator(part)).to_have_count(1)
    github = page.locator(f"#sources tbody tr[data-source={GITHUB}]")
    expect(github.locator(".events")).to_contain_text("issues.opened")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=console.url)
    github.locator("button.copy").click()
    expect(github.locator("button.copy")).to_have_text("Copied")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == f"{PUBLIC_URL}/webhooks/github/{GITHUB}"
    screenshot(page, "sources")

    before = console.active_secrets(SPARE)
    submit(page, f"#sources tr[data-source={SPARE}] form.rotate")
    new_secret = page.inner_text("#new-secret").strip()
    assert new_secret and new_secret not in before
    assert console.active_secrets(SPARE) == [*before, new_secret]
    open_page(page, f"{console.url}/console/sources")
    assert page.locator("#new-secret").count() == 0, "the new secret is shown more than once"
    spare = page.locator(f"#sources tr[data-source={SPARE}]")
    expect(spare.locator("form.finish-rotation button")).to_be_hidden()  # no one-click finish
    spare.locator("details.confirm summary").click()
    expect(spare.locator("form.finish-rotation")).to_contain_text("refused (401)")
    # The browser will not send it untyped; typed wrong, the server refuses it.
    spare.locator("form.finish-rotation [type=submit]").click()
    assert console.active_secrets(SPARE) == [*before, new_secret]
    spare.locator("form.finish-rotation input[name=confirm]").fill(GITHUB)
    submit(page, f"#sources tr[data-source={SPARE}] form.finish-rotation")
    expect(page.locator(".error")).to_contain_text(f"({SPARE}) to confirm")
    assert console.active_secrets(SPARE) == [*before, new_secret]
    spare = page.locator(f"#sources tr[data-source={SPARE}]")
    spare.locator("details.confirm summary").click()
    spare.locator("form.finish-rotation input[name=confirm]").fill(SPARE)
    submit(page, f"#sources tr[data-source={SPARE}] form.finish-rotation")
    expect(page.locator(".notice")).to_be_visible()
    assert console.active_secrets(SPARE) == [new_secret]
    ping = fixture("github", "ping__basic")
    console.wait_done(console.post(SPARE, "ping__basic", ping, secret=new_secret))

    open_page(page, f"{console.url}/console/tokens")
    assert_console_chrome(page, console.operator)
    for person in (console.operator, console.member):
        row = page.locator(f"#tokens tbody tr[data-token-id='{person.token_id}']")
        expect(row).to_contain_text(person.name)
        expect(row.locator("form.revoke")).to_have_count(1)
    screenshot(page, "tokens")


def test_revoking_ones_own_token_is_confirmed_and_signs_out(
    page: Page, console: Console, browser_log: BrowserLog
):
    with session_scope(console.sessions) as session:
        issued = issue_token(
            session=session, name="eve", role="operator", workspace_ids=[console.workspace_id]
        )
        eve = Person("eve", "operator", issued.token, issued.record.id)

    sign_in(page, console.url, eve.token)
    open_page(page, f"{console.url}/console/tokens")
    own = page.locator(f"#tokens tr[data-token-id='{eve.token_id}']")
    other = page.locator(f"#tokens tr[data-token-id='{console.member.token_id}']")
    expect(own.locator("form.revoke button")).to_be_hidden()  # no one-click revoke
    own.locator("details.confirm summary").click()
    expect(own.locator(".own-token")).to_contain_text("signs you out")
    expect(other.locator(".own-token")).to_have_count(0)
    own.locator("form.revoke input[name=confirm]").fill("eve")
    submit(page, f"#tokens tr[data-token-id='{eve.token_id}'] form.revoke")

    assert urlparse(page.url).path == "/console/sign-in"
    expect(page.locator(".notice")).to_contain_text("Your own token is revoked")
    with console.sessions() as session:
        assert session.get(ApiToken, eve.token_id).revoked_at is not None
    assert browser_log.dialogs == []


def test_replaying_a_resent_body_warns_and_waits_for_a_tick(page: Page, console: Console):
    pk = console.post_issue(901, "Resent by someone")
    console.wait_done(pk)
    # As the ingress stores a captured body sent again under another delivery id.
    with session_scope(console.sessions) as session:
        session.execute(update(Delivery).where(Delivery.id == pk).values(status="replay"))

    sign_in(page, console.url, console.operator.token)
    open_page(page, f"{console.url}/console/deliveries/{pk}")
    expect(page.locator("#resent-meaning")).to_contain_text("someone resent a captured")
    page.click("form#replay [type=submit]")  # unticked: the browser does not send it
    page.wait_for_timeout(300)
    assert urlparse(page.url).path == f"/console/deliveries/{pk}"
    with console.sessions() as session:
        assert session.get(Delivery, pk).status == "replay"
    page.check("form#replay input[name=consent]")
    submit(page, "form#replay")
    expect(page.locator(".notice")).to_contain_text("queued again")
    console.wait_done(pk)


def test_times_are_24_hour_utc_and_urls_break_only_after_a_slash(page: Page, console: Console):
    page.goto(f"{console.url}/")
    assert urlparse(page.url).path == "/console/sign-in"  # / leads to the console
    sign_in(page, console.url, console.operator.token)
    expect(page.locator("#chart canvas").first).to_be_visible()
    ticks = page.evaluate("document.getElementById('chart').uplot.axes[0]._values")
    assert ticks and all(re.fullmatch(r"\d\d:\d\d(\n\d{4}-\d\d-\d\d)?", t) for t in ticks), ticks
    box = page.locator("#chart .u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] - 5, box["y"] + box["height"] / 2)
    legend = page.locator("#chart .u-legend .u-series").first.locator(".u-value")
    expect(legend).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d UTC$"))

    page.set_viewport_size({"width": 560, "height": 900})
    open_page(page, f"{console.url}/console/sources")
    for url in page.locator("code.webhook-url").all():
        # Where each character is drawn: a line may end only after a "/".
        ends = url.evaluate(
            """code => {
              const text = code.textContent, range = document.createRange(), ends = [];
              const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
              const chars = [];
              for (let node; (node = walker.nextNode()); )
                for (let i = 0; i < node.length; i++) chars.push([node, i]);
              let top = null;
              chars.forEach(([node, i], index) => {
                range.setStart(node, i); range.setEnd(node, i + 1);
                const now = range.getBoundingClientRect().top;
                if (top !== null && now > top + 2) ends.push(text[index - 1]);
                top = now;
              });
              return ends;
            }"""
        )
        assert set(ends) <= {"/"}, f"{url.text_content()} wraps after {ends}"
