"""HMAC-SHA256 webhook signatures, computed while a body streams in.

GitHub (``X-Hub-Signature-256``) and Jira (``X-Hub-Signature``) both sign the
raw body as ``sha256=`` + the hex HMAC-SHA256 under the webhook's secret. An
HMAC is incremental, so the ingress feeds it each chunk as it arrives and
never needs an unverified body whole in memory (docs/reliability.md,
"Hostile input").
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

SIGNATURE_PREFIX = "sha256="


class HmacSha256Stream:
    """The signatures of one body under each active secret, fed chunk by chunk.

    Several secrets may be active at once so that a secret rotates without
    downtime: add the new one, switch the provider over, drop the old one.
    Empty secrets are skipped -- an empty key would make any sender's
    signature "valid".
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        if isinstance(secrets, str):
            # A bare string is an iterable of one-character "secrets": refuse it loudly.
            raise TypeError("secrets must be an iterable of strings, not a single string")
        self._macs = [
            hmac.new(secret.encode("utf-8"), digestmod=hashlib.sha256)
            for secret in secrets
            if secret
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
        # Every active secret is compared, matched or not, so the time taken does
        # not tell which one (if any) matched.
        return any(matches)
