"""A key per console form (docs/contract.md §16): every form the console
renders carries a hidden ``idempotency_key`` of its own, so a form sent twice
-- a double click, a browser resending a POST after a lost answer -- acts
once and shows the first answer again.

The actor is the session's token; the answer kept is the notice the action
showed. What the caller may see is asked before the key is looked up, on a
replay as on a first send (each action's ``visible``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta

from sqlalchemy.orm import Session
from starlette.datastructures import FormData
from starlette.requests import Request

from models import idempotency
from models.console_sessions import SignedIn

#: The hidden field every form carries (templates/macros.html, csrf_field).
FIELD = "idempotency_key"


def new_key() -> str:
    """A form's key, made when the page is rendered."""
    return uuid.uuid4().hex


def form_retry(request: Request, user: SignedIn, form: FormData) -> idempotency.Retry:
    """The form's key as a retry; raises ``InvalidIdempotencyKey`` for one no
    row can keep. A form without one (an older page) acts without a key."""
    hours = request.app.state.runtime.settings.idempotency_window_hours
    return idempotency.Retry.of(
        idempotency.token_actor(user.principal.token_id),
        form.get(FIELD) or None,
        window=timedelta(hours=hours),
    )


def once(
    session: Session,
    retry: idempotency.Retry,
    *,
    action: str,
    target: str,
    body: Mapping[str, object],
    work: Callable[[Session], str],
) -> tuple[str, bool]:
    """``work``'s notice, once per key, and whether this was a form sent
    again (which gets the first notice, and must not repeat what followed
    the commit -- a message enqueued, a secret shown)."""
    answer, replayed = idempotency.answered_once(
        session,
        retry,
        action=action,
        target=target,
        body=body,
        work=lambda: {"notice": work(session)},
    )
    return str(answer.get("notice", "")), replayed
