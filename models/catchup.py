"""What the catch-up keeps: where a source's provider is read, and each run.

GitHub never redelivers a delivery our ingress failed to take; it keeps a log
of them for 3 days (7 on Enterprise Server). Jira retries for a while, then
gives up. GitLab retries a few times, then disables a failing hook for a
while and sends nothing at all. A source configured here can be caught up
(``worker.catchup``): a GitHub source from its hook's delivery log or by a
scan of its issues and pull requests, a Jira source by a search of its site,
a GitLab source from its hook's recorded events and a scan of its issues and
merge requests. Each run is recorded, and the last complete one is the
cursor the next starts from.

A window no catch-up can read (a sender taskhook cannot read, an API that
is down for good) can be marked as handled by hand (:func:`mark_handled`):
a ``by-hand`` run that covers it, with who and why, never a cursor.

Which command covers a source is decided here, once
(:func:`catch_up_command`): ``taskhook stats``, the console and ``/metrics``
(and so the alert) all name the command this gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from sqlalchemy import desc, func, select
from sqlalchemy.orm import Session

from models.errors import InvalidOperation, InvalidRelease, InvalidSource, SourceNotFound
from models.names import NameKind
from models.sealing import PREFIX as SEALED_PREFIX
from models.sealing import is_sealed
from models.tables import (
    CatchUpRun,
    CatchUpSource,
    Delivery,
    Identity,
    Operation,
    Task,
    WebhookSource,
    utcnow,
)
from models.tasks import MAX_OPERATOR_LENGTH, clean_release_text

GITHUB_API = "https://api.github.com"
#: How long GitHub keeps a hook's deliveries (7 days on Enterprise Server):
#: how far back a source's first catch-up reads (a Jira source's too: Jira
#: gives up retrying well within it).
GITHUB_LOG_RETENTION = timedelta(days=3)
#: Read again from a little before the last run's end: an attempt GitHub
#: logged just before that run listed may appear in the log a moment late.
CURSOR_OVERLAP = timedelta(minutes=10)

_OWNER = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})"
_TARGET = re.compile(rf"repos/{_OWNER}/[A-Za-z0-9._-]{{1,100}}|orgs/{_OWNER}")
_HOOK_ID = re.compile(r"[0-9]{1,20}")
_APP_ID = re.compile(r"[0-9]{1,20}")
#: The target of a GitHub App's own webhook: its hook path is ``app/hook``.
APP_TARGET = "app"
#: The target of a Jira source: its site, at ``api_base_url``.
JIRA_TARGET = "jira"
#: A repository's issues, the one thing a GitHub scan lists.
REPO_PREFIX = "repos/"
_REPO = re.compile(rf"{_OWNER}/[A-Za-z0-9._-]{{1,100}}")
#: An email as Atlassian accounts have them: something@something, one line.
_EMAIL = re.compile(r"[^@\s]{1,200}@[^@\s]{1,119}")
_MAX_JQL = 2000
#: GitLab.com; a self-managed instance is read at its own URL.
GITLAB_URL = "https://gitlab.com"
#: Where GitLab's REST API lives below an instance's URL.
GITLAB_API_PATH = "/api/v4"
#: A GitLab project or group: its numeric id, or its full path (groups nest).
_GITLAB_PART = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}"
_GITLAB_NAMESPACE = re.compile(rf"[0-9]{{1,20}}|{_GITLAB_PART}(?:/{_GITLAB_PART}){{0,20}}")
GITLAB_OWNERS = ("projects", "groups")
#: ``catchup_runs.kind`` of a run that read a GitLab hook's events and scanned
#: its issues and merge requests.
GITLAB_KIND = "gitlab"
#: ``catchup_runs.kind`` of a window an operator marked as handled by hand.
BY_HAND = "by-hand"
#: ``operations.kind`` of the same mark, in the operations history.
MARK_HANDLED = "mark-handled"
_MAX_MARK_REASON = 1000
#: The most hook ids a GitHub catch-up without a configured or confirmed hook
#: tries (newest named first): each costs a read of that hook's log.
HOOK_CANDIDATES = 5
#: The ``taskhook catch-up`` subcommand that reads each provider's API.
_CATCH_UP_SUBCOMMANDS = {"github": "github", "jira": "jira", "gitlab": "gitlab"}


@dataclass(frozen=True)
class LogSettings:
    """Where one source's log is read, and with what: a ``token``, or a GitHub
    App's ``app_id`` and ``private_key`` (PEM). Credentials: never shown."""

    source_id: int
    slug: str
    api_base_url: str
    #: ``repos/OWNER/REPO/hooks/ID``, ``orgs/ORG/hooks/ID`` or ``app/hook``.
    hook_path: str
    token: str | None = None
    app_id: str | None = None
    private_key: str | None = None
    #: Hook ids the source's deliveries named (``X-GitHub-Hook-ID``, which
    #: the signature does not cover), newest first, when no hook id is
    #: configured or confirmed: ``hook_path`` is then the first's, and the
    #: catch-up reads a hook's log only once that log confirms it
    #: (:func:`confirm_hook`).
    unconfirmed: tuple[str, ...] = ()

    def __repr__(self) -> str:
        credential = "token=<hidden>" if self.token else f"app_id={self.app_id!r}, key=<hidden>"
        return f"LogSettings(source={self.slug!r}, hook_path={self.hook_path!r}, {credential})"

    def with_hook(self, hook_id: str) -> LogSettings:
        """The same settings, reading hook ``hook_id`` of the same owner."""
        owner = self.hook_path.rpartition("/hooks/")[0]
        return replace(self, hook_path=f"{owner}/hooks/{checked_hook_id(hook_id)}", unconfirmed=())

    @property
    def repo(self) -> str | None:
        """``OWNER/REPO`` of a repository's hook: what a scan lists by default."""
        if not self.hook_path.startswith(REPO_PREFIX):
            return None
        return self.hook_path.removeprefix(REPO_PREFIX).rpartition("/hooks/")[0]


@dataclass(frozen=True)
class JiraSettings:
    """Where one Jira source's site is searched, and with what: an ``email``
    and API token (Jira Cloud), or a personal access token alone (Data
    Center); ``jql`` narrows the search. The token is never shown."""

    source_id: int
    slug: str
    site_url: str
    token: str
    email: str | None = None
    jql: str | None = None

    def __repr__(self) -> str:
        who = f"email={self.email!r}, token=<hidden>" if self.email else "pat=<hidden>"
        return f"JiraSettings(source={self.slug!r}, site={self.site_url!r}, {who})"


@dataclass(frozen=True)
class GitLabSettings:
    """Where one GitLab source is read: its project's or group's hook events
    (when ``hook_id`` is known) and its issues and merge requests, under
    ``api_base_url`` (``https://HOST/api/v4``) with a ``token``. Never shown."""

    source_id: int
    slug: str
    api_base_url: str
    #: ``projects/ID`` or ``groups/ID``, ID a number or a full path.
    owner: str
    hook_id: str | None
    token: str

    def __repr__(self) -> str:
        return (
            f"GitLabSettings(source={self.slug!r}, owner={self.owner!r}, "
            f"hook_id={self.hook_id!r}, token=<hidden>)"
        )


def catch_up_command(provider: str, slug: str, *, since: datetime | None = None) -> str:
    """What an operator runs to catch source ``slug`` up from ``since``: the
    ``taskhook catch-up`` of its provider; for a provider no catch-up reads,
    the manual mark. The one place ``stats``, the console and ``/metrics``
    take it from."""
    subcommand = _CATCH_UP_SUBCOMMANDS.get(provider)
    if subcommand is None:
        return mark_handled_command(slug, since=since, until=None)
    command = f"taskhook catch-up {subcommand} --source {slug}"
    return command if since is None else f"{command} --since {_floor(since)}"


def mark_handled_command(slug: str, *, since: datetime | None, until: datetime | None) -> str:
    """The manual mark of a window of source ``slug``: its times rounded
    outwards to the second, so the mark holds the window whole."""
    since_text = "SINCE" if since is None else _floor(since)
    until_text = "UNTIL" if until is None else _ceiling(until)
    return (
        f"taskhook catch-up mark-handled --source {slug} --since {since_text} "
        f"--until {until_text} --reason TEXT"
    )


def _floor(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def _ceiling(moment: datetime) -> str:
    if moment.microsecond:
        moment = moment.replace(microsecond=0) + timedelta(seconds=1)
    return _floor(moment)


def set_log_access(
    *,
    session: Session,
    slug: str,
    target: str,
    token: str,
    hook_id: str | None = None,
    api_base_url: str = GITHUB_API,
) -> CatchUpSource:
    """Let source ``slug`` (a GitHub source) be caught up from its hook's log:
    ``target`` is the hook's owner, ``repos/OWNER/REPO`` or ``orgs/ORG``.
    Raises :class:`SourceNotFound`, or :class:`InvalidSource` naming what is
    wrong with a value."""
    source = _github_source(session, slug)
    target, hook_id = checked_target(target), checked_hook_id(hook_id)
    token, api_base_url = checked_token(token), checked_api_url(api_base_url)
    return _stored_access(
        session, source, target=target, hook_id=hook_id, api_base_url=api_base_url, token=token
    )


def set_app_access(
    *,
    session: Session,
    slug: str,
    app_id: str,
    private_key: str,
    api_base_url: str = GITHUB_API,
) -> CatchUpSource:
    """Let source ``slug`` (a GitHub source fed by a GitHub App's webhook) be
    caught up from the App's own hook log, ``app/hook``, read with a JWT the
    App's ``private_key`` (PEM) signs. Raises as :func:`set_log_access` does."""
    source = _github_source(session, slug)
    app_id, private_key = checked_app_id(app_id), checked_private_key(private_key)
    return _stored_access(
        session,
        source,
        target=APP_TARGET,
        hook_id=None,  # the path names the App's one hook: app/hook
        api_base_url=checked_api_url(api_base_url),
        app_id=app_id,
        private_key=private_key,
    )


def set_jira_access(
    *,
    session: Session,
    slug: str,
    token: str,
    email: str | None = None,
    site_url: str | None = None,
    jql: str | None = None,
) -> CatchUpSource:
    """Let Jira source ``slug`` be caught up by a search of its site:
    ``site_url`` (by default the source's own), read with ``email`` and an API
    token (Jira Cloud) or a personal access token alone (Data Center);
    ``jql`` is the filter the source's webhook uses. Raises as
    :func:`set_log_access` does."""
    source = _source_of(session, slug, "jira", "a Jira site")
    site_url = site_url or source.site_url
    if site_url is None:
        raise InvalidSource(
            f"source {slug!r} names no Jira site: give the site's URL (--site https://…)"
        )
    access = _stored_access(
        session,
        source,
        target=JIRA_TARGET,
        hook_id=None,
        api_base_url=checked_api_url(site_url),
        token=checked_token(token),
    )
    access.email = checked_email(email)
    access.jql = checked_jql(jql)
    return access


def set_gitlab_access(
    *,
    session: Session,
    slug: str,
    owner: str,
    token: str,
    hook_id: str | None = None,
    site_url: str = GITLAB_URL,
) -> CatchUpSource:
    """Let GitLab source ``slug`` be caught up: ``owner`` is ``projects/ID``
    or ``groups/ID`` (its hook's owner, whose issues and merge requests are
    scanned), ``hook_id`` the hook whose events are read (by default the one
    of the owner's hooks whose URL ends with the source's name), read at
    ``site_url`` (GitLab.com, or a self-managed instance) with ``token``.
    Raises as :func:`set_log_access` does."""
    source = _source_of(session, slug, "gitlab", "GitLab")
    return _stored_access(
        session,
        source,
        target=checked_gitlab_owner(owner),
        hook_id=checked_hook_id(hook_id),
        api_base_url=checked_api_url(site_url) + GITLAB_API_PATH,
        token=checked_token(token),
    )


def checked_gitlab_owner(owner: str) -> str:
    """``projects/ID`` or ``groups/ID``, ID a number or a full path; else
    :class:`InvalidSource`."""
    kind, _, name = owner.partition("/")
    if kind not in GITLAB_OWNERS or not _GITLAB_NAMESPACE.fullmatch(name):
        raise InvalidSource(
            "a GitLab project or group is its numeric id or its full path "
            f"(group/subgroup/project), not {name or owner!r}"
        )
    return owner


def gitlab_settings(*, session: Session, slug: str) -> GitLabSettings:
    """Where GitLab source ``slug`` is read. Raises :class:`SourceNotFound`
    or :class:`InvalidSource` saying what to set."""
    source, access = _source_and_access(session, slug)
    if source.provider != "gitlab":
        raise InvalidSource(f"source {slug!r} is a {source.provider} source, not GitLab's")
    if access is None or access.target.partition("/")[0] not in GITLAB_OWNERS:
        raise InvalidSource(
            f"source {slug!r} has no access to GitLab's API: "
            f"taskhook source catch-up {slug} --project ID (or --group ID)"
        )
    return GitLabSettings(
        source_id=source.id,
        slug=slug,
        api_base_url=access.api_base_url,
        owner=access.target,
        hook_id=access.hook_id,
        token=access.token,
    )


def mark_handled(
    *,
    session: Session,
    slug: str,
    since: datetime,
    until: datetime,
    operator: str,
    reason: str,
    now: datetime | None = None,
) -> CatchUpRun:
    """Record that source ``slug``'s deliveries from ``since`` to ``until``
    were handled by hand (``operator`` says who, ``reason`` why): a
    ``by-hand`` run covering the window, which ``stats``, the console and
    ``/metrics`` then no longer report, and an entry in the operations
    history. It is never a catch-up's cursor (:func:`window_start`).
    Raises :class:`SourceNotFound`, or :class:`InvalidOperation` saying
    what is wrong with a value."""
    now = now or utcnow()
    for name, moment in (("--since", since), ("--until", until)):
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise InvalidOperation(f"{name} must say its time zone")
    if until <= since:
        raise InvalidOperation("--until must be after --since")
    if until > now:
        raise InvalidOperation("--until is in the future: only a window that has passed is handled")
    operator = _audit_text(
        operator, "the operator", "a mark needs the operator's name", MAX_OPERATOR_LENGTH
    )
    reason = _audit_text(reason, "the reason", "a mark must give a reason", _MAX_MARK_REASON)
    source = session.scalars(select(WebhookSource).where(WebhookSource.slug == slug)).first()
    if source is None:
        raise SourceNotFound(slug)
    run = CatchUpRun(
        source_id=source.id,
        kind=BY_HAND,
        since=since,
        covered_until=until,
        started_at=now,
        finished_at=now,
        operator=operator,
        reason=reason,
    )
    session.add(run)
    session.add(
        Operation(
            kind=MARK_HANDLED,
            name=f"{slug} handled by hand",
            operator=operator,
            criteria={
                "source": slug,
                "since": since.isoformat(),
                "until": until.isoformat(),
                "reason": reason,
            },
            scope=None,  # from the CLI: every workspace's
            matched=1,
            done=1,
            started_at=now,
            finished_at=now,
        )
    )
    session.flush()
    return run


def _audit_text(value: str, what: str, missing: str, limit: int) -> str:
    try:
        return clean_release_text(value, what=what, missing=missing, limit=limit)
    except InvalidRelease as error:
        raise InvalidOperation(str(error)) from None


def _github_source(session: Session, slug: str) -> WebhookSource:
    return _source_of(session, slug, "github", "GitHub")


def _source_of(session: Session, slug: str, provider: str, what: str) -> WebhookSource:
    source = session.scalars(select(WebhookSource).where(WebhookSource.slug == slug)).first()
    if source is None:
        raise SourceNotFound(slug)
    if source.provider != provider:
        raise InvalidSource(
            f"source {slug!r} is a {source.provider} source; this access is for {what}"
        )
    return source


def _stored_access(
    session: Session,
    source: WebhookSource,
    *,
    target: str,
    hook_id: str | None,
    api_base_url: str,
    token: str | None = None,
    app_id: str | None = None,
    private_key: str | None = None,
) -> CatchUpSource:
    """Set the source's access, replacing whichever credential it held before."""
    access = session.get(CatchUpSource, source.id) or CatchUpSource(source_id=source.id)
    access.target = target
    access.hook_id = hook_id
    access.token = token
    access.app_id = app_id
    access.private_key = private_key
    access.email = access.jql = None
    access.api_base_url = api_base_url
    access.updated_at = utcnow()
    session.add(access)
    session.flush()
    return access


def checked_target(target: str) -> str:
    """The hook's owner, ``repos/OWNER/REPO`` or ``orgs/ORG``; else :class:`InvalidSource`."""
    if not _TARGET.fullmatch(target):
        raise InvalidSource(
            f"the hook's owner must be repos/OWNER/REPO or orgs/ORG, not {target!r}"
        )
    return target


def checked_hook_id(hook_id: str | None) -> str | None:
    if hook_id is not None and not _HOOK_ID.fullmatch(hook_id):
        raise InvalidSource(f"a hook id is a number, not {hook_id!r}")
    return hook_id


def checked_token(token: str) -> str:
    token = token.strip()
    if not token or any(c.isspace() for c in token):
        raise InvalidSource("the token must be one word, without spaces")
    if is_sealed(token):
        raise InvalidSource(f"a token cannot begin with {SEALED_PREFIX!r}")
    return token


def checked_repo(repo: str) -> str:
    """``OWNER/REPO``; else :class:`InvalidSource`."""
    if not _REPO.fullmatch(repo):
        raise InvalidSource(f"a repository is OWNER/REPO, not {repo!r}")
    return repo


def checked_email(email: str | None) -> str | None:
    """An Atlassian account's email, or None (a personal access token alone)."""
    if email is None:
        return None
    email = email.strip()
    if not _EMAIL.fullmatch(email):
        raise InvalidSource(f"{email!r} is not an email address")
    return email


def checked_jql(jql: str | None) -> str | None:
    """A JQL filter, one line, without its own ``ORDER BY`` (the search orders
    by creation); else :class:`InvalidSource`. Jira itself checks the rest."""
    if jql is None or not jql.strip():
        return None
    jql = jql.strip()
    if len(jql) > _MAX_JQL or any(ord(c) < 32 for c in jql):
        raise InvalidSource(f"a JQL filter is one line of at most {_MAX_JQL} characters")
    if re.search(r"\border\s+by\b", jql, re.IGNORECASE):
        raise InvalidSource("the JQL filter must not hold ORDER BY: the search orders by creation")
    return jql


def checked_app_id(app_id: str) -> str:
    """A GitHub App's id: the number on its settings page (not its client id)."""
    app_id = app_id.strip()
    if not _APP_ID.fullmatch(app_id):
        raise InvalidSource("a GitHub App id is a number, as on the App's settings page")
    return app_id


def rsa_private_key(pem: str) -> RSAPrivateKey:
    """The key of ``pem``, an unencrypted RSA private key as GitHub gives an
    App's; else :class:`InvalidSource`, whose message never quotes the key."""
    try:
        key = load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError, UnicodeError):
        key = None  # the library's message may quote what it could not read
    if not isinstance(key, RSAPrivateKey):
        raise InvalidSource(
            "the private key must be a GitHub App's: an unencrypted RSA key in PEM, "
            "the .pem file GitHub generated"
        )
    return key


def checked_private_key(private_key: str) -> str:
    """``private_key`` as stored, once :func:`rsa_private_key` reads it."""
    pem = private_key.strip() + "\n"
    rsa_private_key(pem)
    return pem


def checked_api_url(api_base_url: str) -> str:
    """An http(s) base URL, without a trailing slash."""
    parts = urlsplit(api_base_url)
    if parts.scheme not in ("https", "http") or not parts.netloc or parts.query or parts.fragment:
        raise InvalidSource(f"the API base URL must be an http(s) URL, not {api_base_url!r}")
    return api_base_url.rstrip("/")


def log_settings(*, session: Session, slug: str) -> LogSettings:
    """Where source ``slug``'s log is read: its hook's, configured
    (``--hook-id``) or confirmed by an earlier run (:func:`confirm_hook`);
    else the hooks its deliveries named are ``unconfirmed`` candidates. Raises
    :class:`SourceNotFound` or :class:`InvalidSource` saying what to set."""
    source, access = _source_and_access(session, slug)
    if source.provider != "github":
        raise InvalidSource(f"source {slug!r} is a {source.provider} source, not GitHub's")
    if access is None:
        raise InvalidSource(
            f"source {slug!r} has no access to its delivery log: "
            f"taskhook source catch-up {slug} --repo OWNER/REPO (or --org ORG, "
            "or --app-id ID --private-key-file PEM)"
        )
    if access.target == APP_TARGET:
        return LogSettings(
            source_id=source.id,
            slug=slug,
            api_base_url=access.api_base_url,
            hook_path="app/hook",
            app_id=access.app_id,
            private_key=access.private_key,
        )
    if access.hook_id is not None:
        # Configured (--hook-id), or confirmed by an earlier run's read of its log.
        if not _HOOK_ID.fullmatch(access.hook_id):  # no command stores one: never into a URL
            raise InvalidSource(
                f"source {slug!r}: its stored hook id is not a number; "
                f"taskhook source catch-up {slug} ... --hook-id ID"
            )
        hook_id, unconfirmed = access.hook_id, ()
    else:
        unconfirmed = _named_hooks(session, source.id)
        if not unconfirmed:
            raise InvalidSource(
                f"source {slug!r}: no delivery has named its hook yet; "
                f"taskhook source catch-up {slug} ... --hook-id ID"
            )
        hook_id = unconfirmed[0]
    return LogSettings(
        source_id=source.id,
        slug=slug,
        api_base_url=access.api_base_url,
        hook_path=f"{access.target}/hooks/{hook_id}",
        token=access.token,
        unconfirmed=unconfirmed,
    )


def _named_hooks(session: Session, source_id: int) -> tuple[str, ...]:
    """The numeric hook ids the source's deliveries named, newest first, at
    most :data:`HOOK_CANDIDATES`. Anyone holding one signed body can resend
    it under a header of their choosing: these are candidates, never the hook."""
    named = session.execute(
        select(Delivery.hook_id)
        .where(Delivery.source_id == source_id, Delivery.hook_id.is_not(None))
        .group_by(Delivery.hook_id)
        .order_by(desc(func.max(Delivery.id)))
    )
    candidates: list[str] = []
    for (hook_id,) in named:
        if _HOOK_ID.fullmatch(hook_id):
            candidates.append(hook_id)
            if len(candidates) == HOOK_CANDIDATES:
                break
    return tuple(candidates)


def held_from_hook(
    *, session: Session, source_id: int, hook_id: str, delivery_ids: list[str]
) -> bool:
    """Whether the inbox holds, from the source, one of ``delivery_ids`` (read
    from hook ``hook_id``'s own log) that named that hook: what confirms it."""
    return any(
        session.scalar(
            select(Delivery.id)
            .where(
                Delivery.source_id == source_id,
                Delivery.hook_id == hook_id,
                Delivery.delivery_id.in_(delivery_ids[start : start + 500]),
            )
            .limit(1)
        )
        is not None
        for start in range(0, len(delivery_ids), 500)
    )


def confirm_hook(*, session: Session, source_id: int, target: str, hook_id: str) -> bool:
    """Record ``hook_id``, confirmed by its own log, as the source's hook, so
    later runs read it and no header moves them; unless the access changed
    meanwhile (another owner, or a hook id given). Whether it was recorded."""
    access = session.get(CatchUpSource, source_id)
    if access is None or access.target != target or access.hook_id is not None:
        return False
    access.hook_id = checked_hook_id(hook_id)
    access.updated_at = utcnow()
    return True


def _source_and_access(session: Session, slug: str) -> tuple[WebhookSource, CatchUpSource | None]:
    row = session.execute(
        select(WebhookSource, CatchUpSource)
        .outerjoin(CatchUpSource, CatchUpSource.source_id == WebhookSource.id)
        .where(WebhookSource.slug == slug)
    ).first()
    if row is None:
        raise SourceNotFound(slug)
    return row[0], row[1]


def jira_settings(*, session: Session, slug: str) -> JiraSettings:
    """Where Jira source ``slug`` is searched. Raises :class:`SourceNotFound`
    or :class:`InvalidSource` saying what to set."""
    source, access = _source_and_access(session, slug)
    if source.provider != "jira":
        raise InvalidSource(f"source {slug!r} is a {source.provider} source, not Jira's")
    if access is None or access.target != JIRA_TARGET:
        raise InvalidSource(
            f"source {slug!r} has no access to its Jira site: "
            f"taskhook source catch-up {slug} --email EMAIL (or --pat)"
        )
    return JiraSettings(
        source_id=source.id,
        slug=slug,
        site_url=access.api_base_url,
        token=access.token,
        email=access.email,
        jql=access.jql,
    )


def window_start(*, session: Session, source_id: int, now: datetime) -> datetime:
    """Where a run without ``--since`` starts: a little before the end of the
    last complete run, or as far back as GitHub keeps deliveries."""
    covered = session.scalar(
        select(CatchUpRun.covered_until)
        .where(
            CatchUpRun.source_id == source_id,
            CatchUpRun.covered_until.is_not(None),
            # A window handled by hand says nothing of what came before it.
            CatchUpRun.kind != BY_HAND,
        )
        .order_by(desc(CatchUpRun.covered_until))
        .limit(1)
    )
    earliest = now - GITHUB_LOG_RETENTION
    if covered is None:
        return earliest
    return max(earliest, covered - CURSOR_OVERLAP)


def known_delivery_ids(*, session: Session, source_id: int, delivery_ids: list[str]) -> set[str]:
    """Which of ``delivery_ids`` the inbox holds for the source."""
    known: set[str] = set()
    for start in range(0, len(delivery_ids), 500):
        chunk = delivery_ids[start : start + 500]
        known.update(
            session.scalars(
                select(Delivery.delivery_id).where(
                    Delivery.source_id == source_id, Delivery.delivery_id.in_(chunk)
                )
            )
        )
    return known


def known_identities(*, session: Session, workspace_id: int, external_ids: list[str]) -> set[str]:
    """Which of ``external_ids`` the identity ledger knows in the workspace,
    whatever became of them: a scan or search never creates one again
    (docs/contract.md §15, "The identity ledger"). Only a filter, to store
    less: the worker asks the ledger again when it runs the delivery, for a
    delivery stored before a delete or a release, and for the names a
    rename or a stable key ties to one of these."""
    known: set[str] = set()
    for start in range(0, len(external_ids), 500):
        chunk = external_ids[start : start + 500]
        known.update(
            session.scalars(
                select(Identity.name).where(
                    Identity.workspace_id == workspace_id,
                    Identity.kind == NameKind.EXTERNAL.value,
                    Identity.name.in_(chunk),
                )
            )
        )
        # A task's own name is on its row (models/identities.py).
        known.update(
            session.scalars(
                select(Task.external_id).where(
                    Task.workspace_id == workspace_id, Task.external_id.in_(chunk)
                )
            )
        )
    return known


def sources_to_catch_up(*, session: Session) -> list[tuple[str, str]]:
    """The enabled sources a catch-up can read, as (slug, provider): a GitHub
    source's delivery log, a Jira source's site, a GitLab source's API."""
    return [
        (slug, provider)
        for slug, provider in session.execute(
            select(WebhookSource.slug, WebhookSource.provider)
            .join(CatchUpSource, CatchUpSource.source_id == WebhookSource.id)
            .where(WebhookSource.enabled.is_(True))
            .order_by(WebhookSource.slug)
        )
    ]
