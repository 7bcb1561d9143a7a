"""API tokens: who may call the REST API, on which workspaces, in which role."""

from __future__ import annotations

import enum
import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from models.access import Caller
from models.errors import InvalidRelease, InvalidToken, TokenNotFound
from models.tables import MAX_ROW_ID, ApiToken, ApiTokenWorkspace, Workspace, utcnow
from models.tasks import MAX_OPERATOR_LENGTH, clean_release_text

TOKEN_PREFIX = "th_"
#: How many of a token's first characters are kept and shown (``token_prefix``):
#: enough for a person to tell tokens apart, public to whoever sees the token list.
SHOWN_PREFIX_LENGTH = 10


class Role(enum.StrEnum):
    MEMBER = "member"
    OPERATOR = "operator"


@dataclass(frozen=True)
class Principal:
    """The caller behind a valid token."""

    token_id: int
    name: str
    role: Role
    caller: Caller

    @property
    def is_operator(self) -> bool:
        return self.role is Role.OPERATOR


@dataclass(frozen=True)
class IssuedToken:
    token: str  # shown once; never stored
    record: ApiToken


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def checked_name(name: str) -> str:
    """``name`` trimmed, if a token may hold it; else :class:`InvalidToken`.
    The name is the operator of the releases made with the token, so it keeps
    the audit row's rules (``models.tasks.clean_release_text``)."""
    try:
        return clean_release_text(
            name,
            what="a token's name",
            missing="a token needs a name (it is the operator name in audit rows)",
            limit=MAX_OPERATOR_LENGTH,
        )
    except InvalidRelease as error:
        raise InvalidToken(str(error)) from None


def issue_token(
    *, session: Session, name: str, role: str, workspace_ids: Iterable[int]
) -> IssuedToken:
    """A new token for ``workspace_ids``. Tokens are long random strings, so a
    plain SHA-256 is enough to keep a database leak from revealing them."""
    name = checked_name(name)
    try:
        role = Role(role)
    except ValueError:
        raise InvalidToken(f"role must be one of {', '.join(Role)}") from None
    workspaces = sorted(set(workspace_ids))
    if not workspaces:
        raise InvalidToken("a token needs at least one workspace")
    known = set(session.scalars(select(Workspace.id).where(Workspace.id.in_(workspaces))))
    if missing := [w for w in workspaces if w not in known]:
        raise InvalidToken(f"unknown workspace {missing[0]}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = ApiToken(
        name=name,
        role=role.value,
        token_sha256=_digest(token),
        token_prefix=token[:SHOWN_PREFIX_LENGTH],
    )
    session.add(record)
    session.flush()
    session.add_all(ApiTokenWorkspace(token_id=record.id, workspace_id=w) for w in workspaces)
    session.flush()
    return IssuedToken(token, record)


def authenticate(*, session: Session, token: str) -> Principal | None:
    """The principal of an unrevoked token, or None."""
    record = session.scalar(
        select(ApiToken).where(
            ApiToken.token_sha256 == _digest(token), ApiToken.revoked_at.is_(None)
        )
    )
    if record is None:
        return None
    return principal_of(session=session, record=record)


def known_prefix(*, session: Session, token: str) -> str | None:
    """``token``'s first characters when they are a token's shown prefix
    (``api_tokens.token_prefix``, public to whoever sees the token list);
    None otherwise: then they may be part of some other secret."""
    prefix = token[:SHOWN_PREFIX_LENGTH]
    if len(prefix) < SHOWN_PREFIX_LENGTH:
        return None
    # Compared here, not in SQL: what was typed never becomes a statement's
    # parameter, which a DEBUG log of the engine would print. Tokens are few.
    known = set(session.scalars(select(ApiToken.token_prefix)))
    return prefix if prefix in known else None


def principal_of(*, session: Session, record: ApiToken) -> Principal:
    """The principal acting as token ``record`` (revoked or not: the caller checks)."""
    workspaces = session.scalars(
        select(ApiTokenWorkspace.workspace_id).where(ApiTokenWorkspace.token_id == record.id)
    )
    role = Role(record.role)
    return Principal(
        token_id=record.id,
        name=record.name,
        role=role,
        caller=Caller.of_workspaces(record.name, *workspaces, operator=role is Role.OPERATOR),
    )


def _workspaces_of(session: Session, token_ids: Iterable[int] | None) -> dict[int, list[int]]:
    query = select(ApiTokenWorkspace.token_id, ApiTokenWorkspace.workspace_id)
    if token_ids is not None:
        query = query.where(ApiTokenWorkspace.token_id.in_(list(token_ids)))
    workspaces: dict[int, list[int]] = {}
    for token_id, workspace_id in session.execute(query):
        workspaces.setdefault(token_id, []).append(workspace_id)
    return {token_id: sorted(ids) for token_id, ids in workspaces.items()}


def list_tokens(
    *, session: Session, workspace_ids: frozenset[int] | None = None
) -> list[tuple[ApiToken, list[int]]]:
    """Every token with the workspaces it may see, by id; with
    ``workspace_ids``, the tokens that may see at least one of them, each
    with only those of its workspaces (the others are not the caller's to see)."""
    query = select(ApiToken).order_by(ApiToken.id)
    if workspace_ids is not None:
        query = query.where(
            ApiToken.id.in_(
                select(ApiTokenWorkspace.token_id).where(
                    ApiTokenWorkspace.workspace_id.in_(sorted(workspace_ids))
                )
            )
        )
    tokens = session.scalars(query).all()
    workspaces = _workspaces_of(session, None if workspace_ids is None else [t.id for t in tokens])
    return [
        (
            token,
            [
                w
                for w in workspaces.get(token.id, [])
                if workspace_ids is None or w in workspace_ids
            ],
        )
        for token in tokens
    ]


def token_in_scope(
    *, session: Session, token_id: int, workspace_ids: frozenset[int] | None = None
) -> ApiToken:
    """The token, if a caller scoped to ``workspace_ids`` may revoke it: all
    its workspaces are among them (None: any token). Another is
    :class:`TokenNotFound`, like an unknown id, so a caller learns nothing of
    tokens beyond its scope."""
    record = session.get(ApiToken, token_id) if 1 <= token_id <= MAX_ROW_ID else None
    if record is None:
        raise TokenNotFound(token_id)
    if workspace_ids is not None:
        # A token that sees no workspace any more (they were deleted) is no
        # scoped caller's either.
        its_workspaces = set(_workspaces_of(session, [token_id]).get(token_id, []))
        if not its_workspaces or not its_workspaces <= workspace_ids:
            raise TokenNotFound(token_id)
    return record


def revoke_token(
    *, session: Session, token_id: int, workspace_ids: frozenset[int] | None = None
) -> ApiToken:
    """Revoke the token (again: a no-op), if it is in scope (:func:`token_in_scope`)."""
    record = token_in_scope(session=session, token_id=token_id, workspace_ids=workspace_ids)
    if record.revoked_at is None:
        record.revoked_at = utcnow()
        session.flush()
    return record
