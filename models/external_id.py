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

from models.errors import ExternalIdHasControlCharacter, ExternalIdNotText, ExternalIdTooLong

MAX_EXTERNAL_ID_BYTES = 255

_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f]")

# Every code point with the Unicode White_Space property (PropList.txt).
# Spelled out because str.strip() follows str.isspace(), a different set.
UNICODE_WHITE_SPACE = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def normalize_external_id(raw: object) -> str | None:
    """The normalized identity for ``raw``, or ``None`` when it is absent.

    Raises a :class:`models.errors.InvalidExternalId` subclass naming the first rule broken.
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
        raise ExternalIdTooLong(length, MAX_EXTERNAL_ID_BYTES)
    return trimmed
