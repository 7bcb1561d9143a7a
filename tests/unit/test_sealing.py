"""models.sealing: credentials sealed with a key that each value names."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from models import sealing
from models.sealing import Keyring, SealingError, UnknownKey

OLD, NEW = sealing.new_key(), sealing.new_key()


def test_a_sealed_value_names_its_key_and_hides_the_credential() -> None:
    keyring = Keyring([OLD])
    stored = keyring.seal("whsec-canary-1234")
    assert stored.startswith(f"enc:fernet:{sealing.key_id(OLD)}:")
    assert "whsec-canary-1234" not in stored
    assert sealing.sealed_by(stored) == sealing.key_id(OLD) == keyring.primary_id
    assert keyring.open(stored) == "whsec-canary-1234"


@given(st.text())
def test_any_text_comes_back_as_it_went_in(plain: str) -> None:
    keyring = Keyring([NEW])
    assert keyring.open(keyring.seal(plain)) == plain


def test_the_first_key_seals_and_every_key_opens() -> None:
    sealed_by_old = Keyring([OLD]).seal("secret")
    both = Keyring([NEW, OLD])
    assert both.open(sealed_by_old) == "secret"
    assert sealing.sealed_by(both.seal("secret")) == sealing.key_id(NEW)
    assert both.key_ids == [sealing.key_id(NEW), sealing.key_id(OLD)]


def test_a_removed_key_is_named_and_the_value_is_not() -> None:
    stored = Keyring([OLD]).seal("canary-credential")
    with pytest.raises(UnknownKey) as raised:
        Keyring([NEW]).open(stored)
    assert raised.value.key_id == sealing.key_id(OLD)
    assert "canary" not in str(raised.value) and OLD not in str(raised.value)


def test_an_altered_value_fails_its_check() -> None:
    keyring = Keyring([OLD])
    stored = keyring.seal("secret")
    # Flip one character of the token, keeping it valid base64.
    head, token = stored.rsplit(":", 1)
    flipped = token[:20] + ("A" if token[20] != "A" else "B") + token[21:]
    with pytest.raises(SealingError, match="fails its check"):
        keyring.open(f"{head}:{flipped}")


def test_a_value_stored_before_sealing_reads_as_it_is() -> None:
    assert Keyring([OLD]).open("plain-secret") == "plain-secret"
    assert sealing.sealed_by("plain-secret") is None


def test_reseal_moves_a_value_to_the_first_key_and_leaves_one_already_there() -> None:
    keyring = Keyring([NEW, OLD])
    moved = keyring.reseal(Keyring([OLD]).seal("secret"))
    assert moved is not None and sealing.sealed_by(moved) == keyring.primary_id
    assert keyring.open(moved) == "secret"
    assert keyring.reseal(moved) is None
    plain = keyring.reseal("plain-secret")
    assert plain is not None and keyring.open(plain) == "plain-secret"


def test_a_key_that_is_not_a_key_is_refused_without_being_shown() -> None:
    with pytest.raises(SealingError, match="not a Fernet key") as raised:
        Keyring(["not-a-key-at-all"])
    assert "not-a-key-at-all" not in str(raised.value)


def test_no_key_at_all_says_how_to_make_one(tmp_path) -> None:
    with pytest.raises(sealing.NoEncryptionKey, match="taskhook secrets new-key"):
        sealing.keyring_from(None, str(tmp_path / "missing.key"))


def test_keys_come_from_the_setting_before_the_file(tmp_path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# a comment\n{OLD}\n")
    assert sealing.keyring_from(None, str(path)).primary_id == sealing.key_id(OLD)
    assert sealing.keyring_from(f"{NEW}, {OLD}", str(path)).key_ids == [
        sealing.key_id(NEW),
        sealing.key_id(OLD),
    ]


def test_the_key_file_is_made_once_readable_by_its_owner_only(tmp_path) -> None:
    path = tmp_path / "var" / "encryption.key"
    assert sealing.create_key_file(str(path)) is True
    first = path.read_text()
    assert sealing.create_key_file(str(path)) is False
    assert path.read_text() == first
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(sealing.keyring_from(None, str(path)).key_ids) == 1


def test_a_process_opens_each_value_once() -> None:
    keyring = Keyring([OLD])
    stored = keyring.seal("secret")
    assert keyring.open(stored) == "secret"
    keyring._fernets.clear()  # a second decryption would now fail
    assert keyring.open(stored) == "secret"
