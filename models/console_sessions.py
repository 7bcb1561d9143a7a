"""Console sign-ins: a browser's session, acting as the API token it signed in with.

A session is a random key in an HttpOnly cookie (``ingest.console.auth``);
the store keeps only its SHA-256, as it does for tokens, so reading the
table signs nobody in. A session lasts ``TASKHOOK_CONSOLE_SESSION_HOURS``
and ends earlier when its browser signs out (the row is deleted) or its
token is revoked (a revoked token's sessions are refused, then deleted).

Each session has its own CSRF token, which every form the console serves
carries back: an action without it is refused.

Every sign-in is recorded in the operations history (``operations``, kind
:data:`CONSOLE_SIGN_IN`): who (the token's name, its shown prefix and role),
when, and from which address; ``taskhook operations list`` and the console's
operations page show it, within the token's workspaces as for any operation.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from models.tables import ApiToken, ConsoleSession, Operation, utcnow
from models.tokens import Principal, authenticate, principal_of

#: ``operations.kind`` of a console sign-in.
CONSOLE_SIGN_IN = "console-sign-in"
#: The longest client address a sign-in's record keeps.
_MAX_ADDRESS_LENGTH = 100
_MAX_NAME_LENGTH = 200


@dataclass(frozen=True)
class StartedSession:
    #: For the cookie only; never stored.
    key: str
    csrf_token: str
    expires_at: datetime


@dataclass(frozen=True)
class SignedIn:
    """Who is behind a console session."""

    principal: Principal
    csrf_token: str
    expires_at: datetime


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def start_session(
    *, session: Session, token: str, lifetime: timedelta, address: str | None = None
) -> StartedSession | None:
    """A new session for the holder of ``token``, signing in from client
    ``address``, recorded in the operations history; None when the token is
    unknown or revoked. Sessions that ran out are deleted on the way."""
    principal = authenticate(session=session, token=token)
    if principal is None:
        return None
    now = utcnow()
    record = session.get(ApiToken, principal.token_id)
    workspaces = principal.caller.workspace_ids or frozenset()
    session.add(
        Operation(
            kind=CONSOLE_SIGN_IN,
            # operations.name holds 200 characters, as a token's name does.
            name=f"{principal.name} signed in to the console"[:_MAX_NAME_LENGTH],
            operator=principal.name,
            criteria={
                "token": record.token_prefix if record is not None else "",
                "role": principal.role.value,
                "address": (address or "unknown")[:_MAX_ADDRESS_LENGTH],
            },
            # Seen by a token that may see every workspace this one may; one
            # that sees none any more (they were deleted): by the CLI alone.
            scope=sorted(workspaces) or None,
            matched=1,
            done=1,
            started_at=now,
            finished_at=now,
        )
    )
    session.execute(delete(ConsoleSession).where(ConsoleSession.expires_at <= now))
    started = StartedSession(
        key=secrets.token_urlsafe(32),
        csrf_token=secrets.token_urlsafe(32),
        expires_at=now + lifetime,
    )
    session.add(
        ConsoleSession(
            session_sha256=_digest(started.key),
            token_id=principal.token_id,
            csrf_token=started.csrf_token,
            created_at=now,
            expires_at=started.expires_at,
        )
    )
    session.flush()
    return started


def signed_in(*, session: Session, key: str) -> SignedIn | None:
    """The session with cookie ``key``, while it lasts and its token is not
    revoked; else None."""
    row = session.execute(
        select(ConsoleSession, ApiToken)
        .join(ApiToken, ApiToken.id == ConsoleSession.token_id)
        .where(ConsoleSession.session_sha256 == _digest(key))
    ).one_or_none()
    if row is None:
        return None
    console_session, token = row
    if console_session.expires_at <= utcnow() or token.revoked_at is not None:
        session.delete(console_session)
        session.flush()
        return None
    return SignedIn(
        principal=principal_of(session=session, record=token),
        csrf_token=console_session.csrf_token,
        expires_at=console_session.expires_at,
    )


def end_session(*, session: Session, key: str) -> bool:
    """Sign out: the session is gone for good. False when there was none."""
    result = session.execute(
        delete(ConsoleSession).where(ConsoleSession.session_sha256 == _digest(key))
    )
    return bool(result.rowcount)
