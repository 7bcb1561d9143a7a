"""Credentials sealed at rest: what taskhook must use again is stored encrypted.

Signing secrets, catch-up tokens, GitHub App private keys and Jira tokens
are written as ``enc:fernet:<key id>:<Fernet token>`` (:class:`SealedText`,
the column type of each). Fernet (``cryptography``) is AES-128-CBC with an
HMAC-SHA256 over it: a value altered in the database fails to open rather
than opening to something else. The key id is the first 8 hex digits of the
SHA-256 of the key, so a value names the key that sealed it without naming
the key.

The keys come from the settings as a list (``TASKHOOK_ENCRYPTION_KEYS``, or
one per line in ``TASKHOOK_ENCRYPTION_KEY_FILE``): the first seals, every
one opens. A value stored before sealing existed (no prefix) still reads as
it is; ``taskhook secrets rotate`` seals it, and re-seals every value under
the first key (docs/runbook.md, "Rotate the encryption key").

A process opens each value once: :meth:`Keyring.open` keeps what it opened,
keyed by the sealed value itself (which holds the key id, and is unique to
its row), so the ingress verifies signatures without a decryption per
delivery.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import Text
from sqlalchemy.types import TypeDecorator

from models.settings import Settings, get_settings

#: How every sealed value begins; a stored value without it is plain text.
PREFIX = "enc:fernet:"
#: How many opened values a process keeps (a few per source).
OPENED_CACHE = 4096
#: How a person makes a key (the refusals say it).
MAKE_A_KEY = "taskhook secrets new-key"


class SealingError(Exception):
    """A credential cannot be sealed or opened: ``str()`` is one line, and
    never holds the credential nor a key."""


class NoEncryptionKey(SealingError):
    pass


class UnknownKey(SealingError):
    """A value sealed by a key the settings no longer hold."""

    def __init__(self, key_id: str) -> None:
        super().__init__(
            f"a stored credential is sealed by key {key_id}, which the encryption keys "
            "no longer hold: put that key back in TASKHOOK_ENCRYPTION_KEYS (after the "
            "first) and run `taskhook secrets rotate`"
        )
        self.key_id = key_id


def new_key() -> str:
    """A fresh key, as ``TASKHOOK_ENCRYPTION_KEYS`` takes it."""
    return Fernet.generate_key().decode()


def key_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


def sealed_by(value: str) -> str | None:
    """The id of the key that sealed ``value``; None if it is plain text."""
    if not is_sealed(value):
        return None
    return value[len(PREFIX) :].split(":", 1)[0]


class Keyring:
    """The keys of a process: the first seals, each opens what it sealed."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._fernets: dict[str, Fernet] = {}
        for key in keys:
            try:
                fernet = Fernet(key.strip().encode())
            except (ValueError, TypeError):
                raise SealingError(
                    "an encryption key is not a Fernet key (32 bytes, url-safe base64): "
                    f"make one with `{MAKE_A_KEY}`"
                ) from None
            self._fernets.setdefault(key_id(key.strip()), fernet)
        if not self._fernets:
            raise NoEncryptionKey(f"no encryption key: make one with `{MAKE_A_KEY}`")
        self.primary_id = next(iter(self._fernets))
        self._opened: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def key_ids(self) -> list[str]:
        """Every key's id, the sealing one first."""
        return list(self._fernets)

    def seal(self, plain: str) -> str:
        token = self._fernets[self.primary_id].encrypt(plain.encode()).decode()
        return f"{PREFIX}{self.primary_id}:{token}"

    def open(self, stored: str) -> str:
        """The credential ``stored`` holds: plain text as it is, a sealed value
        opened by the key it names."""
        if not is_sealed(stored):
            return stored
        with self._lock:
            if (plain := self._opened.get(stored)) is not None:
                self._opened.move_to_end(stored)
                return plain
        which, _, token = stored[len(PREFIX) :].partition(":")
        fernet = self._fernets.get(which)
        if fernet is None:
            raise UnknownKey(which)
        try:
            plain = fernet.decrypt(token.encode()).decode()
        except InvalidToken:
            raise SealingError(
                f"a stored credential sealed by key {which} fails its check: "
                "it was altered, or sealed by another key under the same id"
            ) from None
        with self._lock:
            self._opened[stored] = plain
            if len(self._opened) > OPENED_CACHE:
                self._opened.popitem(last=False)
        return plain

    def reseal(self, stored: str) -> str | None:
        """``stored`` sealed by the first key; None if it already is."""
        if sealed_by(stored) == self.primary_id:
            return None
        return self.seal(self.open(stored))


# --- the process's keyring ----------------------------------------------------------

_installed: Keyring | None = None
_install_lock = threading.Lock()


def keys_from(keys: str | None, key_file: str) -> list[str]:
    """The keys the settings name: ``keys`` (comma-separated) if set, else the
    lines of ``key_file`` if it exists, else none."""
    if keys and keys.strip():
        return [key for key in (part.strip() for part in keys.split(",")) if key]
    path = Path(key_file)
    if path.is_file():
        lines = path.read_text().splitlines()
        return [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return []


def keyring_from(keys: str | None, key_file: str) -> Keyring:
    found = keys_from(keys, key_file)
    if not found:
        raise NoEncryptionKey(
            f"no encryption key: set TASKHOOK_ENCRYPTION_KEYS to a key made by "
            f"`{MAKE_A_KEY}`, or put one in {key_file} (TASKHOOK_ENCRYPTION_KEY_FILE)"
        )
    return Keyring(found)


def install(keyring: Keyring) -> Keyring:
    """Make ``keyring`` the one this process seals and opens credentials with."""
    global _installed
    with _install_lock:
        _installed = keyring
    return keyring


def installed() -> Keyring:
    """The process's keyring; on first use, the one the settings name."""
    global _installed
    if _installed is None:
        settings = get_settings()
        with _install_lock:
            if _installed is None:
                _installed = keyring_of(settings)
    return _installed


def keyring_of(settings: Settings) -> Keyring:
    """The keyring ``settings`` name; :class:`NoEncryptionKey` if they name none."""
    keys = settings.encryption_keys
    return keyring_from(
        keys.get_secret_value() if keys is not None else None, settings.encryption_key_file
    )


def create_key_file(path: str) -> bool:
    """Write a new key to ``path`` (mode 0600) unless the file exists; True if
    it wrote one. Safe against another process doing the same at once: the
    key is written whole under a name of its own, then linked into place,
    so no reader ever sees the file half written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        return False
    descriptor, draft = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(descriptor, "w") as file:  # mkstemp's mode is 0600
            file.write(
                "# taskhook's encryption keys, one a line: the first seals, every one opens.\n"
                "# Keep this file with the database's backups: without it the stored\n"
                "# credentials cannot be read.\n"
            )
            file.write(new_key() + "\n")
        os.link(draft, target)
    except FileExistsError:
        return False
    finally:
        os.unlink(draft)
    return True


class SealedText(TypeDecorator[str]):
    """A credential column: sealed as it is written, opened as it is read.

    A value already sealed is written as it is (``taskhook secrets rotate``
    writes values it sealed itself)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: object) -> str | None:
        if value is None or is_sealed(value):
            return value
        return installed().seal(value)

    def process_result_value(self, value: str | None, dialect: object) -> str | None:
        if value is None:
            return None
        return installed().open(value)
