"""``taskhook secrets``: make a key, count what each key seals, rotate."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from models import sealing
from tests.support.cli import as_json, refused
from tests.support.feeds import make_feed
from tests.support.stores import Store
from worker.cli import cli

OLD, NEW = sealing.new_key(), sealing.new_key()


@pytest.fixture(autouse=True)
def keyring_put_back() -> Iterator[None]:
    """The CLI installs its keyring in this process: the suite's comes back after."""
    before = sealing.installed()
    yield
    sealing.install(before)


def secrets(store: Store, *args: str, **env: str) -> Result:
    runner = CliRunner(env={"TASKHOOK_DATABASE_URL": store.url, **env})
    result = runner.invoke(cli, ["secrets", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def test_new_key_prints_a_key_that_seals():
    result = CliRunner().invoke(cli, ["secrets", "new-key"])
    key = result.stdout.strip()
    assert sealing.Keyring([key]).open(sealing.Keyring([key]).seal("x")) == "x"


def test_init_makes_the_key_file_once_and_says_so(store: Store, tmp_path: Path):
    path = tmp_path / "var" / "encryption.key"
    made = secrets(store, "init", TASKHOOK_ENCRYPTION_KEY_FILE=str(path))
    assert made.exit_code == 0 and f"Made an encryption key in {path}" in made.stdout
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = secrets(store, "init", TASKHOOK_ENCRYPTION_KEY_FILE=str(path))
    assert "Made" not in again.stdout and str(path) in again.stdout
    assert len(path.read_text().strip().splitlines()) == 4  # three comment lines, one key


def test_status_and_rotate_move_every_credential_to_the_first_key(store: Store):
    sealing.install(sealing.Keyring([OLD]))
    make_feed(store.sessions)
    old, new = sealing.key_id(OLD), sealing.key_id(NEW)
    both = f"{NEW},{OLD}"

    before = as_json(secrets(store, "status", "--json", TASKHOOK_ENCRYPTION_KEYS=both))
    assert before == {
        "keys": [
            {"key_id": new, "role": "seals", "seals": 0},
            {"key_id": old, "role": "opens", "seals": 2},
        ],
        "plain": 0,
    }
    first = secrets(
        store, "rotate", "--batch-size", "1", "--max-batches", "1", TASKHOOK_ENCRYPTION_KEYS=both
    )
    assert first.exit_code == 0
    assert f"Sealed 1 under key {new}." in first.stdout
    assert "1 sealed; 1 left: run `taskhook secrets rotate` again." in first.stdout
    done = as_json(secrets(store, "rotate", "--json", TASKHOOK_ENCRYPTION_KEYS=both))
    assert done == {"key_id": new, "resealed": 1, "left": 0}
    after = secrets(store, "status", TASKHOOK_ENCRYPTION_KEYS=NEW)
    assert after.exit_code == 0
    assert new in after.stdout and "Plain text (sealed by `taskhook secrets rotate`): 0" in (
        after.stdout
    )


def test_status_names_a_key_that_still_seals_but_is_gone(store: Store):
    sealing.install(sealing.Keyring([OLD]))
    make_feed(store.sessions)
    rows = as_json(secrets(store, "status", "--json", TASKHOOK_ENCRYPTION_KEYS=NEW))["keys"]
    assert {"key_id": sealing.key_id(OLD), "role": "missing", "seals": 2} in rows


def test_a_key_that_is_not_one_is_refused_in_one_line(store: Store):
    line = refused(secrets(store, "status", TASKHOOK_ENCRYPTION_KEYS="not-a-key"))
    assert line == (
        "Error: an encryption key is not a Fernet key (32 bytes, url-safe base64): "
        "make one with `taskhook secrets new-key`"
    )
