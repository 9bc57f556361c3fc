"""The save's array parameters, packed by recorders.py, are the bytes and
parameter types psycopg's own list dumper would send for the same lists."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.adapt import PyFormat, Transformer
from psycopg.types.numeric import Int8

from kandev_es.storage.recorders import (
    pack_byteas,
    pack_chain_hashes,
    pack_int8s,
    pack_texts,
    pack_uuids,
)

INT8 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def psycopg_dump(values: list[object]) -> tuple[bytes, int]:
    transformer = Transformer()
    (dumped,) = transformer.dump_sequence([values], [PyFormat.BINARY])
    assert dumped is not None
    return bytes(dumped), transformer.types[0]


def ours(packed: bytes) -> tuple[bytes, int]:
    transformer = Transformer()
    (dumped,) = transformer.dump_sequence([packed], [PyFormat.BINARY])
    assert dumped is not None
    return bytes(dumped), transformer.types[0]


@given(st.lists(st.uuids(), min_size=1))
def test_uuids_pack_as_psycopg_dumps_them(values: list[uuid.UUID]) -> None:
    assert ours(pack_uuids(values)) == psycopg_dump(list(values))


@given(st.lists(st.uuids(), min_size=1))
def test_uuid_strings_pack_as_the_uuids(values: list[uuid.UUID]) -> None:
    assert pack_uuids([str(value) for value in values]) == pack_uuids(values)


@given(st.lists(INT8, min_size=1))
def test_int8s_pack_as_psycopg_dumps_them_as_bigint(values: list[int]) -> None:
    packed, oid = ours(pack_int8s(values))
    # psycopg picks the narrowest integer type for a list; the save casts to
    # bigint[], so compare with an explicit bigint list.
    assert (packed, oid) == psycopg_dump([Int8(value) for value in values])


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\x00")), min_size=1))
def test_texts_pack_as_psycopg_dumps_them(values: list[str]) -> None:
    """Same bytes, or (a lone surrogate has no UTF-8 form) the same refusal."""

    def outcome(dump: Callable[[], tuple[bytes, int]]) -> object:
        try:
            return dump()
        except UnicodeEncodeError as error:
            return type(error), error.object[error.start : error.end]

    assert outcome(lambda: ours(pack_texts(values, "utf-8"))) == outcome(
        lambda: psycopg_dump(list(values))
    )


def test_a_lone_surrogate_is_refused_as_psycopg_refuses_it() -> None:
    with pytest.raises(UnicodeEncodeError):
        pack_texts(["ok", "\ud800"], "utf-8")
    with pytest.raises(UnicodeEncodeError):
        psycopg_dump(["ok", "\ud800"])


@given(st.lists(st.binary(), min_size=1))
def test_byteas_pack_as_psycopg_dumps_them(values: list[bytes]) -> None:
    assert ours(pack_byteas(values)) == psycopg_dump(list(values))


@given(st.lists(st.one_of(st.none(), st.binary(min_size=32, max_size=32)), min_size=1))
def test_chain_hashes_pack_as_psycopg_dumps_them_with_nulls(values: list[bytes | None]) -> None:
    """The save's chain hashes: a None (filled by the save's statement) is a NULL."""
    if all(value is None for value in values):
        # psycopg cannot type a list of only Nones; ours is bytea[] with NULLs
        packed, oid = ours(pack_chain_hashes(values))
        assert oid == 1001 and packed.count(b"\xff\xff\xff\xff") == len(values)
        return
    assert ours(pack_chain_hashes(values)) == psycopg_dump(list(values))


def test_empty_arrays_keep_their_element_type() -> None:
    # psycopg sends an empty list untyped; ours is typed, which the save's
    # casts (uuid[], bigint[]) make the same to the server.
    for packed, oid in ((pack_uuids([]), 2951), (pack_int8s([]), 1016)):
        assert ours(packed)[1] == oid
        assert len(packed) == 12  # no dimensions, no elements
