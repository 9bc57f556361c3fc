"""The input limits as pure functions: no recursion, no overflow, brackets
inside strings ignored."""

from __future__ import annotations

import json

import pytest

from kandev_es.errors import InvalidCursor, MalformedJson, MalformedQuery
from kandev_es.limits import (
    MAX_CURSOR,
    MAX_JSON_DEPTH,
    check_json_depth,
    check_query_string,
    parse_cursor,
)


def test_depth_up_to_the_limit_passes_and_one_more_is_malformed_json():
    check_json_depth(json.dumps([[]] * 3).encode())
    check_json_depth(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH)
    with pytest.raises(MalformedJson):
        check_json_depth(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(MalformedJson):
        check_json_depth(b"[" * 1_000_000)  # a recursive check would overflow here


def test_brackets_in_strings_and_escaped_quotes_do_not_count():
    body = json.dumps({"a": '\\"[{' * 10_000, "b": "[" * 10_000}).encode()
    check_json_depth(body)
    sneaky = b'{"a": "\\"", "b": ' + b"[" * 100 + b"]" * 100 + b"}"
    with pytest.raises(MalformedJson):
        check_json_depth(sneaky)


@pytest.mark.parametrize("raw", [str(MAX_CURSOR + 1), "-1", "1.0", "+1", "\u0663", "0x10", "1 2"])
def test_cursors_outside_0_to_2_63_minus_1_or_not_ascii_digits_are_invalid(raw):
    with pytest.raises(InvalidCursor):
        parse_cursor(raw)


def test_cursor_bounds_and_blank():
    assert parse_cursor(str(MAX_CURSOR)) == MAX_CURSOR
    assert parse_cursor(" 7 ") == 7
    assert parse_cursor(None) == parse_cursor("") == 0


def test_query_string_must_be_utf8_after_percent_decoding():
    check_query_string(b"external_id=%E2%82%AC+x&after=1")
    for raw in (b"external_id=%FF", b"x=%C3%28", b"a=\xff"):
        with pytest.raises(MalformedQuery):
            check_query_string(raw)
