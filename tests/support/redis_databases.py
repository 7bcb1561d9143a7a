"""Which database of the machine's Redis a group of tests uses.

The end-to-end tests' processes (and the integration tests of the Redis
transport and relay) share one database, the CLI's tests another; each
empties its own before and after. Under pytest-xdist (``scripts/test`` runs
the suite on several workers) two workers emptying one database would empty
each other's queues mid-test, so each worker past the first shifts both
down by two: gw0 uses 13 and 14, gw1 11 and 12, gw2 9 and 10, and so on.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

#: How many databases each worker takes (the shared one and the CLI's).
PER_WORKER = 2


def machine_redis_url(variable: str, default: str) -> str:
    """``variable``'s URL (else ``default``), its database shifted for this
    pytest-xdist worker."""
    parts = urlsplit(os.environ.get(variable, default))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    database = int(parts.path.lstrip("/") or 0) - PER_WORKER * int(worker.removeprefix("gw"))
    if database < 0:
        raise RuntimeError(f"{worker}: no Redis database left for {variable} (too many workers)")
    return urlunsplit(parts._replace(path=f"/{database}"))
