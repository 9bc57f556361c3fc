"""The events' JSON, byte for byte as eventsourcing's ``JSONTranscoder``
writes it, in less CPU: a save's events are encoded on the request path.

The library's ``encode`` builds a ``json.JSONEncoder`` pass per call (a new C
encoder object, circular-reference markers) and turns each UUID and datetime
into its ``{"_type_": ..., "_data_": ...}`` object through two lookups and a
method call. Here the C encoder is made once, without markers (an event's
state is a tree: what a cycle would do is recurse until Python refuses), and
the two transcodings the application registers (``UUIDAsHex``,
``DatetimeAsISO``) are inlined in the hook; any other type goes to the
library's hook as before. Decoding is the library's: the bytes are the same.
tests/unit/test_event_transcoder.py compares the two encoders.
"""

from __future__ import annotations

import json.encoder
import uuid
from datetime import datetime
from typing import Any

from eventsourcing.persistence import DatetimeAsISO, JSONTranscoder, Transcoding, UUIDAsHex

_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)


class EventTranscoder(JSONTranscoder):
    def __init__(self) -> None:
        super().__init__()
        self._uuid_hex = False
        self._datetime_iso = False
        # What the library's encoder runs per call (JSONEncoder.iterencode,
        # one-shot), made once: compact separators, non-ASCII kept.
        self._encode_one: Any = (
            None
            if _C_ENCODER is None
            else _C_ENCODER(
                None, self._inline_default, json.encoder.encode_basestring, None,
                ":", ",", False, False, True,
            )
        )  # fmt: skip

    def register(self, transcoding: Transcoding) -> None:
        super().register(transcoding)
        # Inlined only while the library's own transcoding is the one registered.
        if transcoding.type is uuid.UUID:
            self._uuid_hex = type(transcoding) is UUIDAsHex
        elif transcoding.type is datetime:
            self._datetime_iso = type(transcoding) is DatetimeAsISO

    def encode(self, obj: Any) -> bytes:
        if self._encode_one is None or isinstance(obj, str):
            return super().encode(obj)
        return "".join(self._encode_one(obj, 0)).encode("utf8")

    def _inline_default(self, o: Any) -> dict[str, Any]:
        kind = type(o)
        if kind is uuid.UUID and self._uuid_hex:
            return {"_type_": "uuid_hex", "_data_": f"{o.int:032x}"}  # UUID.hex, inlined
        if kind is datetime and self._datetime_iso:
            return {"_type_": "datetime_iso", "_data_": o.isoformat()}
        return self._encode_obj(o)
