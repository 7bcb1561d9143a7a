"""Never leaked: every credential kind gets a canary value, the whole stack is
exercised at DEBUG, and everything an outsider or a log reader sees is
searched for the canaries. There must be 0 occurrences, of the whole value
and of its first 12 characters (a partial echo is a leak too).

The canaries, each set through the real CLI as an operator would: the signing
secret of a GitHub and a Jira source; a GitHub catch-up token; a GitHub App's
private key (the base64 lines of its PEM); a Jira Cloud API token (with its
email) and a Jira Data Center personal access token; and the REST/console API
token (``taskhook token add``). Real processes -- the ingress, a worker and
beat, each at DEBUG, and the CLI with DEBUG logging -- on PostgreSQL and Redis.

What is searched (docs/architecture.md, "Secrets at rest"): every process's
log; the status, headers and body of every HTTP answer (webhooks signed well
and badly, REST, MCP, the console's pages, /metrics, /openapi.json, refusals
of near-miss credentials); every CLI command's stdout and stderr, plain and
--json; and the catch-up's error paths against a provider that echoes the
credential it was sent in everything it answers -- a 401, a 500, a redirect
to another host, a ``Link`` to another host, a timeout -- as the catch-up
prints them, as ``stats`` and the console show the stored run, and as the
worker logs a beat catch-up. Only ``taskhook token add``'s own output, which
prints the new token once by design, is left out.

The echoing provider puts the credential at the start of its message, inside
the 200 characters the catch-up quotes: a credential cut by that limit before
it is scrubbed (issue 35, "Redaction before truncation": the App's JWT, which
is longer, still shows its first part in the worker's log here) is fixed and
tested in worker/catchup on its own, not by this module.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bench.fakes.server import Answer, FakeServer, ReceivedRequest
from models.broker.messages import CATCH_UP, DELIVERY_QUEUES, OPERATOR_QUEUE
from models.settings import Settings
from tests.support.deliveries import fixture, github_headers, jira_headers
from tests.support.processes import (
    READY_TIMEOUT,
    ROOT,
    WorkerProcess,
    free_port,
    wait_until,
    worker_environment,
)
from worker.celery_app import make_celery_app

pytestmark = pytest.mark.e2e

#: How much of a canary a partial echo is caught by.
PREFIX = 12


def canary(kind: str) -> str:
    """A value no output could hold by chance; its first 12 characters too."""
    return f"cnry{kind[:4]}{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}"


def private_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")


PEM = private_key()
EMAIL = "canary-reader@example.com"
CANARIES = {
    "github signing secret": canary("ghsecret"),
    "jira signing secret": canary("jirasecret"),
    "app source signing secret": canary("appsecret"),
    "jira dc source signing secret": canary("dcsecret"),
    "github catch-up token": canary("ghtoken"),
    "jira cloud api token": canary("jiratoken"),
    "jira dc personal access token": canary("pat"),
}
#: The PEM's base64 lines. The first starts with the same ASN.1 header in every
#: 2048-bit key (``MIIEv...``): its whole line is searched, not its prefix.
PEM_LINES = [line for line in PEM.splitlines() if line and not line.startswith("-----")]


# --- a provider that echoes the credential it was sent ------------------------------------------


class EchoingProvider(FakeServer):
    """GitHub's and Jira's API as a hostile or careless one would answer: the
    credential it was sent (the Authorization value, and a Basic value
    decoded) in its message, in a redirect's Location and in a Link to
    another host. ``mode`` says what it answers: ``401``, ``500``,
    ``redirect``, ``link`` (an empty page whose Link names another host),
    ``stall`` (no answer for longer than the client waits) or ``ok``."""

    server_version = "EchoingProvider"

    def __init__(self, elsewhere: str = "http://localhost:9") -> None:
        super().__init__()
        self.mode = "401"
        self.elsewhere = elsewhere
        self.requests: list[ReceivedRequest] = []
        self.released = threading.Event()

    def stop(self) -> None:
        self.released.set()
        super().stop()

    def _answer(self, request: ReceivedRequest) -> Answer:
        self.requests.append(request)
        echoed = _credentials_in(request.headers.get("authorization", ""))
        said = " ".join(echoed)
        if self.mode == "401":
            return Answer(401, {"message": f"Bad credentials {said}", "errorMessages": [said]})
        if self.mode == "500":
            return Answer(500, {"message": f"Server error while reading {said}"})
        if self.mode == "redirect":
            location = f"{self.elsewhere}/moved/{echoed[-1]}?token={echoed[-1]}"
            return Answer(302, {"message": f"Moved {said}"}, {"Location": location})
        if self.mode == "link" and "cursor" not in request.query:
            link = (
                f'<{self.elsewhere}{request.path}?per_page=100&cursor=v1_{echoed[-1]}>; rel="next"'
            )
            return Answer(200, [], {"Link": link})
        if self.mode == "stall":
            self.released.wait(15)  # past the client's 10 s; stop() ends it sooner
        return Answer(200, [])


def _credentials_in(authorization: str) -> list[str]:
    scheme, _, value = authorization.partition(" ")
    found = [value or scheme]
    if scheme.lower() == "basic":
        with contextlib.suppress(ValueError):
            found.append(base64.b64decode(value).decode())
    return found


# --- what an outsider sees ----------------------------------------------------------------------


@dataclass
class Seen:
    """Every text the session showed: (where, text)."""

    texts: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, where: str, text: str) -> None:
        with self.lock:
            self.texts.append((where, text))

    def answer(self, where: str, response: httpx.Response) -> httpx.Response:
        headers = "\n".join(f"{name}: {value}" for name, value in response.headers.multi_items())
        self.add(f"HTTP {where} -> {response.status_code}", f"{headers}\n\n{response.text}")
        return response


def leaks(texts: list[tuple[str, str]]) -> list[str]:
    """Each place a canary, or its first 12 characters, was seen."""
    needles = [(name, value, value[:PREFIX]) for name, value in CANARIES.items()]
    needles += [
        (f"the App's private key, line {n}", line, None) for n, line in enumerate(PEM_LINES)
    ]
    needles += [
        (f"the App's private key, line {n} (prefix)", line[:PREFIX], None)
        for n, line in enumerate(PEM_LINES)
        if n > 0
    ]
    needles.append(("the API token", SESSION_TOKEN[0], SESSION_TOKEN[0][:PREFIX]))
    found: list[str] = []
    for where, text in texts:
        for name, value, prefix in needles:
            for needle in (value, prefix):
                if needle and needle in text:
                    at = text.index(needle)
                    context = text[max(0, at - 80) : at + len(needle) + 40]
                    found.append(f"{name} ({needle[:6]}…) in {where}: …{context}…")
                    break
    return found


#: The REST/console API token: made by ``taskhook token add`` in the session.
SESSION_TOKEN: list[str] = [""]


# --- the processes, at DEBUG --------------------------------------------------------------------


@dataclass
class Session:
    folder: Path
    postgres_url: str
    broker_url: str
    seen: Seen
    processes: list[WorkerProcess] = field(default_factory=list)
    ingress_url: str = ""

    def env(self, **extra: str) -> dict[str, str]:
        return worker_environment(self.postgres_url, self.broker_url, **extra)

    def start(self, name: str, args: list[str], *, log_format: str = "text") -> WorkerProcess:
        environment = self.env(TASKHOOK_LOG_FORMAT=log_format)
        process = WorkerProcess(name, self.folder / f"{name}.log", args, environment)
        self.processes.append(process)
        return process

    def command(
        self, line: str, stdin: str | None = None, *, show: bool = True, check: bool = False
    ) -> str:
        """``taskhook`` with the words of ``line``; a line on stdin if given.
        With ``check``, the command must succeed (setting a canary must)."""
        stdin = None if stdin is None else stdin + "\n"
        return self.taskhook(*line.split(), stdin=stdin, show=show, check=check)

    def many(self, *calls, check: bool = False) -> None:
        """Commands at once, four at a time: each a line, or [line, stdin]."""
        if len(calls) == 1 and not isinstance(calls[0], list | str):
            calls = tuple(calls[0])
        with ThreadPoolExecutor(max_workers=4) as pool:
            done = [
                pool.submit(
                    self.command, *([call, None] if isinstance(call, str) else call), check=check
                )
                for call in calls
            ]
        for future in done:
            future.result()

    def taskhook(
        self, *args: str, stdin: str | None = None, show: bool = True, check: bool = False
    ) -> str:
        """The real CLI as a process, with every logger at DEBUG; its stdout."""
        debug = (
            "import logging, runpy; logging.basicConfig(level=logging.DEBUG); "
            "runpy.run_module('worker.cli', run_name='__main__')"
        )
        done = subprocess.run(
            [sys.executable, "-c", debug, *args],
            cwd=ROOT,
            # Text from basicConfig and JSON from the CLI's own handler: both formats.
            env=self.env(
                TASKHOOK_PUBLIC_URL="https://hooks.example.com", TASKHOOK_LOG_FORMAT="json"
            ),
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if show:
            self.seen.add(f"$ taskhook {' '.join(args)} (stdout)", done.stdout)
            self.seen.add(f"$ taskhook {' '.join(args)} (stderr)", done.stderr)
        assert not check or done.returncode == 0, f"taskhook {' '.join(args)}: {done.stderr}"
        return done.stdout if done.returncode == 0 else done.stdout + done.stderr


@pytest.fixture(scope="module")
def outsider(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str, broker_url: str, sessions
) -> Iterator[Seen]:
    """The whole session; what it showed."""
    seen = Seen()
    run = Session(tmp_path_factory.mktemp("canaries"), postgres_url, broker_url, seen)
    elsewhere = EchoingProvider()
    elsewhere.mode = "ok"
    with elsewhere:
        other_host = elsewhere.base_url.replace("127.0.0.1", "localhost")
        provider, slow = EchoingProvider(other_host), EchoingProvider(other_host)
        slow.mode = "stall"
        with provider, slow:
            try:
                _exercise(run, provider, slow)
            finally:
                for process in reversed(run.processes):
                    process.stop()
                for process in run.processes:
                    seen.add(f"log of {process.name}", process.text())
            # Each catch-up credential reached the provider: the token, the
            # App's JWT, Jira Cloud's Basic, the PAT; and the timeout was waited.
            sent = {request.headers.get("authorization", "") for request in provider.requests}
            basic = base64.b64encode(f"{EMAIL}:{CANARIES['jira cloud api token']}".encode())
            assert {
                f"Bearer {CANARIES['github catch-up token']}",
                f"Basic {basic.decode()}",
                f"Bearer {CANARIES['jira dc personal access token']}",
            } <= sent
            assert any(value.count(".") == 2 for value in sent)  # a JWT the PEM signed
            assert len(slow.requests) == 4  # a first try and three retries, each timed out
        # Neither the redirect nor the Link took a request to the other host.
        assert elsewhere.requests == []
    yield seen


def _exercise(run: Session, provider: EchoingProvider, slow: EchoingProvider) -> None:
    port = free_port()
    run.ingress_url = f"http://127.0.0.1:{port}"
    server = "-m ingest.server --host 127.0.0.1 --log-level debug --port"
    # JSON lines carry everything a text line does and the fields passed as
    # ``extra`` besides: the ingress and the worker (which holds the catch-up's
    # credentials) write them, beat writes text, the CLI both.
    ingress = run.start("ingress", [sys.executable, *server.split(), str(port)], log_format="json")
    queues = ",".join((*DELIVERY_QUEUES, OPERATOR_QUEUE))
    name = f"canaries-{uuid.uuid4().hex[:6]}@%h"
    celery = "-m celery -A worker"
    worker = run.start(
        "worker",
        [sys.executable, *celery.split(), "worker", "-Q", queues, "-n", name, "-l", "DEBUG"],
        log_format="json",
    )
    schedule = str(run.folder / "beat-schedule")
    beat = run.start(
        "beat", [sys.executable, *celery.split(), "beat", "-l", "DEBUG", "-s", schedule]
    )

    # --- the canaries, set through the CLI while the processes start ---------------------------
    t, many = run.command, run.many
    t("workspace add canary --name Canary --prefix CAN", check=True)
    jira_site = f"--site {provider.base_url}"
    many(
        *(
            f"source add {kind} --workspace canary --name {slug} --secret {secret} {site}"
            for slug, kind, secret, site in [
                ("canary-gh", "github", CANARIES["github signing secret"], ""),
                ("canary-jira", "jira", CANARIES["jira signing secret"], jira_site),
                ("canary-app", "github", CANARIES["app source signing secret"], ""),
                ("canary-dc", "jira", CANARIES["jira dc source signing secret"], jira_site),
                ("canary-slow", "github", CANARIES["github signing secret"], ""),
            ]
        ),
        check=True,
    )
    key_file = run.folder / "app.pem"
    key_file.write_text(PEM)
    token, api = CANARIES["github catch-up token"], f"--api-url {provider.base_url}"
    many(
        [
            f"source catch-up canary-gh --repo acme/widgets --hook-id 1 {api} --token-stdin",
            token,
        ],
        [f"source catch-up canary-app --app-id 4200 --private-key-file {key_file} {api}", None],
        [
            f"source catch-up canary-jira --email {EMAIL} {jira_site} --token-stdin",
            CANARIES["jira cloud api token"],
        ],
        [
            f"source catch-up canary-dc --pat {jira_site} --token-stdin",
            CANARIES["jira dc personal access token"],
        ],
        check=True,
    )
    # It prints the token once, by design: the one output left out of the search.
    add_token = "token add --workspace canary --role operator --name canary --json"
    made = t(add_token, show=False, check=True)
    SESSION_TOKEN[0] = json.loads(made)["token"]
    worker.wait_ready()
    wait_until(lambda: "beat: Starting..." in beat.text(), timeout=READY_TIMEOUT, what="beat")
    healthy = partial(_healthy, run.ingress_url)
    wait_until(healthy, timeout=READY_TIMEOUT, what="the ingress", logs=[ingress])

    # --- beat's catch-up of every source, in the worker: each refused, the token echoed --------
    app = make_celery_app(Settings(database_url=run.postgres_url, broker_url=run.broker_url))
    try:
        app.send_task(CATCH_UP, args=[], queue=OPERATOR_QUEUE)
    finally:
        app.close()
    wait_until(
        lambda: worker.text().count("catch-up of canary-") >= 4,
        timeout=60,
        what="the worker's catch-up of the four sources",
        logs=[worker],
    )

    # --- the timeout, in the background: four tries of 10 s each -------------------------------
    slow_api = f"--api-url {slow.base_url}"
    t(
        f"source catch-up canary-slow --repo acme/slow --hook-id 2 {slow_api} --token-stdin",
        token,
        check=True,
    )
    timing_out = threading.Thread(target=t, args=("catch-up github --source canary-slow --json",))
    timing_out.start()

    # --- webhooks, REST, MCP, the console, /metrics, /openapi.json -----------------------------
    _webhooks(run)
    _rest(run)
    _mcp(run)
    _console(run)

    # --- the catch-up's error paths, and the stored run as stats and the console show it -------
    for mode, slugs in [
        ("401", ["canary-gh", "canary-app", "canary-jira", "canary-dc"]),
        ("500", ["canary-gh", "canary-jira"]),
        ("redirect", ["canary-gh", "canary-dc"]),
        ("link", ["canary-gh"]),
    ]:
        provider.mode = mode
        for output in ("", "--json"):
            many(
                f"catch-up {'jira' if 'jira' in slug or 'dc' in slug else 'github'} "
                f"--source {slug} --since 1h {output}"
                for slug in slugs
            )
        _stored_runs(run)
    timing_out.join(timeout=60)
    _stored_runs(run)

    # --- every listing and show, plain and --json; refusals of near-miss credentials ----------
    listings = [
        "source list",
        "stats",
        "secrets status",
        "operations list",
        "deliveries list",
        "token list",
        "workspace list",
        "task lookup --workspace canary github:acme/widgets#1",
        "explain --workspace canary github:acme/widgets#1",
    ]
    many(f"{listing} {output}" for listing in listings for output in ("", "--json"))
    delivery_ids = _delivery_ids(t("deliveries list --json"))
    many(f"deliveries show {pk} {output}" for pk in delivery_ids[:6] for output in ("", "--json"))
    many(
        ["source catch-up no-such-source --repo a/b --token-stdin", token[:-1]],
        [f"source add github --workspace canary --name canary-gh --secret {token[:-1]}", None],
        [f"source rotate-secret no-such --secret {CANARIES['jira signing secret'][:-1]}", None],
        [f"source catch-up canary-app --app-id 4200 --private-key-file {run.folder}", None],
    )


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _delivery_ids(listed: str) -> list[int]:
    try:
        document = json.loads(listed)
    except ValueError:
        return []
    rows = document.get("deliveries", document) if isinstance(document, dict) else document
    return [row["id"] for row in rows if isinstance(row, dict) and "id" in row]


def _stored_runs(run: Session) -> None:
    """The last run of each source, as ``stats`` and the console overview show it."""
    run.many("stats", "stats --json")
    with _signed_in(run) as client:
        run.seen.answer("console overview", client.get("/console/"))
        run.seen.answer("console sources", client.get("/console/sources"))
    run.seen.answer("/metrics", httpx.get(f"{run.ingress_url}/metrics", timeout=10))


def _webhooks(run: Session) -> None:
    seen, url = run.seen, run.ingress_url
    github_secret, jira_secret = CANARIES["github signing secret"], CANARIES["jira signing secret"]
    body = fixture("github", "issues__opened")
    with httpx.Client(base_url=url, timeout=10) as client:
        for n, secret in enumerate([github_secret, github_secret[:-1] + "x"]):
            headers = github_headers("issues__opened", body, secret, delivery=f"canary-gh-{n}")
            seen.answer(
                "github webhook",
                client.post("/webhooks/github/canary-gh", content=body, headers=headers),
            )
        bad = github_headers("issues__opened", body, github_secret, delivery="canary-gh-bad")
        bad["X-Hub-Signature-256"] = "sha256=" + "0" * 64
        seen.answer(
            "github webhook, bad signature",
            client.post("/webhooks/github/canary-gh", content=body, headers=bad),
        )
        seen.answer(
            "github webhook, no signature",
            client.post(
                "/webhooks/github/canary-gh",
                content=body,
                headers={k: v for k, v in bad.items() if k.lower() != "x-hub-signature-256"},
            ),
        )
        seen.answer(
            "github webhook, broken body",
            client.post(
                "/webhooks/github/canary-gh",
                content=b"{not json",
                headers=github_headers(
                    "issues__opened", b"{not json", github_secret, delivery="canary-gh-broken"
                ),
            ),
        )
        jira = fixture("jira", "jira_issue_created__cloud")
        for n, secret in enumerate([jira_secret, jira_secret[:-1] + "x"]):
            headers = jira_headers(jira, secret, delivery=f"canary-jira-{n}")
            seen.answer(
                "jira webhook",
                client.post("/webhooks/jira/canary-jira", content=jira, headers=headers),
            )
        seen.answer(
            "unknown source",
            client.post(
                "/webhooks/github/nope",
                content=body,
                headers=github_headers("issues__opened", body, github_secret),
            ),
        )


def _rest(run: Session) -> None:
    seen, token = run.seen, SESSION_TOKEN[0]
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=run.ingress_url, timeout=10) as client:
        for path in ("/openapi.json", "/metrics", "/healthz", "/readyz", "/docs"):
            seen.answer(path, client.get(path))
        created = seen.answer(
            "create a task",
            client.post(
                "/api/v1/tasks", json={"title": "canary", "external_id": "canary:1"}, headers=auth
            ),
        )
        task = created.json().get("id", 1) if created.status_code < 300 else 1
        workspace = created.json().get("workspace_id", 1) if created.status_code < 300 else 1
        for path in (
            f"/api/v1/tasks/{task}",
            f"/api/v1/workspaces/{workspace}/tasks",
            f"/api/v1/workspaces/{workspace}/tasks/by-external-id?external_id=canary:1",
            f"/api/v1/workspaces/{workspace}/events",
            "/api/v1/tasks/999999",
            f"/api/v1/workspaces/{workspace}/tasks?limit=0",
        ):
            seen.answer(f"GET {path}", client.get(path, headers=auth))
        for wrong in (token[:-2] + "zz", token + "x", f"{token} {token}"):
            seen.answer(
                "REST, a near-miss token",
                client.get(
                    f"/api/v1/workspaces/{workspace}/tasks",
                    headers={"Authorization": f"Bearer {wrong}"},
                ),
            )
        seen.answer("REST, a bad body", client.post("/api/v1/tasks", content=b"{", headers=auth))
        seen.answer(
            "MCP, a near-miss token",
            client.post(
                "/mcp/",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Authorization": f"Bearer {token[:-1]}"},
            ),
        )


def _mcp(run: Session) -> None:
    token = SESSION_TOKEN[0]

    async def scenario() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        transport = streamable_http_client(
            f"{run.ingress_url}/mcp/", http_client=httpx2.AsyncClient(headers=headers)
        )
        async with Client(transport) as client:
            tools = await client.list_tools()
            run.seen.add("MCP tools/list", repr(tools))
            for arguments in (
                {"title": "canary over MCP", "external_id": "canary:2"},
                {"title": "t", "external_id": "bad\n"},
                {"title": "t", "workspace_id": 999999},
            ):
                run.seen.add(
                    "MCP create_task", repr(await client.call_tool("create_task", arguments))
                )

    async def bounded() -> None:
        with anyio.fail_after(60):
            await scenario()

    anyio.run(bounded)


class _signed_in:
    """An httpx client signed in to the console with the session's token."""

    def __init__(self, run: Session) -> None:
        self.run = run
        self.client = httpx.Client(base_url=run.ingress_url, timeout=10)

    def __enter__(self) -> httpx.Client:
        form = self.client.get("/console/sign-in")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)[1]
        answer = self.client.post(
            "/console/sign-in", data={"token": SESSION_TOKEN[0], "csrf": csrf, "next": "/console/"}
        )
        self.run.seen.answer("console sign-in", answer)
        return self.client

    def __exit__(self, *exc_info: object) -> None:
        self.client.close()


def _console(run: Session) -> None:
    seen = run.seen
    with httpx.Client(base_url=run.ingress_url, timeout=10) as client:
        form = seen.answer("console sign-in form", client.get("/console/sign-in"))
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)[1]
        for wrong in (SESSION_TOKEN[0][:-1], SESSION_TOKEN[0] + "x"):
            seen.answer(
                "console sign-in, a near-miss token",
                client.post(
                    "/console/sign-in", data={"token": wrong, "csrf": csrf, "next": "/console/"}
                ),
            )
    with _signed_in(run) as client:
        for path in (
            "/console/",
            "/console/sources",
            "/console/deliveries",
            "/console/tasks",
            "/console/operations",
            "/console/tokens",
        ):
            seen.answer(path, client.get(path))
        listed = client.get("/console/deliveries").text
        for pk in sorted(set(re.findall(r"/console/deliveries/(\d+)", listed)))[:4]:
            seen.answer("console delivery page", client.get(f"/console/deliveries/{pk}"))


# --- the assertions -----------------------------------------------------------------------------


def test_the_session_exercised_every_path(outsider: Seen):
    """The canaries were used, and each error path was reached."""
    everything = "\n".join(text for _, text in outsider.texts)
    for said in (
        "rejected",  # a 401, as the catch-up words it
        "answered 500",
        "moved to",
        "unreachable",  # the timeout
        "catch-up of canary-gh stopped",  # the worker's beat catch-up
        "Invalid signature",
    ):
        assert said.lower() in everything.lower(), said
    statuses = " ".join(where for where, _ in outsider.texts)
    assert "github webhook -> 202" in statuses and "jira webhook -> 202" in statuses
    assert "console sign-in -> 200" in statuses or "console sign-in -> 303" in statuses


def test_the_logs_were_searched_in_both_formats(outsider: Seen):
    """The ingress's and the worker's logs were JSON lines at DEBUG, beat's text."""
    logs = {where.removeprefix("log of "): text for where, text in outsider.texts}
    for name in ("ingress", "worker"):
        lines = [json.loads(line) for line in logs[name].splitlines() if line.startswith("{")]
        assert len(lines) > 20 and {"DEBUG", "INFO"} <= {line["level"] for line in lines}, name
    assert not logs["beat"].lstrip().startswith("{") and "beat: Starting..." in logs["beat"]


def assert_unseen(outsider: Seen, kind: str) -> None:
    found = leaks([(where, text) for where, text in outsider.texts if where.startswith(kind)])
    if found:
        pytest.fail(f"{len(found)} leaks:\n" + "\n".join(found), pytrace=False)


def test_no_canary_in_process_logs(outsider: Seen):
    assert_unseen(outsider, "log of ")


def test_no_canary_in_http_answers(outsider: Seen):
    assert_unseen(outsider, "HTTP ")


def test_no_canary_in_cli_output(outsider: Seen):
    assert_unseen(outsider, "$ taskhook")
