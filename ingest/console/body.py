"""What a delivery's page shows of its body: a bounded part, whatever the body.

A body comes from outside and may be up to ``TASKHOOK_MAX_BODY_BYTES``. Shown
whole and pretty-printed, a few hundred KiB nested a few hundred levels deep
became a page of hundreds of MB (every value a line indented by its whole
depth), and a body nested past Python's recursion limit could not be parsed
at all. So the page never parses the body into Python values: it reads the
text's JSON tokens one by one, without recursion, and writes them indented,

- up to :data:`SHOWN_DEPTH` levels: a list or an object nested deeper is
  shown folded, ``[…]`` or ``{…}``;
- up to :data:`SHOWN_CHARS` characters of text, read from at most the
  body's first :data:`READ_BYTES`: past them, the text stops.

Either way the page says so and links to the raw body, a download of its
own (``pages.delivery_body``). A body that is not JSON is shown as text,
cut the same way. The time and the page's size are bounded by these three
numbers, not by the body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The most characters of text the page shows of a body (the page escapes
#: them: a few times as many bytes at worst).
SHOWN_CHARS = 128 * 1024
#: The deepest nesting shown; deeper lists and objects are folded.
SHOWN_DEPTH = 20
#: The most of a body read to show it.
READ_BYTES = 1024 * 1024

_INDENT = "  "
_TOKEN = re.compile(
    r"""
    (?P<space>[\ \t\n\r]+)
  | (?P<string>"(?:[^"\\\x00-\x1f]|\\.)*")
  | (?P<scalar>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null)
  | (?P<open>[\[{])
  | (?P<close>[\]}])
  | (?P<comma>,)
  | (?P<colon>:)
    """,
    re.VERBOSE,
)
_CLOSING = {"[": "]", "{": "}"}
#: What a folded list or object is read as: runs of anything but brackets
#: and strings, strings whole, and brackets.
_SKIPPED = re.compile(r'[^"\[\]{}]+|"(?:[^"\\]|\\.)*"|(?P<open>[\[{])|(?P<close>[\]}])|"')


@dataclass(frozen=True)
class ShownBody:
    """What the page shows of a body, and what it leaves out."""

    text: str
    #: Shown as JSON, indented (else as the body's text).
    is_json: bool
    #: The text stops before the body's end.
    cut: bool
    #: Lists and objects nested deeper than :data:`SHOWN_DEPTH`, shown folded.
    folded: int

    @property
    def in_part(self) -> bool:
        return self.cut or self.folded > 0


class _NotJson(Exception):
    pass


def shown_body(body: bytes) -> ShownBody:
    """The part of ``body`` a delivery's page shows: JSON indented, anything
    else as text; bounded as the module says."""
    text = body[:READ_BYTES].decode("utf-8", errors="replace")
    read_whole = len(body) <= READ_BYTES
    try:
        return _indented(text, read_whole=read_whole)
    except _NotJson:
        cut = not read_whole or len(text) > SHOWN_CHARS
        return ShownBody(text[:SHOWN_CHARS], is_json=False, cut=cut, folded=0)


def _indented(text: str, *, read_whole: bool) -> ShownBody:
    """``text``'s JSON tokens, indented; :class:`_NotJson` when they are not
    JSON (as far as they are read)."""
    out: list[str] = []
    size = 0
    stack: list[str] = []  # the open lists and objects, by their opening bracket
    # What may come next: "value", "key" (in an object), "colon", "next"
    # (a comma or the closing bracket), "end" (after the top value).
    expect = "value"
    just_opened = False  # the last token opened a list or object: it may close at once
    folded = 0
    position, length = 0, len(text)

    def write(piece: str) -> None:
        nonlocal size
        out.append(piece)
        size += len(piece)

    while position < length and size < SHOWN_CHARS:
        token = _TOKEN.match(text, position)
        if token is None:
            raise _NotJson
        kind, value = token.lastgroup, token.group()
        position = token.end()
        if kind == "space":
            continue
        if kind == "close":
            if not stack or _CLOSING[stack[-1]] != value or expect not in ("next", "value", "key"):
                raise _NotJson
            if not just_opened and expect != "next":
                raise _NotJson  # a comma before the closing bracket
            stack.pop()
            write(value if just_opened else "\n" + _INDENT * len(stack) + value)
            just_opened = False
            expect = "next" if stack else "end"
            continue
        if just_opened:
            write("\n" + _INDENT * len(stack))
            just_opened = False
        if kind == "comma":
            if expect != "next" or not stack:
                raise _NotJson
            write(",\n" + _INDENT * len(stack))
            expect = "key" if stack[-1] == "{" else "value"
        elif kind == "colon":
            if expect != "colon":
                raise _NotJson
            write(": ")
            expect = "value"
        elif expect == "key":
            if kind != "string":
                raise _NotJson
            write(value)
            expect = "colon"
        elif expect != "value":
            raise _NotJson
        elif kind == "open":
            if len(stack) >= SHOWN_DEPTH:
                position = _past_closing(text, position, value)
                write(value + "…" + _CLOSING[value])
                folded += 1
                expect = "next" if stack else "end"
            else:
                stack.append(value)
                write(value)
                just_opened = True
                expect = "key" if value == "{" else "value"
        else:
            write(value)
            expect = "next" if stack else "end"
    if size > SHOWN_CHARS:
        out[-1] = out[-1][: len(out[-1]) - (size - SHOWN_CHARS)]
    cut = (size >= SHOWN_CHARS and text[position:].strip() != "") or not read_whole
    if not cut and (stack or expect != "end"):
        raise _NotJson  # the whole body was read, and it ended too early
    return ShownBody("".join(out), is_json=True, cut=cut, folded=folded)


def _past_closing(text: str, position: int, opening: str) -> int:
    """Where the list or object opened just before ``position`` ends (past its
    closing bracket), or the text's end; its strings skipped whole."""
    depth = 1
    length = len(text)
    while position < length:
        token = _SKIPPED.match(text, position)
        if token is None or token.group() == '"':
            raise _NotJson  # a string that never ends
        position = token.end()
        kind = token.lastgroup
        if kind == "open":
            depth += 1
        elif kind == "close":
            depth -= 1
            if depth == 0:
                return position
    return position
