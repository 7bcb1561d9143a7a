"""How a delivery proves who sent it, checked while its body streams in.

Two kinds of proof, each a :class:`models.providers.Verifier` (fed the body
chunk by chunk, then asked whether it matches):

- :class:`HmacSignature`: GitHub (``X-Hub-Signature-256``) and Jira
  (``X-Hub-Signature``) sign the raw body as ``sha256=`` + the hex
  HMAC-SHA256 under the webhook's secret. An HMAC is incremental, so the
  ingress feeds it each chunk as it arrives and never needs an unverified
  body whole in memory (docs/reliability.md, "Hostile input").
- :class:`SecretToken`: GitLab sends the secret itself, in ``X-Gitlab-Token``;
  the body plays no part, and the comparison is all there is.

Several secrets may be active at once so that a secret rotates without
downtime: add the new one, switch the provider over, drop the old one. Empty
secrets are skipped -- an empty key or token would make any sender "valid".
Every active secret is compared, matched or not, so the time taken does not
tell which one (if any) matched.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

SIGNATURE_PREFIX = "sha256="


def _active(secrets: Iterable[str]) -> list[str]:
    if isinstance(secrets, str):
        # A bare string is an iterable of one-character "secrets": refuse it loudly.
        raise TypeError("secrets must be an iterable of strings, not a single string")
    return [secret for secret in secrets if secret]


class HmacSha256Stream:
    """The signatures of one body under each active secret, fed chunk by chunk."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._macs = [
            hmac.new(secret.encode("utf-8"), digestmod=hashlib.sha256)
            for secret in _active(secrets)
        ]

    def update(self, chunk: bytes) -> None:
        for mac in self._macs:
            mac.update(chunk)

    def matches(self, header_value: str | None) -> bool:
        """True when ``header_value`` is exactly ``sha256=`` + the hex HMAC of
        the body so far under one of the secrets."""
        if header_value is None or not header_value.isascii():
            return False
        presented = header_value.encode("ascii")
        matches = [
            hmac.compare_digest(presented, (SIGNATURE_PREFIX + mac.hexdigest()).encode("ascii"))
            for mac in self._macs
        ]
        return any(matches)


class HmacSignature:
    """A :class:`models.providers.Verifier` for a ``sha256=<hex>`` signature header."""

    def __init__(self, presented: str | None, secrets: Iterable[str]) -> None:
        self._presented = presented
        self._stream = HmacSha256Stream(secrets)

    def update(self, chunk: bytes) -> None:
        self._stream.update(chunk)

    def matches(self) -> bool:
        return self._stream.matches(self._presented)


class SecretToken:
    """A :class:`models.providers.Verifier` for a secret sent as it is (GitLab's
    ``X-Gitlab-Token``): the body is not part of the proof."""

    def __init__(self, presented: str | None, secrets: Iterable[str]) -> None:
        self._presented = presented
        self._secrets = _active(secrets)

    def update(self, chunk: bytes) -> None:
        """Nothing to compute: the token does not depend on the body."""

    def matches(self) -> bool:
        if self._presented is None:
            return False
        presented = self._presented.encode("utf-8", "replace")
        matches = [
            hmac.compare_digest(presented, secret.encode("utf-8")) for secret in self._secrets
        ]
        return any(matches)


def hmac_sha256_signature(body: bytes, secret: str) -> str:
    """``sha256=`` + the hex HMAC-SHA256 of ``body`` keyed with ``secret``: the
    signature header GitHub and Jira send (what a sample delivery is signed with)."""
    return SIGNATURE_PREFIX + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify_hmac_sha256(body: bytes, header_value: str | None, secrets: Iterable[str]) -> bool:
    """True when ``header_value`` is exactly ``sha256=`` + the hex HMAC-SHA256 of the
    raw ``body`` keyed with one of ``secrets`` (:class:`HmacSha256Stream`, fed the
    whole body at once)."""
    signature = HmacSha256Stream(secrets)
    signature.update(body)
    return signature.matches(header_value)
