"""``taskhook secrets``: the keys that seal stored credentials (``models.sealing``).

``new-key`` prints a key; ``init`` makes the embedded default's key file;
``status`` counts what each key seals; ``rotate`` seals every credential
under the first key, in committed batches (docs/runbook.md, "Rotate the
encryption key").
"""

from __future__ import annotations

import click

from models import sealing
from models.credentials import PLAIN, Rotated, credential_counts, rotate
from worker.cli.output import echo, emit_json, json_option, print_table
from worker.cli.runtime import CommandRuntime, pass_runtime


@click.group()
def secrets() -> None:
    """The encryption keys of stored credentials: make, count, rotate."""


@secrets.command("new-key")
def new_key() -> None:
    """Print a new key, for TASKHOOK_ENCRYPTION_KEYS (or a line of the key file)."""
    echo(sealing.new_key())


@secrets.command("init")
@pass_runtime
def init(runtime: CommandRuntime) -> None:
    """Make the key file (TASKHOOK_ENCRYPTION_KEY_FILE, mode 0600) unless a key is set."""
    settings = runtime.settings
    path = settings.encryption_key_file
    if settings.encryption_keys is not None:
        echo("Encryption keys are set (TASKHOOK_ENCRYPTION_KEYS): no key file needed.")
    elif sealing.create_key_file(path):
        echo(
            f"Made an encryption key in {path} (mode 0600). Keep it with the database's "
            "backups: without it the stored credentials cannot be read."
        )
    else:
        echo(f"Encryption keys: {path}.")


@secrets.command("status")
@json_option
@pass_runtime
def status(runtime: CommandRuntime, as_json: bool) -> None:
    """How many stored credentials each key seals, and how many are plain text."""
    keyring = runtime.install_keyring()
    assert keyring is not None
    with runtime.session() as session:
        counts = credential_counts(session)
    rows = _key_rows(keyring, counts)
    if as_json:
        emit_json({"keys": rows, "plain": counts.get(PLAIN, 0)})
        return
    print_table(
        ("KEY", "ROLE", "SEALS"),
        ((row["key_id"], row["role"], row["seals"]) for row in rows),
        empty="No key.",
    )
    echo(f"Plain text (sealed by `taskhook secrets rotate`): {counts.get(PLAIN, 0)}")


def _key_rows(keyring: sealing.Keyring, counts: dict[str, int]) -> list[dict]:
    rows = [
        {
            "key_id": which,
            "role": "seals" if which == keyring.primary_id else "opens",
            "seals": counts.get(which, 0),
        }
        for which in keyring.key_ids
    ]
    rows += [
        {"key_id": which, "role": "missing", "seals": count}
        for which, count in sorted(counts.items())
        if which != PLAIN and which not in keyring.key_ids
    ]
    return rows


@secrets.command("rotate")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 10_000),
    default=500,
    show_default=True,
    help="Credentials re-sealed per committed transaction.",
)
@click.option(
    "--max-batches",
    type=click.IntRange(1),
    default=None,
    help="Stop after this many batches; run it again to go on.",
)
@json_option
@pass_runtime
def rotate_command(
    runtime: CommandRuntime, batch_size: int, max_batches: int | None, as_json: bool
) -> None:
    """Seal every stored credential under the first key. Safe while taskhook
    runs, and safe to stop: each batch commits, and a run goes on from what
    is left."""
    keyring = runtime.install_keyring()
    assert keyring is not None

    def said(done: Rotated) -> None:
        if not as_json and done.resealed:
            echo(f"Sealed {done.resealed} under key {keyring.primary_id}.")

    total = rotate(
        runtime.sessions, keyring, batch_size=batch_size, max_batches=max_batches, on_batch=said
    )
    with runtime.session() as session:
        counts = credential_counts(session)
    left = sum(count for which, count in counts.items() if which != keyring.primary_id)
    if as_json:
        emit_json({"key_id": keyring.primary_id, "resealed": total, "left": left})
        return
    if left:
        echo(f"{total} sealed; {left} left: run `taskhook secrets rotate` again.")
    else:
        echo(
            f"{total} sealed; every stored credential is sealed by key {keyring.primary_id}. "
            "The other keys seal nothing now and may be removed."
        )
