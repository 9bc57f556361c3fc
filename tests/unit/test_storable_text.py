"""The edge check every JSON body and MCP argument set passes through
(limits.parse_json_body, limits.check_json_text): a lone surrogate or NUL
anywhere (value or key, at any depth) is a typed 400 naming the field, a number
that is not finite is malformed JSON, and path components the OS cannot take
are 422. Pure functions; the served routes are in tests/hostile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kandev_es.errors import InvalidPath, InvalidText, MalformedJson
from kandev_es.limits import (
    MAX_JSON_DEPTH,
    check_json_text,
    check_path_lengths,
    parse_json_body,
)


def refused(raw: bytes) -> InvalidText:
    with pytest.raises(InvalidText) as caught:
        parse_json_body(raw)
    return caught.value


@pytest.mark.parametrize(
    "raw, field, reason",
    [
        (rb'{"title": "a\ud800"}', "title", "lone_surrogate"),
        (rb'{"title": "ok", "description": "\udfff tail"}', "description", "lone_surrogate"),
        (rb'{"labels": ["ok", "x\u0000"]}', "labels[1]", "nul"),
        (rb'{"a": {"b": [{"c": "\ud83d"}]}}', "a.b[0].c", "lone_surrogate"),
        (rb'{"\ud800": 1}', "\\ud800", "lone_surrogate"),
        (rb'{"k\u0000": 1}', "k\\x00", "nul"),
        (rb'"\ud800"', "(body)", "lone_surrogate"),
        # The raw bytes of a surrogate (json.loads passes them through too).
        (b'{"title": "\xed\xa0\x80"}', "title", "lone_surrogate"),
        # UTF-16 with a lone surrogate escape.
        ('{"title": "\\ud800"}'.encode("utf-16"), "title", "lone_surrogate"),
    ],
)
def test_unstorable_text_anywhere_is_invalid_text_naming_the_field(raw, field, reason):
    error = refused(raw)
    assert error.code == "invalid_text"
    assert error.details == {"field": field, "reason": reason}
    json.dumps(error.to_dict(), ensure_ascii=False).encode("utf-8")  # the answer encodes


def test_surrogate_pairs_and_ordinary_text_pass_unchanged():
    raw = rb'{"title": "\ud83d\ude00 \u00e9 \\u0000 [{", "n": [1, -0, 2.5e10]}'
    assert parse_json_body(raw) == {"title": "\U0001f600 \xe9 \\u0000 [{", "n": [1, 0, 2.5e10]}


def test_external_id_is_left_to_its_own_documented_validator():
    # docs/api.md: External ID rules — NUL is invalid_external_id (control_character).
    assert parse_json_body(rb'{"external_id": "J\u0000", "title": "t"}')["external_id"] == "J\x00"
    with pytest.raises(InvalidText):
        parse_json_body(rb'{"external_id": "J", "title": "\u0000"}')
    with pytest.raises(InvalidText):  # only the top-level field; its key still checked
        parse_json_body(rb'{"nested": {"external_id": "\u0000"}}')


@pytest.mark.parametrize("raw", [b"NaN", b"[Infinity]", b'{"a": -Infinity}', b"1e400",
                                 b'{"wip_limit": 1' + b"0" * 400 + b'.0}'])
def test_numbers_that_are_not_finite_are_malformed_json(raw):
    with pytest.raises(MalformedJson):
        parse_json_body(raw)


def test_the_argument_walk_also_refuses_non_finite_numbers_with_their_field():
    with pytest.raises(MalformedJson) as caught:
        check_json_text({"a": [1.0, float("inf")]})
    assert caught.value.details == {"field": "a[1]"}


def test_the_walk_is_iterative_at_the_depth_limit():
    deep: object = "\ud800"
    for _ in range(MAX_JSON_DEPTH * 50):  # far past any recursion limit
        deep = [deep]
    with pytest.raises(InvalidText):
        check_json_text(deep)


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00")),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=5),
        inner, max_size=4),
    max_leaves=20,
))
def test_any_storable_value_round_trips(value):
    """Whatever json.dumps writes from storable text is parsed back equal (no
    false refusals), escaped or not."""
    for ensure_ascii in (True, False):
        assert parse_json_body(json.dumps(value, ensure_ascii=ensure_ascii).encode()) == value


@given(st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, codec=None),
               min_size=1, max_size=3),
       st.sampled_from(["title", "description", "label"]))
def test_any_lone_surrogate_is_refused(surrogate, field):
    # Pairs written one after the other form a valid character: keep them apart.
    text = "x".join(surrogate)
    with pytest.raises(InvalidText):
        parse_json_body(json.dumps({field: text}).encode())


def test_path_components_over_255_bytes_or_paths_over_4095_are_invalid_path():
    check_path_lengths(Path("/" + "a" * 255))
    check_path_lengths(Path("/" + "/".join(["a" * 200] * 20)))  # 4020 bytes
    for path in ("/" + "a" * 256, "/x/" + "é" * 128, "/" + "/".join(["a" * 200] * 21)):
        with pytest.raises(InvalidPath) as caught:
            check_path_lengths(Path(path))
        assert caught.value.code == "invalid_path" and caught.value.details["field"] == "path"
