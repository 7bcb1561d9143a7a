"""Validation and normalization of caller-supplied external ids.

The order of the steps is part of the contract (docs/contract.md,
"Validation and normalization") because it decides which error a malformed
value gets:

1. reject ASCII control characters anywhere in the *raw* value, before any
   trimming, so a trailing newline is an error rather than silently erased;
2. trim leading and trailing Unicode White_Space;
3. empty after trimming means absent (``None``), not an error;
4. at most 255 bytes of UTF-8.

Everything else is accepted verbatim: byte-exact, case-sensitive, no Unicode
normalization (``é`` and ``e`` + U+0301 are different identities).
"""

from __future__ import annotations

import re

MAX_EXTERNAL_ID_BYTES = 255

_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f]")

# Every code point with the Unicode White_Space property (PropList.txt).
# Spelled out because str.strip() follows str.isspace(), a different set.
UNICODE_WHITE_SPACE = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


class InvalidExternalId(ValueError):
    """The external id is malformed; ``reason`` is safe to show the caller."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ExternalIdHasControlCharacter(InvalidExternalId):
    def __init__(self, position: int, code_point: int) -> None:
        super().__init__(
            f"external_id must not contain control characters "
            f"(U+{code_point:04X} at position {position})"
        )


class ExternalIdTooLong(InvalidExternalId):
    def __init__(self, length: int) -> None:
        super().__init__(
            f"external_id must be at most {MAX_EXTERNAL_ID_BYTES} bytes of UTF-8 (got {length})"
        )


class ExternalIdNotText(InvalidExternalId):
    def __init__(self, kind: str) -> None:
        super().__init__(f"external_id must be a string of Unicode text (got {kind})")


def normalize_external_id(raw: object) -> str | None:
    """The normalized identity for ``raw``, or ``None`` when it is absent.

    Raises an :class:`InvalidExternalId` subclass naming the first rule broken.
    """
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ExternalIdNotText(type(raw).__name__)
    control = _CONTROL_CHARACTER.search(raw)
    if control:  # step 1: before trimming, on the raw value
        raise ExternalIdHasControlCharacter(control.start(), ord(control.group()))
    trimmed = raw.strip(UNICODE_WHITE_SPACE)  # step 2
    if not trimmed:  # step 3
        return None
    try:
        length = len(trimmed.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a lone surrogate, e.g. from a JSON "\\ud800" escape
        raise ExternalIdNotText("text with an unpaired surrogate") from exc
    if length > MAX_EXTERNAL_ID_BYTES:  # step 4
        raise ExternalIdTooLong(length)
    return trimmed
