"""Several hosts on one machine: a network namespace per host, joined to this
machine by a veth link, and forwarders to the servers on its loopback.

Each :class:`Host` is a network namespace ``th<run><role>`` (the run's 4 hex
digits and a role such as ``i``, ``w1``, ``w2``, ``b``) with one veth pair:
``<namespace>h`` on this machine's side, ``<namespace>n`` inside. Every run
takes a /24 of its own, ``10.213.<slot>.0/24``, and host number ``k`` the /30
at ``4k`` in it: ``.4k+1`` on this machine's side, ``.4k+2`` inside. Nothing
else is routed: from inside, a host reaches this machine's side of its own
link and nothing more.

The servers (PostgreSQL, Redis, RabbitMQ) listen on this machine's loopback
only, which no namespace can reach. So each host gets a *forwarder* per server
it may use: a :class:`~tests.support.proxy.TcpProxy` listening on the
host-side address of its link and connecting to ``127.0.0.1:PORT``. The
server sees a loopback peer (so PostgreSQL's trust rule and RabbitMQ's
loopback-only ``guest`` still apply), and the forwarder can delay that host's
bytes (:meth:`TcpProxy.delay`) without touching anyone else's.

Faults on a host's link:

- :meth:`Hosts.cut` sets this machine's end of the link down, as a pulled
  cable or a dead switch port: packets in both directions are dropped, open
  TCP connections stay open and retransmit, new ones time out;
  :meth:`Hosts.restore` sets it up again.
- :meth:`Hosts.slow` puts a ``tbf`` qdisc on both ends: a low rate and a
  queue of a few packets, so whatever overflows the queue is dropped (a slow,
  lossy link). ``netem`` (delay, loss, reordering) is not available in this
  kernel ("Specified qdisc kind is unknown"), nor are fq_codel, sfq, prio or
  tc classifiers: delay comes from the forwarder, loss from tbf's overflow.

Needs root (``ip netns``, ``ip link``, ``tc``). Everything is torn down in
:meth:`Hosts.destroy` (namespaces, links, forwarders; the caller stops its
processes first). A run that crashed leaves its namespaces behind; the next
run deletes every ``th????*`` namespace and link whose run's owner process is
gone (its pid is kept in ``/tmp/taskhook-hosts/<run>``), and never another
live run's.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import secrets
import shlex
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.support.proxy import TcpProxy

PREFIX = "th"
#: Where each run keeps its owner's pid (and the lock of slot allocation).
STATE = Path("/tmp/taskhook-hosts")
_RUN_NAME = re.compile(rf"^{PREFIX}(?P<run>[0-9a-f]{{4}})(?:i|b|w\d)[hn]?$")


class HostsError(RuntimeError):
    pass


def run(*args: str, namespace: str | None = None, check: bool = True) -> str:
    """Run ``ip``/``tc`` (inside ``namespace`` when given); its output."""
    command = list(args)
    if namespace is not None:
        command = ["ip", "netns", "exec", namespace, *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise HostsError(f"{shlex.join(command)} failed: {done.stdout}{done.stderr}".strip())
    return done.stdout


@dataclass
class Host:
    """One host: a namespace, its veth pair and its addresses."""

    role: str
    namespace: str
    outer_veth: str  # this machine's end
    inner_veth: str  # the namespace's end
    outer_address: str  # where this host reaches the servers (its forwarders listen here)
    address: str  # the host's own address: where others reach what it serves
    forwarders: dict[str, TcpProxy] = field(default_factory=dict)
    cut_now: bool = False

    def command(self, args: list[str]) -> list[str]:
        """``args`` to run as a process of this host (the environment passes through)."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def url(self, service: str, url: str) -> str:
        """``url`` (a server on this machine's loopback) as this host reaches it:
        through its forwarder for ``service``."""
        forwarder = self.forwarders[service]
        return rehost(url, self.outer_address, forwarder.port)

    def describe(self) -> dict[str, object]:
        return {
            "namespace": self.namespace,
            "veth": f"{self.outer_veth} {self.outer_address} <-> {self.inner_veth} {self.address}",
            "forwarders": {
                name: f"{self.outer_address}:{proxy.port} -> {proxy.target[0]}:{proxy.target[1]}"
                for name, proxy in self.forwarders.items()
            },
        }


def rehost(url: str, host: str, port: int) -> str:
    """``url`` with its host and port replaced, its user, password, path and query kept."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


class Hosts:
    """The hosts of one run; :meth:`destroy` (or ``with``) removes them all."""

    def __init__(self) -> None:
        STATE.mkdir(parents=True, exist_ok=True)
        self.hosts: list[Host] = []
        with _locked():
            remove_leftovers()
            self.run_id = _free_run_id()
            self.slot = _free_slot()
            owner = os.getpid()
            (STATE / self.run_id).write_text(f"{owner}\n{self.slot}\n{_started(owner)}\n")
        self.subnet = ipaddress.ip_network(f"10.213.{self.slot}.0/24")

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()

    def add(self, role: str) -> Host:
        """A new host: its namespace, its link up, loopback up."""
        index = len(self.hosts)
        if index >= 64:
            raise HostsError("at most 64 hosts a run")
        namespace = f"{PREFIX}{self.run_id}{role}"
        if not _RUN_NAME.match(namespace) or len(namespace) + 1 > 15:
            raise HostsError(f"role {role!r}: i, b or w<digit>")
        base = int(self.subnet.network_address) + 4 * index
        outer, inner = str(ipaddress.ip_address(base + 1)), str(ipaddress.ip_address(base + 2))
        host = Host(role, namespace, f"{namespace}h", f"{namespace}n", outer, inner)
        self.hosts.append(host)  # before anything exists, so destroy() finds it
        run("ip", "netns", "add", namespace)
        run("ip", "link", "add", host.outer_veth, "type", "veth", "peer", "name", host.inner_veth)
        run("ip", "link", "set", host.inner_veth, "netns", namespace)
        run("ip", "addr", "add", f"{outer}/30", "dev", host.outer_veth)
        run("ip", "link", "set", host.outer_veth, "up")
        run("ip", "addr", "add", f"{inner}/30", "dev", host.inner_veth, namespace=namespace)
        run("ip", "link", "set", host.inner_veth, "up", namespace=namespace)
        run("ip", "link", "set", "lo", "up", namespace=namespace)
        return host

    def forward(self, host: Host, service: str, port: int, target: str = "127.0.0.1") -> TcpProxy:
        """A forwarder on ``host``'s side of its link to ``target:port``."""
        name = f"{host.namespace}-{service}"
        proxy = TcpProxy(target, port, name=name, listen_host=host.outer_address)
        host.forwarders[service] = proxy.start()
        return proxy

    # --- faults --------------------------------------------------------------------------------

    def cut(self, host: Host) -> None:
        """This machine's end of the link down: nothing passes either way."""
        run("ip", "link", "set", host.outer_veth, "down")
        host.cut_now = True

    def restore(self, host: Host) -> None:
        run("ip", "link", "set", host.outer_veth, "up")
        host.cut_now = False

    def slow(self, host: Host, rate: str, limit: str, burst: str = "3000") -> None:
        """A token bucket on both ends of the link: ``rate`` (``256kbit``), a
        queue of ``limit`` bytes, beyond which packets are dropped."""
        shape = ["root", "tbf", "rate", rate, "burst", burst, "limit", limit]
        run("tc", "qdisc", "replace", "dev", host.outer_veth, *shape)
        run("tc", "qdisc", "replace", "dev", host.inner_veth, *shape, namespace=host.namespace)

    def clear(self, host: Host) -> None:
        """Back to the default queueing on both ends."""
        run("tc", "qdisc", "del", "dev", host.outer_veth, "root", check=False)
        inner = ["tc", "qdisc", "del", "dev", host.inner_veth, "root"]
        run(*inner, namespace=host.namespace, check=False)

    def drops(self, host: Host) -> dict[str, int]:
        """Packets each end's qdisc dropped so far."""
        outer = run("tc", "-s", "qdisc", "show", "dev", host.outer_veth, check=False)
        inner = ["tc", "-s", "qdisc", "show", "dev", host.inner_veth]
        inner = run(*inner, namespace=host.namespace, check=False)
        return {
            side: sum(int(n) for n in re.findall(r"dropped (\d+)", output))
            for side, output in (("outer", outer), ("inner", inner))
        }

    # --- teardown ------------------------------------------------------------------------------

    def destroy(self) -> None:
        """Forwarders stopped, namespaces and links deleted; safe to call twice."""
        for host in self.hosts:
            for proxy in host.forwarders.values():
                with contextlib.suppress(Exception):
                    proxy.stop()
            host.forwarders.clear()
            _delete(host.namespace, host.outer_veth)
        self.hosts.clear()
        with contextlib.suppress(OSError):
            (STATE / self.run_id).unlink()


def _delete(namespace: str, outer_veth: str) -> None:
    # Deleting the namespace destroys its end of the pair, and with it ours;
    # the link is deleted as well in case it never got moved in.
    run("ip", "netns", "delete", namespace, check=False)
    run("ip", "link", "delete", outer_veth, check=False)


@contextlib.contextmanager
def _locked():
    with (STATE / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _started(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot), None if it is gone or a
    zombie: with the pid, it tells the run's owner from a later process
    that got the same pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _owner_alive(run_id: str) -> bool:
    try:
        pid, _, started = (STATE / run_id).read_text().split()[:3]
        return _started(int(pid)) == started
    except (OSError, ValueError):
        return False


def remove_leftovers() -> list[str]:
    """Delete the namespaces and links of runs whose owner is gone; their names."""
    namespaces = [line.split()[0] for line in run("ip", "netns", "list").splitlines() if line]
    links = re.findall(r"^\d+: ([^:@]+)", run("ip", "-o", "link", "show"), flags=re.M)
    removed = []
    for name in namespaces + links:
        match = _RUN_NAME.match(name)
        if match is None or _owner_alive(match["run"]):
            continue
        if name in namespaces:
            # A crashed run's processes may still live in it: they are that run's.
            for pid in run("ip", "netns", "pids", name, check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            run("ip", "netns", "delete", name, check=False)
        else:
            run("ip", "link", "delete", name, check=False)
        removed.append(name)
    for state in STATE.glob("[0-9a-f]" * 4):
        if not _owner_alive(state.name):
            state.unlink(missing_ok=True)
    return removed


def _free_run_id() -> str:
    while True:
        candidate = secrets.token_hex(2)
        if not (STATE / candidate).exists():
            return candidate


def _free_slot() -> int:
    """A /24 of 10.213.0.0/16 that no address of this machine (nor a live run) uses."""
    used = set()
    for address in re.findall(r"inet (10\.213\.(\d+)\.\d+)", run("ip", "-o", "-4", "addr")):
        used.add(int(address[1]))
    for state in STATE.glob("[0-9a-f]" * 4):
        with contextlib.suppress(OSError, ValueError, IndexError):
            used.add(int(state.read_text().split()[1]))
    start = secrets.randbelow(256)
    for offset in range(256):
        slot = (start + offset) % 256
        if slot not in used:
            return slot
    raise HostsError("no free /24 left in 10.213.0.0/16")
