"""Several PostgreSQL hosts in one URL, in the form SQLAlchemy reads.

A primary and its standbys are named in one URL so that a client finds the
primary after a failover on its own: libpq tries the hosts in turn, and with
``target_session_attrs=read-write`` keeps the first that accepts writes
(docs/deploy.md, "PostgreSQL high availability").

Operators write that list the way libpq's documentation does --
``postgresql://user@h1:5432,h2:5432/db`` or ``?host=h1:5432,h2:5432`` -- but
SQLAlchemy's psycopg dialect reads neither: the first does not parse, and the
second becomes one host named ``h1:5432,h2:5432``. It takes
``?host=h1:5432&host=h2:5432`` (or ``?host=h1,h2&port=5432,5432``), so
:func:`spread_hosts` rewrites the other two into it. Settings are values only:
this is string work, no driver is imported.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

POSTGRES_SCHEMES = ("postgresql", "postgresql+psycopg")


def spread_hosts(url: str) -> str:
    """``url`` with a comma-separated host list, in its authority or in one
    ``host`` parameter, made one ``host=...`` parameter per host; any other
    URL unchanged."""
    scheme, separator, rest = url.partition("://")
    if not separator or scheme.lower() not in POSTGRES_SCHEMES:
        return url
    authority, slash, path_and_query = rest.partition("/")
    path, question, query = path_and_query.partition("?")
    user, at, host_list = authority.rpartition("@")
    hosts = host_list.split(",") if "," in host_list else []
    pairs = parse_qsl(query, keep_blank_values=True) if question else []
    if not hosts and not any(_listed_with_ports(k, v) for k, v in pairs):
        return url
    spread: list[tuple[str, str]] = [("host", host) for host in hosts]
    for key, value in pairs:
        if _listed_with_ports(key, value):
            spread += [("host", host) for host in value.split(",")]
        else:
            spread.append((key, value))
    authority = f"{user}@" if at else ""
    if not hosts:
        authority = f"{user}{at}{host_list}"
    return f"{scheme}://{authority}{slash or '/'}{path}?{urlencode(spread, safe=':,/[]')}"


def _listed_with_ports(key: str, value: str) -> bool:
    """A ``host`` parameter naming several hosts with their ports (``h1:p1,h2:p2``)."""
    return key == "host" and "," in value and ":" in value
