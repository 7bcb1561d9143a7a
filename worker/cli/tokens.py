"""``taskhook token``: bearer tokens for the REST API, each scoped to its workspaces."""

from __future__ import annotations

import click

from models import idempotency
from models.reports import get_workspace, list_workspaces
from models.tokens import (
    Role,
    checked_name,
    issue_token,
    list_tokens,
    revoke_token,
    token_in_scope,
)
from worker.cli.output import echo, emit_json, json_option, print_table
from worker.cli.params import DATABASE_ID, checked_by, idempotency_key_option, os_user_actor
from worker.cli.runtime import CommandRuntime, pass_runtime


@click.group()
def token() -> None:
    """Bearer tokens for the REST API, each scoped to its workspaces."""


@token.command("add")
@click.option(
    "--workspace",
    "workspace_slugs",
    required=True,
    multiple=True,
    help="A workspace the token may see (repeat for several).",
)
@click.option(
    "--role",
    type=click.Choice([role.value for role in Role]),
    default=Role.MEMBER.value,
    show_default=True,
    help="operator tokens may also release external ids.",
)
@click.option(
    "--name",
    required=True,
    callback=checked_by(checked_name),
    help="Who holds it; audit rows name it.",
)
@json_option
@pass_runtime
def token_add(
    runtime: CommandRuntime, workspace_slugs: tuple[str, ...], role: str, name: str, as_json: bool
) -> None:
    """Make a token and print it once: only its hash is kept."""
    with runtime.session() as session:
        workspace_ids = [get_workspace(session=session, slug=slug).id for slug in workspace_slugs]
        issued = issue_token(session=session, name=name, role=role, workspace_ids=workspace_ids)
        summary = {
            "id": issued.record.id,
            "name": issued.record.name,
            "role": issued.record.role,
            "workspaces": sorted(workspace_slugs),
            "token": issued.token,
        }
    if as_json:
        emit_json(summary)
        return
    echo(f"Token {summary['id']} ({role}) for {name} on {', '.join(summary['workspaces'])}:")
    echo(f"  {issued.token}")
    echo("It is shown once and cannot be recovered; send it as 'Authorization: Bearer …'.")


@token.command("list")
@json_option
@pass_runtime
def token_list(runtime: CommandRuntime, as_json: bool) -> None:
    """Every token, never the token itself."""
    with runtime.session() as session:
        slugs = {w.id: w.slug for w in list_workspaces(session=session)}
        rows = [
            {
                "id": record.id,
                "name": record.name,
                "role": record.role,
                "prefix": record.token_prefix + "…",
                "workspaces": [slugs.get(w, str(w)) for w in workspace_ids],
                "created_at": record.created_at,
                "revoked_at": record.revoked_at,
            }
            for record, workspace_ids in list_tokens(session=session)
        ]
    if as_json:
        emit_json({"tokens": rows})
        return
    print_table(
        ("ID", "NAME", "ROLE", "TOKEN", "WORKSPACES", "CREATED", "REVOKED"),
        (
            (
                r["id"],
                r["name"],
                r["role"],
                r["prefix"],
                ",".join(r["workspaces"]),
                r["created_at"],
                r["revoked_at"],
            )
            for r in rows
        ),
        empty="No tokens yet: taskhook token add --workspace SLUG --name NAME",
    )


@token.command("revoke")
@click.argument("token_id", type=DATABASE_ID)
@idempotency_key_option(
    "A key to retry this revocation under: run again with it, it answers that revocation."
)
@json_option
@pass_runtime
def token_revoke(
    runtime: CommandRuntime, token_id: int, idempotency_key: str | None, as_json: bool
) -> None:
    """Revoke token TOKEN_ID: it answers 401 from now on. Revoking a revoked
    token changes nothing."""
    retry = idempotency.Retry.of(os_user_actor(), idempotency_key)
    with runtime.session() as session:
        _answer, replayed = idempotency.answered_once(
            session,
            retry,
            action=idempotency.Action.REVOKE_TOKEN,
            target=f"token {token_id}",
            body={},
            work=lambda: {"token": revoke_token(session=session, token_id=token_id).id},
        )
        record = token_in_scope(session=session, token_id=token_id)
        summary = {
            "id": record.id,
            "name": record.name,
            "revoked_at": record.revoked_at,
            "replayed": replayed,
        }
    if as_json:
        emit_json(summary)
        return
    again = " (already, under this key)" if replayed else ""
    echo(f"Token {token_id} ({summary['name']}) is revoked{again}.")
