"""External-id validation, in the contract's normative order (docs/contract.md,
"Validation and normalization"): control characters on the raw value, then
trim Unicode White_Space, then empty means absent, then the 255-byte limit.
Properties with hypothesis, plus the contract's named examples."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.errors import (
    ExternalIdHasControlCharacter,
    ExternalIdNotText,
    ExternalIdTooLong,
    InvalidExternalId,
)
from models.external_id import MAX_EXTERNAL_ID_BYTES, UNICODE_WHITE_SPACE, normalize_external_id

CONTROL_CHARACTERS = [chr(c) for c in range(0x20)] + ["\x7f"]
# White_Space code points that are not ASCII control characters: the ones a trim must remove.
TRIMMABLE = [c for c in UNICODE_WHITE_SPACE if c not in CONTROL_CHARACTERS]

control_character = st.sampled_from(CONTROL_CHARACTERS)
any_text = st.text(max_size=300)
trimmable_space = st.text(alphabet=st.sampled_from(TRIMMABLE), max_size=5)
# Text that survives validation unchanged: no control characters, no White_Space at the ends.
verbatim = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=CONTROL_CHARACTERS),
    min_size=1,
    max_size=60,
).filter(lambda s: s[0] not in UNICODE_WHITE_SPACE and s[-1] not in UNICODE_WHITE_SPACE)


@pytest.mark.parametrize(
    "value",
    [
        "jira:PROJ-1234",
        "gh-issue/kdlbs/kandev#2325",
        "0d4f7a52-9c3e-4b8e-a1d6-5e2f8c7b3a90",
        "Überprüfung-é-日本語",
    ],
)
def test_accepted_values_come_back_verbatim(value):
    assert normalize_external_id(value) == value


@given(prefix=any_text, control=control_character, suffix=any_text)
def test_a_control_character_anywhere_is_an_error(prefix, control, suffix):
    with pytest.raises(ExternalIdHasControlCharacter):
        normalize_external_id(prefix + control + suffix)


@pytest.mark.parametrize("value", ["jira:PROJ-1\n", "\tjira:PROJ-1", "jira:\x00PROJ-1", "x\x7f"])
def test_control_characters_are_rejected_before_trimming(value):
    # A trailing newline is an error, not something the trim silently erases.
    with pytest.raises(ExternalIdHasControlCharacter):
        normalize_external_id(value)


@given(st.text(alphabet=st.sampled_from(TRIMMABLE), min_size=1, max_size=20))
def test_whitespace_only_is_absent(value):
    assert normalize_external_id(value) is None


@pytest.mark.parametrize("value", [None, "", "\u00a0", "\u2028", "\u3000 \u3000"])
def test_empty_and_missing_are_absent(value):
    assert normalize_external_id(value) is None


@given(leading=trimmable_space, core=verbatim, trailing=trimmable_space)
def test_unicode_white_space_is_trimmed_and_the_rest_kept_verbatim(leading, core, trailing):
    assert normalize_external_id(leading + core + trailing) == core


@given(verbatim)
def test_normalization_is_idempotent(value):
    once = normalize_external_id(value)
    assert normalize_external_id(once) == once


@given(st.data())
def test_the_limit_is_255_bytes_of_utf8_not_characters(data):
    # "é" is 2 bytes and "日" 3: build values at exactly the limit and one byte over.
    wide = data.draw(st.sampled_from(["é", "日", "😀"]))
    width = len(wide.encode())
    count = MAX_EXTERNAL_ID_BYTES // width
    pad = MAX_EXTERNAL_ID_BYTES - count * width
    at_limit = wide * count + "a" * pad
    assert len(at_limit.encode()) == 255
    assert normalize_external_id(at_limit) == at_limit
    with pytest.raises(ExternalIdTooLong):
        normalize_external_id(at_limit + "a")


def test_the_limit_applies_after_trimming():
    value = "a" * 255
    assert normalize_external_id("\u3000" + value + "\u3000") == value


def test_decomposed_and_composed_forms_are_not_unified():
    assert normalize_external_id("\u00e9") != normalize_external_id("e\u0301")


@pytest.mark.parametrize("value", [42, b"jira:PROJ-1", ["x"], "\ud800"])
def test_non_text_is_an_error(value):
    with pytest.raises(ExternalIdNotText):
        normalize_external_id(value)


def test_errors_carry_a_reason_for_the_caller():
    with pytest.raises(InvalidExternalId) as raised:
        normalize_external_id("a\nb")
    assert (
        raised.value.reason
        == "external_id must not contain control characters (U+000A at position 1)"
    )
