"""Scenario 12: taskhook split over several hosts, as users deploy it.

The Procfile's processes each run on a host of their own -- the ingress
(``web``), two ``worker`` processes and ``beat`` -- and reach PostgreSQL and
the broker over the network, not over this machine's loopback. The hosts are
network namespaces on this one machine, each joined to it by a veth link
(``tests/support/hosts.py``); each host reaches the servers through forwarders on its
side of the link, and the load generator (this process) posts to the
ingress's own address over the ingress's link:

    host       namespace     address (inside)  forwarders on 10.213.S.4k+1
    ingress    th<run>i      10.213.S.2        PostgreSQL, broker
    worker A   th<run>w1     10.213.S.6        PostgreSQL, broker
    worker B   th<run>w2     10.213.S.10       PostgreSQL, broker
    beat       th<run>b      10.213.S.14       broker only (beat never opens the database)

The commands are the Procfile's own, read from it (``celery`` and ``python``
from this virtualenv; ``%h`` is the host's name, since the namespaces share
this machine's hostname), with the short timings of ``tests/e2e`` (``FAST``:
5 s leases, a sweep a second).

1. Layout: the release step (``taskhook db upgrade``) from the ingress's host,
   then deliveries posted to the ingress; every one becomes its task once,
   and both workers did some (their logs say how many each recorded done).
2. One worker's link cut mid-batch (its end of the veth down on this side: a
   pulled cable, packets dropped both ways, its connections left hanging):
   the other worker keeps draining, the sweeper sends again what the cut
   worker held once its leases run out, and everything is done once while the
   link is still down; the link comes back, the cut worker's stale attempts
   are fenced off, and it takes deliveries again.
3. A bad link: worker B's database link delayed 200 ms each way (its
   forwarder holds every chunk of bytes) and its whole link squeezed by a
   token bucket (``tbf``, 128 kbit/s, a queue of 3 kB: what overflows is
   dropped); nothing is lost or done twice, and the drain time is compared
   with a clean run of the same size.

**netem is not available in this kernel** (``tc qdisc ... netem``: "Specified
qdisc kind is unknown"; nor fq_codel, sfq, prio or tc classifiers). What
stands in for it: delay from the user-space forwarder
(:meth:`~tests.support.proxy.TcpProxy.delay`), slowness and loss from a
``tbf`` with a small queue, a cut from ``ip link set ... down``.

Each runs on Redis (a private ``redis-server``, so no other engineer's
worker takes our messages) and on RabbitMQ (a virtual host of its own on the
machine's RabbitMQ, reached through the forwarders like Redis: RabbitMQ sees
a loopback peer, so ``guest`` may log in). The default run is a smoke run
(hundreds of deliveries; about 65 s for the six tests on a quiet machine).
``TASKHOOK_HOSTS_SOAK=1`` runs five times the counts and keeps the cut link
down 30 s past the drain, a long partition (about 4 min in all); the suite's
``TASKHOOK_RELIABILITY_SCALE`` multiplies the counts as everywhere. Needs
root (``ip netns``): without it the scenarios fail, as they do without a
server they need.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.support.brokers import rabbitmq_vhost
from tests.support.hosts import Host, Hosts
from tests.support.invariants import assert_invariants
from tests.support.processes import (
    READY_TIMEOUT,
    ROOT,
    WorkerProcess,
    wait_until,
    worker_environment,
)
from tests.support.procfile import expanded, procfile
from tests.support.stack import (
    add_tenant,
    assert_each_jira_issue_done_once,
    database_view,
    outcomes,
    scaled,
    swept_in,
    tasks_by_external_id,
    wait_drained,
    wait_for_text,
)
from tests.support.traffic import post_all

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.e2e,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.rabbitmq,
]

SCENARIO = "12. several hosts"
SOAK = os.environ.get("TASKHOOK_HOSTS_SOAK") == "1"
BROKERS_HERE = ("redis", "rabbitmq")
#: Counts of the smoke run; the soak run's are five times larger.
SIZE = 5 if SOAK else 1
INGRESS_PORT = 8000
WORKERS = ("w1", "w2")
#: Scenario 3's bad link to worker B: each chunk of its database bytes held this
#: long each way, and a token bucket on its whole link with a queue this small.
BAD_LINK_DELAY = 0.2
BAD_LINK_RATE = "128kbit"
BAD_LINK_LIMIT = "3000"

#: What a worker logs when a delivery task returns; its result says what it recorded.
SUCCEEDED = re.compile(
    r"Task (?P<task>taskhook\.process_deliver(?:y|ies))\[(?P<id>[^\]]+)\] succeeded in [\d.]+s: "
    r"(?P<result>\{.*\})$",
    re.M,
)
SWEPT = re.compile(r"Task taskhook\.sweep\[[^\]]+\] succeeded in ")
#: A delivery message's life in a worker's log: received, then one ending.
MESSAGE = re.compile(
    r"Task taskhook\.process_deliver(?:y|ies)\[(?P<id>[^\]]+)\] "
    r"(?P<what>received|succeeded|retry|raised|failed)"
)
TAKEN_OVER = re.compile(r"delivery \d+: attempt \d+ was taken over")


def in_flight(text: str) -> set[str]:
    """Delivery messages a worker's log shows received and not yet ended."""
    received, ended = set(), set()
    for match in MESSAGE.finditer(text):
        (received if match["what"] == "received" else ended).add(match["id"])
    return received - ended


def received(text: str) -> set[str]:
    """Delivery messages a worker's log shows received so far."""
    return {m["id"] for m in MESSAGE.finditer(text) if m["what"] == "received"}


def done_in(text: str, skip: frozenset[str] | set[str] = frozenset()) -> int:
    """Deliveries a worker's log says it recorded done (in messages not in
    ``skip``): each delivery is recorded done by exactly one run, whichever
    worker ran it."""
    done = 0
    for match in SUCCEEDED.finditer(text):
        if match["id"] in skip:
            continue
        result = ast.literal_eval(match["result"])
        if match["task"].endswith("ies"):
            done += int(result.get("done", 0))
        else:
            done += result.get("status") == "done"
    return done


# --- the Procfile, as each host runs it ----------------------------------------------------------


def argv(command: str, env: dict[str, str], hostname: str) -> list[str]:
    """A Procfile command as argv: ``${VAR:-default}`` expanded from ``env``,
    ``%h`` (Celery's host name) the host's, the programs from this virtualenv."""
    words = expanded(command.replace("%h", hostname), env)
    programs = {
        "celery": [sys.executable, "-m", "celery"],
        "python": [sys.executable],
        "taskhook": [sys.executable, "-m", "worker.cli"],
    }
    return programs.get(words[0], words[:1]) + words[1:]


@dataclass
class Deployment:
    """The Procfile's processes, each on its host; stopped by pid."""

    folder: Path
    network: Network
    database_url: str  # as this machine reaches it (127.0.0.1)
    broker_url: str
    processes: dict[str, WorkerProcess] = field(default_factory=dict)

    def environment(self, host: Host, **extra: str) -> dict[str, str]:
        """The host's settings: the servers through its own forwarders. Beat has
        no database forwarder: its database URL names 127.0.0.1, which inside
        its namespace is its own loopback, where nothing listens."""
        database = self.database_url
        if "postgres" in host.forwarders:
            database = host.url("postgres", self.database_url)
        return worker_environment(database, host.url("broker", self.broker_url), **extra)

    def launch(self, name: str, host: Host, entry: str, **extra: str) -> WorkerProcess:
        env = self.environment(host, **extra)
        args = host.command(argv(procfile()[entry], env, host.namespace))
        process = WorkerProcess(name, self.folder / f"{host.namespace}-{name}.log", args, env)
        self.processes[name] = process
        return process

    def start(self) -> None:
        """Every process at once, then each waited for."""
        hosts = self.network.layout
        ingress = hosts["i"]
        self.launch(
            "ingress",
            ingress,
            "web",
            TASKHOOK_HOST=ingress.address,
            TASKHOOK_PORT=str(INGRESS_PORT),
        )
        for role in WORKERS:
            self.launch(role, hosts[role], "worker")
        schedule = self.folder / f"{hosts['b'].namespace}-celerybeat-schedule"
        self.launch("beat", hosts["b"], "beat", TASKHOOK_BEAT_SCHEDULE=str(schedule))
        wait_until(self._ingress_ready, timeout=READY_TIMEOUT, what="the ingress", logs=self.all)
        for role in WORKERS:
            self.processes[role].wait_ready()
        wait_for_text(self.processes["beat"], "beat: Starting...")

    @property
    def url(self) -> str:
        return f"http://{self.network.layout['i'].address}:{INGRESS_PORT}"

    @property
    def all(self) -> list[WorkerProcess]:
        return list(self.processes.values())

    def _ingress_ready(self) -> bool:
        process = self.processes["ingress"]
        if process.process.poll() is not None:
            pytest.fail(f"the ingress exited early\n{process.tail()}", pytrace=False)
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        return False

    def done_by(self) -> dict[str, int]:
        return {role: done_in(self.processes[role].text()) for role in WORKERS}

    def settle(self, timeout: float = 30) -> None:
        """Wait until neither worker has a delivery message in hand."""
        wait_until(
            lambda: not any(in_flight(self.processes[role].text()) for role in WORKERS),
            timeout=timeout,
            what="the workers' last messages",
            logs=self.all,
        )

    def swept(self) -> int:
        """Rows the sweeps sent again, by both workers' logs."""
        return sum(swept_in(self.processes[role].text()) for role in WORKERS)

    def sweeps(self) -> int:
        """Sweeps run: beat sent them, through the broker, to a worker."""
        return sum(len(SWEPT.findall(self.processes[role].text())) for role in WORKERS)

    def release(self) -> subprocess.CompletedProcess:
        """The Procfile's release step, from the ingress's host."""
        host = self.network.layout["i"]
        env = self.environment(host)
        return subprocess.run(
            host.command(argv(procfile()["release"], env, host.namespace)),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def stop(self) -> None:
        """All at once (each a warm shutdown by pid, then SIGKILL to its group)."""

        def stop(process: WorkerProcess) -> None:
            with contextlib.suppress(Exception):
                process.stop()

        with ThreadPoolExecutor(len(self.processes) or 1) as pool:
            list(pool.map(stop, self.all))


@dataclass
class Network:
    hosts: Hosts
    layout: dict[str, Host]

    def heal(self) -> None:
        """Every link up, unshaped and undelayed."""
        for host in self.layout.values():
            if host.cut_now:
                self.hosts.restore(host)
            self.hosts.clear(host)
            for proxy in host.forwarders.values():
                proxy.delay(0)

    def describe(self) -> dict[str, object]:
        return {role: host.describe() for role, host in self.layout.items()}


# --- fixtures ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Broker:
    kind: str
    url: str  # as this machine reaches it
    port: int
    flush: Callable[[], None] | None = None

    @property
    def letter(self) -> str:
        """In the scenario's task prefixes, so that each broker's tenants differ."""
        return {"redis": "R", "rabbitmq": "Q"}[self.kind]


@pytest.fixture(scope="module", params=BROKERS_HERE)
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    if request.param == "redis":
        server = request.getfixturevalue("private_redis")
        yield Broker("redis", server.url, server.port, server.flushall)
        return
    with rabbitmq_vhost() as url:
        yield Broker("rabbitmq", url, make_url(url).port or 5672)


@pytest.fixture(scope="module")
def network(broker: Broker, shared_database) -> Iterator[Network]:
    if os.geteuid() != 0:  # fails, as a missing server does: nothing skips
        pytest.fail("scenario 12 makes network namespaces (ip netns): run it as root", False)
    database_port = make_url(shared_database.url).port or 5432
    with Hosts() as hosts:
        layout = {role: hosts.add(role) for role in ("i", *WORKERS, "b")}
        for role, host in layout.items():
            if role != "b":
                hosts.forward(host, "postgres", database_port)
            hosts.forward(host, "broker", broker.port)
        yield Network(hosts, layout)


@pytest.fixture(scope="module")
def views(shared_database):
    engine, sessions = database_view(shared_database.url)
    try:
        yield engine, sessions
    finally:
        engine.dispose()


@pytest.fixture
def deployment(request, network, broker, shared_database, module_logs) -> Iterator[Deployment]:
    """This test's processes, on their hosts, logging to a folder of the test's
    own; stopped (links healed first) when it ends."""
    if broker.flush is not None:
        broker.flush()  # what an earlier test left queued (done rows) is not this test's
    folder = module_logs / f"{request.node.originalname}-{broker.kind}"
    folder.mkdir(exist_ok=True)
    built = Deployment(folder, network, shared_database.url, broker.url)
    try:
        built.start()
        yield built
    finally:
        network.heal()
        built.stop()


def _reclaimed(engine, workspace_id: int) -> int:
    """The workspace's deliveries claimed more than once: a lease that ran out
    (its worker cut off) and a second worker's claim."""
    query = text(
        "SELECT count(*) FROM deliveries d JOIN webhook_sources s ON s.id = d.source_id "
        "WHERE s.workspace_id = :workspace AND d.attempts > 1"
    )
    with engine.connect() as connection:
        return connection.execute(query, {"workspace": workspace_id}).scalar_one()


def _post(deployment: Deployment, tenant, prefix: str, count: int, **options):
    deliveries = [tenant.jira(f"{prefix}-{n}") for n in range(1, count + 1)]
    answers = post_all(deployment.url, deliveries, **options)
    assert answers.statuses() == {202: count}, answers.statuses()
    return answers


# --- the scenarios -----------------------------------------------------------------------------


def test_the_procfile_split_over_four_hosts_does_every_delivery_once(
    broker, network, deployment, views, secret_book, figures
):
    engine, sessions = views
    release = deployment.release()
    assert release.returncode == 0, release.stdout + release.stderr
    ready = httpx.get(f"{deployment.url}/readyz", timeout=5).json()
    assert ready["status"] == "ready", ready

    prefix = f"LAY{broker.letter}"
    tenant = add_tenant(sessions, secret_book, f"layout-{broker.kind}", prefix)
    count = scaled(200 * SIZE)
    started = time.monotonic()
    answers = _post(deployment, tenant, prefix, count)
    drained = wait_drained(sessions, expected=count, logs=deployment.all)
    seconds = time.monotonic() - started
    assert_each_jira_issue_done_once(sessions, engine, tenant.workspace_id, prefix, count)

    wait_until(deployment.sweeps, timeout=60, what="a sweep (beat -> broker -> a worker)")
    done = deployment.done_by()
    assert sum(done.values()) == count, done
    assert all(done.values()), f"a worker did nothing: {done}"
    figures.record(
        SCENARIO,
        topology=network.describe(),
        **{
            f"{broker.kind}_layout_deliveries": count,
            f"{broker.kind}_layout_seconds_post_to_drained": round(seconds, 1),
            f"{broker.kind}_layout_seconds_to_drain_after_posting": round(drained, 1),
            f"{broker.kind}_layout_slowest_answer_s": round(answers.slowest(), 3),
            f"{broker.kind}_layout_done_by_worker": done,
            f"{broker.kind}_layout_sweeps_run": deployment.sweeps(),
            f"{broker.kind}_layout_swept": deployment.swept(),
        },
    )


def test_a_worker_cut_off_mid_batch_loses_nothing_and_doubles_nothing(
    broker, network, deployment, views, secret_book, figures
):
    engine, sessions = views
    hosts, cut_host = network.hosts, network.layout["w1"]
    cut_worker, other = deployment.processes["w1"], deployment.processes["w2"]
    prefix = f"CUT{broker.letter}"
    tenant = add_tenant(sessions, secret_book, f"cut-{broker.kind}", prefix)
    count = scaled(300 * SIZE)
    rate = 60.0
    deliveries = [tenant.jira(f"{prefix}-{n}") for n in range(1, count + 1)]
    burst = count // 2
    posted = []

    def post() -> None:
        # A burst, so each worker holds full messages (16 keys), then a steady flow.
        posted.append(post_all(deployment.url, deliveries[:burst]))
        posted.append(post_all(deployment.url, deliveries[burst:], rate=rate))

    poster = threading.Thread(target=post, daemon=True)
    poster.start()
    # Mid-batch: once both are at work and the doomed one holds a message.
    wait_until(
        lambda: (
            done_in(cut_worker.text()) > 0
            and done_in(other.text()) > 0
            and in_flight(cut_worker.text())
        ),
        timeout=30,
        what="both workers at work",
    )
    hosts.cut(cut_host)
    cut_at = time.monotonic()
    before = deployment.done_by()
    swept_before = deployment.swept()
    poster.join(timeout=count / rate + 60)
    assert sum((answers.statuses() for answers in posted), Counter()) == {202: count}, posted

    # The whole batch done while the link is still down.
    wait_drained(sessions, expected=count, logs=deployment.all)
    seconds_cut_to_drained = time.monotonic() - cut_at
    at_drain = deployment.done_by()
    reclaimed = _reclaimed(engine, tenant.workspace_id)
    swept_while_cut = deployment.swept() - swept_before
    if SOAK:
        time.sleep(30)  # a long partition: the cut worker's connections give up
    assert_each_jira_issue_done_once(sessions, engine, tenant.workspace_id, prefix, count)

    hosts.restore(cut_host)
    restored_at = time.monotonic()
    held = {role: received(deployment.processes[role].text()) for role in WORKERS}
    # The cut worker comes back: what it still held is fenced off (its
    # attempts were taken over), and it takes new deliveries again.
    again = scaled(40 * SIZE)
    _post(deployment, tenant, f"{prefix}X", again, rate=20.0)
    wait_drained(sessions, expected=count + again, logs=deployment.all)
    assert tasks_by_external_id(sessions, tenant.workspace_id) == {
        **{f"jira:{prefix}-{n}": 1 for n in range(1, count + 1)},
        **{f"jira:{prefix}X-{n}": 1 for n in range(1, again + 1)},
    }
    assert outcomes(sessions, tenant.workspace_id) == {("done", "created"): count + again}
    assert_invariants(engine)
    after = {role: done_in(deployment.processes[role].text(), held[role]) for role in WORKERS}
    assert at_drain["w2"] > before["w2"], "worker B did not keep draining"
    assert swept_while_cut > 0, "the sweeper sent nothing again while worker A was cut off"
    figures.record(
        SCENARIO,
        **{
            f"{broker.kind}_cut_deliveries": count,
            f"{broker.kind}_cut_done_by_worker_before_cut": before,
            f"{broker.kind}_cut_done_by_worker_while_cut": {
                role: at_drain[role] - before[role] for role in WORKERS
            },
            f"{broker.kind}_cut_seconds_cut_to_all_done": round(seconds_cut_to_drained, 1),
            f"{broker.kind}_cut_swept_while_cut": swept_while_cut,
            f"{broker.kind}_cut_claimed_again_after_lease_ran_out": reclaimed,
            f"{broker.kind}_cut_taken_over_in_cut_worker_log": len(
                TAKEN_OVER.findall(cut_worker.text())
            ),
            f"{broker.kind}_cut_after_restore_deliveries": again,
            # Only messages received after the restore: not the cut worker's
            # stale batch, whose line comes once its link is back.
            f"{broker.kind}_cut_after_restore_done_by_worker": after,
            f"{broker.kind}_cut_seconds_restore_to_all_done": round(
                time.monotonic() - restored_at, 1
            ),
        },
    )


def test_a_slow_lossy_link_to_one_worker_loses_nothing_and_doubles_nothing(
    broker, network, deployment, views, secret_book, figures
):
    engine, sessions = views
    hosts, slow_host = network.hosts, network.layout["w2"]
    count, rate = scaled(100 * SIZE), 40.0
    drains, tails, done, swept = {}, {}, {}, {}
    for phase in ("clean", "bad"):
        if phase == "bad":
            slow_host.forwarders["postgres"].delay(BAD_LINK_DELAY)
            hosts.slow(slow_host, rate=BAD_LINK_RATE, limit=BAD_LINK_LIMIT)
        prefix = f"{phase[0].upper()}L{broker.letter}"
        tenant = add_tenant(sessions, secret_book, f"{phase}-link-{broker.kind}", prefix)
        before, swept_before = deployment.done_by(), deployment.swept()
        started = time.monotonic()
        _post(deployment, tenant, prefix, count, rate=rate)
        posted = time.monotonic()
        drained_at = wait_until(
            lambda t=tenant: (
                outcomes(sessions, t.workspace_id) == {("done", "created"): count}
                and time.monotonic()
            ),
            timeout=240,
            what=f"the {phase} run drained",
            logs=deployment.all,
        )
        drains[phase] = round(drained_at - started, 1)
        tails[phase] = round(drained_at - posted, 1)
        # The slow worker's last messages end after the rows did (their keys
        # found done); its log counts what it recorded once they have.
        deployment.settle()
        after = deployment.done_by()
        done[phase] = {role: after[role] - before[role] for role in WORKERS}
        swept[phase] = deployment.swept() - swept_before
        assert_each_jira_issue_done_once(sessions, engine, tenant.workspace_id, prefix, count)
    drops = hosts.drops(slow_host)
    network.heal()
    assert sum(done["bad"].values()) == count, done
    figures.record(
        SCENARIO,
        **{
            f"{broker.kind}_bad_link_deliveries_per_run": count,
            f"{broker.kind}_bad_link_posted_per_s": rate,
            f"{broker.kind}_bad_link": f"worker B: database +{BAD_LINK_DELAY * 1000:.0f} ms "
            f"each way (forwarder), whole link tbf {BAD_LINK_RATE} limit {BAD_LINK_LIMIT} B",
            f"{broker.kind}_bad_link_seconds_first_post_to_drained": drains,
            f"{broker.kind}_bad_link_seconds_last_post_to_drained": tails,
            f"{broker.kind}_bad_link_done_by_worker": done,
            f"{broker.kind}_bad_link_swept": swept,
            f"{broker.kind}_bad_link_tbf_dropped_packets": drops,
        },
    )
