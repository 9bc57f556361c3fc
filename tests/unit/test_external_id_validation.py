"""Specification of external-ID validation (docs/api.md: External ID rules).

AC-TASKS-EXTERNAL-ID-001.1: a create carrying an external ID resolves the single
task associated with the *normalized, byte-exact, case-sensitive* identity. The
normalisation is fixed, in this order:

1. reject ASCII control characters (U+0000-U+001F, U+007F) - before trimming,
2. trim surrounding Unicode whitespace (``str.isspace``),
3. empty after trimming means absent (``None``), not an error,
4. at most 255 UTF-8 bytes, counted after trimming.

Nothing else is normalised (no case folding, no NFC/NFD), so two IDs that differ
in any code point name two different identities.
"""

from __future__ import annotations

import unicodedata
import uuid

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from kandev_es.domain.external_id import (
    MAX_EXTERNAL_ID_BYTES,
    identity_id,
    normalize_external_id,
)
from kandev_es.errors import BadRequest, InvalidExternalId, http_status

ASCII_CONTROLS = [chr(code) for code in range(0x20)] + ["\x7f"]
# Whitespace (str.isspace) that is *not* an ASCII control: these are trimmed.
# Spelled out rather than computed, so the test does not share the code's idea
# of whitespace; the last test in this block checks the list is complete.
TRIMMABLE_WHITESPACE = [
    " ",
    "\u0085",
    "\u00a0",
    "\u1680",
    *[chr(code) for code in range(0x2000, 0x200B)],
    "\u2028",
    "\u2029",
    "\u202f",
    "\u205f",
    "\u3000",
]
ONE, TWO, THREE, FOUR = "a", "\u00e9", "\u20ac", "\U0001f600"  # a, é, €, 😀
WORKSPACE = uuid.UUID("11111111-2222-3333-4444-555555555555")
OTHER_WORKSPACE = uuid.UUID("99999999-8888-7777-6666-555555555555")


def _reason(raw: object) -> str:
    with pytest.raises(InvalidExternalId) as caught:
        normalize_external_id(raw)
    return str(caught.value.details["reason"])


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


controls = st.sampled_from(ASCII_CONTROLS)
trimmable = st.sampled_from(TRIMMABLE_WHITESPACE)
padding = st.text(alphabet=trimmable, max_size=5)
# Printable-ish text with no ASCII control and no surrogate.
clean_text = st.text(
    alphabet=st.characters(
        codec="utf-8", exclude_categories=("Cs",), exclude_characters="".join(ASCII_CONTROLS)
    )
)
# Non-empty, with non-whitespace at both ends, and short enough to be accepted.
core_id = clean_text.map(str.strip).filter(lambda s: 0 < _utf8_len(s) <= MAX_EXTERNAL_ID_BYTES)
sized_chars = st.sampled_from([ONE, TWO, THREE, FOUR])


# ----- absent ---------------------------------------------------------------
def test_none_means_absent() -> None:
    assert normalize_external_id(None) is None


def test_empty_string_means_absent() -> None:
    assert normalize_external_id("") is None


@given(st.text(alphabet=trimmable, min_size=1, max_size=20))
@example(" ")
@example("\u00a0\u2003\u3000")
def test_whitespace_only_means_absent_not_an_error(raw: str) -> None:
    assert normalize_external_id(raw) is None


# ----- control characters, checked before trimming --------------------------
@pytest.mark.parametrize("control", ASCII_CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
def test_every_ascii_control_character_is_rejected(control: str) -> None:
    assert _reason(f"ab{control}cd") == "control_character"


@pytest.mark.parametrize("control", ["\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f"])
def test_control_character_is_rejected_before_trimming(control: str) -> None:
    # These are str.isspace() and would vanish under strip(); they must not.
    assert _reason(f"{control}JIRA-1") == "control_character"
    assert _reason(f"JIRA-1{control}") == "control_character"
    assert _reason(f"{control}JIRA-1{control}") == "control_character"


@pytest.mark.parametrize("control", ["\t", "\n", "\x00", "\x7f"])
def test_control_only_string_is_an_error_not_absent(control: str) -> None:
    assert _reason(control) == "control_character"
    assert _reason(f" {control} ") == "control_character"


@given(prefix=clean_text, control=controls, suffix=clean_text)
def test_control_character_anywhere_is_rejected(prefix: str, control: str, suffix: str) -> None:
    assert _reason(prefix + control + suffix) == "control_character"


@given(prefix=st.text(alphabet=sized_chars, min_size=300, max_size=400), control=controls)
def test_control_character_wins_over_too_long(prefix: str, control: str) -> None:
    assert _reason(prefix + control) == "control_character"


def test_invalid_external_id_is_a_typed_400() -> None:
    with pytest.raises(InvalidExternalId) as caught:
        normalize_external_id("a\x00b")
    error = caught.value
    assert isinstance(error, BadRequest)
    assert http_status(error) == 400
    assert error.to_dict()["error"] == "invalid_external_id"
    assert error.to_dict()["details"]["reason"] == "control_character"


def test_c1_next_line_is_whitespace_not_an_ascii_control() -> None:
    # U+0085 is a C1 control but outside the ASCII range: it is trimmed.
    assert normalize_external_id("\u0085X-1\u0085") == "X-1"


# ----- trimming ---------------------------------------------------------------
@pytest.mark.parametrize("space", TRIMMABLE_WHITESPACE, ids=lambda c: f"U+{ord(c):04X}")
def test_surrounding_unicode_whitespace_is_trimmed(space: str) -> None:
    assert normalize_external_id(f"{space}{space}JIRA-1{space}") == "JIRA-1"


def test_trimmable_whitespace_list_covers_every_non_control_isspace_character() -> None:
    expected = {
        chr(code)
        for code in range(0x110000)
        if chr(code).isspace() and chr(code) not in ASCII_CONTROLS
    }
    assert set(TRIMMABLE_WHITESPACE) == expected


@given(left=padding, core=core_id, right=padding)
def test_result_is_the_trimmed_input_exactly(left: str, core: str, right: str) -> None:
    assert normalize_external_id(left + core + right) == core


@given(
    core_left=core_id, inner=st.text(alphabet=trimmable, min_size=1, max_size=3), core_right=core_id
)
def test_inner_whitespace_is_kept(core_left: str, inner: str, core_right: str) -> None:
    raw = core_left + inner + core_right
    assume(_utf8_len(raw) <= MAX_EXTERNAL_ID_BYTES)
    assert normalize_external_id(raw) == raw


def test_zero_width_space_is_not_whitespace_and_is_kept() -> None:
    # U+200B is not str.isspace(): it is part of the ID, not trimmed.
    assert normalize_external_id("\u200bX\u200b") == "\u200bX\u200b"


# ----- byte length --------------------------------------------------------------
@pytest.mark.parametrize(
    "char", [ONE, TWO, THREE, FOUR], ids=["1-byte", "2-byte", "3-byte", "4-byte"]
)
def test_length_is_counted_in_utf8_bytes_not_code_points(char: str) -> None:
    width = _utf8_len(char)
    fits = MAX_EXTERNAL_ID_BYTES // width
    accepted = char * fits
    assert normalize_external_id(accepted) == accepted
    too_long = accepted + char  # one more character crosses the limit
    assert _utf8_len(too_long) > MAX_EXTERNAL_ID_BYTES
    assert _reason(too_long) == "too_long"


def test_exactly_255_bytes_is_accepted_and_256_rejected() -> None:
    assert normalize_external_id("a" * 255) == "a" * 255
    assert _reason("a" * 256) == "too_long"


@pytest.mark.parametrize("char", [TWO, THREE, FOUR], ids=["2-byte", "3-byte", "4-byte"])
def test_multibyte_character_that_crosses_the_limit_is_rejected(char: str) -> None:
    # 254 bytes of "a" leave one byte free; any multi-byte char overflows it.
    assert _reason("a" * 254 + char) == "too_long"
    # ...while the same char fits exactly when the ASCII part leaves room for it.
    exact = "a" * (MAX_EXTERNAL_ID_BYTES - _utf8_len(char)) + char
    assert _utf8_len(exact) == 255
    assert normalize_external_id(exact) == exact


def test_too_long_reports_the_byte_length() -> None:
    with pytest.raises(InvalidExternalId) as caught:
        normalize_external_id(FOUR * 64)  # 64 code points, 256 bytes
    assert caught.value.details["reason"] == "too_long"
    assert caught.value.details["length_bytes"] == 256


@given(st.lists(sized_chars, max_size=120))
def test_mixed_width_id_of_exactly_255_bytes_is_accepted(chars: list[str]) -> None:
    body = "".join(chars)
    assume(_utf8_len(body) <= MAX_EXTERNAL_ID_BYTES)
    exact = body + "a" * (MAX_EXTERNAL_ID_BYTES - _utf8_len(body))
    assert _utf8_len(exact) == 255
    assert normalize_external_id(exact) == exact


@given(chars=st.lists(sized_chars, max_size=120), extra=sized_chars)
def test_mixed_width_id_one_char_past_255_bytes_is_rejected(chars: list[str], extra: str) -> None:
    body = "".join(chars)
    assume(_utf8_len(body) <= MAX_EXTERNAL_ID_BYTES)
    exact = body + "a" * (MAX_EXTERNAL_ID_BYTES - _utf8_len(body))
    assert _reason(exact + extra) == "too_long"


@given(chars=st.lists(sized_chars, max_size=120), left=padding, right=padding)
def test_255_bytes_plus_surrounding_whitespace_is_accepted(
    chars: list[str], left: str, right: str
) -> None:
    body = "".join(chars)
    assume(_utf8_len(body) <= MAX_EXTERNAL_ID_BYTES)
    exact = body + "a" * (MAX_EXTERNAL_ID_BYTES - _utf8_len(body))
    assert normalize_external_id(left + exact + right) == exact


def test_length_limit_applies_after_trimming_with_wide_whitespace() -> None:
    # U+3000 is 3 bytes: 255 bytes of ID plus 30 bytes of padding is still valid.
    exact = THREE * 85
    assert normalize_external_id("\u3000" * 5 + exact + "\u3000" * 5) == exact


# ----- no other normalisation -------------------------------------------------------
def test_case_is_preserved_and_case_variants_are_different_identities() -> None:
    assert normalize_external_id("ABC") == "ABC"
    assert normalize_external_id("abc") == "abc"
    assert identity_id(WORKSPACE, "ABC") != identity_id(WORKSPACE, "abc")


@pytest.mark.parametrize("word", ["caf\u00e9", "\u00c5ngstr\u00f6m", "\uac00", "\u1e9b\u0323"])
def test_nfc_and_nfd_variants_are_returned_unchanged_and_are_different_identities(
    word: str,
) -> None:
    nfc = unicodedata.normalize("NFC", word)
    nfd = unicodedata.normalize("NFD", word)
    assert nfc != nfd
    assert normalize_external_id(nfc) == nfc
    assert normalize_external_id(nfd) == nfd
    assert identity_id(WORKSPACE, nfc) != identity_id(WORKSPACE, nfd)


def test_compatibility_characters_are_not_folded() -> None:
    # NFKC would turn the ligature into "fi" and the full-width A into "A".
    assert normalize_external_id("\ufb01") == "\ufb01"
    assert normalize_external_id("\uff21") == "\uff21"
    assert identity_id(WORKSPACE, "\ufb01") != identity_id(WORKSPACE, "fi")


@given(core_id)
def test_identity_id_is_deterministic(external_id: str) -> None:
    first = identity_id(WORKSPACE, external_id)
    assert first == identity_id(uuid.UUID(str(WORKSPACE)), external_id)
    assert isinstance(first, uuid.UUID)


@given(core_id)
def test_identity_id_differs_across_workspaces(external_id: str) -> None:
    assert identity_id(WORKSPACE, external_id) != identity_id(OTHER_WORKSPACE, external_id)


@given(core_id, core_id)
def test_distinct_external_ids_give_distinct_identities(left: str, right: str) -> None:
    assume(left != right)
    assert identity_id(WORKSPACE, left) != identity_id(WORKSPACE, right)


# ----- type and encoding ----------------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    [0, 42, 1.5, True, False, ["JIRA-1"], {"id": "JIRA-1"}, b"JIRA-1", ()],
    ids=repr,
)
def test_non_string_is_rejected(raw: object) -> None:
    assert _reason(raw) == "not_a_string"


@pytest.mark.parametrize("raw", ["\ud800", "JIRA-\udfff", " \udc00 "])
def test_lone_surrogate_is_rejected_as_invalid_unicode(raw: str) -> None:
    assert _reason(raw) == "invalid_unicode"


@given(
    prefix=clean_text,
    surrogate=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, codec=None),
    suffix=clean_text,
)
def test_any_lone_surrogate_is_rejected(prefix: str, surrogate: str, suffix: str) -> None:
    # Even an over-long value: a string that is not text has no byte length.
    assert _reason(prefix + surrogate + suffix) == "invalid_unicode"


# ----- properties over arbitrary input ------------------------------------------------
@given(st.text(alphabet=st.characters(codec=None)))
@example("\t x \t")
@example("\u00a0" + "a" * 255 + "\u00a0")
@example("a" * 256)
def test_validation_matches_the_specified_order(raw: str) -> None:
    """An oracle written straight from docs/api.md's External ID rules."""
    if any(char in ASCII_CONTROLS for char in raw):
        assert _reason(raw) == "control_character"
        return
    trimmed = raw.strip()
    if not trimmed:
        assert normalize_external_id(raw) is None
        return
    try:
        length = len(trimmed.encode("utf-8"))
    except UnicodeEncodeError:
        assert _reason(raw) == "invalid_unicode"
        return
    if length > MAX_EXTERNAL_ID_BYTES:
        assert _reason(raw) == "too_long"
    else:
        assert normalize_external_id(raw) == trimmed


@given(st.one_of(st.text(alphabet=st.characters(codec=None)), padding.map(lambda p: p + "x" + p)))
def test_accepted_values_are_idempotent_and_fit_in_255_bytes(raw: str) -> None:
    try:
        value = normalize_external_id(raw)
    except InvalidExternalId:
        return
    if value is None:
        return
    assert normalize_external_id(value) == value
    assert normalize_external_id(normalize_external_id(value)) == value
    assert 0 < _utf8_len(value) <= MAX_EXTERNAL_ID_BYTES
    assert value == value.strip()


@pytest.mark.parametrize("raw", [None, "", "  \u3000 "])
def test_require_external_id_refuses_an_absent_one(raw: object) -> None:
    from kandev_es.domain.external_id import require_external_id

    with pytest.raises(InvalidExternalId) as caught:
        require_external_id(raw)
    assert caught.value.details["reason"] == "missing"


def test_require_external_id_returns_the_canonical_one() -> None:
    from kandev_es.domain.external_id import require_external_id

    assert require_external_id("  PROJ-1 ") == "PROJ-1"
